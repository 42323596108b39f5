#include "common/elf_image.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/hex.hpp"

namespace xenprobes::elf {
namespace {

struct ElfEnd {
  void operator()(Elf* e) const { elf_end(e); }
};
using ElfPtr = std::unique_ptr<Elf, ElfEnd>;

struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// libelf's message for its last error ("invalid section header", ...).
std::string libelf_says() {
  const char* m = elf_errmsg(-1);
  return std::string(" (libelf: ") + (m ? m : "unknown error") + ")";
}

bool libelf_ready() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

// The identification bytes, checked on the raw bytes before libelf reads further, by both
// reads alike: libelf is handed only little-endian ELF64 (by parse(), the caller's memory).
Result<void> check_ident(const std::uint8_t* p, std::uint64_t size, const std::string& what) {
  if (size < sizeof(Elf64_Ehdr)) return fail(Errc::InvalidArgument, what + ": too small for an ELF header");
  if (std::memcmp(p, ELFMAG, SELFMAG) != 0) return fail(Errc::InvalidArgument, what + ": not an ELF file");
  if (p[EI_CLASS] != ELFCLASS64 || p[EI_DATA] != ELFDATA2LSB)
    return fail(Errc::InvalidArgument, what + ": not a little-endian x86-64 ELF64 image (class " +
                                           std::to_string(p[EI_CLASS]) + ", data " + std::to_string(p[EI_DATA]) + ")");
  return {};
}

// One SHT_SYMTAB section's defined, named symbols into img; "" or what is wrong with it.
std::string read_symtab(Elf* e, std::size_t index, const GElf_Shdr& sh, std::size_t shnum, Image& img) {
  const std::string which = "the symbol table (section " + std::to_string(index) + ")";
  if (sh.sh_entsize != sizeof(Elf64_Sym))
    return which + " has entries of " + std::to_string(sh.sh_entsize) + " bytes, not " +
           std::to_string(sizeof(Elf64_Sym));
  if (sh.sh_link == 0 || sh.sh_link >= shnum)
    return which + " names section " + std::to_string(sh.sh_link) + " as its string table, which does not exist";
  Elf_Scn* strscn = elf_getscn(e, sh.sh_link);
  GElf_Shdr str;
  if (!strscn || !gelf_getshdr(strscn, &str))
    return which + ": its string table's header is unreadable" + libelf_says();
  if (str.sh_type != SHT_STRTAB)
    return which + " names section " + std::to_string(sh.sh_link) + " as its string table, which is of type " +
           std::to_string(str.sh_type) + ", not SHT_STRTAB";
  if (sh.sh_size > kMaxSymtabBytes || str.sh_size > kMaxSymtabBytes)
    return which + " or its string table is larger than " + std::to_string(kMaxSymtabBytes >> 20) + " MiB";
  Elf_Data* syms = elf_getdata(elf_getscn(e, index), nullptr);
  if (!syms) return which + " is unreadable" + libelf_says();
  if (!elf_getdata(strscn, nullptr)) return which + ": its string table is unreadable" + libelf_says();
  const std::size_t n = syms->d_size / sizeof(Elf64_Sym);
  for (std::size_t k = 0; k < n; ++k) {
    GElf_Sym sym;
    if (!gelf_getsym(syms, static_cast<int>(k), &sym)) return which + ": symbol " + std::to_string(k) + libelf_says();
    if (sym.st_name == 0 || sym.st_shndx == SHN_UNDEF) continue;
    // Null past the table's end or with no terminator inside it: the symbol is left out.
    const char* name = elf_strptr(e, sh.sh_link, sym.st_name);
    if (!name || !*name) continue;
    img.symtab.push_back(
        Symbol{name, sym.st_value, sym.st_size, sym.st_info, static_cast<std::uint16_t>(sym.st_shndx)});
    img.symbols.emplace(img.symtab.back().name, sym.st_value);
  }
  return {};
}

// The section headers and the symbol tables; "" or what is wrong with them (Image::symtab_error:
// an image without usable sections still boots at e_entry).
std::string read_sections(Elf* e, const Elf64_Ehdr& eh, Image& img) {
  std::size_t shnum = 0;
  if (elf_getshdrnum(e, &shnum) != 0) return "the section headers are unreadable" + libelf_says();
  if (shnum == 0)  // libelf drops section headers that lie outside the file
    return eh.e_shoff == 0 ? "" : "the section headers at " + hex(eh.e_shoff) + " lie outside the file";
  if (eh.e_shentsize != sizeof(Elf64_Shdr))
    return "the section headers have entries of " + std::to_string(eh.e_shentsize) + " bytes, not " +
           std::to_string(sizeof(Elf64_Shdr));
  std::vector<GElf_Shdr> sh(shnum);
  for (std::size_t i = 0; i < shnum; ++i) {
    Elf_Scn* scn = elf_getscn(e, i);
    if (!scn || !gelf_getshdr(scn, &sh[i]))
      return "section header " + std::to_string(i) + " is unreadable" + libelf_says();
  }
  for (const GElf_Shdr& s : sh) img.sections.push_back(Section{s.sh_type, s.sh_flags, s.sh_addr, s.sh_size});
  for (std::size_t i = 0; i < shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    if (std::string why = read_symtab(e, i, sh[i], shnum, img); !why.empty()) {
      img.symtab.clear();
      img.symbols.clear();
      return why;
    }
  }
  return "";
}

Result<Image> read_image(Elf* e, const std::string& what) {
  std::size_t size = 0;
  const auto* raw = reinterpret_cast<const std::uint8_t*>(elf_rawfile(e, &size));
  if (!raw) return fail(Errc::Io, what + ": cannot read" + libelf_says());
  XP_TRY(check_ident(raw, size, what));  // first, as parse() does: the same message for a file
  if (elf_kind(e) != ELF_K_ELF) return fail(Errc::InvalidArgument, what + ": not an ELF file");
  const Elf64_Ehdr* eh = elf64_getehdr(e);
  if (!eh) return fail(Errc::InvalidArgument, what + ": unreadable ELF header" + libelf_says());
  if (eh->e_machine != EM_X86_64)
    return fail(Errc::InvalidArgument,
                what + ": not a little-endian x86-64 ELF64 image (machine " + std::to_string(eh->e_machine) + ")");
  // elf_getphdrnum() counts only the program headers inside the file; elf64_getphdr() wants
  // them all there.
  std::size_t phnum = 0;
  const bool libelf_failed = elf_getphdrnum(e, &phnum) != 0 || (phnum != 0 && !elf64_getphdr(e));
  if (libelf_failed || (eh->e_phnum != PN_XNUM && phnum != eh->e_phnum))
    return fail(Errc::InvalidArgument, what + ": program headers out of bounds (" + std::to_string(eh->e_phnum) +
                                           " at " + hex(eh->e_phoff) + ", file size " + hex(size) + ")" +
                                           (libelf_failed ? libelf_says() : ""));
  if (phnum != 0 && eh->e_phentsize != sizeof(Elf64_Phdr))
    return fail(Errc::InvalidArgument, what + ": program headers out of bounds (entries of " +
                                           std::to_string(eh->e_phentsize) + " bytes, not " +
                                           std::to_string(sizeof(Elf64_Phdr)) + ")");

  Image img;
  img.entry = eh->e_entry;
  for (std::size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(e, static_cast<int>(i), &ph))
      return fail(Errc::InvalidArgument, what + ": program headers out of bounds" + libelf_says());
    if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
    if (ph.p_filesz > ph.p_memsz || ph.p_offset > size || ph.p_filesz > size - ph.p_offset)
      return fail(Errc::InvalidArgument,
                  what + ": PT_LOAD segment " + std::to_string(i) + " out of bounds (file bytes " + hex(ph.p_offset) +
                      " + " + hex(ph.p_filesz) + ", memory size " + hex(ph.p_memsz) + ", file size " + hex(size) + ")");
    if (ph.p_memsz > kMaxSegmentBytes)
      return fail(Errc::InvalidArgument, what + ": PT_LOAD segment " + std::to_string(i) + " larger than 1 GiB (" +
                                             hex(ph.p_memsz) + " bytes)");
    Segment s;
    s.vaddr = ph.p_vaddr;
    s.memsz = ph.p_memsz;
    s.bytes.assign(raw + ph.p_offset, raw + ph.p_offset + ph.p_filesz);
    s.writable = ph.p_flags & PF_W;
    s.executable = ph.p_flags & PF_X;
    img.segments.push_back(std::move(s));
  }
  if (img.segments.empty()) return fail(Errc::InvalidArgument, what + ": no PT_LOAD segments");

  img.symtab_error = read_sections(e, *eh, img);
  if (!img.symtab_error.empty()) img.sections.clear();
  return img;
}

Result<void> need_libelf(const std::string& what) {
  if (!libelf_ready()) return fail(Errc::NotSupported, what + ": libelf refuses its ELF version" + libelf_says());
  elf_errno();  // forget an earlier error: libelf_says() names this image's
  return {};
}

}  // namespace

Result<Image> parse(std::span<const std::uint8_t> file, const std::string& what) {
  XP_TRY(need_libelf(what));
  XP_TRY(check_ident(file.data(), file.size(), what));
  // libelf takes a char* but writes nothing into it (ElfImage.ParsesAnImageInReadOnlyMemory).
  ElfPtr e(elf_memory(reinterpret_cast<char*>(const_cast<std::uint8_t*>(file.data())), file.size()));
  if (!e) return fail(Errc::InvalidArgument, what + ": libelf cannot open it" + libelf_says());
  return read_image(e.get(), what);
}

Result<Image> load(const std::string& path) {
  XP_TRY(need_libelf(path));
  const Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return fail_errno(errno, "cannot open " + path);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fail_errno(errno, "cannot stat " + path);
  if (!S_ISREG(st.st_mode)) return fail(Errc::InvalidArgument, path + ": not a regular file");
  // A /proc file has no size: nothing to map.
  if (static_cast<std::uint64_t>(st.st_size) < sizeof(Elf64_Ehdr))
    return fail(Errc::InvalidArgument, path + ": too small for an ELF header");
  ElfPtr e(elf_begin(f.fd, ELF_C_READ_MMAP, nullptr));
  if (!e) return fail(Errc::InvalidArgument, path + ": libelf cannot open it" + libelf_says());
  return read_image(e.get(), path);
}

}  // namespace xenprobes::elf
