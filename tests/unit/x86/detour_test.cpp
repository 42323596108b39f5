// Detours (x86/detour.hpp): the bytes for each kind of relocated instruction, written out by
// hand, and the detour run under Unicorn beside the original region: the same registers and
// memory at the region's end, and the entry called once with the probed instruction's stack.
#include <gtest/gtest.h>
#include <unicorn/unicorn.h>

#include <cstring>
#include <vector>

#include "x86/detour.hpp"

namespace xenprobes::x86 {
namespace {

constexpr std::uint64_t F = 0x400000;  // the function
constexpr std::uint64_t D = 0x500000;  // the detour
constexpr std::uint64_t E = 0x600000;  // the jump entry
constexpr std::uint64_t kStack = 0x708000;

JumpFunction fn(const std::vector<std::uint8_t>& bytes, const JumpContext& ctx) {
  auto r = JumpFunction::decode(bytes, Gva{F}, ctx);
  EXPECT_TRUE(r) << r.error().what;
  return r ? *r : JumpFunction{};
}

std::vector<std::uint8_t> le32(std::int64_t v) {
  const auto u = static_cast<std::uint32_t>(static_cast<std::int32_t>(v));
  return {static_cast<std::uint8_t>(u), static_cast<std::uint8_t>(u >> 8), static_cast<std::uint8_t>(u >> 16),
          static_cast<std::uint8_t>(u >> 24)};
}
std::vector<std::uint8_t> cat(std::initializer_list<std::vector<std::uint8_t>> parts) {
  std::vector<std::uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
// rel32 of an instruction of `len` bytes at `at` reaching `to`.
std::vector<std::uint8_t> rel(std::uint64_t at, std::size_t len, std::uint64_t to) {
  return le32(static_cast<std::int64_t>(to - (at + len)));
}

struct Built {
  JumpRegion region;
  DetourLayout layout;
  std::vector<std::uint8_t> bytes;
};

Built build(const JumpFunction& f, std::uint64_t point) {
  Built b;
  const JumpVerdict v = check_jump(f, Gva{point});
  EXPECT_TRUE(v.optimizable) << v.refusal.reason;
  b.region = v.region;
  std::vector<std::uint8_t> buf(kMaxDetourSize, 0xcc);
  auto l = emit_detour(buf, Gva{D}, f, v.region, Gva{point}, Gva{E});
  EXPECT_TRUE(l) << (l ? "" : l.error().what);
  if (!l) return b;
  b.layout = *l;
  b.bytes.assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(l->size));
  return b;
}

TEST(Detour, PlainRegionCallsTheEntryThenRunsTheCopiesThenJumpsBack) {
  //   F+0 48 89 e5  mov rbp, rsp
  //   F+3 31 c0     xor eax, eax      (region [F, F+5))
  //   F+5 c3        ret
  JumpContext ctx;
  JumpFunction f = fn({0x48, 0x89, 0xe5, 0x31, 0xc0, 0xc3}, ctx);
  Built b = build(f, F);
  EXPECT_EQ(b.region.length, 5);
  EXPECT_EQ(b.layout.call_offset, 0u);
  EXPECT_EQ(b.layout.resume_offset, 5u);
  EXPECT_EQ(b.bytes, cat({{0xe8}, rel(D, 5, E), {0x48, 0x89, 0xe5, 0x31, 0xc0}, {0xe9}, rel(D + 10, 5, F + 5)}));
}

TEST(Detour, AnEarlierStartCallsTheEntryBeforeTheProbedInstructionsCopy) {
  //   F+0 48 89 e5  mov rbp, rsp      (region [F, F+5) serves a probe at F+3)
  //   F+3 31 c0     xor eax, eax
  //   F+5 c3        ret
  // A branch elsewhere to F+5 makes the probe's own region [F+3, ...) impossible (it would
  // cross the function's end), so check_jump starts at F.
  JumpContext ctx;
  JumpFunction f = fn({0x48, 0x89, 0xe5, 0x31, 0xc0, 0xc3}, ctx);
  const JumpVerdict v = check_jump(f, Gva{F + 3});
  ASSERT_TRUE(v.optimizable);
  ASSERT_TRUE(v.starts_earlier);
  std::vector<std::uint8_t> buf(kMaxDetourSize);
  auto l = emit_detour(buf, Gva{D}, f, v.region, Gva{F + 3}, Gva{E});
  ASSERT_TRUE(l) << l.error().what;
  EXPECT_EQ(l->call_offset, 3u);
  EXPECT_EQ(l->resume_offset, 8u);
  // Where each instruction's copy is: the probed one's right after the call.
  EXPECT_EQ(l->copy_of(Gva{F}), std::optional<std::size_t>{0});
  EXPECT_EQ(l->copy_of(Gva{F + 3}), std::optional<std::size_t>{8});
  EXPECT_EQ(l->copy_of(Gva{F + 1}), std::nullopt);
  buf.resize(l->size);
  EXPECT_EQ(buf, cat({{0x48, 0x89, 0xe5}, {0xe8}, rel(D + 3, 5, E), {0x31, 0xc0}, {0xe9}, rel(D + 10, 5, F + 5)}));
}

TEST(Detour, RipRelativeOperandsAddressTheSameByte) {
  //   F+0 48 8b 05 10 00 00 00  mov rax, [rip + 0x10]   → F+7+0x10
  //   F+7 c3
  JumpContext ctx;
  JumpFunction f = fn({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3}, ctx);
  Built b = build(f, F);
  EXPECT_EQ(b.bytes,
            cat({{0xe8}, rel(D, 5, E), {0x48, 0x8b, 0x05}, rel(D + 5, 7, F + 0x17), {0xe9}, rel(D + 12, 5, F + 7)}));
}

TEST(Detour, ShortBranchesBecomeRel32FormsToTheSameTargets) {
  //   F+0 74 07     je  F+9
  //   F+2 75 05     jne F+9
  //   F+4 48 89 e5  mov rbp, rsp      (region [F, F+7))
  //   F+7 90 90     nop; nop
  //   F+9 c3
  JumpContext ctx;
  JumpFunction f = fn({0x74, 0x07, 0x75, 0x05, 0x48, 0x89, 0xe5, 0x90, 0x90, 0xc3}, ctx);
  Built b = build(f, F);
  EXPECT_EQ(b.region.length, 7);
  EXPECT_EQ(b.bytes, cat({{0xe8},
                          rel(D, 5, E),
                          {0x0f, 0x84},
                          rel(D + 5, 6, F + 9),
                          {0x0f, 0x85},
                          rel(D + 11, 6, F + 9),
                          {0x48, 0x89, 0xe5},
                          {0xe9},
                          rel(D + 20, 5, F + 7)}));
}

TEST(Detour, ACallPushesTheOriginalReturnAddressAndNeedsNoJumpBack) {
  //   F+0 31 c0            xor eax, eax
  //   F+2 e8 <F+0x20>      call F+0x20    (region [F, F+7): the call closes it)
  //   F+7 c3               ret
  //   ...
  //   F+0x20 c3
  std::vector<std::uint8_t> code = cat({{0x31, 0xc0, 0xe8}, rel(F + 2, 5, F + 0x20), {0xc3}});
  code.resize(0x20, 0xcc);
  code.push_back(0xc3);
  JumpContext ctx;
  JumpFunction f = fn(code, ctx);
  Built b = build(f, F);
  EXPECT_EQ(b.region.length, 7);
  EXPECT_EQ(b.bytes, cat({{0xe8}, rel(D, 5, E), {0x31, 0xc0}, {0x68}, le32(F + 7), {0xe9}, rel(D + 12, 5, F + 0x20)}));
}

TEST(Detour, AnIndirectCallBecomesPushAndAJumpThroughTheSameOperand) {
  //   F+0 48 89 c7   mov rdi, rax
  //   F+3 ff d0      call rax        (region [F, F+5))
  //   F+5 c3
  JumpContext ctx;
  JumpFunction f = fn({0x48, 0x89, 0xc7, 0xff, 0xd0, 0xc3}, ctx);
  Built b = build(f, F);
  EXPECT_EQ(b.bytes, cat({{0xe8}, rel(D, 5, E), {0x48, 0x89, 0xc7}, {0x68}, le32(F + 5), {0xff, 0xe0}}));
  //   F+0 ff 15 <disp32>   call [rip + 0x100]   → jmp [rip + ...] addressing F+6+0x100
  //   F+6 c3
  JumpFunction g = fn({0xff, 0x15, 0x00, 0x01, 0x00, 0x00, 0xc3}, ctx);
  Built c = build(g, F);
  EXPECT_EQ(c.bytes, cat({{0xe8}, rel(D, 5, E), {0x68}, le32(F + 6), {0xff, 0x25}, rel(D + 10, 6, F + 0x106)}));
}

TEST(Detour, FailuresWriteNothing) {
  JumpContext ctx;
  JumpFunction f = fn({0x48, 0x89, 0xe5, 0x31, 0xc0, 0xc3}, ctx);
  const JumpVerdict v = check_jump(f, Gva{F});
  ASSERT_TRUE(v.optimizable);
  std::vector<std::uint8_t> small(8, 0xaa);
  auto r = emit_detour(small, Gva{D}, f, v.region, Gva{F}, Gva{E});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NoSpace);
  EXPECT_EQ(small, std::vector<std::uint8_t>(8, 0xaa));
  std::vector<std::uint8_t> buf(kMaxDetourSize, 0xaa);
  r = emit_detour(buf, Gva{D}, f, v.region, Gva{F + 1}, Gva{E});  // no instruction starts there
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
  r = emit_detour(buf, Gva{D}, f, v.region, Gva{F}, Gva{D + (1ull << 32)});  // the entry out of reach
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Range);
  EXPECT_NE(r.error().what.find("jump entry"), std::string::npos) << r.error().what;
  EXPECT_EQ(buf, std::vector<std::uint8_t>(kMaxDetourSize, 0xaa));
}

// ---- run under Unicorn: the region at F as it is, and the jump to the detour in its place ----

struct Machine {
  uc_engine* uc = nullptr;
  Machine() {
    EXPECT_EQ(uc_open(UC_ARCH_X86, UC_MODE_64, &uc), UC_ERR_OK);
    for (std::uint64_t base : {F, D, E, std::uint64_t{0x700000}, std::uint64_t{0x800000}})
      EXPECT_EQ(uc_mem_map(uc, base, 0x10000, UC_PROT_ALL), UC_ERR_OK);
  }
  ~Machine() { uc_close(uc); }
  void write(std::uint64_t at, const std::vector<std::uint8_t>& b) {
    ASSERT_EQ(uc_mem_write(uc, at, b.data(), b.size()), UC_ERR_OK);
  }
  std::uint64_t reg(int r) {
    std::uint64_t v = 0;
    uc_reg_read(uc, r, &v);
    return v;
  }
  void set(int r, std::uint64_t v) { uc_reg_write(uc, r, &v); }
};

constexpr int kGprs[] = {UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDX, UC_X86_REG_RSI, UC_X86_REG_RDI,
                         UC_X86_REG_RBP, UC_X86_REG_RSP, UC_X86_REG_R8,  UC_X86_REG_R9,  UC_X86_REG_R10, UC_X86_REG_R11,
                         UC_X86_REG_R12, UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15};

struct Run {
  std::vector<std::uint64_t> regs;
  std::uint64_t rip = 0, flags = 0;
  std::vector<std::uint8_t> data;  // 0x800000.. (what the code writes)
  std::uint64_t entry_rsp = 0;     // rsp when the entry ran (0: never)
  unsigned entry_calls = 0;
};

// Runs `code` (the function at F, patched or not) from F until `stop` (or 200 instructions),
// with the detour at D and, at E, an entry that records its stack and returns.
Run run(const std::vector<std::uint8_t>& code, const std::vector<std::uint8_t>& detour, std::uint64_t stop,
        std::uint64_t rax) {
  Machine m;
  Run out;
  m.write(F, code);
  if (!detour.empty()) m.write(D, detour);
  m.write(E, {0xc3});  // ret
  m.write(0x800000, std::vector<std::uint8_t>(64, 0x5a));
  std::uint64_t v = 0x1000;
  for (int r : kGprs) m.set(r, v += 0x111);
  m.set(UC_X86_REG_RSP, kStack);
  m.set(UC_X86_REG_RAX, rax);
  m.set(UC_X86_REG_RDI, 0x800020);
  uc_hook h;
  struct Seen {
    Run* out;
  } seen{&out};
  uc_hook_add(m.uc, &h, UC_HOOK_CODE,
              reinterpret_cast<void*>(+[](uc_engine* uc, std::uint64_t, std::uint32_t, void* ud) {
                auto* s = static_cast<Seen*>(ud);
                std::uint64_t rsp = 0;
                uc_reg_read(uc, UC_X86_REG_RSP, &rsp);
                s->out->entry_rsp = rsp;
                ++s->out->entry_calls;
              }),
              &seen, E, E);
  EXPECT_EQ(uc_emu_start(m.uc, F, stop, 0, 200), UC_ERR_OK);
  for (int r : kGprs) out.regs.push_back(m.reg(r));
  out.rip = m.reg(UC_X86_REG_RIP);
  out.flags = m.reg(UC_X86_REG_EFLAGS) & 0x8d5;  // the arithmetic flags
  out.data.resize(64);
  uc_mem_read(m.uc, 0x800000, out.data.data(), out.data.size());
  return out;
}

// The region of `code` at F probed at `point`: the detour run equals the plain run at `stop`.
void same_as_unprobed(const std::vector<std::uint8_t>& code, std::uint64_t point, std::uint64_t stop,
                      std::uint64_t rax = 0x800010) {
  JumpContext ctx;
  JumpFunction f = fn(code, ctx);
  Built b = build(f, point);
  ASSERT_FALSE(b.bytes.empty());
  std::vector<std::uint8_t> patched = code;
  const std::uint64_t start = b.region.start.value - F;
  patched[start] = 0xe9;
  const auto r = rel(b.region.start.value, 5, D);
  std::copy(r.begin(), r.end(), patched.begin() + static_cast<std::ptrdiff_t>(start) + 1);
  const Run plain = run(code, {}, stop, rax);
  const Run probed = run(patched, b.bytes, stop, rax);
  EXPECT_EQ(probed.regs, plain.regs);
  EXPECT_EQ(probed.rip, plain.rip);
  EXPECT_EQ(probed.flags, plain.flags);
  EXPECT_EQ(probed.data, plain.data);
  EXPECT_EQ(plain.entry_calls, 0u);
  EXPECT_EQ(probed.entry_calls, 1u);
  // The entry sees the stack of the probed instruction, below the call's return address.
  const std::uint64_t rsp_at_point = point == F ? kStack : run(code, {}, point, rax).regs[7];
  EXPECT_EQ(probed.entry_rsp, rsp_at_point - 8);
}

TEST(DetourRun, ArithmeticAndStores) {
  //   F+0 48 89 38      mov [rax], rdi
  //   F+3 48 83 c7 05   add rdi, 5
  //   F+7 48 31 f8      xor rax, rdi
  //   F+a f4            (stop)
  same_as_unprobed({0x48, 0x89, 0x38, 0x48, 0x83, 0xc7, 0x05, 0x48, 0x31, 0xf8, 0xf4}, F, F + 0xa);
  same_as_unprobed({0x48, 0x89, 0x38, 0x48, 0x83, 0xc7, 0x05, 0x48, 0x31, 0xf8, 0xf4}, F + 3, F + 0xa);
}

TEST(DetourRun, ConditionalBranchTakenAndNot) {
  //   F+0 48 85 c0      test rax, rax
  //   F+3 74 06         je F+0xb          (region [F, F+5))
  //   F+5 48 ff c0      inc rax
  //   F+8 48 ff c7      inc rdi
  //   F+b 48 ff c6      inc rsi
  //   F+e 90            (stop)
  const std::vector<std::uint8_t> code = {0x48, 0x85, 0xc0, 0x74, 0x06, 0x48, 0xff, 0xc0,
                                          0x48, 0xff, 0xc7, 0x48, 0xff, 0xc6, 0x90};
  same_as_unprobed(code, F, F + 0xe, 0x800010);  // not taken
  same_as_unprobed(code, F, F + 0xe, 0);         // taken
}

TEST(DetourRun, ACallReturnsToTheOriginalTextAndSeesItsReturnAddress) {
  //   F+0    31 c0         xor eax, eax
  //   F+2    e8 <F+0x20>   call F+0x20      (region [F, F+7))
  //   F+7    90            (stop)
  //   F+0x20 48 8b 3c 24   mov rdi, [rsp]   (the callee reads its return address)
  //   F+0x24 c3
  std::vector<std::uint8_t> code = cat({{0x31, 0xc0, 0xe8}, rel(F + 2, 5, F + 0x20), {0x90}});
  code.resize(0x20, 0xcc);
  code.insert(code.end(), {0x48, 0x8b, 0x3c, 0x24, 0xc3});
  same_as_unprobed(code, F, F + 7);
}

TEST(DetourRun, RipRelativeLoadAndIndirectCall) {
  //   F+0    48 8b 05 19 00 00 00   mov rax, [rip + 0x19]   (F+0x20: the callee's address)
  //   F+7    ff d0                  call rax               (region [F, F+9))
  //   F+9    90                     (stop)
  //   F+0x20 <F+0x30 as a u64>
  //   F+0x30 48 ff c6; c3           inc rsi; ret
  std::vector<std::uint8_t> code = {0x48, 0x8b, 0x05, 0x19, 0x00, 0x00, 0x00, 0xff, 0xd0, 0x90};
  code.resize(0x20, 0xcc);
  const std::uint64_t callee = F + 0x30;
  for (int k = 0; k < 8; ++k) code.push_back(static_cast<std::uint8_t>(callee >> (8 * k)));
  code.resize(0x30, 0xcc);
  code.insert(code.end(), {0x48, 0xff, 0xc6, 0xc3});
  same_as_unprobed(code, F, F + 9);
}

}  // namespace
}  // namespace xenprobes::x86
