// The address rules over a loaded module's text (kernel/address_rules.cpp): a live module's
// text is kernel text with its own tables applying; lock prefixes, .kprobes.text and the
// blacklist, and modules going, in init, unknown or unreadable (the fake guest:
// unit/kernel/module_walk.hpp).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "kernel/address_rules.hpp"
#include "kernel/modules.hpp"
#include "unit/kernel/fake_kernel.hpp"
#include "unit/kernel/module_walk.hpp"

namespace xenprobes::testing {
namespace {

// ---- the address rules over module text

x86::Insn insn(std::uint64_t at, std::vector<std::uint8_t> bytes) {
  auto i = x86::decode(bytes, Gva{at});
  if (!i) throw std::runtime_error(i.error().what);
  return *i;
}

// A kernel with one live module "ext4" whose tables hold one entry of each kind, a GOING
// module, and a NOKPROBE range and .kprobes.text inside ext4.
struct ModuleRules : Walk {
  static constexpr std::uint64_t kFn = kMod + 0x100;       // ext4_fn, 0x100 bytes
  static constexpr std::uint64_t kCopy = kFn + 0x20;       // ext4's __ex_table instruction
  static constexpr std::uint64_t kJump = kFn + 0x40;       // ext4's jump-label site
  static constexpr std::uint64_t kCall = kFn + 0x60;       // ext4's static-call site
  static constexpr std::uint64_t kKprobes = kMod + 0x800;  // ext4's .kprobes.text, 0x100 bytes
  static constexpr std::uint64_t kNok = kMod + 0xa00;      // a NOKPROBE function of ext4
  kernel::KernelTables tables;
  symbols::SymbolTable syms;
  symbols::Function fn{"ext4_fn", Gva{kFn}, 0x100};

  void SetUp() override {
    k.blacklist({{kNok, kNok + 0x40}, {kKprobes, kKprobes + 0x100}});
    k.smp_locks({kText + 0x10});  // still mapped: the kernel may still rewrite lock prefixes
    k.ex_table({});
    k.jump_table({});
    k.static_calls({});
    put_btf();
    put({{.name = "ext4",
          .text = kMod,
          .init = kMod + 0x100000,
          .init_size = 0x1000,
          .ex = {{kCopy, kFn + 0xf0, 3}},
          .jumps = {{kJump, kFn + 0xe0, kData + 0x800}},
          .calls = {{kCall, kData + 0x900}},
          .kprobes = kKprobes,
          .kprobes_size = 0x100},
         {.name = "dying", .state = 2, .text = kMod + 0x10000}});
    tables = k.read();
    tables.refresh_modules(k.symbols(), k.reader());
    syms = k.symbols();
  }
  kernel::RuleContext ctx(bool guest) {
    kernel::RuleContext c;
    c.tables = &tables;
    c.syms = &syms;
    c.guest_channel = guest;
    return c;
  }
  std::string rule(const x86::Insn& i, bool guest = true, const symbols::Function* f = nullptr) {
    auto r = kernel::check_address(ctx(guest), i, f ? f : &fn);
    return r ? r->rule : "";
  }
};

TEST_F(ModuleRules, ALiveModulesTextIsKernelText) {
  ASSERT_TRUE(tables.modules()->status().found) << tables.modules()->status().why;
  EXPECT_TRUE(kernel::in_kernel_text(ctx(false), kFn));
  EXPECT_EQ(rule(insn(kFn + 4, {0x48, 0x89, 0xe5})), "");        // mov rbp, rsp
  EXPECT_EQ(rule(insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08})), "");  // mov rax, [rdi+8]
  EXPECT_EQ(rule(insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08}), false), "");
}

TEST_F(ModuleRules, ItsOwnTablesApply) {
  auto r = kernel::check_address(ctx(false), insn(kCopy, {0xf3, 0xa4}), &fn);  // rep movsb
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "exception-table");
  EXPECT_NE(r->entry.find("module ext4 __ex_table entry"), std::string::npos) << r->entry;
  EXPECT_EQ(rule(insn(kJump, {0x0f, 0x1f, 0x44, 0x00, 0x00})), "jump-label");  // nop5
  EXPECT_EQ(rule(insn(kJump - 2, {0x48, 0x89, 0xc8})), "jump-label");          // overlaps it
  EXPECT_EQ(rule(insn(kCall, {0xe8, 0x00, 0x10, 0x00, 0x00})), "static-call");
  // The same bytes elsewhere in the module are no site.
  EXPECT_EQ(rule(insn(kFn + 0x80, {0x0f, 0x1f, 0x44, 0x00, 0x00})), "");
}

TEST_F(ModuleRules, LockPrefixesAreRefusedWhileTheKernelMayRewriteThem) {
  auto r = kernel::check_address(ctx(false), insn(kFn + 0x90, {0xf0, 0x48, 0xff, 0x00}), &fn);  // lock inc
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "smp-lock");
  EXPECT_NE(r->reason.find("module"), std::string::npos);
  // Once the kernel freed its .smp_locks (no prefix is rewritten any more), accepted.
  k.unreadable.push_back(kRodata + 0x3000);
  tables = k.read();
  ASSERT_TRUE(tables.smp_locks_status().freed);
  tables.refresh_modules(k.symbols(), k.reader());
  EXPECT_EQ(rule(insn(kFn + 0x90, {0xf0, 0x48, 0xff, 0x00}), false), "");
}

TEST_F(ModuleRules, KprobesTextAndTheBlacklistApplyOnTheGuestChannel) {
  symbols::Function kp{"ext4_kp", Gva{kKprobes}, 0x100};
  EXPECT_EQ(rule(insn(kKprobes + 0x10, {0x48, 0x89, 0xe5}), true, &kp), "kprobes-text");
  EXPECT_EQ(rule(insn(kKprobes + 0x10, {0x48, 0x89, 0xe5}), false, &kp), "");
  symbols::Function nok{"ext4_nok", Gva{kNok}, 0x40};
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), true, &nok), "kprobe-blacklist");
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), false, &nok), "");
  EXPECT_EQ(rule(insn(kNok + 0x40, {0x48, 0x89, 0xe5}), true, &nok), "");  // past it
}

TEST_F(ModuleRules, GoingInitUnknownAndUnreadableModulesStayRefused) {
  auto why = [&](std::uint64_t a) {
    auto r = kernel::check_address(ctx(false), insn(a, {0x48, 0x89, 0xe5}), &fn);
    return r ? std::string(r->rule) + ": " + r->reason + " (" + r->entry + ")" : std::string();
  };
  EXPECT_NE(why(kMod + 0x10010).find("GOING"), std::string::npos) << why(kMod + 0x10010);
  EXPECT_NE(why(kMod + 0x100010).find("init text of a module"), std::string::npos) << why(kMod + 0x100010);
  EXPECT_NE(why(kMod + 0x50000).find("every live module"), std::string::npos) << why(kMod + 0x50000);
  EXPECT_EQ(why(kMod + 0x50000).substr(0, 15), "not-kernel-text");
  // An instruction that runs past the end of the module's text.
  EXPECT_NE(why(kMod + 0xffe).find("runs past the end"), std::string::npos) << why(kMod + 0xffe);
  // The guest module's own text keeps its own rule.
  kernel::RuleContext c = ctx(true);
  c.module_text = {kMod, kMod + 0x1000};
  EXPECT_STREQ(kernel::check_address(c, insn(kFn + 4, {0x48, 0x89, 0xe5}), &fn)->rule, "module-text");
  // No BTF: module text is refused, saying why.
  FakeKernel bare;
  auto t = bare.read();
  t.refresh_modules(bare.symbols(), bare.reader());
  c.tables = &t;
  c.module_text = {};
  auto r = kernel::check_address(c, insn(kFn + 4, {0x48, 0x89, 0xe5}), &fn);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "not-kernel-text");
  EXPECT_NE(r->reason.find("could not be read"), std::string::npos) << r->reason;
  EXPECT_NE(r->entry.find("BTF"), std::string::npos) << r->entry;
}

}  // namespace
}  // namespace xenprobes::testing
