// A reader for x86-64 ELF64 kernel images: PT_LOAD segments, sections and the symbol table,
// read with libelf (elfutils). The simulated Xen boots a guest kernel from one; the symbols
// layer takes a vmlinux as a guest kernel's symbols and image (symbols/kernel_image.hpp). The
// image is untrusted input (a user may point XENPROBES_SIM_GUEST or load_symbols at anything):
// libelf bounds-checks the headers, the section data and the strings; we check what it does
// not (a segment's file range, the entry sizes, the limits below, x86-64 ELF64 only). A file
// is mapped (ELF_C_READ_MMAP), not read: of a vmlinux with its debug information (hundreds of
// MiB) only the pages of its segments and symbols are touched. A file truncated by someone
// else while it is read can therefore end the process with SIGBUS (as any mmap reader).
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
  // Why symtab is empty although the image has section headers or a symbol table: they lie
  // outside the file, an entry size is wrong, the string table is not one, a limit is passed.
  // Empty when they were read, or when the image has neither (a stripped kernel).
  std::string symtab_error;
};

// Errors name the file (path, or what) and what is wrong with it, with libelf's message when
// libelf refused: InvalidArgument for a file that is no usable image, NotFound/Permission/Io
// when it cannot be opened.
Result<Image> load(const std::string& path);
Result<Image> parse(std::span<const std::uint8_t> file, const std::string& what);

}  // namespace xenprobes::elf
