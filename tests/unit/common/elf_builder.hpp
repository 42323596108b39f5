// Small x86-64 ELF64 images written from scratch, for the tests of the ELF reader
// (common/elf_image.hpp) and the seeds of its fuzz target: PT_LOAD segments, one PROGBITS
// section per segment, .symtab, .strtab and .shstrtab. The layout, in file order: ELF header,
// program headers, section headers, the segments' bytes, .symtab, .strtab, .shstrtab (section
// headers before the data, so that cutting the file cuts the data first). The returned
// offsets let a test break one field at a time.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace xenprobes::testing {

struct ElfSegment {
  std::uint64_t vaddr = 0;
  std::vector<std::uint8_t> bytes;  // filesz = bytes.size()
  std::uint64_t memsz = 0;          // 0: bytes.size()
  std::uint32_t flags = PF_R;
};

struct ElfSymbol {
  std::string name;
  std::uint64_t value = 0, size = 0;
  std::uint8_t info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
  std::uint16_t shndx = 1;  // the first segment's section
};

struct BuiltElf {
  std::vector<std::uint8_t> bytes;
  std::size_t symtab_index = 0, strtab_index = 0;  // section indexes
  std::size_t symtab_offset = 0, strtab_offset = 0;

  template <class T>
  T get(std::size_t off) const {
    T v;
    std::memcpy(&v, bytes.data() + off, sizeof v);
    return v;
  }
  // edit<T>(off, f): f changes the T at off.
  template <class T, class F>
  BuiltElf& edit(std::size_t off, F f) {
    T v = get<T>(off);
    f(v);
    std::memcpy(bytes.data() + off, &v, sizeof v);
    return *this;
  }
  Elf64_Ehdr ehdr() const { return get<Elf64_Ehdr>(0); }
  std::size_t phdr_at(std::size_t i) const { return ehdr().e_phoff + i * sizeof(Elf64_Phdr); }
  std::size_t shdr_at(std::size_t i) const { return ehdr().e_shoff + i * sizeof(Elf64_Shdr); }
  std::size_t sym_at(std::size_t i) const { return symtab_offset + i * sizeof(Elf64_Sym); }
  Elf64_Phdr phdr(std::size_t i) const { return get<Elf64_Phdr>(phdr_at(i)); }
  Elf64_Shdr shdr(std::size_t i) const { return get<Elf64_Shdr>(shdr_at(i)); }
  template <class F>
  BuiltElf& edit_ehdr(F f) {
    return edit<Elf64_Ehdr>(0, f);
  }
  template <class F>
  BuiltElf& edit_phdr(std::size_t i, F f) {
    return edit<Elf64_Phdr>(phdr_at(i), f);
  }
  template <class F>
  BuiltElf& edit_shdr(std::size_t i, F f) {
    return edit<Elf64_Shdr>(shdr_at(i), f);
  }
};

inline BuiltElf build_elf(std::uint64_t entry, const std::vector<ElfSegment>& segs,
                          const std::vector<ElfSymbol>& syms) {
  BuiltElf out;
  std::vector<std::uint8_t>& f = out.bytes;
  auto put = [&f](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    f.insert(f.end(), b, b + n);
  };
  auto align = [&f](std::size_t a) { f.resize((f.size() + a - 1) / a * a); };

  const std::size_t nseg = segs.size();
  const std::size_t nsec = nseg + 4;  // null, one per segment, .symtab, .strtab, .shstrtab
  out.symtab_index = nseg + 1;
  out.strtab_index = nseg + 2;
  const std::size_t shstrtab_index = nseg + 3;

  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_entry = entry;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_shoff = sizeof(Elf64_Ehdr) + nseg * sizeof(Elf64_Phdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = static_cast<std::uint16_t>(nseg);
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = static_cast<std::uint16_t>(nsec);
  eh.e_shstrndx = static_cast<std::uint16_t>(shstrtab_index);
  put(&eh, sizeof eh);
  f.resize(eh.e_shoff + nsec * sizeof(Elf64_Shdr));  // headers, written below
  align(16);

  std::vector<Elf64_Phdr> ph(nseg);
  std::vector<Elf64_Shdr> sh(nsec);
  std::string shstr(1, '\0');
  // Section i: its header, and its bytes put at the end of the file.
  auto section = [&](std::size_t i, const std::string& name, std::uint32_t type, const void* p, std::size_t n,
                     std::uint64_t alignment) -> Elf64_Shdr& {
    Elf64_Shdr& x = sh[i];
    x.sh_name = static_cast<std::uint32_t>(shstr.size());
    shstr += name + '\0';
    x.sh_type = type;
    x.sh_offset = f.size();
    x.sh_size = n;
    x.sh_addralign = alignment;
    put(p, n);
    return x;
  };
  for (std::size_t i = 0; i < nseg; ++i) {
    const ElfSegment& s = segs[i];
    ph[i].p_type = PT_LOAD;
    ph[i].p_flags = s.flags;
    ph[i].p_offset = f.size();
    ph[i].p_vaddr = ph[i].p_paddr = s.vaddr;
    ph[i].p_filesz = s.bytes.size();
    ph[i].p_memsz = s.memsz ? s.memsz : s.bytes.size();
    ph[i].p_align = 16;
    Elf64_Shdr& x = section(i + 1, ".seg" + std::to_string(i), SHT_PROGBITS, s.bytes.data(), s.bytes.size(), 16);
    x.sh_flags = SHF_ALLOC | ((s.flags & PF_X) ? SHF_EXECINSTR : 0) | ((s.flags & PF_W) ? SHF_WRITE : 0);
    x.sh_addr = s.vaddr;
    align(16);
  }

  std::string str(1, '\0');
  std::vector<Elf64_Sym> st(1);  // symbol 0: the null symbol
  for (const ElfSymbol& s : syms) {
    Elf64_Sym e{};
    e.st_name = static_cast<std::uint32_t>(s.name.empty() ? 0 : str.size());
    if (!s.name.empty()) str += s.name + '\0';
    e.st_info = s.info;
    e.st_shndx = s.shndx;
    e.st_value = s.value;
    e.st_size = s.size;
    st.push_back(e);
  }
  out.symtab_offset = f.size();
  Elf64_Shdr& y = section(out.symtab_index, ".symtab", SHT_SYMTAB, st.data(), st.size() * sizeof(Elf64_Sym), 8);
  y.sh_link = static_cast<std::uint32_t>(out.strtab_index);
  y.sh_info = 1;
  y.sh_entsize = sizeof(Elf64_Sym);
  out.strtab_offset = f.size();
  section(out.strtab_index, ".strtab", SHT_STRTAB, str.data(), str.size(), 1);
  const std::size_t shstr_name = shstr.size();
  shstr += ".shstrtab";
  shstr += '\0';
  Elf64_Shdr& w = sh[shstrtab_index];  // names itself: its bytes are complete only now
  w.sh_name = static_cast<std::uint32_t>(shstr_name);
  w.sh_type = SHT_STRTAB;
  w.sh_offset = f.size();
  w.sh_size = shstr.size();
  w.sh_addralign = 1;
  put(shstr.data(), shstr.size());

  std::memcpy(f.data() + eh.e_phoff, ph.data(), nseg * sizeof(Elf64_Phdr));
  std::memcpy(f.data() + eh.e_shoff, sh.data(), nsec * sizeof(Elf64_Shdr));
  return out;
}

// A kernel-like image: text and data in the kernel mapping with a bss past the data's file
// bytes, and symbols of each kind (a duplicate name, a local, an undefined and a nameless one).
inline BuiltElf small_kernel_elf() {
  std::vector<std::uint8_t> text = {0x55, 0x48, 0x89, 0xe5, 0x90, 0x5d, 0xc3, 0xcc};
  std::vector<std::uint8_t> data = {1, 2, 3, 4};
  return build_elf(0xffffffff81000000ull,
                   {{0xffffffff81000000ull, text, 0, PF_R | PF_X}, {0xffffffff81200000ull, data, 0x1000, PF_R | PF_W}},
                   {{"_text", 0xffffffff81000000ull, 0, ELF64_ST_INFO(STB_GLOBAL, STT_NOTYPE), 1},
                    {"start_kernel", 0xffffffff81000000ull, 7, ELF64_ST_INFO(STB_GLOBAL, STT_FUNC), 1},
                    {"local_helper", 0xffffffff81000004ull, 3, ELF64_ST_INFO(STB_LOCAL, STT_FUNC), 1},
                    {"jiffies", 0xffffffff81200000ull, 4, ELF64_ST_INFO(STB_GLOBAL, STT_OBJECT), 2},
                    {"local_helper", 0xffffffff81000006ull, 1, ELF64_ST_INFO(STB_LOCAL, STT_FUNC), 1},
                    {"printk", 0, 0, ELF64_ST_INFO(STB_GLOBAL, STT_FUNC), SHN_UNDEF},
                    {"", 0xffffffff81000001ull, 0, ELF64_ST_INFO(STB_LOCAL, STT_NOTYPE), 1}});
}

}  // namespace xenprobes::testing
