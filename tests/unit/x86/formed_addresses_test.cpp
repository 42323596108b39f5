// x86::formed_addresses(), the tail-call proof's lean decoder, against decode_function() +
// materialized_addresses(): the same failures and the same addresses, instruction by
// instruction, over chosen encodings and random bytes. Every function of the demo guest and of
// Debian's 6.1 and 6.12 kernels: tests/unit/probe/addresses_taken_test.cpp.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"

namespace xenprobes::x86 {
namespace {

constexpr Gva kBase{0xffffffff81000000};

// What addresses_taken() used to take from decode_function(): nullopt when it fails.
std::optional<std::vector<FormedAddress>> reference(std::span<const std::uint8_t> b, Gva at) {
  auto insns = decode_function(b, at);
  if (!insns) return std::nullopt;
  std::vector<FormedAddress> out;
  for (const Insn& i : *insns)
    for (std::uint64_t a : materialized_addresses(i)) out.push_back({i.address, a});
  return out;
}

std::optional<std::vector<FormedAddress>> lean(std::span<const std::uint8_t> b, Gva at) {
  std::vector<FormedAddress> out{{Gva{1}, 2}};  // cleared first
  if (!formed_addresses(b, at, out)) return std::nullopt;
  return out;
}

std::string show(const std::optional<std::vector<FormedAddress>>& r) {
  if (!r) return "fails";
  std::string s;
  for (const FormedAddress& a : *r) s += hex_addr(a.by.value) + ":" + hex_addr(a.value) + " ";
  return s.empty() ? "none" : s;
}

// Operands that form addresses and those that do not, and the refusals decode() makes.
TEST(FormedAddresses, ChosenEncodings) {
  const std::vector<std::pair<const char*, std::vector<std::uint8_t>>> cases = {
      {"lea rax, [rip]", {0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"mov rax, [rip] (negative)", {0x48, 0x8b, 0x05, 0xf0, 0xff, 0xff, 0xff}},
      {"mov word [rip], ax", {0x66, 0x89, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"addr32 mov eax, [eip]", {0x67, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"mov dword [rip], imm32", {0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x81}},
      {"mov qword [rip], imm32", {0x48, 0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x81}},
      {"lea with sib, no base", {0x48, 0x8d, 0x04, 0x25, 0x00, 0x10, 0x00, 0x81}},
      {"jmp [rax*8 + table]", {0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x81}},
      {"mov rax, [rbx + disp32]", {0x48, 0x8b, 0x83, 0x00, 0x10, 0x00, 0x00}},
      {"mov rax, [rbx + disp8]", {0x48, 0x8b, 0x43, 0x10}},
      {"movabs rax, imm64", {0x48, 0xb8, 0x10, 0x00, 0x00, 0x81, 0xff, 0xff, 0xff, 0xff}},
      {"movabs rax, [moffs64]", {0x48, 0xa1, 0x10, 0x00, 0x00, 0x81, 0xff, 0xff, 0xff, 0xff}},
      {"mov rax, simm32", {0x48, 0xc7, 0xc0, 0x10, 0x00, 0x00, 0x81}},
      {"mov eax, imm32", {0xb8, 0x10, 0x00, 0x00, 0x81}},
      {"push imm32", {0x68, 0x10, 0x00, 0x00, 0x81}},
      {"push imm8", {0x6a, 0x10}},
      {"add rax, imm8", {0x48, 0x83, 0xc0, 0x10}},
      {"mov ax, imm16", {0x66, 0xb8, 0x10, 0x00}},
      {"cmp qword [rip], imm8", {0x48, 0x83, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x01}},
      {"call rel32", {0xe8, 0x10, 0x00, 0x00, 0x00}},
      {"jmp rel32", {0xe9, 0xf0, 0xff, 0xff, 0xff}},
      {"jcc rel32", {0x0f, 0x85, 0x00, 0x01, 0x00, 0x00}},
      {"xbegin", {0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00}},
      {"call [rip]", {0xff, 0x15, 0x00, 0x10, 0x00, 0x00}},
      {"lcall [rip]", {0xff, 0x1d, 0x00, 0x10, 0x00, 0x00}},
      {"enter imm16, imm8", {0xc8, 0x10, 0x00, 0x01}},
      {"nop5 then lea", {0x0f, 0x1f, 0x44, 0x00, 0x00, 0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00}},
      {"invalid in 64-bit mode", {0x06}},
      {"truncated lea", {0x48, 0x8d, 0x05, 0x10}},
      {"an address before an invalid byte", {0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00, 0x06}},
      {"empty", {}},
  };
  for (const auto& [name, b] : cases) EXPECT_EQ(show(lean(b, kBase)), show(reference(b, kBase))) << name;
  // The classes that matter, said outright (reference() is only compared with).
  const std::vector<std::uint8_t> lea{0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00};
  EXPECT_EQ(show(lean(lea, kBase)), "0xffffffff81000000:0xffffffff81000017 ");
  const std::vector<std::uint8_t> both{0x48, 0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x81};
  EXPECT_EQ(show(lean(both, kBase)), "0xffffffff81000000:0xffffffff8100001b 0xffffffff81000000:0xffffffff81000010 ");
  const std::vector<std::uint8_t> sib{0x48, 0x8d, 0x04, 0x25, 0x00, 0x10, 0x00, 0x81};
  EXPECT_EQ(show(lean(sib, kBase)), "0xffffffff81000000:0xffffffff81001000 ");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0xe8, 0x10, 0, 0, 0}, kBase)), "none");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0xc7, 0xf8, 0, 0, 0, 0}, kBase)), "none");
  EXPECT_EQ(show(lean(std::vector<std::uint8_t>{0x48, 0x8d, 0x05, 0x10, 0, 0, 0, 0x06}, kBase)), "fails");
}

// Random functions: most fail somewhere, the rest form addresses at random; each instruction
// is at most 15 bytes from a function's end, so truncation is exercised too.
TEST(FormedAddresses, RandomBytes) {
  std::mt19937_64 rng(0x466f726d65644164ull);  // fixed seed: failures reproduce
  std::size_t ok = 0, formed = 0;
  // Bytes that start operands with addresses, so that a run of random bytes has some.
  static constexpr std::uint8_t kAddressy[] = {0x48, 0x8d, 0x8b, 0x05, 0x25, 0x04, 0xc7, 0xb8,
                                               0x68, 0xa1, 0x66, 0x67, 0xff, 0xe8, 0x81};
  for (int n = 0; n < 20000; ++n) {
    std::vector<std::uint8_t> b(1 + rng() % 48);
    for (auto& x : b) x = rng() % 3 == 0 ? kAddressy[rng() % std::size(kAddressy)] : static_cast<std::uint8_t>(rng());
    const Gva at{kBase.value + (rng() & 0xfff)};
    const auto want = reference(b, at), got = lean(b, at);
    ASSERT_EQ(show(got), show(want)) << "[" << hex_bytes(b) << "] at " << hex_addr(at.value);
    if (want) ++ok, formed += want->size();
  }
  EXPECT_GT(ok, 1000u);
  EXPECT_GT(formed, 1000u);
}

}  // namespace
}  // namespace xenprobes::x86
