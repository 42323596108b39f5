// The demo guest's vmlinux with one more PT_LOAD segment (guest data a test lays out: module
// lists, BTF, struct modules), for the simulated Xen to boot in place of the demo image.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xenprobes::testing {

// `vmlinux` read whole, `seg` appended at the next page as a segment at `vaddr` (its physical
// address in the kernel image's map) with `flags` (PF_R, PF_W, ...).
inline std::vector<char> demo_image_with_segment(const std::string& vmlinux, std::uint64_t vaddr,
                                                 std::span<const std::uint8_t> seg, std::uint32_t flags) {
  std::ifstream in(vmlinux, std::ios::binary);
  std::vector<char> f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (f.size() < sizeof(Elf64_Ehdr)) throw std::runtime_error("cannot read " + vmlinux);
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  const std::size_t new_ph = eh.e_phoff + eh.e_phnum * sizeof(Elf64_Phdr);
  for (unsigned i = 0; i < eh.e_phnum; ++i) {  // the new program header must not cover any data
    Elf64_Phdr ph;
    std::memcpy(&ph, f.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_filesz && ph.p_offset < new_ph + sizeof(Elf64_Phdr))
      throw std::runtime_error(vmlinux + ": no room for one more program header");
  }
  f.resize((f.size() + 4095) & ~std::size_t{4095});
  Elf64_Phdr ph{};
  ph.p_type = PT_LOAD;
  ph.p_flags = flags;
  ph.p_offset = f.size();
  ph.p_vaddr = vaddr;
  ph.p_paddr = vaddr - 0xffffffff80000000ull;
  ph.p_filesz = ph.p_memsz = seg.size();
  ph.p_align = 4096;
  std::memcpy(f.data() + new_ph, &ph, sizeof ph);
  ++eh.e_phnum;
  std::memcpy(f.data(), &eh, sizeof eh);
  f.insert(f.end(), seg.begin(), seg.end());
  return f;
}

}  // namespace xenprobes::testing
