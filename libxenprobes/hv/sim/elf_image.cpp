#include "hv/sim/elf_image.hpp"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>

namespace xenprobes::hv::sim {
namespace {

bool in_bounds(std::size_t file_size, std::uint64_t off, std::uint64_t len) {
  return off <= file_size && len <= file_size - off;
}

}  // namespace

Result<ElfImage> parse_elf(const std::vector<std::uint8_t>& f, const std::string& what) {
  Elf64_Ehdr eh;
  if (f.size() < sizeof eh) return fail(Errc::InvalidArgument, what + ": too small for an ELF header");
  std::memcpy(&eh, f.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64)
    return fail(Errc::InvalidArgument, what + ": not a little-endian x86-64 ELF64 image");
  if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
      !in_bounds(f.size(), eh.e_phoff, std::uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))
    return fail(Errc::InvalidArgument, what + ": program headers out of bounds");

  ElfImage img;
  img.entry = eh.e_entry;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, f.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
    if (ph.p_filesz > ph.p_memsz || !in_bounds(f.size(), ph.p_offset, ph.p_filesz))
      return fail(Errc::InvalidArgument, what + ": PT_LOAD segment out of bounds");
    if (ph.p_memsz > (1ull << 30)) return fail(Errc::InvalidArgument, what + ": PT_LOAD segment larger than 1 GiB");
    ElfSegment s;
    s.vaddr = ph.p_vaddr;
    s.memsz = ph.p_memsz;
    s.bytes.assign(f.begin() + static_cast<std::ptrdiff_t>(ph.p_offset),
                   f.begin() + static_cast<std::ptrdiff_t>(ph.p_offset + ph.p_filesz));
    s.writable = ph.p_flags & PF_W;
    s.executable = ph.p_flags & PF_X;
    img.segments.push_back(std::move(s));
  }
  if (img.segments.empty()) return fail(Errc::InvalidArgument, what + ": no PT_LOAD segments");

  // Symbols: optional (a stripped image still boots at e_entry).
  if (eh.e_shentsize == sizeof(Elf64_Shdr) &&
      in_bounds(f.size(), eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr))) {
    auto shdr = [&](unsigned i) {
      Elf64_Shdr sh;
      std::memcpy(&sh, f.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
      return sh;
    };
    for (unsigned i = 0; i < eh.e_shnum; ++i) {
      Elf64_Shdr sh = shdr(i);
      if (sh.sh_type != SHT_SYMTAB || sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh.e_shnum) continue;
      Elf64_Shdr str = shdr(sh.sh_link);
      if (!in_bounds(f.size(), sh.sh_offset, sh.sh_size) || !in_bounds(f.size(), str.sh_offset, str.sh_size)) continue;
      for (std::uint64_t off = 0; off + sizeof(Elf64_Sym) <= sh.sh_size; off += sizeof(Elf64_Sym)) {
        Elf64_Sym sym;
        std::memcpy(&sym, f.data() + sh.sh_offset + off, sizeof sym);
        if (sym.st_name == 0 || sym.st_name >= str.sh_size || sym.st_shndx == SHN_UNDEF) continue;
        const char* name = reinterpret_cast<const char*>(f.data() + str.sh_offset + sym.st_name);
        std::size_t maxlen = str.sh_size - sym.st_name;
        std::size_t len = strnlen(name, maxlen);
        if (len == maxlen) continue;  // not terminated inside the string table
        img.symbols.emplace(std::string(name, len), sym.st_value);
      }
    }
  }
  return img;
}

Result<ElfImage> load_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::NotFound, "cannot open guest image " + path);
  std::vector<std::uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_elf(data, path);
}

}  // namespace xenprobes::hv::sim
