// The ELF reader (common/elf_image.hpp, on libelf): images written by elf_builder.hpp, read
// from memory and from a file, and hostile ones, each refused with its reason.
#include "common/elf_image.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/hex.hpp"
#include "unit/common/elf_builder.hpp"

namespace xenprobes::elf {
namespace {

using testing::BuiltElf;
using testing::small_kernel_elf;

std::string err(const Result<Image>& r) { return r ? std::string("(accepted)") : r.error().what; }

// The refusal a hostile image must get: InvalidArgument, naming the file and the reason.
void expect_refused(const BuiltElf& b, const std::string& reason) {
  auto r = parse(b.bytes, "hostile.elf");
  ASSERT_FALSE(r) << "accepted; wanted: " << reason;
  EXPECT_EQ(r.error().code, Errc::InvalidArgument) << r.error().what;
  EXPECT_TRUE(r.error().what.starts_with("hostile.elf: ")) << r.error().what;
  EXPECT_NE(r.error().what.find(reason), std::string::npos) << r.error().what;
}

// An image read all the same, without sections or symbols, saying why.
void expect_no_symbols(const BuiltElf& b, const std::string& reason) {
  auto r = parse(b.bytes, "hostile.elf");
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->segments.size(), 2u);
  EXPECT_TRUE(r->symtab.empty());
  EXPECT_TRUE(r->symbols.empty());
  EXPECT_NE(r->symtab_error.find(reason), std::string::npos) << r->symtab_error;
}

class TempFile {
 public:
  explicit TempFile(const std::vector<std::uint8_t>& bytes)
      : path_(std::filesystem::temp_directory_path() / ("xp-elf-test-" + std::to_string(::getpid()))) {
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::filesystem::remove(path_); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

void expect_the_small_kernel(const Image& img) {
  EXPECT_EQ(img.entry, 0xffffffff81000000ull);
  ASSERT_EQ(img.segments.size(), 2u);
  const Segment& text = img.segments[0];
  EXPECT_EQ(text.vaddr, 0xffffffff81000000ull);
  EXPECT_EQ(text.memsz, 8u);
  EXPECT_EQ(text.bytes, (std::vector<std::uint8_t>{0x55, 0x48, 0x89, 0xe5, 0x90, 0x5d, 0xc3, 0xcc}));
  EXPECT_TRUE(text.executable);
  EXPECT_FALSE(text.writable);
  const Segment& data = img.segments[1];
  EXPECT_EQ(data.memsz, 0x1000u);  // its bss: past the file bytes, zero
  EXPECT_EQ(data.bytes, (std::vector<std::uint8_t>{1, 2, 3, 4}));
  EXPECT_TRUE(data.writable);
  EXPECT_FALSE(data.executable);
  ASSERT_EQ(img.sections.size(), 6u);
  EXPECT_EQ(img.sections[0].type, static_cast<std::uint32_t>(SHT_NULL));
  EXPECT_EQ(img.sections[1].type, static_cast<std::uint32_t>(SHT_PROGBITS));
  EXPECT_EQ(img.sections[1].flags, static_cast<std::uint64_t>(SHF_ALLOC | SHF_EXECINSTR));
  EXPECT_EQ(img.sections[1].addr, 0xffffffff81000000ull);
  EXPECT_EQ(img.sections[2].flags, static_cast<std::uint64_t>(SHF_ALLOC | SHF_WRITE));
  EXPECT_EQ(img.sections[3].type, static_cast<std::uint32_t>(SHT_SYMTAB));
  EXPECT_EQ(img.sections[4].type, static_cast<std::uint32_t>(SHT_STRTAB));
  // Defined, named symbols in file order: the undefined and the nameless one left out.
  std::vector<std::string> names;
  for (const Symbol& s : img.symtab) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"_text", "start_kernel", "local_helper", "jiffies", "local_helper"}));
  EXPECT_EQ(img.symtab[1].size, 7u);
  EXPECT_EQ(img.symtab[1].info, ELF64_ST_INFO(STB_GLOBAL, STT_FUNC));
  EXPECT_EQ(img.symtab[3].shndx, 2u);
  EXPECT_EQ(img.symbols.at("local_helper"), 0xffffffff81000004ull) << "the first of a name wins";
  EXPECT_EQ(img.symbols.at("jiffies"), 0xffffffff81200000ull);
  EXPECT_FALSE(img.symbols.contains("printk"));
  EXPECT_EQ(img.symbols.size(), 4u);
  EXPECT_EQ(img.symtab_error, "");
}

TEST(ElfImage, ReadsSegmentsSectionsAndSymbolsFromMemoryAndFromAFile) {
  const BuiltElf b = small_kernel_elf();
  auto m = parse(b.bytes, "small.elf");
  ASSERT_TRUE(m) << m.error().what;
  expect_the_small_kernel(*m);
  TempFile f(b.bytes);
  auto l = load(f.path());
  ASSERT_TRUE(l) << l.error().what;
  expect_the_small_kernel(*l);
}

// parse() hands libelf the caller's memory as a char*: it must not write into it.
TEST(ElfImage, ParsesAnImageInReadOnlyMemory) {
  const BuiltElf b = small_kernel_elf();
  void* p = ::mmap(nullptr, b.bytes.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memcpy(p, b.bytes.data(), b.bytes.size());
  ASSERT_EQ(::mprotect(p, b.bytes.size(), PROT_READ), 0);
  auto r = parse(std::span(static_cast<const std::uint8_t*>(p), b.bytes.size()), "read-only");
  ASSERT_TRUE(r) << r.error().what;
  expect_the_small_kernel(*r);
  ::munmap(p, b.bytes.size());
}

TEST(ElfImage, FilesThatAreNoImageAreRefusedNamingThePath) {
  auto gone = load("/nonexistent/vmlinux");
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, Errc::NotFound);
  EXPECT_NE(gone.error().what.find("/nonexistent/vmlinux"), std::string::npos) << gone.error().what;
  auto dir = load("/tmp");
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error().what, "/tmp: not a regular file");
  auto proc = load("/proc/self/status");  // no size
  ASSERT_FALSE(proc);
  EXPECT_EQ(proc.error().what, "/proc/self/status: too small for an ELF header");
  const std::vector<std::uint8_t> text(100, 'x');
  TempFile f(text);
  auto t = load(f.path());
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().what, f.path() + ": not an ELF file");
}

TEST(ElfImage, ATruncatedImageIsRefusedWhereverItIsCut) {
  const BuiltElf b = small_kernel_elf();
  const Elf64_Ehdr eh = b.ehdr();
  for (std::size_t n = 0; n < b.bytes.size(); ++n) {
    BuiltElf cut = b;
    cut.bytes.resize(n);
    auto r = parse(cut.bytes, "cut");
    const std::string why = err(r);
    if (n < sizeof(Elf64_Ehdr)) {
      EXPECT_EQ(why, "cut: too small for an ELF header") << n;
    } else if (n < eh.e_phoff + eh.e_phnum * sizeof(Elf64_Phdr)) {
      EXPECT_TRUE(why.starts_with("cut: program headers out of bounds")) << n << ": " << why;
    } else if (n < b.phdr(1).p_offset + b.phdr(1).p_filesz) {
      EXPECT_TRUE(why.starts_with("cut: PT_LOAD segment")) << n << ": " << why;
      EXPECT_NE(why.find("out of bounds"), std::string::npos) << n << ": " << why;
    } else if (n >= b.strtab_offset + b.shdr(b.strtab_index).sh_size) {
      // Cut in .shstrtab, which the reader does not need: all there.
      ASSERT_TRUE(r) << n << ": " << why;
      expect_the_small_kernel(*r);
    } else {
      // Cut in the symbol or string tables: the segments, and no symbols, saying why.
      ASSERT_TRUE(r) << n << ": " << why;
      EXPECT_TRUE(r->symtab.empty()) << n;
      EXPECT_TRUE(r->sections.empty()) << n;
      EXPECT_NE(r->symtab_error.find("unreadable (libelf: "), std::string::npos) << n << ": " << r->symtab_error;
    }
  }
}

TEST(ElfImage, OnlyLittleEndianX8664Elf64IsTaken) {
  expect_refused(small_kernel_elf().edit<std::uint8_t>(0, [](std::uint8_t& m) { m = 0x7e; }), "not an ELF file");
  expect_refused(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_ident[EI_CLASS] = ELFCLASS32; }),
                 "not a little-endian x86-64 ELF64 image (class 1, data 1)");
  expect_refused(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_ident[EI_DATA] = ELFDATA2MSB; }),
                 "not a little-endian x86-64 ELF64 image (class 2, data 2)");
  expect_refused(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_machine = EM_AARCH64; }),
                 "not a little-endian x86-64 ELF64 image (machine 183)");
}

TEST(ElfImage, ProgramHeadersAndSegmentsOutsideTheFileOrTheLimitsAreRefused) {
  const std::size_t size = small_kernel_elf().bytes.size();
  expect_refused(small_kernel_elf().edit_ehdr([&](Elf64_Ehdr& h) { h.e_phoff = size - 8; }),
                 "program headers out of bounds (2 at ");
  expect_refused(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_phentsize = 32; }),
                 "program headers out of bounds (entries of 32 bytes, not 56)");
  expect_refused(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_phnum = 0; }), "no PT_LOAD segments");

  // A segment's file range past the end, wrapping, or larger than its memory.
  for (const auto& [off, filesz, memsz] :
       {std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{0, 1u << 20, 1u << 20},
        {~0ull - 3, 8, 8},
        {64, 16, 8}}) {
    expect_refused(small_kernel_elf().edit_phdr(0,
                                                [&](Elf64_Phdr& p) {
                                                  p.p_offset = off;
                                                  p.p_filesz = filesz;
                                                  p.p_memsz = memsz;
                                                }),
                   "PT_LOAD segment 0 out of bounds");
  }
  // A huge segment: 2 GiB of memory from 4 bytes of the file.
  expect_refused(small_kernel_elf().edit_phdr(1, [](Elf64_Phdr& p) { p.p_memsz = std::uint64_t{2} << 30; }),
                 "PT_LOAD segment 1 larger than 1 GiB (0x80000000 bytes)");
  const BuiltElf limit = small_kernel_elf().edit_phdr(1, [](Elf64_Phdr& p) { p.p_memsz = kMaxSegmentBytes; });
  auto r = parse(limit.bytes, "limit");  // the limit itself is taken
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->segments[1].memsz, kMaxSegmentBytes);
  EXPECT_EQ(r->segments[1].bytes.size(), 4u);
}

TEST(ElfImage, UnusableSectionHeadersLeaveTheSegmentsAndSayWhy) {
  const std::size_t size = small_kernel_elf().bytes.size();
  const BuiltElf past = small_kernel_elf().edit_ehdr([&](Elf64_Ehdr& h) { h.e_shoff = size - 10; });
  expect_no_symbols(past, "the section headers at " + hex(size - 10) + " lie outside the file");
  expect_no_symbols(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_shoff = ~0ull - 100; }),  // wraps
                    "lie outside the file");
  expect_no_symbols(small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) { h.e_shentsize = 32; }),
                    "the section headers have entries of 32 bytes, not 64");
  // No section headers at all (a stripped image): no symbols, nothing wrong.
  const BuiltElf stripped = small_kernel_elf().edit_ehdr([](Elf64_Ehdr& h) {
    h.e_shoff = 0;
    h.e_shnum = 0;
    h.e_shstrndx = 0;
  });
  auto r = parse(stripped.bytes, "stripped");
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_TRUE(r->sections.empty());
  EXPECT_TRUE(r->symtab.empty());
  EXPECT_EQ(r->symtab_error, "");
}

TEST(ElfImage, ABrokenSymbolTableGivesNoSymbolsAndSaysWhy) {
  const BuiltElf small = small_kernel_elf();
  const std::size_t symtab = small.symtab_index, strtab = small.strtab_index;
  ASSERT_EQ(symtab, 3u);
  auto symtab_with = [&](auto f) { return small_kernel_elf().edit_shdr(symtab, f); };
  // Its string table is another kind of section (a segment's PROGBITS), none, or past the end.
  expect_no_symbols(
      symtab_with([](Elf64_Shdr& s) { s.sh_link = 1; }),
      "the symbol table (section 3) names section 1 as its string table, which is of type 1, not SHT_STRTAB");
  expect_no_symbols(symtab_with([](Elf64_Shdr& s) { s.sh_link = 0; }),
                    "names section 0 as its string table, which does not exist");
  expect_no_symbols(symtab_with([](Elf64_Shdr& s) { s.sh_link = 99; }),
                    "names section 99 as its string table, which does not exist");
  // Entries of another size; more than the limit; outside the file.
  expect_no_symbols(symtab_with([](Elf64_Shdr& s) { s.sh_entsize = 16; }), "has entries of 16 bytes, not 24");
  expect_no_symbols(symtab_with([](Elf64_Shdr& s) { s.sh_size = kMaxSymtabBytes + sizeof(Elf64_Sym); }),
                    "or its string table is larger than 256 MiB");
  expect_no_symbols(symtab_with([](Elf64_Shdr& s) { s.sh_offset = ~0ull - 8; }),
                    "the symbol table (section 3) is unreadable (libelf: ");
  expect_no_symbols(small_kernel_elf().edit_shdr(strtab, [&](Elf64_Shdr& s) { s.sh_offset = small.bytes.size() - 1; }),
                    "the symbol table (section 3): its string table is unreadable (libelf: ");
}

TEST(ElfImage, NamesOutsideTheStringTableOrUnterminatedAreLeftOut) {
  BuiltElf b = small_kernel_elf();
  // Symbol 1 (_text) names a string past the table.
  b.edit<Elf64_Sym>(b.sym_at(1), [](Elf64_Sym& s) { s.st_name = 10000; });
  // Symbol 5 (the second local_helper) names the table's last string, "printk", whose NUL
  // is overwritten: it runs off the table's end.
  const std::uint32_t printk = b.get<Elf64_Sym>(b.sym_at(6)).st_name;
  b.edit<Elf64_Sym>(b.sym_at(5), [&](Elf64_Sym& s) { s.st_name = printk; });
  const Elf64_Shdr str = b.shdr(b.strtab_index);
  ASSERT_EQ(std::string(reinterpret_cast<const char*>(b.bytes.data() + str.sh_offset + printk)), "printk");
  b.bytes[str.sh_offset + str.sh_size - 1] = 'X';
  auto r = parse(b.bytes, "strings");
  ASSERT_TRUE(r) << r.error().what;
  std::vector<std::string> names;
  for (const Symbol& y : r->symtab) names.push_back(y.name);
  EXPECT_EQ(names, (std::vector<std::string>{"start_kernel", "local_helper", "jiffies"}));
  EXPECT_EQ(r->symtab_error, "");
}

}  // namespace
}  // namespace xenprobes::elf
