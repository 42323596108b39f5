#include "common/elf_image.hpp"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <functional>

namespace xenprobes::elf {
namespace {

// The file, as a size and a reader of [off, off + len) that checks both against the size.
struct Source {
  std::uint64_t size = 0;
  std::function<bool(std::uint64_t off, std::uint64_t len, std::uint8_t* out)> read_at;
  bool in_bounds(std::uint64_t off, std::uint64_t len) const { return off <= size && len <= size - off; }
  bool read(std::uint64_t off, std::uint64_t len, void* out) const {
    return in_bounds(off, len) && read_at(off, len, static_cast<std::uint8_t*>(out));
  }
};

Result<Image> parse_source(const Source& f, const std::string& what) {
  Elf64_Ehdr eh;
  if (!f.read(0, sizeof eh, &eh)) return fail(Errc::InvalidArgument, what + ": too small for an ELF header");
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64)
    return fail(Errc::InvalidArgument, what + ": not a little-endian x86-64 ELF64 image");
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || !f.in_bounds(eh.e_phoff, std::uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))
    return fail(Errc::InvalidArgument, what + ": program headers out of bounds");

  Image img;
  img.entry = eh.e_entry;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (!f.read(eh.e_phoff + i * sizeof ph, sizeof ph, &ph)) return fail(Errc::Io, what + ": cannot read");
    if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
    if (ph.p_filesz > ph.p_memsz || !f.in_bounds(ph.p_offset, ph.p_filesz))
      return fail(Errc::InvalidArgument, what + ": PT_LOAD segment out of bounds");
    if (ph.p_memsz > kMaxSegmentBytes) return fail(Errc::InvalidArgument, what + ": PT_LOAD segment larger than 1 GiB");
    Segment s;
    s.vaddr = ph.p_vaddr;
    s.memsz = ph.p_memsz;
    s.bytes.resize(ph.p_filesz);
    if (!f.read(ph.p_offset, ph.p_filesz, s.bytes.data())) return fail(Errc::Io, what + ": cannot read a segment");
    s.writable = ph.p_flags & PF_W;
    s.executable = ph.p_flags & PF_X;
    img.segments.push_back(std::move(s));
  }
  if (img.segments.empty()) return fail(Errc::InvalidArgument, what + ": no PT_LOAD segments");

  // Sections and symbols: optional (a stripped image still boots at e_entry).
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || !f.in_bounds(eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)))
    return img;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!f.read(eh.e_shoff, sh.size() * sizeof(Elf64_Shdr), sh.data())) return img;
  for (const Elf64_Shdr& s : sh) img.sections.push_back(Section{s.sh_type, s.sh_flags, s.sh_addr, s.sh_size});
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type != SHT_SYMTAB || s.sh_entsize != sizeof(Elf64_Sym) || s.sh_link >= sh.size()) continue;
    const Elf64_Shdr& str = sh[s.sh_link];
    if (s.sh_size > kMaxSymtabBytes || str.sh_size > kMaxSymtabBytes || !f.in_bounds(s.sh_offset, s.sh_size) ||
        !f.in_bounds(str.sh_offset, str.sh_size))
      continue;
    std::vector<Elf64_Sym> syms(s.sh_size / sizeof(Elf64_Sym));
    std::vector<char> strs(str.sh_size);
    if (!f.read(s.sh_offset, syms.size() * sizeof(Elf64_Sym), syms.data()) ||
        !f.read(str.sh_offset, strs.size(), strs.data()))
      continue;
    for (const Elf64_Sym& sym : syms) {
      if (sym.st_name == 0 || sym.st_name >= strs.size() || sym.st_shndx == SHN_UNDEF) continue;
      const char* name = strs.data() + sym.st_name;
      const std::size_t maxlen = strs.size() - sym.st_name;
      const std::size_t len = strnlen(name, maxlen);
      if (len == maxlen || len == 0) continue;  // not terminated inside the string table
      img.symtab.push_back(Symbol{std::string(name, len), sym.st_value, sym.st_size, sym.st_info, sym.st_shndx});
      img.symbols.emplace(img.symtab.back().name, sym.st_value);
    }
  }
  return img;
}

}  // namespace

Result<Image> parse(std::span<const std::uint8_t> file, const std::string& what) {
  Source s;
  s.size = file.size();
  s.read_at = [file](std::uint64_t off, std::uint64_t len, std::uint8_t* out) {
    std::memcpy(out, file.data() + off, len);
    return true;
  };
  return parse_source(s, what);
}

Result<Image> load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::NotFound, "cannot open " + path);
  Source s;
  in.seekg(0, std::ios::end);
  const std::streamoff end = in ? static_cast<std::streamoff>(in.tellg()) : -1;
  s.size = end > 0 ? static_cast<std::uint64_t>(end) : 0;  // no size (a /proc file): nothing to read
  s.read_at = [&in](std::uint64_t off, std::uint64_t len, std::uint8_t* out) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(off));
    in.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(len));
    return in.good() || (in.eof() && static_cast<std::uint64_t>(in.gcount()) == len);
  };
  return parse_source(s, path);
}

}  // namespace xenprobes::elf
