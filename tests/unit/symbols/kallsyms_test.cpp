// The kallsyms search on memory that holds no tables, or decoys: it ends, bounded, with an
// error that says what it saw. (Decoding real tables: tests/unit/kernel/guest_kernel_test.cpp
// on Debian's kernels, tests/engine/guest_symbols_test.cpp end to end on the simulated Xen.)
#include "symbols/kallsyms.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace xenprobes::symbols {
namespace {

constexpr std::uint64_t kBase = 0xffffffff81000000ull;
constexpr char kDigits[] =
    "0\0"
    "1\0"
    "2\0"
    "3\0"
    "4\0"
    "5\0"
    "6\0"
    "7\0"
    "8\0"
    "9";

struct Memory {
  std::vector<std::byte> bytes;
  std::size_t reads = 0;
  MemoryReadFn fn() {
    return [this](std::uint64_t a, std::span<std::byte> out) -> Result<void> {
      ++reads;
      if (a < kBase || a - kBase > bytes.size() || bytes.size() - (a - kBase) < out.size())
        return fail(Errc::Fault, "unmapped");
      std::memcpy(out.data(), bytes.data() + (a - kBase), out.size());
      return {};
    };
  }
};

TEST(Kallsyms, NoTablesIsNotFound) {
  Memory m;
  m.bytes.assign(1 << 20, std::byte{0x90});
  auto r = find_kallsyms(m.fn(), kBase, kBase + (64ull << 20));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NotFound);
  EXPECT_NE(r.error().what.find("no kallsyms token table"), std::string::npos) << r.error().what;
}

TEST(Kallsyms, UnmappedMemoryIsSkippedIn2MiBSteps) {
  Memory m;
  m.bytes.assign(4096, std::byte{0});
  // 256 MiB of which one page is mapped: one failed read per 2 MiB step, not per page.
  auto r = find_kallsyms(m.fn(), kBase - (128ull << 20), kBase + (128ull << 20));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NotFound);
  EXPECT_LT(m.reads, 400u);
}

TEST(Kallsyms, DecoysAreBounded) {
  Memory m;
  // Digit signatures every 64 bytes, with nothing around them that agrees.
  m.bytes.assign(1 << 20, std::byte{0x41});
  for (std::size_t off = 0; off + sizeof kDigits <= m.bytes.size(); off += 64)
    std::memcpy(m.bytes.data() + off, kDigits, sizeof kDigits);
  auto r = find_kallsyms(m.fn(), kBase, kBase + m.bytes.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
  EXPECT_NE(r.error().what.find("look-alikes"), std::string::npos) << r.error().what;
}

TEST(Kallsyms, SlideFromASymbolIsChecked) {
  auto t = SymbolTable::parse("ffffffff81000000 T _text\nffffffff81c00080 T entry_SYSCALL_64\n", "map");
  ASSERT_TRUE(t);
  auto s = slide_from_symbol(*t, "entry_SYSCALL_64", 0xffffffff81c00080ull + (6ull << 20));
  ASSERT_TRUE(s) << s.error().what;
  EXPECT_EQ(*s, 6ll << 20);
  EXPECT_EQ(t->resolve("_text")->value, 0xffffffff81600000ull);
  EXPECT_FALSE(slide_from_symbol(*t, "entry_SYSCALL_64", 0x400000));  // a user address
  EXPECT_FALSE(slide_from_symbol(*t, "missing", 0xffffffff81c00080ull));
}

}  // namespace
}  // namespace xenprobes::symbols
