// The address rules, one test per rule, each from annotated instruction bytes at an address
// of a fake kernel whose tables say what is there.
#include <gtest/gtest.h>

#include "kernel/address_rules.hpp"
#include "unit/kernel/fake_kernel.hpp"

namespace xenprobes::testing {
namespace {

using kernel::check_address;
using kernel::RuleContext;

x86::Insn insn(std::uint64_t at, std::vector<std::uint8_t> bytes) {
  auto i = x86::decode(bytes, Gva{at});
  if (!i) throw std::runtime_error(i.error().what);
  return *i;
}

// A kernel with every table present and one entry of each kind.
struct Rules : ::testing::Test {
  static constexpr std::uint64_t kFn = kText + 0x1000;   // "some_function", 0x100 bytes
  static constexpr std::uint64_t kCopy = kFn + 0x20;     // an __ex_table instruction
  static constexpr std::uint64_t kJump = kFn + 0x40;     // a jump-label site
  static constexpr std::uint64_t kCall = kFn + 0x60;     // a static-call site
  static constexpr std::uint64_t kLock = kFn + 0x80;     // an .smp_locks prefix
  static constexpr std::uint64_t kNok = kText + 0x3000;  // a NOKPROBE function
  FakeKernel k;
  kernel::KernelTables tables;
  symbols::SymbolTable syms;
  symbols::Function fn{"some_function", Gva{kFn}, 0x100};

  void SetUp() override {
    k.sym(kFn, 'T', "some_function");
    k.sym(kFn + 0x100, 'T', "other_function");
    k.sym(kText + 0x2000, 'T', "__entry_text_start");
    k.sym(kText + 0x2100, 'T', "__entry_text_end");
    k.sym(kText + 0x2100, 'T', "__noinstr_text_start");
    k.sym(kText + 0x2200, 'T', "__noinstr_text_end");
    k.sym(kText + 0x2200, 'T', "__kprobes_text_start");
    k.sym(kText + 0x2300, 'T', "__kprobes_text_end");
    k.ex_table({{kCopy, kFn + 0xf0, 3}});
    k.jump_table({{kJump, kFn + 0xe0, kData + 0x800}});
    k.static_calls({{kCall, kData + 0x900}});
    k.smp_locks({kLock});
    k.blacklist({{kNok, kNok + 0x40}});
    tables = k.read();
    syms = k.symbols();
  }
  RuleContext ctx(bool guest) {
    RuleContext c;
    c.tables = &tables;
    c.syms = &syms;
    c.guest_channel = guest;
    return c;
  }
  std::string rule(const x86::Insn& i, bool guest = true, const symbols::Function* f = nullptr) {
    auto r = check_address(ctx(guest), i, f ? f : &fn);
    return r ? r->rule : "";
  }
};

TEST_F(Rules, OrdinaryInstructionsPass) {
  EXPECT_EQ(rule(insn(kFn + 4, {0x48, 0x89, 0xe5})), "");        // mov rbp, rsp
  EXPECT_EQ(rule(insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08})), "");  // mov rax, [rdi+8]
}

TEST_F(Rules, ExceptionTableInstructionsAreRefused) {
  auto r = check_address(ctx(false), insn(kCopy, {0xf3, 0xa4}), &fn);  // rep movsb
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "exception-table");
  EXPECT_FALSE(r->guest_channel_only);
  std::string m = r->message("some_function+0x20");
  EXPECT_NE(m.find("rule 'exception-table'"), std::string::npos) << m;
  EXPECT_NE(m.find("fixup"), std::string::npos) << m;
  EXPECT_NE(m.find("gives no fixup slots"), std::string::npos) << m;
  EXPECT_NE(m.find("the vmevent channel in int3 mode"), std::string::npos) << m;
  EXPECT_NE(m.find("and so does every channel when the guest module gives fixup slots"), std::string::npos) << m;
  EXPECT_EQ(rule(insn(kCopy + 2, {0x48, 0x89, 0xc8})), "");  // the instruction after it
}

// With the guest module's fixup slots, an entry of a type whose handler needs only the
// registers and the fixup is accepted on every channel; needs_own_address hands the entry on.
TEST_F(Rules, ExceptionTableInstructionsAreAcceptedWithFixupSlots) {
  for (bool guest : {true, false}) {
    RuleContext c = ctx(guest);
    c.fixup_slots = true;
    const x86::Insn copy = insn(kCopy, {0xf3, 0xa4});
    EXPECT_FALSE(check_address(c, copy, &fn)) << guest;
    auto own = needs_own_address(c, copy);
    ASSERT_TRUE(own);
    ASSERT_TRUE(own->entry);
    EXPECT_EQ(own->entry->insn, kCopy);
    EXPECT_EQ(own->entry->fixup, kFn + 0xf0);
    EXPECT_EQ(own->entry->type(), 3u);
  }
  // A zeropad load keeps its refusal there: its handler decodes at the faulting address.
  FakeKernel z;
  z.sym(kFn, 'T', "some_function");
  z.ex_table({{kCopy, kFn + 0xf0, 20}});
  auto zt = z.read();
  auto zs = z.symbols();
  RuleContext c{&zt, &zs, {}, false};
  c.fixup_slots = true;
  auto r = check_address(c, insn(kCopy, {0x48, 0x8b, 0x07}), &fn);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "exception-table");
  const std::string m = r->message("f");
  EXPECT_NE(m.find("zeropad"), std::string::npos) << m;
  EXPECT_EQ(m.find("and so does every channel"), std::string::npos) << m;
}

// Which fixup types may run from a slot: those whose handler does not look at the faulting
// address (Linux 6.1 and 6.12 number them alike).
TEST(FixupSlotTypes, OnlyHandlersThatIgnoreTheFaultingAddressAreAccepted) {
  for (unsigned t : {1u, 2u, 3u, 4u, 5u, 6u, 8u, 9u, 10u, 11u, 12u, 13u, 14u, 15u, 16u, 17u, 18u, 19u})
    EXPECT_EQ(kernel::fixup_slot_refusal(t), nullptr) << t;
  ASSERT_NE(kernel::fixup_slot_refusal(20), nullptr);
  EXPECT_NE(std::string(kernel::fixup_slot_refusal(20)).find("zeropad"), std::string::npos);
  for (unsigned t : {0u, 7u, 21u, 22u, 255u}) EXPECT_NE(kernel::fixup_slot_refusal(t), nullptr) << t;
}

// A channel that has the hypervisor run the instruction where it is (the vmevent channel)
// keeps the faulting address the kernel looks the fixup up by: accepted there, and
// needs_own_address says why it must run that way.
TEST_F(Rules, ExceptionTableInstructionsAreAcceptedWhereTheChannelRunsThemInPlace) {
  RuleContext c = ctx(false);
  c.emulates_in_place = true;
  const x86::Insn copy = insn(kCopy, {0xf3, 0xa4});
  EXPECT_FALSE(check_address(c, copy, &fn));
  auto own = needs_own_address(c, copy);
  ASSERT_TRUE(own);
  EXPECT_NE(own->why.find("__ex_table entry"), std::string::npos) << own->why;
  EXPECT_NE(own->why.find("fixup"), std::string::npos) << own->why;
  EXPECT_TRUE(own->entry);
  // Neither an ordinary memory access nor the instruction after the covered one.
  EXPECT_FALSE(needs_own_address(c, insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08})));
  EXPECT_FALSE(needs_own_address(c, insn(kCopy + 2, {0x48, 0x89, 0xc8})));
  // The other rules still hold there.
  EXPECT_STREQ(check_address(c, insn(kJump, {0x0f, 0x1f, 0x44, 0x00, 0x00}), &fn)->rule, "jump-label");
}

TEST_F(Rules, JumpLabelSitesAreRefusedWhateverTheirState) {
  EXPECT_EQ(rule(insn(kJump, {0x0f, 0x1f, 0x44, 0x00, 0x00})), "jump-label");  // nop5
  EXPECT_EQ(rule(insn(kJump, {0xe9, 0x10, 0x00, 0x00, 0x00})), "jump-label");  // jmp rel32
  EXPECT_EQ(rule(insn(kJump, {0xeb, 0x10})), "jump-label");                    // jmp rel8
  // An instruction that overlaps the site's bytes from before.
  EXPECT_EQ(rule(insn(kJump - 2, {0x48, 0x89, 0xc8})), "jump-label");
  auto r = check_address(ctx(false), insn(kJump, {0x66, 0x90}), &fn);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code, Errc::Busy);
}

TEST_F(Rules, StaticCallSitesAndTrampolinesAreRefused) {
  EXPECT_EQ(rule(insn(kCall, {0xe8, 0x00, 0x10, 0x00, 0x00})), "static-call");
  symbols::Function tramp{"__SCT__preempt_schedule", Gva{kText + 0x4000}, 8};
  EXPECT_EQ(rule(insn(kText + 0x4000, {0xe9, 0x00, 0x10, 0x00, 0x00}), false, &tramp), "static-call-trampoline");
}

TEST_F(Rules, SmpLockPrefixesAreRefused) {
  EXPECT_EQ(rule(insn(kLock, {0xf0, 0x48, 0xff, 0x00})), "smp-lock");  // lock inc qword [rax]
  EXPECT_EQ(rule(insn(kLock, {0x3e, 0x48, 0xff, 0x00})), "smp-lock");  // as a UP kernel patched it
  // An entry whose byte is no lock prefix (a freed, reused table) is not a site.
  EXPECT_EQ(rule(insn(kLock, {0x48, 0xff, 0x00})), "");
}

TEST_F(Rules, EntryTextIsRefusedOnEveryChannel) {
  symbols::Function f{"entry_SYSCALL_64", Gva{kText + 0x2000}, 0x100};
  EXPECT_EQ(rule(insn(kText + 0x2010, {0x48, 0x89, 0xe5}), true, &f), "entry-text");
  EXPECT_EQ(rule(insn(kText + 0x2010, {0x48, 0x89, 0xe5}), false, &f), "entry-text");
}

TEST_F(Rules, NoinstrAndKprobesTextAreRefusedOnlyOnTheGuestChannel) {
  symbols::Function ni{"exc_page_fault", Gva{kText + 0x2100}, 0x100};
  auto r = check_address(ctx(true), insn(kText + 0x2110, {0x48, 0x89, 0xe5}), &ni);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "noinstr");
  EXPECT_TRUE(r->guest_channel_only);
  EXPECT_NE(r->message("x").find("vmevent and debugger channels accept it"), std::string::npos);
  EXPECT_EQ(rule(insn(kText + 0x2110, {0x48, 0x89, 0xe5}), false, &ni), "");
  symbols::Function kp{"kprobe_handler", Gva{kText + 0x2200}, 0x100};
  EXPECT_EQ(rule(insn(kText + 0x2210, {0x48, 0x89, 0xe5}), true, &kp), "kprobes-text");
  EXPECT_EQ(rule(insn(kText + 0x2210, {0x48, 0x89, 0xe5}), false, &kp), "");
}

TEST_F(Rules, TheKprobeBlacklistAppliesToTheGuestChannel) {
  symbols::Function f{"nmi_handle", Gva{kNok}, 0x40};
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), true, &f), "kprobe-blacklist");
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), false, &f), "");
}

TEST_F(Rules, TheGuestModulesOwnPathIsRefusedOnTheGuestChannel) {
  symbols::Function rcu{"__rcu_read_lock", Gva{kText + 0x5000}, 0x20};
  EXPECT_EQ(rule(insn(kText + 0x5004, {0x48, 0x89, 0xe5}), true, &rcu), "guest-hook-path");
  EXPECT_EQ(rule(insn(kText + 0x5004, {0x48, 0x89, 0xe5}), false, &rcu), "");
  symbols::Function thunk{"__x86_indirect_thunk_rax", Gva{kText + 0x5100}, 0x20};
  EXPECT_EQ(rule(insn(kText + 0x5100, {0xff, 0xe0}), true, &thunk), "guest-hook-path");
  // The module's own text, as it publishes it (outside the kernel's text, like all module
  // text): named as such on every channel.
  for (bool guest : {true, false}) {
    RuleContext c = ctx(guest);
    c.module_text = {0xffffffffc0001000ull, 0xffffffffc0002000ull};
    symbols::Function hook{"xp_die_notify", Gva{0xffffffffc0001100ull}, 0x40};
    auto r = check_address(c, insn(0xffffffffc0001104ull, {0x48, 0x89, 0xe5}), &hook);
    ASSERT_TRUE(r);
    EXPECT_STREQ(r->rule, "module-text");
    EXPECT_FALSE(r->guest_channel_only);
  }
}

// What the hook's callees call in turn (guest-module/README.md "The hook path"), on 6.1 and
// 6.12: Dom0 knows them by name, since the module cannot publish static functions.
TEST(GuestHookPath, TheCalleesOfTheModulesCalleesAreOnItByName) {
  for (const char* n :
       {"info_for_irq", "irq_to_desc", "radix_tree_lookup", "__radix_tree_lookup", "mtree_load",
        "evtchn_2l_clear_pending", "evtchn_fifo_clear_pending", "xen_clocksource_read", "xen_clocksource_get_cycles",
        "read_tsc", "xen_pmd_val", "xen_pte_val", "pte_mfn_to_pfn", "__check_object_size", "is_vmalloc_addr"})
    EXPECT_TRUE(kernel::on_guest_hook_path(n)) << n;
  // The user copies stay probe-able: the extable support runs them in fixup slots, and a hit
  // in them from the hook's own captures is a nested one (its fallback).
  for (const char* n : {"copy_user_enhanced_fast_string", "rep_movs_alternative", "kvm_clock_read"})
    EXPECT_FALSE(kernel::on_guest_hook_path(n)) << n;
}

// The functions the guest module publishes as its hit path (hook-path/*, protocol.h): a
// function that contains a published address is refused on the guest channel, naming the
// entry, though no name Dom0 knows matches it; the other channels accept it. Without the
// list (an older module) the names alone decide, as before; an unreadable list refuses all.
TEST_F(Rules, FunctionsTheGuestModulePublishesAreRefusedOnTheGuestChannel) {
  symbols::Function clock{"kvm_clock_read", Gva{kText + 0x5200}, 0x40};
  const x86::Insn mov = insn(kText + 0x5210, {0x48, 0x89, 0xe5});
  ASSERT_FALSE(kernel::on_guest_hook_path(clock.name));
  EXPECT_EQ(rule(mov, true, &clock), "") << "not a name Dom0 knows";
  const std::vector<std::uint64_t> published = {kText + 0x100, kText + 0x5200, kText + 0x9000};
  RuleContext c = ctx(true);
  c.hook_path = &published;
  auto r = check_address(c, mov, &clock);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "guest-hook-path");
  EXPECT_TRUE(r->guest_channel_only);
  EXPECT_NE(r->entry.find("kvm_clock_read, published as 0xffffffff81005200 in hook-path"), std::string::npos)
      << r->entry;
  EXPECT_NE(r->message("x").find("refused by rule 'guest-hook-path'"), std::string::npos) << r->message("x");
  // Every instruction of the function, not only its first.
  EXPECT_EQ(kernel::published_hook_path_entry(c, clock), kText + 0x5200);
  EXPECT_TRUE(check_address(c, insn(kText + 0x523f, {0x90}), &clock));
  // A published address anywhere inside it (a pointer into the function) counts too; one
  // past its end does not.
  const std::vector<std::uint64_t> inside = {kText + 0x523f};
  c.hook_path = &inside;
  EXPECT_EQ(kernel::published_hook_path_entry(c, clock), kText + 0x523f);
  const std::vector<std::uint64_t> after = {kText + 0x5240, kText + 0x51ff};
  c.hook_path = &after;
  EXPECT_EQ(kernel::published_hook_path_entry(c, clock), std::nullopt);
  EXPECT_FALSE(check_address(c, mov, &clock));
  // Without a size (symbols that give none), its first byte only.
  symbols::Function sizeless{"kvm_clock_read", Gva{kText + 0x5200}, 0};
  c.hook_path = &published;
  EXPECT_EQ(kernel::published_hook_path_entry(c, sizeless), kText + 0x5200);
  // The other channels: accepted.
  RuleContext other = ctx(false);
  other.hook_path = &published;
  EXPECT_FALSE(check_address(other, mov, &clock));
  // An empty list, or none: the names alone.
  const std::vector<std::uint64_t> none;
  c.hook_path = &none;
  EXPECT_FALSE(check_address(c, mov, &clock));
  symbols::Function rcu{"__rcu_read_lock", Gva{kText + 0x5000}, 0x20};
  EXPECT_STREQ(check_address(c, insn(kText + 0x5004, {0x48, 0x89, 0xe5}), &rcu)->rule, "guest-hook-path");
  c.hook_path = nullptr;
  EXPECT_FALSE(check_address(c, mov, &clock));
  // A list that could not be read: every point on the guest channel, none elsewhere.
  c.hook_path_error = "xenstore key hook-path/0 = 'junk': not a 0x-prefixed 64-bit hex address";
  r = check_address(c, mov, &clock);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "guest-hook-path");
  EXPECT_NE(r->entry.find("hook-path: xenstore key hook-path/0"), std::string::npos) << r->entry;
  other.hook_path_error = c.hook_path_error;
  EXPECT_FALSE(check_address(other, mov, &clock));
}

TEST_F(Rules, AddressesOutsideTheTextOrWithoutAFunctionAreRefused) {
  symbols::Function data{"jiffies_64", Gva{kRodata}, 8};
  EXPECT_EQ(rule(insn(kRodata, {0x90}), false, &data), "not-kernel-text");
  auto r = check_address(ctx(false), insn(kFn, {0x90}), nullptr);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "no-function");
  // An instruction that starts in the text and runs past _etext.
  symbols::Function last{"last", Gva{kTextEnd - 2}, 2};
  EXPECT_EQ(rule(insn(kTextEnd - 2, {0x48, 0x89, 0xe5}), false, &last), "not-kernel-text");
  // No tables at all: nothing can be checked.
  RuleContext none;
  EXPECT_STREQ(check_address(none, insn(kFn, {0x90}), &fn)->rule, "not-kernel-text");
}

// Where a table could not be read, its rule refuses every instruction it could cover.
TEST(RulesWithoutTables, EachMissingTableRefusesTheShapesItCouldCover) {
  FakeKernel k;
  k.sym(kText + 0x1000, 'T', "some_function");
  auto tables = k.read();
  auto syms = k.symbols();
  symbols::Function fn{"some_function", Gva{kText + 0x1000}, 0x100};
  RuleContext c;
  c.tables = &tables;
  c.syms = &syms;
  auto rule = [&](std::vector<std::uint8_t> b, bool guest) {
    c.guest_channel = guest;
    auto r = check_address(c, insn(kText + 0x1010, std::move(b)), &fn);
    return r ? std::string(r->rule) + ": " + r->entry : std::string();
  };
  EXPECT_EQ(rule({0x48, 0x89, 0xe5}, false), "");  // mov rbp, rsp: no table could cover it
  EXPECT_EQ(rule({0x0f, 0x1f, 0x44, 0x00, 0x00}, false).substr(0, 10), "jump-label");
  EXPECT_EQ(rule({0xe8, 0, 0, 0, 0}, false).substr(0, 10), "jump-label");
  EXPECT_EQ(rule({0x48, 0x8b, 0x07}, false).substr(0, 15), "exception-table");
  EXPECT_EQ(rule({0xf3, 0xa4}, false).substr(0, 15), "exception-table");
  EXPECT_EQ(rule({0xf0, 0x48, 0xff, 0x00}, false).substr(0, 8), "smp-lock");
  // Where instructions run in place, any memory access may keep its own address: it runs so.
  c.emulates_in_place = true;
  EXPECT_EQ(rule({0x48, 0x8b, 0x07}, false), "");
  ASSERT_TRUE(needs_own_address(c, insn(kText + 0x1010, {0x48, 0x8b, 0x07})));
  EXPECT_FALSE(needs_own_address(c, insn(kText + 0x1010, {0x48, 0x8b, 0x07}))->entry) << "no table, no entry";
  // Fixup slots need the entry: without the table they do not help.
  c.emulates_in_place = false;
  c.fixup_slots = true;
  EXPECT_EQ(rule({0x48, 0x8b, 0x07}, false).substr(0, 15), "exception-table");
  c.fixup_slots = false;
  c.emulates_in_place = true;
  EXPECT_FALSE(needs_own_address(c, insn(kText + 0x1010, {0x48, 0x89, 0xe5})));
  c.emulates_in_place = false;
  // On the guest channel the unreadable blacklist refuses everything.
  EXPECT_EQ(rule({0x48, 0x89, 0xe5}, true).substr(0, 16), "kprobe-blacklist");
  EXPECT_NE(rule({0x48, 0x89, 0xe5}, true).find("kprobe_blacklist"), std::string::npos);
}

// ---- entry placement

struct Entry : Rules {
  std::vector<x86::Insn> fn_insns(std::vector<std::vector<std::uint8_t>> code, std::uint64_t at = kFn) {
    std::vector<x86::Insn> v;
    for (auto& b : code) {
      v.push_back(insn(at, b));
      at += b.size();
    }
    return v;
  }
};

TEST_F(Entry, AProbeOnAFunctionStartGoesPastTheFtraceSite) {
  auto f = fn_insns({{0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}});
  auto p = kernel::place_entry_probe(ctx(false), f, Gva{kFn});
  EXPECT_EQ(p.address, Gva{kFn + 5});
  EXPECT_NE(p.moved_because.find("ftrace"), std::string::npos);
  // When ftrace uses the site it is a call: still the kernel's.
  auto g = fn_insns({{0xe8, 0x00, 0x10, 0x00, 0x00}, {0x55}, {0xc3}});
  EXPECT_EQ(kernel::place_entry_probe(ctx(false), g, Gva{kFn}).address, Gva{kFn + 5});
}

TEST_F(Entry, PastTheEndbrThenTheFtraceSite) {
  auto f = fn_insns({{0xf3, 0x0f, 0x1e, 0xfa}, {0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}});
  auto p = kernel::place_entry_probe(ctx(false), f, Gva{kFn});
  EXPECT_EQ(p.address, Gva{kFn + 9});
  EXPECT_NE(p.moved_because.find("endbr64"), std::string::npos);
  EXPECT_NE(p.moved_because.find("ftrace"), std::string::npos);
  // Without an ftrace site only the endbr is passed.
  auto g = fn_insns({{0xf3, 0x0f, 0x1e, 0xfa}, {0x55}, {0xc3}});
  EXPECT_EQ(kernel::place_entry_probe(ctx(false), g, Gva{kFn}).address, Gva{kFn + 4});
}

TEST_F(Entry, OtherAddressesAndOtherFirstInstructionsStay) {
  auto f = fn_insns({{0x55}, {0x48, 0x89, 0xe5}, {0xc3}});
  EXPECT_EQ(kernel::place_entry_probe(ctx(false), f, Gva{kFn}).address, Gva{kFn});
  auto g = fn_insns({{0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}});
  EXPECT_EQ(kernel::place_entry_probe(ctx(false), g, Gva{kFn + 5}).address, Gva{kFn + 5});
  EXPECT_TRUE(kernel::place_entry_probe(ctx(false), g, Gva{kFn + 5}).moved_because.empty());
}

TEST_F(Entry, ANopThatIsAJumpLabelSiteIsNotAnFtraceSite) {
  // A function whose first instruction is a static branch (the site at kJump).
  auto f = fn_insns({{0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}}, kJump);
  EXPECT_FALSE(kernel::is_ftrace_site(ctx(false), f, f[0]));
  EXPECT_EQ(kernel::place_entry_probe(ctx(false), f, Gva{kJump}).address, Gva{kJump});
}

TEST_F(Entry, TheFtraceSiteAskedForByAddressIsRefused) {
  // Linux 6.12 with IBT: endbr64 at +0, the ftrace nop5 at +4. The first byte moves past both;
  // +4 asked for by address is the ftrace site itself and is refused, naming the way to it.
  auto f = fn_insns({{0xf3, 0x0f, 0x1e, 0xfa}, {0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}});
  auto r = kernel::check_in_function(ctx(false), f, f[1]);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "ftrace-site");
  EXPECT_EQ(r->code, Errc::Busy);
  EXPECT_NE(r->message("f+0x4").find("ask for the function itself"), std::string::npos);
  EXPECT_FALSE(kernel::check_in_function(ctx(false), f, f[2])) << "the instruction after it";
  // The same shape without endbr64: the site at +0.
  auto g = fn_insns({{0x0f, 0x1f, 0x44, 0x00, 0x00}, {0x55}, {0xc3}});
  ASSERT_TRUE(kernel::check_in_function(ctx(false), g, g[0]));
  // A nop5 further into a function is no ftrace site.
  auto h = fn_insns({{0x55}, {0x0f, 0x1f, 0x44, 0x00, 0x00}, {0xc3}});
  EXPECT_FALSE(kernel::check_in_function(ctx(false), h, h[1]));
}

// A jmp rel32 at `at` to `to`, as the bytes an optimized kprobe (or any patcher) writes.
std::vector<std::uint8_t> jmp_rel32(std::uint8_t op, std::uint64_t at, std::uint64_t to) {
  const auto rel = static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<std::int64_t>(to - (at + 5))));
  return {op, static_cast<std::uint8_t>(rel), static_cast<std::uint8_t>(rel >> 8), static_cast<std::uint8_t>(rel >> 16),
          static_cast<std::uint8_t>(rel >> 24)};
}

TEST_F(Rules, AJumpOutOfEveryKnownTextMakesTheFunctionsBoundariesForeign) {
  // An in-guest optimized kprobe at some_function+0x10: e9 to its detour buffer, which the
  // kernel allocates in the module area where no module's text is.
  const std::uint64_t at = kFn + 0x10, buffer = 0xffffffffc0201000ull;
  auto r = kernel::check_foreign_jump(ctx(true), insn(at, jmp_rel32(0xe9, at, buffer)), "some_function");
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "foreign-jump");
  EXPECT_EQ(r->code, Errc::Busy);
  EXPECT_NE(r->entry.find("to 0xffffffffc0201000"), std::string::npos) << r->entry;
  EXPECT_NE(r->message("x").find("no channel accepts it"), std::string::npos);
  EXPECT_TRUE(kernel::check_foreign_jump(ctx(false), insn(at, jmp_rel32(0xe9, at, buffer)), "some_function"))
      << "every channel: the boundaries are Dom0's to decode";
  // A jump within the text (a tail call, a jump label's jump, a .cold part) is no such jump.
  EXPECT_FALSE(kernel::check_foreign_jump(ctx(true), insn(at, jmp_rel32(0xe9, at, kFn + 0x100)), "some_function"));
  EXPECT_FALSE(kernel::check_foreign_jump(ctx(true), insn(at, jmp_rel32(0xe9, at, kTextEnd - 1)), "some_function"));
  EXPECT_TRUE(kernel::check_foreign_jump(ctx(true), insn(at, jmp_rel32(0xe9, at, kTextEnd)), "some_function"))
      << "_etext is past the text";
  // A call to a trampoline outside the text (the ftrace site of a traced function) is one
  // whole instruction: the boundaries after it are sound.
  EXPECT_FALSE(kernel::check_foreign_jump(ctx(true), insn(at, jmp_rel32(0xe8, at, buffer)), "some_function"));
  // A short jump cannot leave the text.
  EXPECT_FALSE(kernel::check_foreign_jump(ctx(true), insn(at, {0xeb, 0x10}), "some_function"));
}

TEST_F(Rules, AnEndbr64IsRefused) {
  auto r = check_address(ctx(false), insn(kFn + 0x10, {0xf3, 0x0f, 0x1e, 0xfa}), &fn);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "endbr64");
  EXPECT_FALSE(r->guest_channel_only);
  EXPECT_NE(r->reason.find("#CP"), std::string::npos) << r->reason;
}

TEST_F(Rules, FunctionPaddingIsRefused) {
  // 6.12's 16 bytes of nop before each function carry their own symbol, __pfx_<function>.
  symbols::Function pfx{"__pfx_some_function", Gva{kFn - 0x10}, 0x10};
  auto r = check_address(ctx(false), insn(kFn - 0x10, {0x90}), &pfx);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "function-padding");
  EXPECT_NE(r->message("__pfx_some_function").find("__pfx_some_function"), std::string::npos);
}

}  // namespace
}  // namespace xenprobes::testing
