// x86::relative_branches(), the jump index's lean decoder, against decode_function() +
// Insn::is_relative_branch(): the same failures and the same branches, instruction by
// instruction, over chosen encodings and random bytes. Every function of the demo guest and of
// Debian's 6.1 and 6.12 kernels: tests/unit/probe/jump_index_decode_test.cpp.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "x86/insn.hpp"

namespace xenprobes::x86 {
namespace {

constexpr Gva kBase{0xffffffff81000000};

// What the index used to take from decode_function(): nullopt when it fails.
std::optional<std::vector<RelativeBranch>> reference(std::span<const std::uint8_t> b, Gva at) {
  auto insns = decode_function(b, at);
  if (!insns) return std::nullopt;
  std::vector<RelativeBranch> out;
  for (const Insn& i : *insns)
    if (i.is_relative_branch()) out.push_back({i.address, i.branch_target});
  return out;
}

std::optional<std::vector<RelativeBranch>> lean(std::span<const std::uint8_t> b, Gva at) {
  std::vector<RelativeBranch> out{{Gva{1}, Gva{2}}};  // cleared first
  if (!relative_branches(b, at, out)) return std::nullopt;
  return out;
}

std::string show(const std::optional<std::vector<RelativeBranch>>& r) {
  if (!r) return "fails";
  std::string s;
  for (const RelativeBranch& b : *r) s += hex_addr(b.address.value) + "->" + hex_addr(b.target.value) + " ";
  return s.empty() ? "no branch" : s;
}

void expect_same(std::span<const std::uint8_t> b, Gva at, const std::string& what) {
  const auto want = reference(b, at), got = lean(b, at);
  EXPECT_EQ(show(got), show(want)) << what << ": [" << hex_bytes(b) << "]";
}

// Every kind classify() knows of a branch, and the refusals decode() makes.
TEST(RelativeBranches, ChosenEncodings) {
  const std::vector<std::pair<const char*, std::vector<std::uint8_t>>> cases = {
      {"call rel32", {0xe8, 0x10, 0x00, 0x00, 0x00}},
      {"jmp rel32", {0xe9, 0xf0, 0xff, 0xff, 0xff}},
      {"jmp rel8", {0xeb, 0xfe}},
      {"jcc rel8", {0x74, 0x02}},
      {"jcc rel32", {0x0f, 0x85, 0x00, 0x01, 0x00, 0x00}},
      {"loop", {0xe2, 0xfe}},
      {"loope", {0xe1, 0x00}},
      {"loopne", {0xe0, 0x00}},
      {"jrcxz", {0xe3, 0x05}},
      {"jecxz", {0x67, 0xe3, 0x05}},
      {"66 jmp rel16", {0x66, 0xe9, 0x10, 0x00}},
      {"66 call", {0x66, 0xe8, 0x10, 0x00, 0x00, 0x00}},
      {"bnd jmp", {0xf2, 0xe9, 0x00, 0x00, 0x00, 0x00}},
      {"jcc with a hint", {0x3e, 0x74, 0x02}},
      {"call [rip]", {0xff, 0x15, 0x00, 0x10, 0x00, 0x00}},
      {"jmp [rip]", {0xff, 0x25, 0x00, 0x10, 0x00, 0x00}},
      {"jmp rax", {0xff, 0xe0}},
      {"call r11", {0x41, 0xff, 0xd3}},
      {"lcall [rsp]", {0xff, 0x1c, 0x24}},
      {"ljmp [rsp]", {0xff, 0x2c, 0x24}},
      {"retf", {0xcb}},
      {"ret", {0xc3}},
      {"xbegin", {0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00}},
      {"mov rax, [rip]", {0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"mov word [rip], ax", {0x66, 0x89, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"addr32 rip", {0x67, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"lea with sib", {0x48, 0x8d, 0x04, 0x25, 0x00, 0x10, 0x00, 0x00}},
      {"ud2", {0x0f, 0x0b}},
      {"invalid in 64-bit mode", {0x06}},
      {"truncated call", {0xe8, 0x00, 0x00}},
      {"a branch after an invalid byte", {0x90, 0xeb, 0x00, 0x06}},
      {"nop5 then call", {0x0f, 0x1f, 0x44, 0x00, 0x00, 0xe8, 0x00, 0x00, 0x00, 0x00}},
      {"empty", {}},
  };
  for (const auto& [name, b] : cases) expect_same(b, kBase, name);
  // The classes that matter, said outright (reference() is only compared with).
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0xe2, 0xfe}, kBase)), "0xffffffff81000000->0xffffffff81000000 ");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0xff, 0x1c, 0x24}, kBase)), "no branch");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0xc7, 0xf8, 0, 0, 0, 0}, kBase)), "no branch");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0x90, 0x06}, kBase)), "fails");
}

// Random functions: most fail somewhere, the rest branch at random; each instruction is at
// most 15 bytes from a function's end, so truncation is exercised too.
TEST(RelativeBranches, RandomBytes) {
  std::mt19937_64 rng(0x4a756d70496e6478ull);  // fixed seed: failures reproduce
  std::size_t ok = 0, branches = 0;
  // Bytes that start branches, so that a run of random bytes has some.
  static constexpr std::uint8_t kBranchy[] = {0xe8, 0xe9, 0xeb, 0x74, 0x0f, 0xe2, 0xe3, 0xff, 0x66, 0x67, 0xc7};
  for (int n = 0; n < 20000; ++n) {
    std::vector<std::uint8_t> b(1 + rng() % 48);
    for (auto& x : b) x = rng() % 3 == 0 ? kBranchy[rng() % std::size(kBranchy)] : static_cast<std::uint8_t>(rng());
    const Gva at{kBase.value + (rng() & 0xfff)};
    const auto want = reference(b, at), got = lean(b, at);
    ASSERT_EQ(show(got), show(want)) << "[" << hex_bytes(b) << "] at " << hex_addr(at.value);
    if (want) ++ok, branches += want->size();
  }
  EXPECT_GT(ok, 1000u);
  EXPECT_GT(branches, 1000u);
}

}  // namespace
}  // namespace xenprobes::x86
