// Writes the seeds of the elf_image fuzz target (tests/fuzz/corpus/elf_image/): the small
// kernel image of the ELF reader's unit tests (tests/unit/common/elf_builder.hpp), whole and
// broken the ways those tests break it. Not built by the project; run once by hand:
//   g++ -std=c++20 -Itests tests/fuzz/make_elf_image_seeds.cpp -o /tmp/seedgen
//   /tmp/seedgen tests/fuzz/corpus/elf_image
#include <fstream>
#include <string>

#include "unit/common/elf_builder.hpp"

using xenprobes::testing::BuiltElf;
using xenprobes::testing::small_kernel_elf;

namespace {

void put(const std::string& dir, const std::string& name, const BuiltElf& b) {
  std::ofstream(dir + "/" + name, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.bytes.data()), static_cast<std::streamsize>(b.bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  put(dir, "small_kernel", small_kernel_elf());

  put(dir, "stripped", small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) {  // no section headers
    h.e_shoff = 0;
    h.e_shnum = 0;
    h.e_shstrndx = 0;
  }));
  BuiltElf b = small_kernel_elf();  // the symbol table's string table is a PROGBITS section
  put(dir, "symtab_link_progbits", b.edit_shdr(b.symtab_index, [](Elf64_Shdr& s) { s.sh_link = 1; }));
  b = small_kernel_elf();  // cut inside the symbol table
  b.bytes.resize(b.symtab_offset + 40);
  put(dir, "cut_in_symtab", b);
  return 0;
}
