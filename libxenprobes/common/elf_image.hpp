// A reader for x86-64 ELF64 kernel images: PT_LOAD segments, sections and the symbol table.
// The simulated Xen boots a guest kernel from one; the symbols layer takes a vmlinux as a
// guest kernel's symbols and image (symbols/kernel_image.hpp). The image is untrusted input (a
// user may point XENPROBES_SIM_GUEST or load_symbols at anything): every offset and size is
// bounds-checked, and a file is read piece by piece (a vmlinux with its debug information is
// hundreds of MiB; only its segments and symbols are read).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"

namespace xenprobes::elf {

inline constexpr std::uint64_t kMaxSegmentBytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t kMaxSymtabBytes = std::uint64_t{256} << 20;

struct Segment {
  std::uint64_t vaddr = 0;
  std::uint64_t memsz = 0;
  std::vector<std::uint8_t> bytes;  // filesz bytes; the rest up to memsz is zero
  bool writable = false;
  bool executable = false;
};

struct Section {
  std::uint32_t type = 0;   // SHT_*
  std::uint64_t flags = 0;  // SHF_*
  std::uint64_t addr = 0, size = 0;
};

struct Symbol {
  std::string name;
  std::uint64_t value = 0, size = 0;
  std::uint8_t info = 0;    // ELF64_ST_BIND << 4 | ELF64_ST_TYPE
  std::uint16_t shndx = 0;  // its section (an index into Image::sections), or SHN_ABS
};

struct Image {
  std::uint64_t entry = 0;
  std::vector<Segment> segments;
  std::vector<Section> sections;                           // by index; empty when the section headers are unusable
  std::vector<Symbol> symtab;                              // every defined, named symbol of .symtab, in file order
  std::unordered_map<std::string, std::uint64_t> symbols;  // name -> value (the first of a name)
};

Result<Image> load(const std::string& path);
Result<Image> parse(std::span<const std::uint8_t> file, const std::string& what);

}  // namespace xenprobes::elf
