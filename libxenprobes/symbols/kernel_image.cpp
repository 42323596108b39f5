#include "symbols/kernel_image.hpp"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/hex.hpp"

namespace xenprobes::symbols {

namespace {

// nm's letter for a symbol of the image, or 0 to leave it out (what postlink-style System.maps
// drop: absolute, undefined, section and file symbols, local labels).
char nm_letter(const elf::Image& img, const elf::Symbol& s) {
  const unsigned type = ELF64_ST_TYPE(s.info), bind = ELF64_ST_BIND(s.info);
  if (type == STT_SECTION || type == STT_FILE || s.shndx == SHN_ABS || s.shndx >= img.sections.size()) return 0;
  if (s.name.front() == '.' || s.name.front() == '$') return 0;
  const elf::Section& sec = img.sections[s.shndx];
  if (!(sec.flags & SHF_ALLOC)) return 0;
  char c = 'r';
  if (sec.flags & SHF_EXECINSTR) c = 't';
  else if (sec.type == SHT_NOBITS) c = 'b';
  else if (sec.flags & SHF_WRITE) c = 'd';
  if (bind == STB_WEAK) return c == 't' ? 'W' : 'V';
  return bind == STB_GLOBAL ? static_cast<char>(c - 'a' + 'A') : c;
}

}  // namespace

bool is_elf_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, ELFMAG, SELFMAG) == 0;
}

bool is_bzimage_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.seekg(0x202) && in.read(m, 4) && std::memcmp(m, "HdrS", 4) == 0;
}

Result<KernelImage> KernelImage::load(const std::filesystem::path& path) {
  auto img = XP_TRY(elf::load(path.string()));
  return from_elf(std::move(img), path.string());
}

Result<KernelImage> KernelImage::from_elf(elf::Image img, std::string source) {
  std::vector<const elf::Symbol*> order;
  for (const elf::Symbol& s : img.symtab) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->value < b->value; });
  std::string map;
  for (const elf::Symbol* s : order)
    if (char c = nm_letter(img, *s); c && s->name.size() < kMaxNameLen)
      map += hex(s->value).substr(2) + " " + c + " " + s->name + "\n";
  if (map.empty())
    return fail(Errc::InvalidArgument, source + ": no kernel symbols in its symbol table" +
                                           (img.symtab_error.empty() ? "" : " (" + img.symtab_error + ")"));
  KernelImage k;
  k.syms_ = XP_TRY(SymbolTable::parse(map, source));
  k.img_ = std::move(img);
  k.source_ = std::move(source);
  return k;
}

KernelImage KernelImage::with_symbols(elf::Image img, SymbolTable syms, std::string source) {
  KernelImage k;
  k.img_ = std::move(img);
  k.syms_ = std::move(syms);
  k.source_ = std::move(source);
  return k;
}

Result<std::int64_t> link_to_image(SymbolTable& syms, const elf::Image& img, const std::string& source) {
  std::uint64_t text = 0;
  for (const elf::Segment& s : img.segments)
    if (s.executable && s.vaddr >= kKernelImageStart && s.vaddr < kKernelImageEnd && (text == 0 || s.vaddr < text))
      text = s.vaddr;
  if (text == 0)
    return fail(Errc::InvalidArgument, source + ": no executable segment in the x86-64 kernel image window [" +
                                           hex(kKernelImageStart) + ", " + hex(kKernelImageEnd) + "): not a vmlinux");
  XP_TRY(syms.set_slide(0));
  auto moved = syms.slide_from_text(Gva{text});
  if (!moved)
    return fail(moved.error().code,
                source + " does not fit the symbols loaded before (" + syms.source() + "): " + moved.error().what);
  return *moved;
}

Result<void> KernelImage::read(Gva addr, std::span<std::byte> out) const {
  for (const elf::Segment& s : img_.segments) {
    if (s.vaddr < kKernelImageStart) continue;  // the per-CPU segment, linked at 0
    const std::uint64_t a = addr.value;
    if (a < s.vaddr || a - s.vaddr > s.memsz || s.memsz - (a - s.vaddr) < out.size()) continue;
    const std::uint64_t off = a - s.vaddr;
    std::memset(out.data(), 0, out.size());  // bss past filesz reads as zeros
    if (off < s.bytes.size())
      std::memcpy(out.data(), s.bytes.data() + off, std::min<std::uint64_t>(out.size(), s.bytes.size() - off));
    return {};
  }
  return fail(Errc::Fault, "not in the image " + source_ + ": " + hex(addr.value));
}

}  // namespace xenprobes::symbols
