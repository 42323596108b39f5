// The real probe engine over the guest channel: probe::Engine constructed with a GuestChannel
// directly (no Session), XP pre/post handlers on the demo guest.
#include <algorithm>
#include <cstring>
#include <new>

#include "guestch/guestch_fixture.hpp"
#include "probe/engine.hpp"

namespace xenprobes::testing {
namespace {

struct EngineGuest {
  ChannelGuest g;
  probe::Engine engine;  // after g: destroyed first (it detaches, restoring every byte)

  explicit EngineGuest(hv::sim::DomainConfig cfg) : g(cfg), engine(*g.hv, *g.ch) {
    auto r = engine.set_symbols(g.dom, g.demo_symbols());
    if (!r) throw std::runtime_error(r.error().what);
  }
  Gva resolve(const char* expr) {
    auto a = engine.symbols(g.dom)->resolve(expr);
    if (!a) throw std::runtime_error(a.error().what);
    return *a;
  }
  // The event loop: the channel's fd, process, then what handlers deferred.
  bool run_to_completion(std::chrono::milliseconds timeout = 60s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{g.ch->fd(), POLLIN, 0};
      (void)::poll(&p, 1, 2);
      g.acknowledge();
      auto r = g.ch->process(engine);
      if (!r) {
        ADD_FAILURE() << "process: " << r.error().what;
        return false;
      }
      if (auto d = engine.after_dispatch(); !d) {
        ADD_FAILURE() << "after_dispatch: " << d.error().what;
        return false;
      }
      if (!g.host->crash_reason(g.dom).empty()) return false;
      if (g.host->wait_halted(g.dom, 0ms)) return true;
    }
    return false;
  }
};

void pre_post_hits_equal_calls(hv::GuestType type, unsigned vcpus) {
  constexpr std::uint64_t kIters = 4;
  auto cfg = guest_config(vcpus, kIters);
  cfg.type = type;
  EngineGuest e(cfg);
  const auto text = e.g.peek(e.g.layout.text_start, e.g.layout.text_end - e.g.layout.text_start);
  std::uint64_t open = 0, recurse = 0, posts = 0, classify_pre = 0, classify_post = 0;
  const Gva load = e.resolve("sys_getppid+0x38");  // movslq demo_ppid(%rip), %rax: boosted, trap after
  auto p1 = e.engine.add(e.g.dom, e.resolve("sys_open"),
                         [&](HitContext& c) {
                           EXPECT_EQ(c.regs().rip, c.address().value);
                           ++open;
                           return 0;
                         },
                         {});
  auto p2 = e.engine.add(e.g.dom, e.resolve("demo_recurse"),
                         [&](HitContext&) {
                           ++recurse;
                           return 0;
                         },
                         {});
  auto p3 = e.engine.add(e.g.dom, load, {}, [&](HitContext& c) {
    EXPECT_EQ(c.regs().rax, 1u) << "demo_ppid is 1";
    EXPECT_EQ(c.regs().rip, load.value + 7) << "post-handlers see the next instruction";
    ++posts;
  });
  auto p4 = e.engine.add(
      e.g.dom, e.resolve("demo_classify+0x5"),
      [&](HitContext&) {
        ++classify_pre;
        return 0;
      },
      [&](HitContext&) { ++classify_post; });
  ASSERT_TRUE(p1) << p1.error().what;
  ASSERT_TRUE(p2) << p2.error().what;
  ASSERT_TRUE(p3) << p3.error().what;
  ASSERT_TRUE(p4) << p4.error().what;
  ASSERT_GE(e.g.ch->traps(e.g.dom), 4u)
      << "the engine did not report its traps to the channel (TrapTable::trap_added): every hit would be "
         "a foreign int3 to the guest module";
  e.g.host->reset_counts();
  e.g.start();
  ASSERT_TRUE(e.run_to_completion()) << e.g.host->crash_reason(e.g.dom);
  EXPECT_EQ(open, vcpus * expected_calls(DEMO_FN_OPEN, kIters));
  EXPECT_EQ(recurse, vcpus * expected_calls(DEMO_FN_RECURSE, kIters));
  EXPECT_EQ(posts, vcpus * expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(classify_pre, vcpus * expected_calls(DEMO_FN_CLASSIFY, kIters));
  EXPECT_EQ(classify_post, classify_pre);
  EXPECT_EQ(e.engine.stats(*p1).hits, open);
  EXPECT_EQ(e.engine.stats(*p1).unhandled, 0u);
  for (unsigned v = 0; v < vcpus; ++v) {
    EXPECT_EQ(e.g.stats(v).checksum, reference_stats(v, kIters, vcpus).checksum) << "vcpu " << v;
    EXPECT_EQ(e.g.stats(v).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, kIters));
  }
  auto c = e.g.ch->module_counters(e.g.dom);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->timeouts, 0u);
  EXPECT_EQ(c->foreign, 0u);
  EXPECT_EQ(e.g.host->op_count(hv::sim::Op::SetRegs), 0u) << "no vCPU context on the hit path";
  EXPECT_EQ(e.g.host->op_count(hv::sim::Op::Pause), 0u) << "no domain pause on the hit path";
  for (auto id : {*p1, *p2, *p3, *p4}) ASSERT_TRUE(e.engine.remove(id));
  // Every probe point's trap is gone; the two post-handler slot traps may stay until the
  // guest module confirms the quiescence their slots wait for.
  EXPECT_LE(e.g.ch->traps(e.g.dom), 2u) << "every probe point's trap reported removed";
  EXPECT_EQ(e.g.peek(e.g.layout.text_start, text.size()), text) << "text restored exactly";
}

TEST(GuestChannelEngine, ReturnProbesThroughTheReturnTable) {
  // XrP over the guest channel: the engine reports every live instance (return_added) and
  // its trampoline (a Return trap); entries and returns match the calls, recursion included.
  constexpr std::uint64_t kIters = 3;
  EngineGuest e(guest_config(1, kIters));
  std::uint64_t entries = 0, returns = 0;
  auto p = e.engine.add_ret(
      e.g.dom, e.resolve("demo_recurse"),
      [&](HitContext&, std::span<std::byte>) {
        ++entries;
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{});
  ASSERT_TRUE(p) << p.error().what;
  e.g.start();
  ASSERT_TRUE(e.run_to_completion()) << e.g.host->crash_reason(e.g.dom);
  EXPECT_EQ(entries, expected_calls(DEMO_FN_RECURSE, kIters));
  EXPECT_EQ(returns, entries);
  EXPECT_EQ(e.engine.stats(*p).untracked_calls, 0u);
  EXPECT_EQ(e.g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(e.g.ch->module_counters(e.g.dom)->timeouts, 0u);
}

TEST(GuestChannelEngine, Dom0KilledTheGuestFinishesOnItsOwn) {
  // The engine's own trap entries (slots, slot traps, emulated branches, the trampoline and
  // return instances) must let the module finish every hit without Dom0. The Dom0 process
  // "dies": no destructor of the engine runs (it lives in static storage, never destroyed),
  // the channel and the handle close.
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 6;
  ChannelGuest g(guest_config(kVcpus, kIters, 30));
  const auto text = g.peek(g.layout.text_start, g.layout.text_end - g.layout.text_start);
  alignas(probe::Engine) static unsigned char storage[sizeof(probe::Engine)];
  auto* engine = new (storage) probe::Engine(*g.hv, *g.ch);
  ASSERT_TRUE(engine->set_symbols(g.dom, g.demo_symbols()));
  auto at = [&](const char* expr) { return *engine->symbols(g.dom)->resolve(expr); };
  std::uint64_t hits = 0;
  auto count = [&](HitContext&) {
    ++hits;
    return 0;
  };
  ASSERT_TRUE(engine->add(g.dom, at("sys_open"), count, {}));
  ASSERT_TRUE(engine->add(g.dom, at("sys_getppid+0x38"), {}, [&](HitContext&) { ++hits; }));
  ASSERT_TRUE(engine->add(g.dom, at("demo_classify+0x5"), count, [&](HitContext&) { ++hits; }));
  ASSERT_TRUE(engine->add_ret(
      g.dom, at("demo_recurse"),
      [&](HitContext&, std::span<std::byte>) {
        ++hits;
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++hits; }, RetProbeOptions{}));
  g.start();
  auto end = std::chrono::steady_clock::now() + 30s;
  while (hits < 200 && std::chrono::steady_clock::now() < end) {
    pollfd p{g.ch->fd(), POLLIN, 0};
    (void)::poll(&p, 1, 2);
    g.acknowledge();
    ASSERT_TRUE(g.ch->process(*engine));
    ASSERT_TRUE(engine->after_dispatch());
  }
  ASSERT_GE(hits, 200u) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.header().timeouts, 0u) << "the module's clock stood still while Dom0 answered";
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, kVcpus) >= 1; }));
  g.kill_dom0();
  ASSERT_TRUE(g.advance_until_halted(30ms)) << g.host->crash_reason(g.dom);
  for (unsigned v = 0; v < kVcpus; ++v) {
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus).checksum) << "vcpu " << v;
    EXPECT_EQ(g.stats(v).calls[DEMO_FN_RECURSE], expected_calls(DEMO_FN_RECURSE, kIters));
  }
  EXPECT_EQ(g.header().dom0_gone, 1u);
  EXPECT_EQ(g.peek(g.layout.text_start, text.size()), text) << "the module restored every probe point";
}

TEST(GuestChannelEngine, PvPrePostHitsEqualCalls) { pre_post_hits_equal_calls(hv::GuestType::Pv, 2); }
TEST(GuestChannelEngine, HvmPrePostHitsEqualCalls) { pre_post_hits_equal_calls(hv::GuestType::Hvm, 1); }

}  // namespace
}  // namespace xenprobes::testing

namespace xenprobes::testing {
namespace {

// What the module's trap table says about one address (read through the sim).
std::optional<xenprobes_trap> module_trap(ChannelGuest& g, Gva addr) {
  const auto h = g.header();
  for (const xenprobes_trap& t : g.peek_array<xenprobes_trap>(g.layout.control_addr + h.trap_offset, h.nr_traps))
    if (t.addr == addr.value) return t;
  return std::nullopt;
}

TEST(GuestChannelEngine, APointThatChangesSlotsSendsTheModulesFallbackToTheNewSlot) {
  // A post-handler added to an armed boosted point moves it to a slot with a trap tail, and
  // removing it moves it again. The module's entry for the point (what it runs when Dom0 does
  // not answer) must follow: the old slot is released and, once quiescent, reused.
  EngineGuest e(guest_config(1, 1));
  const Gva load = e.resolve("sys_getppid+0x38");  // movslq demo_ppid(%rip), %rax: boosted
  auto slot_of = [&](probe::ProbeId id) { return e.engine.info(id)->slot; };
  auto pre = e.engine.add(e.g.dom, load, [](HitContext&) { return 0; }, {});
  ASSERT_TRUE(pre) << pre.error().what;
  const Gva first = slot_of(*pre);
  auto t = module_trap(e.g, load);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->flags, XENPROBES_TRAP_FALLBACK);
  EXPECT_EQ(t->fallback, first.value);

  auto post = e.engine.add(e.g.dom, load, {}, [](HitContext&) {});
  ASSERT_TRUE(post) << post.error().what;
  const Gva second = slot_of(*pre);
  ASSERT_NE(second, first);
  t = module_trap(e.g, load);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fallback, second.value) << "the module would resume in the released slot";

  ASSERT_TRUE(e.engine.remove(*post));
  const Gva third = slot_of(*pre);
  ASSERT_NE(third, second);
  t = module_trap(e.g, load);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fallback, third.value) << "the module would resume in the released slot";
}

}  // namespace
}  // namespace xenprobes::testing

// protocol.h, "Return slots written by the module": with a module that publishes
// XENPROBES_FEATURE_RET_WRITE, a return probe's entry hit has the module write the return slot,
// and Dom0 maps no guest stack for it; with an older module Dom0 writes it as before. Either
// way every call is seen, in the same order, with the same results.
namespace xenprobes::testing {
namespace {

std::uint64_t recurse_ref(std::uint64_t n) {
  if (n == 0) return 1;
  std::uint64_t r = recurse_ref(n - 1);
  return (r ^ (r >> 7)) * 0x9e3779b97f4a7c15ULL + n;
}

struct RetRun {
  struct Return {
    unsigned fn;
    std::uint64_t arg, rip, rax;
    bool operator==(const Return&) const = default;
  };
  std::vector<Return> returns;  // in the order they came
  std::uint64_t entries[3] = {};
  ProbeStats stats[3];
  std::uint64_t maps = 0, get_regs = 0;  // hypervisor calls from the guest's start to its end
  std::uint64_t ret_writes = 0;          // answers that asked the module for the write
  std::uint32_t refused = 0;
  std::uint64_t wrong_recurse = 0;
  demo_stats st{};
};

// XrPs on demo_recurse (recursive: nested instances), demo_classify (several returns) and
// sys_getppid; handlers that read no guest memory (the entry keeps the argument in the call's
// data), so every map the run makes is the engine's own.
RetRun run_ret_probes(bool module_writes, std::uint64_t iters) {
  auto cfg = guest_config(1, iters);
  cfg.module_ret_write = module_writes;
  EngineGuest e(cfg);
  RetRun out;
  const char* fns[3] = {"demo_recurse", "demo_classify", "sys_getppid"};
  std::vector<probe::ProbeId> ids;
  for (unsigned f = 0; f < 3; ++f) {
    auto p = e.engine.add_ret(
        e.g.dom, e.resolve(fns[f]),
        [&out, f](HitContext& c, std::span<std::byte> d) {
          ++out.entries[f];
          std::memcpy(d.data(), &c.regs().rdi, 8);
          return 0;
        },
        [&out, f](HitContext& c, std::span<std::byte> d) {
          std::uint64_t arg;
          std::memcpy(&arg, d.data(), 8);
          out.returns.push_back({f, arg, c.regs().rip, c.regs().rax});
          if (f == 0 && c.regs().rax != recurse_ref(arg)) ++out.wrong_recurse;
        },
        RetProbeOptions{32, 8});
    if (!p) throw std::runtime_error(p.error().what);
    ids.push_back(*p);
  }
  e.g.host->reset_counts();
  e.g.start();
  if (!e.run_to_completion()) throw std::runtime_error("the guest did not finish: " + e.g.host->crash_reason(e.g.dom));
  out.maps = e.g.host->op_count(hv::sim::Op::MapFrames);
  out.get_regs = e.g.host->op_count(hv::sim::Op::GetRegs);
  for (unsigned f = 0; f < 3; ++f) out.stats[f] = e.engine.stats(ids[f]);
  out.ret_writes = e.g.ch->stats(e.g.dom).ret_writes;
  out.refused = e.g.ch->module_counters(e.g.dom)->ret_refused;
  out.st = e.g.stats(0);
  return out;
}

TEST(GuestChannelRetWrite, TheModuleWritesTheSlotsDom0MapsNoStackAndTheResultsAreAnOlderModules) {
  constexpr std::uint64_t kIters = 3;
  const RetRun mod = run_ret_probes(true, kIters);
  const RetRun old = run_ret_probes(false, kIters);
  const unsigned fn_of[3] = {DEMO_FN_RECURSE, DEMO_FN_CLASSIFY, DEMO_FN_GETPPID};
  std::uint64_t calls = 0;
  for (unsigned f = 0; f < 3; ++f) {
    SCOPED_TRACE(f);
    const std::uint64_t want = expected_calls(fn_of[f], kIters);
    calls += want;
    for (const RetRun* r : {&mod, &old}) {
      EXPECT_EQ(r->entries[f], want);
      EXPECT_EQ(r->stats[f].hits, want);
      EXPECT_EQ(r->stats[f].returns, want);
      EXPECT_EQ(r->stats[f].untracked_calls, 0u);
      EXPECT_EQ(r->stats[f].reclaimed, 0u);
      EXPECT_EQ(r->stats[f].unhandled, 0u);
      EXPECT_EQ(r->stats[f].active, 0u);
    }
  }
  EXPECT_EQ(mod.returns.size(), calls);
  EXPECT_TRUE(mod.returns == old.returns) << "every return, in order, with its rip and rax";
  EXPECT_EQ(mod.wrong_recurse, 0u);
  EXPECT_EQ(mod.st.checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(old.st.checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(mod.refused, 0u);
  EXPECT_EQ(old.refused, 0u);
  // The module wrote every slot; Dom0 mapped nothing and asked Xen for no vCPU's cr3.
  EXPECT_EQ(mod.ret_writes, calls);
  EXPECT_EQ(mod.maps, 0u) << "Dom0 mapped guest frames for return probes the module serves";
  EXPECT_EQ(mod.get_regs, 0u);
  // The older module: Dom0 reads and writes each slot (a frame mapped, then mapped writable).
  EXPECT_EQ(old.ret_writes, 0u);
  EXPECT_GE(old.maps, calls) << "the older module's path is Dom0's own write";
  EXPECT_GE(old.get_regs, calls);
}

TEST(GuestChannelRetWrite, ASlotThatNoLongerHoldsTheReturnAddressIsRefusedAndNeverWritten) {
  // Dom0 is told a return address the slot does not hold (the guest wrote stack_top after the
  // hit was published, as a hostile or buggy guest may): the module refuses the write, counts
  // it, and the call returns to its caller untouched; the next calls are served as usual.
  constexpr std::uint64_t kIters = 2;
  EngineGuest e(guest_config(1, kIters));
  std::uint64_t entries = 0, returns = 0;
  auto p = e.engine.add_ret(
      e.g.dom, e.resolve("sys_getppid"),
      [&](HitContext&, std::span<std::byte>) {
        ++entries;
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{});
  ASSERT_TRUE(p) << p.error().what;
  const Gva tramp = e.engine.info(*p)->trampoline;
  e.g.start();
  ASSERT_TRUE(eventually([&] { return e.g.mailbox(0).state == XENPROBES_MBOX_HIT; }));
  const xenprobes_mailbox mb = e.g.mailbox(0);
  ASSERT_NE(mb.stack_top, 0u) << "the module told Dom0 the return address";
  const std::uint64_t bogus = mb.stack_top ^ 0x10;
  const std::uint64_t at =
      e.g.layout.control_addr + e.g.header().mailbox_offset + offsetof(xenprobes_mailbox, stack_top);
  ASSERT_TRUE(e.g.memory->write_u64(Gva{at}, bogus));
  ASSERT_TRUE(e.run_to_completion()) << e.g.host->crash_reason(e.g.dom);
  const std::uint64_t calls = expected_calls(DEMO_FN_GETPPID, kIters);
  EXPECT_EQ(entries, calls);
  EXPECT_EQ(returns, calls - 1) << "the refused call returned without the trampoline";
  EXPECT_EQ(e.g.ch->module_counters(e.g.dom)->ret_refused, 1u);
  EXPECT_EQ(e.g.ch->stats(e.g.dom).ret_writes, calls);
  EXPECT_EQ(e.g.stats(0).checksum, reference_stats(0, kIters).checksum) << "the guest ran as without probes";
  auto stacks = e.g.peek_array<std::uint64_t>(e.g.sym(DEMO_SYM_STACKS), DEMO_MAX_VCPUS * DEMO_STACK_SIZE / 8);
  EXPECT_EQ(std::count(stacks.begin(), stacks.end(), tramp.value), 0) << "no trampoline left on a stack";
  EXPECT_EQ(e.g.ch->module_counters(e.g.dom)->timeouts, 0u);
}

TEST(GuestChannelRetWrite, AWriteTheVcpuHasNotTakenYetIsWithdrawnByAnUnregister) {
  // Answered with the domain paused, the vCPU has not taken the answer (nor its write) when
  // the return probe goes: Dom0 withdraws the write (protocol.h "Cancelling"), and the module,
  // once it runs, writes nothing; the call returns to its caller.
  EngineGuest e(guest_config(1, 1));
  std::uint64_t entries = 0, returns = 0;
  auto p = e.engine.add_ret(
      e.g.dom, e.resolve("demo_recurse"),
      [&](HitContext&, std::span<std::byte>) {
        ++entries;
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{});
  ASSERT_TRUE(p) << p.error().what;
  e.g.start();
  ASSERT_TRUE(eventually([&] { return e.g.mailbox(0).state == XENPROBES_MBOX_HIT; }));
  const std::uint64_t slot = e.g.mailbox(0).regs.rsp;
  ASSERT_TRUE(e.g.hv->pause(e.g.dom));
  e.g.acknowledge();
  ASSERT_EQ(*e.g.ch->process(e.engine), 1u);
  ASSERT_EQ(e.g.mailbox(0).state, XENPROBES_MBOX_DONE);
  EXPECT_EQ(e.g.mailbox(0).ret_slot, slot) << "the answer asks for the write";
  ASSERT_TRUE(e.engine.remove(*p));
  EXPECT_EQ(e.g.mailbox(0).ret_slot, 0u) << "withdrawn before the vCPU took it";
  ASSERT_TRUE(e.g.hv->unpause(e.g.dom));
  ASSERT_TRUE(e.run_to_completion()) << e.g.host->crash_reason(e.g.dom);
  EXPECT_EQ(entries, 1u);
  EXPECT_EQ(returns, 0u);
  EXPECT_EQ(e.g.stats(0).checksum, reference_stats(0, 1).checksum);
  EXPECT_EQ(e.g.ch->module_counters(e.g.dom)->ret_refused, 0u) << "nothing taken, nothing refused";
  EXPECT_EQ(e.g.ch->module_counters(e.g.dom)->timeouts, 0u);
}

}  // namespace
}  // namespace xenprobes::testing
