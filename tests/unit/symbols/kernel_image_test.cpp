// A vmlinux as a guest kernel's symbols and image (symbols/kernel_image.hpp): the demo guest's
// own ELF, and hostile files the ELF reader must refuse without reading past them.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "symbols/kernel_image.hpp"
#include "unit/common/elf_builder.hpp"

namespace xenprobes::symbols {
namespace {

// An image written by the test: its symbols with nm's letters, the undefined, nameless and
// non-allocated ones left out; the same image with a broken symbol table is refused, saying why.
TEST(KernelImage, ABuiltImageGivesItsSymbolsAndABrokenSymbolTableIsRefusedSayingWhy) {
  testing::BuiltElf b = testing::small_kernel_elf();
  auto img = elf::parse(b.bytes, "small.elf");
  ASSERT_TRUE(img) << img.error().what;
  auto k = KernelImage::from_elf(std::move(*img), "small.elf");
  ASSERT_TRUE(k) << k.error().what;
  auto letter = [&](const std::string& name) {
    auto l = k->symbols().lookup(name);
    return l ? l->front().type : '?';
  };
  EXPECT_EQ(letter("start_kernel"), 'T');
  EXPECT_EQ(letter("local_helper"), 't');
  EXPECT_EQ(letter("jiffies"), 'D');
  EXPECT_EQ(letter("printk"), '?');
  std::uint8_t byte = 0;
  ASSERT_TRUE(k->read(Gva{0xffffffff81200003ull}, std::as_writable_bytes(std::span(&byte, 1))));
  EXPECT_EQ(byte, 4);
  ASSERT_TRUE(k->read(Gva{0xffffffff81200800ull}, std::as_writable_bytes(std::span(&byte, 1))));
  EXPECT_EQ(byte, 0) << "the bss";

  b.edit_shdr(b.symtab_index, [](Elf64_Shdr& s) { s.sh_link = 1; });
  auto bad = elf::parse(b.bytes, "bad.elf");
  ASSERT_TRUE(bad) << bad.error().what;
  auto r = KernelImage::from_elf(std::move(*bad), "bad.elf");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().what,
            "bad.elf: no kernel symbols in its symbol table (the symbol table (section 3) names section 1 as its "
            "string table, which is of type 1, not SHT_STRTAB)");
}

#ifdef XENPROBES_DEMO_VMLINUX
std::vector<std::uint8_t> demo() {
  std::ifstream in(XENPROBES_DEMO_VMLINUX, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(KernelImage, TheDemoVmlinuxGivesTheSymbolsItsSystemMapListsAndItsBytes) {
  ASSERT_TRUE(is_elf_file(XENPROBES_DEMO_VMLINUX));
  auto k = KernelImage::load(XENPROBES_DEMO_VMLINUX);
  ASSERT_TRUE(k) << k.error().what;
  auto map = SymbolTable::load(XENPROBES_DEMO_SYSTEM_MAP);
  ASSERT_TRUE(map) << map.error().what;
  EXPECT_FALSE(is_elf_file(XENPROBES_DEMO_SYSTEM_MAP));
  // Every symbol of the System.map (nm -n, as Linux writes it), with its letter.
  for (const Symbol& s : map->matching("*")) {
    auto e = k->symbols().lookup(s.name);
    ASSERT_TRUE(e) << s.name;
    EXPECT_EQ(e->front().address, s.address) << s.name;
    EXPECT_EQ(e->front().type, s.type) << s.name;
  }
  EXPECT_EQ(k->symbols().size(), map->size());
  // Its bytes at link addresses.
  std::uint8_t b[4] = {};
  const Gva text = k->symbols().lookup("_text")->front().address;
  ASSERT_TRUE(k->read(text, std::as_writable_bytes(std::span(b))));
  auto f = demo();
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  Elf64_Phdr ph;
  std::memcpy(&ph, f.data() + eh.e_phoff, sizeof ph);  // the first PT_LOAD: the text
  EXPECT_EQ(std::memcmp(b, f.data() + ph.p_offset + (text.value - ph.p_vaddr), 4), 0);
  EXPECT_FALSE(k->read(Gva{0xffffffff80000000ull}, std::as_writable_bytes(std::span(b)))) << "in no segment";
}

TEST(KernelImage, HostileFilesAreRefusedWithoutReadingPastThem) {
  const auto f = demo();
  // Cut anywhere in the headers or the segments: refused (or, cut in the section headers only,
  // no symbols), never a read past the end.
  for (std::size_t n : {std::size_t{0}, std::size_t{16}, sizeof(Elf64_Ehdr), std::size_t{200}, f.size() / 2}) {
    auto e = elf::parse(std::span(f).first(n), "cut");
    if (e) { EXPECT_TRUE(e->symtab.empty()) << n; }
  }
  // A program header whose segment runs past the file.
  auto g = f;
  Elf64_Ehdr eh;
  std::memcpy(&eh, g.data(), sizeof eh);
  Elf64_Phdr ph;
  std::memcpy(&ph, g.data() + eh.e_phoff, sizeof ph);
  ph.p_filesz = g.size();
  ph.p_memsz = g.size();
  std::memcpy(g.data() + eh.e_phoff, &ph, sizeof ph);
  auto e = elf::parse(g, "long segment");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Errc::InvalidArgument);
  // A symbol table whose string table lies past the file: no symbols, so no kernel image.
  auto h = f;
  std::memcpy(&eh, h.data(), sizeof eh);
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, h.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_STRTAB) continue;
    sh.sh_offset = h.size() - 1;
    std::memcpy(h.data() + eh.e_shoff + i * sizeof sh, &sh, sizeof sh);
  }
  auto img = elf::parse(h, "bad strings");
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_TRUE(img->symtab.empty());
  auto k = KernelImage::from_elf(std::move(*img), "bad strings");
  ASSERT_FALSE(k);
  EXPECT_NE(k.error().what.find("no kernel symbols"), std::string::npos) << k.error().what;
}
#endif

}  // namespace
}  // namespace xenprobes::symbols
