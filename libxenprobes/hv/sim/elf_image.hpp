// A minimal reader for the guest kernel ELF the simulated Xen boots: PT_LOAD segments and
// the symbol table. The image is untrusted input (a user may point XENPROBES_SIM_GUEST at
// anything): every offset and size is bounds-checked.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"

namespace xenprobes::hv::sim {

struct ElfSegment {
  std::uint64_t vaddr = 0;
  std::uint64_t memsz = 0;
  std::vector<std::uint8_t> bytes;  // filesz bytes; the rest up to memsz is zero
  bool writable = false;
  bool executable = false;
};

struct ElfImage {
  std::uint64_t entry = 0;
  std::vector<ElfSegment> segments;
  std::unordered_map<std::string, std::uint64_t> symbols;
};

Result<ElfImage> load_elf(const std::string& path);
Result<ElfImage> parse_elf(const std::vector<std::uint8_t>& file, const std::string& what);

}  // namespace xenprobes::hv::sim
