// The real probe engine over the guest channel: probe::Engine constructed with a GuestChannel
// directly (no Session), XP pre/post handlers on the demo guest.
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
