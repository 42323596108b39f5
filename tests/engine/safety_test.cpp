// The address rules on the simulated Xen, over each channel: the demo guest carries the
// kernel's own tables in Linux's formats (guest/safety.S), and every point they cover is
// refused with its rule, the table entry and the channels that would accept it, without a
// byte of the guest changed. Also the text checks at arm and disarm, and entry placement.
#include <cstring>

#include "mem/frame_source.hpp"
#include "probe/engine.hpp"
#include "channel/debugger.hpp"
#include "xenprobes/guest_view.hpp"

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

auto nop() {
  return [](HitContext&) { return 0; };
}

struct Case {
  const char* at;    // symbol+offset
  const char* rule;  // the rule that refuses it
  bool guest_only;   // the vmevent and debugger channels accept it
};

// Offsets from guest/safety.S (each function starts with the 5-byte ftrace nop unless noted).
const Case kCases[] = {
    {"demo_load_zeropad+0x5", "exception-table", false},    // a fixup that needs the faulting address
    {"demo_static_branch+0x5", "jump-label", false},        // the static-key nop5
    {"demo_static_call+0x5", "static-call", false},         // call __SCT__demo_hook
    {"__SCT__demo_hook", "static-call-trampoline", false},  // the trampoline's jmp
    {"demo_locked_inc+0xc", "smp-lock", false},             // lock incq (%rax)
    {"demo_entry_stub", "entry-text", false},               // .entry.text
    {"demo_noinstr_fn", "noinstr", true},                   // .noinstr.text
    {"demo_kprobes_fn", "kprobes-text", true},              // .kprobes.text
    {"demo_nokprobe_fn+0x5", "kprobe-blacklist", true},     // on kprobe_blacklist
    {"__rcu_read_lock+0x5", "guest-hook-path", true},       // the module's int3 path
    {"lookup_address+0x5", "guest-hook-path", true},
};

TEST(AddressRules, EveryTableEntryIsRefusedWithItsRuleAndNothingIsWritten) {
  ProbedGuest g;
  const bool guest = test_channel() == ChannelKind::Guest;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.at);
    Gva a = *g.session->resolve(g.dom, c.at);
    auto before = g.peek(a.value, 8);
    auto p = g.session->probe(g.dom, a, nop());
    if (c.guest_only && !guest) {
      // Xen takes these traps before the guest's own int3 path: safe here.
      ASSERT_TRUE(p) << p.error().what;
      EXPECT_EQ(g.peek(a.value, 1)[0], trap_byte());
      ASSERT_TRUE(p->unregister());
      EXPECT_EQ(g.peek(a.value, 8), before);
      continue;
    }
    ASSERT_FALSE(p) << "probed " << c.at;
    const std::string& m = p.error().what;
    EXPECT_NE(m.find(std::string("rule '") + c.rule + "'"), std::string::npos) << m;
    // Run in place by Xen's emulator (int3 mode, no guest module), a zeropad load keeps its address.
    const char* accepted = c.guest_only ? "the vmevent and debugger channels accept it"
                           : std::string_view(c.rule) == "exception-table" ? "the vmevent channel in int3 mode"
                                                                           : "no channel accepts it";
    EXPECT_NE(m.find(accepted), std::string::npos) << m;
    EXPECT_EQ(g.peek(a.value, 8), before) << "a refusal writes nothing";
  }
}

// An instruction the exception table covers must fault where the kernel finds a fixup for it.
// The guest module's fixup slots have exception-table entries of their own: the copy goes to
// one, and its entry gets the original's fixup and type, on every channel.
struct FixupEntry {
  std::uint64_t insn = 0, fixup = 0;
  std::int32_t data = 0;
};
FixupEntry fixup_entry(ProbedGuest& g, unsigned k) {
  const auto layout = *g.host->layout(g.dom);
  const std::uint64_t at = layout.fixup_table + 12ull * k;
  auto b = g.peek(at, 12);
  std::int32_t f[3];
  std::memcpy(f, b.data(), sizeof f);
  return {at + static_cast<std::uint64_t>(std::int64_t{f[0]}), at + 4 + static_cast<std::uint64_t>(std::int64_t{f[1]}),
          f[2]};
}

TEST(ExceptionTable, TheCopyGoesToAFixupSlotWhoseEntryHasTheOriginalFixup) {
  ProbedGuest g;
  const auto layout = *g.host->layout(g.dom);
  ASSERT_NE(layout.fixup_count, 0u);
  Gva a = *g.session->resolve(g.dom, "demo_uaccess_copy+0x8");
  Gva fix = *g.session->resolve(g.dom, "demo_uaccess_copy+0xa");
  auto before = g.peek(a.value, 8);
  ASSERT_EQ(before[0], 0xf3);  // rep movsb
  auto p = g.session->probe(g.dom, a, nop());
  ASSERT_TRUE(p) << p.error().what;
  const Gva slot = p->info()->slot;
  EXPECT_EQ(p->info()->mode, ExecMode::Boosted);
  ASSERT_GE(slot.value, layout.fixup_slots);
  ASSERT_LT(slot.value, layout.fixup_slots + 32ull * layout.fixup_count);
  const unsigned k = static_cast<unsigned>((slot.value - layout.fixup_slots) / 32);
  EXPECT_EQ(slot.value, layout.fixup_slots + 32ull * k) << "a slot's first byte";
  // The copy and a jmp back to the instruction after it.
  auto code = g.peek(slot.value, 32);
  EXPECT_EQ(code[0], 0xf3);
  EXPECT_EQ(code[1], 0xa4);
  EXPECT_EQ(code[2], 0xe9);
  std::int32_t rel;
  std::memcpy(&rel, &code[3], 4);
  EXPECT_EQ(slot.value + 7 + static_cast<std::uint64_t>(std::int64_t{rel}), a.value + 2);
  // Its entry: the slot's first byte, the original fixup and type (EX_TYPE_UACCESS).
  FixupEntry e = fixup_entry(g, k);
  EXPECT_EQ(e.insn, slot.value);
  EXPECT_EQ(e.fixup, fix.value);
  EXPECT_EQ(e.data, 3);
  EXPECT_EQ(g.peek(a.value, 1)[0], trap_byte());
  // A post-handler cannot follow it (the slot ends in a jmp back, for good).
  auto post = g.session->probe(g.dom, a, {}, [](HitContext&) {});
  ASSERT_FALSE(post);
  EXPECT_EQ(post.error().code, Errc::NotSupported);
  EXPECT_NE(post.error().what.find("post-handlers cannot run"), std::string::npos) << post.error().what;
  // Unregistered, the text comes back and the slot stays as it is: a task may still sleep in a
  // fault taken there.
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(a.value, 8), before);
  EXPECT_EQ(g.peek(slot.value, 32), code);
  EXPECT_EQ(fixup_entry(g, k).insn, slot.value);
  // The same instruction again: the same slot, found by its bytes and entry.
  auto again = g.session->probe(g.dom, a, nop());
  ASSERT_TRUE(again) << again.error().what;
  EXPECT_EQ(again->info()->slot, slot);
  // Another instruction: another slot.
  auto other = g.session->probe(g.dom, "demo_get_user+0x5", nop());
  ASSERT_TRUE(other) << other.error().what;
  EXPECT_NE(other->info()->slot, slot);
  EXPECT_TRUE(layout.fixup_slots <= other->info()->slot.value &&
              other->info()->slot.value < layout.fixup_slots + 32ull * layout.fixup_count);
}

// Slots the engine did not leave unused (another instruction's, or bytes it does not
// recognise) are never written over; with none left the probe is refused and nothing written.
TEST(ExceptionTable, ATakenOrUnknownSlotIsNeverWrittenOver) {
  ProbedGuest g;
  const auto layout = *g.host->layout(g.dom);
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  // Slot 0: a byte that is not int3; slot 1: an entry that points at the slot (taken by
  // something else). Every other slot: entries for another fixup.
  const std::byte other{0x90};
  ASSERT_TRUE((*gv)->write(Gva{layout.fixup_slots + 5}, std::span(&other, 1)));
  auto take = [&](unsigned k, std::uint64_t fixup) {
    const std::uint64_t at = layout.fixup_table + 12ull * k, slot = layout.fixup_slots + 32ull * k;
    std::int32_t f[3] = {static_cast<std::int32_t>(slot - at), static_cast<std::int32_t>(fixup - (at + 4)), 3};
    return (*gv)->write(Gva{at}, std::as_bytes(std::span(f)));
  };
  const std::uint64_t elsewhere = *g.host->symbol(g.dom, "demo_get_user");
  ASSERT_TRUE(take(1, elsewhere));
  auto p = g.session->probe(g.dom, "demo_uaccess_copy+0x8", nop());
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(p->info()->slot.value, layout.fixup_slots + 64) << "slots 0 and 1 are not the engine's to take";
  EXPECT_EQ(g.peek(layout.fixup_slots + 5, 1)[0], 0x90);
  EXPECT_EQ(fixup_entry(g, 1).fixup, elsewhere);
  for (unsigned k = 3; k < layout.fixup_count; ++k) ASSERT_TRUE(take(k, elsewhere));
  Gva b = *g.session->resolve(g.dom, "demo_get_user+0x5");
  auto before = g.peek(b.value, 8);
  auto full = g.session->probe(g.dom, b, nop());
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::NoSpace);
  EXPECT_NE(full.error().what.find("fixup slots"), std::string::npos) << full.error().what;
  EXPECT_EQ(g.peek(b.value, 8), before) << "a refusal writes nothing";
}

// A guest module that gives no fixup slots (an older one): refused, with what would work.
TEST(ExceptionTable, WithoutFixupSlotsItIsRefusedAndTheRefusalSaysWhatWouldWork) {
  hv::sim::DomainConfig cfg = demo_config();
  cfg.module_fixup_slots = false;
  ProbedGuest g(cfg);
  Gva a = *g.session->resolve(g.dom, "demo_get_user+0x5");
  auto before = g.peek(a.value, 8);
  auto p = g.session->probe(g.dom, a, nop());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::InvalidArgument);
  EXPECT_NE(p.error().what.find("rule 'exception-table'"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("gives no fixup slots"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("the vmevent channel in int3 mode"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("every channel when the guest module gives fixup slots"), std::string::npos)
      << p.error().what;
  EXPECT_EQ(g.peek(a.value, 8), before);
}

TEST(AddressRules, ANeighbourRunOutOfLineIsCheckedToo) {
  ProbedGuest g;
  // push %rbx, then a rep movsb the exception table covers.
  Gva push = *g.session->resolve(g.dom, "demo_uaccess_neighbour+0x8");
  ASSERT_EQ(g.peek(push.value, 1)[0], 0x53);
  auto p = g.session->probe(g.dom, push, nop());
  if (test_channel() != ChannelKind::Debugger) {
    EXPECT_TRUE(p) << p.error().what;  // only the push runs out of line there
    return;
  }
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("neighbour"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("rule 'exception-table'"), std::string::npos) << p.error().what;
}

TEST(AddressRules, TheGuestModulesOwnTextIsRefused) {
  ProbedGuest g;
  auto layout = g.host->layout(g.dom);
  ASSERT_TRUE(layout);
  // The module's code after its static OEA pool, as it publishes module-text.
  Gva code{layout->oea_addr + layout->oea_size + 0x10};
  auto p = g.session->probe(g.dom, code, nop());
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("rule 'module-text'"), std::string::npos) << p.error().what;
}

TEST(AddressRules, RefusalsNameTheTableEntry) {
  ProbedGuest g;
  auto ex = g.session->probe(g.dom, "demo_load_zeropad+0x5", nop());
  ASSERT_FALSE(ex);
  EXPECT_EQ(ex.error().code, Errc::InvalidArgument);
  EXPECT_NE(ex.error().what.find("__ex_table entry demo_load_zeropad+0x5"), std::string::npos) << ex.error().what;
  EXPECT_NE(ex.error().what.find("fixup demo_load_zeropad+0x8"), std::string::npos) << ex.error().what;
  EXPECT_NE(ex.error().what.find("type 20"), std::string::npos) << ex.error().what;
  EXPECT_NE(ex.error().what.find("zeropad"), std::string::npos) << ex.error().what;
  auto jl = g.session->probe(g.dom, "demo_static_branch+0x5", nop());
  ASSERT_FALSE(jl);
  EXPECT_EQ(jl.error().code, Errc::Busy);
  EXPECT_NE(jl.error().what.find("key demo_static_key"), std::string::npos) << jl.error().what;
  auto sc = g.session->probe(g.dom, "demo_static_call+0x5", nop());
  ASSERT_FALSE(sc);
  EXPECT_NE(sc.error().what.find("key __SCK__demo_hook"), std::string::npos) << sc.error().what;
}

TEST(AddressRules, DataAndAddressesOutsideTheTextAreRefused) {
  ProbedGuest g;
  Gva key{g.sym("demo_static_key")};
  auto before = g.peek(key.value, 8);
  auto p = g.session->probe(g.dom, key, nop());
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("rule 'not-kernel-text'"), std::string::npos) << p.error().what;
  EXPECT_EQ(g.peek(key.value, 8), before);
  auto r = g.session->ret_probe(g.dom, key, {}, [](HitContext&, std::span<std::byte>) {});
  ASSERT_FALSE(r);
}

TEST(AddressRules, WithoutSymbolsNothingIsProbed) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config(1, 1);
  c.start_paused = true;
  DomId dom = *host->create_domain(c);
  auto hv = host->open();
  auto ch = channel::DebuggerChannel::open(*hv);
  ASSERT_TRUE(ch) << ch.error().what;
  probe::Engine engine(*hv, **ch);
  const std::uint64_t at = *host->symbol(dom, "sys_getppid") + 5;
  auto id = engine.add(dom, Gva{at}, [](HitContext&) { return 0; }, {});
  ASSERT_FALSE(id);
  EXPECT_NE(id.error().what.find("rule 'no-symbols'"), std::string::npos) << id.error().what;
  EXPECT_NE(id.error().what.find("load_symbols()"), std::string::npos) << id.error().what;
}

TEST(AddressRules, AForeignBreakpointEarlierInTheFunctionMakesItsBoundariesUntrusted) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  // An in-guest kprobe's int3 over the first byte of `sub $…, %rax` at demo_classify+0x8.
  const std::uint64_t foreign = g.sym("demo_classify") + 0x8;
  std::uint8_t orig = g.peek(foreign, 1)[0], cc = 0xcc;
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(&cc, 1))));
  auto p = g.session->probe(g.dom, Gva{g.sym("demo_classify") + 0x15}, nop());  // mov %rax,%rcx
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::Busy);
  EXPECT_NE(p.error().what.find("rule 'foreign-trap'"), std::string::npos) << p.error().what;
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(&orig, 1))));
  auto q = g.session->probe(g.dom, Gva{g.sym("demo_classify") + 0x15}, nop());
  EXPECT_TRUE(q) << q.error().what;
}

TEST(AddressRules, AnOptimizedKprobesJumpEarlierInTheFunctionMakesItsBoundariesUntrusted) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  // An in-guest optimized kprobe at demo_classify+0x8: `jmp rel32` to a detour buffer in the
  // module area, over the instructions there (leaving the rest of their bytes).
  const std::uint64_t fn = g.sym("demo_classify"), foreign = fn + 0x8, buffer = 0xffffffffc0201000ull;
  const auto orig = g.peek(foreign, 5);
  const auto rel =
      static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<std::int64_t>(buffer - (foreign + 5))));
  const std::uint8_t jmp[5] = {0xe9, static_cast<std::uint8_t>(rel), static_cast<std::uint8_t>(rel >> 8),
                               static_cast<std::uint8_t>(rel >> 16), static_cast<std::uint8_t>(rel >> 24)};
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(jmp))));
  const auto before = g.peek(fn, 0x20);
  auto p = g.session->probe(g.dom, Gva{fn + 0x15}, nop());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::Busy);
  EXPECT_NE(p.error().what.find("rule 'foreign-jump'"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("0xffffffffc0201000"), std::string::npos) << p.error().what;
  EXPECT_EQ(g.peek(fn, 0x20), before) << "a refusal writes nothing";
  auto early = g.session->probe(g.dom, Gva{fn + 0x5}, nop());  // before the jump: as ever
  EXPECT_TRUE(early) << early.error().what;
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(orig))));
  auto q = g.session->probe(g.dom, Gva{fn + 0x15}, nop());
  EXPECT_TRUE(q) << q.error().what;
}

// guest/safety.S's demo_bug_end (never run): +0x0a ud2 (a WARN: the kernel goes on) · +0x0c
// test %rdi · +0x11 mov $1,%eax · +0x16 ret · +0x17 int3 · +0x18 ud2 (a BUG) · +0x1a..+0x1f
// int3 to the function's end.
constexpr std::uint64_t kWarnNext = 0x0c, kMov = 0x11, kAfterRet = 0x17, kBug = 0x18, kPadding = 0x1a, kEnd = 0x20;

// The part of a refusal after the instruction it names: the rule's reason.
std::string reason(const Error& e) {
  auto at = e.what.find(": foreign breakpoint");
  return at == std::string::npos ? e.what : e.what.substr(at);
}

TEST(AddressRules, ThePaddingAfterABugIsRefusedAsThePaddingAfterARet) {
  ProbedGuest g;
  const std::uint64_t fn = g.sym("demo_bug_end");
  const std::vector<std::uint8_t> bug_and_padding = {0x0f, 0x0b, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc};
  ASSERT_EQ(g.peek(fn + kBug, kEnd - kBug), bug_and_padding);
  const auto before = g.peek(fn, kEnd);
  auto after_ret = g.session->probe(g.dom, Gva{fn + kAfterRet}, nop());
  ASSERT_FALSE(after_ret);
  EXPECT_EQ(after_ret.error().code, Errc::Busy);
  EXPECT_NE(after_ret.error().what.find("foreign breakpoint: an int3/ICEBP is already there"), std::string::npos)
      << after_ret.error().what;
  EXPECT_EQ(after_ret.error().what.find("rule '"), std::string::npos) << after_ret.error().what;
  for (std::uint64_t off = kPadding; off < kEnd; ++off) {
    SCOPED_TRACE(off);
    auto p = g.session->probe(g.dom, Gva{fn + off}, nop());
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, Errc::Busy);
    EXPECT_EQ(p.error().what.find("rule 'foreign-trap'"), std::string::npos) << p.error().what;
    EXPECT_EQ(reason(p.error()), reason(after_ret.error())) << p.error().what;
  }
  // The BUG's ud2 by its own rule, the code before it as ever.
  auto bug = g.session->probe(g.dom, Gva{fn + kBug}, nop());
  ASSERT_FALSE(bug);
  EXPECT_NE(bug.error().what.find("deliberate #UD"), std::string::npos) << bug.error().what;
  EXPECT_EQ(g.peek(fn, kEnd), before) << "a refusal writes nothing";
  auto mov = g.session->probe(g.dom, Gva{fn + kMov}, nop());
  ASSERT_TRUE(mov) << mov.error().what;
  ASSERT_TRUE(mov->unregister());
  EXPECT_EQ(g.peek(fn, kEnd), before);
}

TEST(AddressRules, AForeignBreakpointAfterAWarnStaysForeign) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  // An in-guest kprobe's int3 over the first byte of `test %rdi,%rdi`, the instruction a WARN's
  // ud2 goes on with: in the flow, so every point past it is refused as before.
  const std::uint64_t fn = g.sym("demo_bug_end"), foreign = fn + kWarnNext;
  std::uint8_t orig = g.peek(foreign, 1)[0], cc = 0xcc;
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(&cc, 1))));
  for (std::uint64_t off : {kWarnNext, kMov, kPadding}) {
    SCOPED_TRACE(off);
    auto p = g.session->probe(g.dom, Gva{fn + off}, nop());
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, Errc::Busy);
    EXPECT_NE(p.error().what.find("rule 'foreign-trap'"), std::string::npos) << p.error().what;
  }
  ASSERT_TRUE((*gv)->write(Gva{foreign}, std::as_bytes(std::span(&orig, 1))));
  auto q = g.session->probe(g.dom, Gva{fn + kMov}, nop());
  EXPECT_TRUE(q) << q.error().what;
}

TEST(TextChecks, EnableAfterTheGuestRewroteTheInstructionIsRefused) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  const std::uint64_t at = g.sym("demo_classify") + 0x15;  // mov %rax,%rcx (3 bytes)
  auto p = g.session->probe(g.dom, Gva{at}, nop());
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_TRUE(p->disable());
  // The guest rewrites it meanwhile (as a static key flip or a module reload would).
  const std::uint8_t other[3] = {0x48, 0x89, 0xc2};  // mov %rax,%rdx
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(other))));
  auto e = p->enable();
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Errc::Again);
  EXPECT_NE(e.error().what.find("rule 'text-changed'"), std::string::npos) << e.error().what;
  EXPECT_EQ(g.peek(at, 3), std::vector<std::uint8_t>(other, other + 3)) << "no trap over bytes we did not decode";
}

TEST(TextChecks, DisarmLeavesAByteTheGuestRewroteAlone) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  const std::uint64_t at = g.sym("demo_classify") + 0x15;
  auto p = g.session->probe(g.dom, Gva{at}, nop());
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(g.peek(at, 1)[0], trap_byte());
  const std::uint8_t theirs = 0x90;
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&theirs, 1))));
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(at, 1)[0], theirs) << "the saved byte must not be written over the guest's own";
}

TEST(EntryPlacement, NameAndStartAddressBothLandPastTheFtraceSite) {
  ProbedGuest g;
  std::uint64_t hits = 0;
  auto by_name = g.session->probe(g.dom, "sys_getppid", [&](HitContext& c) {
    EXPECT_EQ(c.regs().rip, g.entry("sys_getppid"));
    ++hits;
    return 0;
  });
  ASSERT_TRUE(by_name) << by_name.error().what;
  auto by_addr = g.session->probe(g.dom, Gva{g.sym("sys_getppid")}, nop());
  ASSERT_TRUE(by_addr) << by_addr.error().what;
  EXPECT_EQ(by_addr->info()->address.value, g.entry("sys_getppid"));
  EXPECT_EQ(by_addr->info()->requested.value, g.sym("sys_getppid"));
  // The ftrace nop itself is untouched; the trap is on the next instruction.
  EXPECT_EQ(g.peek(g.sym("sys_getppid"), 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00}));
  EXPECT_EQ(g.peek(g.entry("sys_getppid"), 1)[0], trap_byte());
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, expected_calls(DEMO_FN_GETPPID, 5)) << "every call is still seen";
}

}  // namespace
}  // namespace xenprobes::testing

namespace xenprobes::testing {
namespace {

// Page-table isolation: vCPU 0 in user mode holds the user half of its top-level table pair,
// which maps no kernel text (the simulated Xen allocates the pair as Linux does). Kernel text
// is still decoded and patched, through the kernel half.
TEST(KernelPageTables, AVcpuHoldingUserPageTablesDoesNotHideKernelText) {
  hv::sim::DomainConfig c = demo_config(1, 5);
  c.type = hv::GuestType::Hvm;
  ProbedGuest g(c);
  hv::Hypervisor& hv = g.session->hypervisor();
  hv::VcpuRegs r = *hv.get_vcpu_regs(g.dom, VcpuId{0});
  const std::uint64_t kernel_cr3 = r.cr3;
  ASSERT_EQ(kernel_cr3 & 0x1fffu, 0u) << "the kernel half of an 8 KiB pair";
  r.cr3 = kernel_cr3 | 0x1000;
  ASSERT_TRUE(hv.set_vcpu_regs(g.dom, VcpuId{0}, r));
  std::uint64_t hits = 0;
  auto p = g.session->probe(g.dom, "sys_getppid", [&](HitContext&) {
    ++hits;
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  r.cr3 = kernel_cr3;  // back in the kernel before it runs
  ASSERT_TRUE(hv.set_vcpu_regs(g.dom, VcpuId{0}, r));
  EXPECT_EQ(g.peek(g.entry("sys_getppid"), 1)[0], trap_byte());
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, expected_calls(DEMO_FN_GETPPID, 5));
}

// A removal that fails keeps the registration and the caller's handle: the probe may still be
// armed, and a retry must find it instead of "succeeding" with the trap byte in the guest. The
// second registration of a point exercises the slot move (its post-handler's trap tail goes).
TEST(Unregister, AFailedUnregisterKeepsTheHandleAndARetryFinishesTheJob) {
  ProbedGuest g;
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  const std::uint64_t at = g.sym("sys_getppid") + 0x38;  // boosted: a slot
  auto first = g.session->probe(g.dom, Gva{at}, [](HitContext&) { return 0; });
  ASSERT_TRUE(first) << first.error().what;
  auto second = g.session->probe(g.dom, Gva{at}, {}, [](HitContext&) {});
  ASSERT_TRUE(second) << second.error().what;
  unsigned failures = 0;
  for (std::uint64_t n = 0; n < 200; ++n) {
    g.host->fail_nth_call(n, Errc::Io);
    auto r = second->unregister();
    g.host->clear_faults();
    if (r) break;
    ++failures;
    EXPECT_TRUE(*second) << "fault at call " << n << ": the handle was dropped";
    EXPECT_TRUE(second->info()) << "fault at call " << n << ": the registration is gone";
    EXPECT_EQ(g.peek(at, 1)[0], trap_byte()) << "fault at call " << n << ": the point lost its trap";
  }
  EXPECT_GT(failures, 0u);
  EXPECT_FALSE(*second);
  ASSERT_TRUE(first->info());
  EXPECT_EQ(first->info()->mode, ExecMode::Boosted) << "the post-handler's trap tail went with it";
  for (std::uint64_t n = 0; n < 200; ++n) {
    g.host->fail_nth_call(n, Errc::Io);
    auto r = first->unregister();
    g.host->clear_faults();
    if (r) break;
    EXPECT_TRUE(*first) << "fault at call " << n;
  }
  EXPECT_FALSE(*first);
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "text restored exactly";
}

// ---- limits (SessionLimits) -----------------------------------------------------------------

SessionLimits limits_with(unsigned domains, unsigned points, unsigned instances, std::size_t frames = 256) {
  SessionLimits l;
  l.domains = domains, l.points_per_domain = points, l.instances_per_domain = instances;
  l.mapped_frames_per_domain = frames;
  return l;
}

TEST(Limits, ADomainOverTheLimitIsRefusedWithEnospcAndLeftUntouched) {
  ProbedGuest g(demo_config(), {}, limits_with(1, 4096, 16384));
  auto cfg = demo_config();
  cfg.start_paused = true;
  auto second = g.host->create_domain(cfg);
  ASSERT_TRUE(second) << second.error().what;
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a) << a.error().what;
  const auto before = g.peek_at(*second, g.sym("sys_read"), 64);
  // Loading its symbols attaches the domain: refused there, and so is a probe by address.
  auto l = g.session->load_symbols(*second, demo_map());
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code, Errc::NoSpace);
  EXPECT_NE(l.error().what.find("SessionLimits::domains"), std::string::npos) << l.error().what;
  auto b = g.session->probe(*second, Gva{g.entry("sys_read")}, [](HitContext&) { return 0; });
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, Errc::NoSpace);
  EXPECT_EQ(g.peek_at(*second, g.sym("sys_read"), 64), before);
  EXPECT_EQ(*g.host->pause_count(*second), 1u) << "only its creator's pause";
}

TEST(Limits, APointOverTheLimitIsRefusedAndAnotherHandlerOnAnExistingPointIsNot) {
  ProbedGuest g(demo_config(), {}, limits_with(64, 2, 16384));
  auto h = [](HitContext&) { return 0; };
  auto a = g.session->probe(g.dom, "sys_read", h);
  auto b = g.session->probe(g.dom, "sys_write", h);
  ASSERT_TRUE(a && b);
  const auto text = g.peek(g.sym("sys_getppid"), 64);
  auto c = g.session->probe(g.dom, "sys_getppid", h);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Errc::NoSpace);
  EXPECT_NE(c.error().what.find("SessionLimits::points_per_domain"), std::string::npos) << c.error().what;
  EXPECT_EQ(g.peek(g.sym("sys_getppid"), 64), text) << "nothing written";
  auto same = g.session->probe(g.dom, "sys_read", h);
  EXPECT_TRUE(same) << "a second handler on a point already there adds no point";
  ASSERT_TRUE(b->unregister());
  auto d = g.session->probe(g.dom, "sys_getppid", h);
  EXPECT_TRUE(d) << "room again after a removal";
}

TEST(Limits, ReturnProbeInstancesOverTheLimitAreRefused) {
  ProbedGuest g(demo_config(), {}, limits_with(64, 4096, 20));
  auto entry = [](HitContext&, std::span<std::byte>) { return 0; };
  auto ret = [](HitContext&, std::span<std::byte>) {};
  auto a = g.session->ret_probe(g.dom, "sys_read", entry, ret, RetProbeOptions{16, 0});
  ASSERT_TRUE(a) << a.error().what;
  auto b = g.session->ret_probe(g.dom, "sys_write", entry, ret, RetProbeOptions{8, 0});
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, Errc::NoSpace);
  EXPECT_NE(b.error().what.find("SessionLimits::instances_per_domain"), std::string::npos) << b.error().what;
  auto c = g.session->ret_probe(g.dom, "sys_write", entry, ret, RetProbeOptions{4, 0});
  EXPECT_TRUE(c) << "16 + 4 fits";
}

// One mapped frame per domain still serves handlers that read across pages (each read maps
// what it needs, evicting the last), and the guest finishes unchanged.
TEST(Limits, OneMappedFrameIsEnoughForHandlersToReadGuestMemory) {
  ProbedGuest g(demo_config(), {}, limits_with(64, 4096, 16384, 1));
  std::uint64_t ok = 0, hits = 0;
  auto p = g.session->probe(g.dom, "sys_read", [&](HitContext& c) {
    ++hits;
    std::array<std::byte, 64> stack{}, text{};
    if (c.read(Gva{c.regs().rsp}, stack) && c.read(c.address(), text)) ++ok;
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_GT(hits, 0u);
  EXPECT_EQ(ok, hits);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 5).checksum);
}

TEST(Limits, AZeroLimitIsRefusedAtOpen) {
  auto host = hv::sim::SimHost::create();
  SessionOptions o;
  o.limits.points_per_domain = 0;
  auto s = Session::open(host->open(), o);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::InvalidArgument);
  EXPECT_NE(s.error().what.find("points_per_domain"), std::string::npos) << s.error().what;
}

}  // namespace
}  // namespace xenprobes::testing
