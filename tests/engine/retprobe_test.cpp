// XrP return probes over the simulated Xen: entry/return pairing (plain, recursive,
// multi-return-path functions, several vCPUs), return values, maxactive and untracked calls, stale
// instances, unregister and detach with calls in flight, aggregates with XP probes.
#include <cstring>

#include "channel/debugger.hpp"
#include "probe/engine.hpp"
#include "xenprobes/guest_view.hpp"

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

// The demo guest's functions, recomputed here: the oracles for return values.
std::uint64_t demo_recurse_ref(std::uint64_t n) {
  if (n == 0) return 1;
  std::uint64_t r = demo_recurse_ref(n - 1);
  return (r ^ (r >> 7)) * 0x9e3779b97f4a7c15ULL + n;
}

std::int64_t demo_classify_ref(std::int64_t x) {
  if (x < 0) return -1;
  if (x == 0) return 0;
  if ((x & (x - 1)) == 0) return 1;
  if (x % 2 == 0) return 2;
  if (x % 3 == 0) return 3;
  if (x < 100) return 4;
  return 5;
}

// Per-call data: the argument and the real return address, saved at entry.
struct CallData {
  std::uint64_t arg;
  std::uint64_t ret;
};

CallData& call_data(std::span<std::byte> d) {
  EXPECT_EQ(d.size(), sizeof(CallData));
  return *reinterpret_cast<CallData*>(d.data());
}

struct Pairs {
  std::uint64_t entries = 0, returns = 0, wrong_value = 0, wrong_rip = 0, wrong_vcpu_data = 0;
};

// Entry saves the argument and the return address; return checks the value and the rip.
template <typename Ref>
std::pair<EntryHandler, ReturnHandler> checking_handlers(Pairs& p, Ref ref) {
  EntryHandler entry = [&p](HitContext& c, std::span<std::byte> d) {
    CallData& cd = call_data(d);
    EXPECT_EQ(cd.arg, 0u) << "data is zeroed for every call";
    cd.arg = c.regs().rdi;
    cd.ret = *c.read_u64(Gva{c.regs().rsp});
    ++p.entries;
    return 0;
  };
  ReturnHandler ret = [&p, ref](HitContext& c, std::span<std::byte> d) {
    CallData& cd = call_data(d);
    if (c.regs().rax != static_cast<std::uint64_t>(ref(cd.arg))) ++p.wrong_value;
    if (c.regs().rip != cd.ret) ++p.wrong_rip;
    ++p.returns;
  };
  return {entry, ret};
}

TEST(RetProbe, PairsMatchCallsOnSeveralVcpus) {
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 4;
  ProbedGuest g(demo_config(kVcpus, kIters));
  Pairs recurse, classify, getppid;
  RetProbeOptions o{64, sizeof(CallData)};  // 2 vCPUs x 9 nested calls fit
  auto [re, rr] = checking_handlers(recurse, [](std::uint64_t n) { return demo_recurse_ref(n); });
  auto [ce, cr] = checking_handlers(classify, [](std::uint64_t x) { return demo_classify_ref(std::int64_t(x)); });
  auto [ge, gr] = checking_handlers(getppid, [](std::uint64_t) { return 1; });
  auto r = g.session->ret_probe(g.dom, "demo_recurse", re, rr, o);
  auto c = g.session->ret_probe(g.dom, "demo_classify", ce, cr, o);
  auto p = g.session->ret_probe(g.dom, "sys_getppid", ge, gr, o);
  ASSERT_TRUE(r) << r.error().what;
  ASSERT_TRUE(c && p);
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  struct {
    Pairs& pairs;
    Probe& probe;
    unsigned fn;
  } cases[] = {{recurse, *r, DEMO_FN_RECURSE}, {classify, *c, DEMO_FN_CLASSIFY}, {getppid, *p, DEMO_FN_GETPPID}};
  for (auto& k : cases) {
    SCOPED_TRACE(k.fn);
    EXPECT_EQ(k.pairs.entries, kVcpus * expected_calls(k.fn, kIters));
    EXPECT_EQ(k.pairs.returns, k.pairs.entries);
    EXPECT_EQ(k.pairs.wrong_value, 0u);
    EXPECT_EQ(k.pairs.wrong_rip, 0u);
    ProbeStats st = k.probe.stats();
    EXPECT_EQ(st.hits, k.pairs.entries);
    EXPECT_EQ(st.returns, k.pairs.returns);
    EXPECT_EQ(st.untracked_calls, 0u);
    EXPECT_EQ(st.reclaimed, 0u);
    EXPECT_EQ(st.maxactive, 64u);
  }
  for (unsigned v = 0; v < kVcpus; ++v) EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus).checksum);
  EXPECT_NE(r->info()->trampoline.value, 0u);
  EXPECT_EQ(r->stats().active, 0u) << "every tracked call returned";
}

TEST(RetProbe, ReturnHandlerChangesTheGuestsResult) {
  // Reference: the same workload with sys_getppid's value really 7.
  demo_stats want{};
  {
    ProbedGuest ref;
    auto gv = GuestView::open(ref.session->hypervisor(), ref.dom);
    ASSERT_TRUE(gv);
    std::int32_t seven = 7;
    ASSERT_TRUE((*gv)->write(Gva{ref.sym(DEMO_SYM_PPID)}, std::as_bytes(std::span(&seven, 1))));
    ref.start();
    ASSERT_TRUE(ref.host->wait_halted(ref.dom, 60s));
    want = ref.stats(0);
    ASSERT_NE(want.checksum, reference_stats(0, 5).checksum) << "the value must matter";
  }
  ProbedGuest g;
  auto p = g.session->ret_probe(g.dom, "sys_getppid", {}, [](HitContext& c, std::span<std::byte>) {
    EXPECT_EQ(c.regs().rax, 1u);
    c.regs().rax = 7;
  });
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion());
  EXPECT_EQ(p->stats().returns, expected_calls(DEMO_FN_GETPPID, 5));
  EXPECT_EQ(g.stats(0).checksum, want.checksum);
}

TEST(RetProbe, MaxactiveExhaustionCountsUntrackedCallsExactly) {
  // One vCPU: demo_recurse(8) nests 9 calls, demo_recurse(3) 4. With 3 instances the 3
  // outermost calls of each are tracked, the rest missed: 6 + 1 missed, 6 tracked, per iteration.
  constexpr std::uint64_t kIters = 5;
  ProbedGuest g(demo_config(1, kIters));
  Pairs pairs;
  auto [e, r] = checking_handlers(pairs, [](std::uint64_t n) { return demo_recurse_ref(n); });
  auto p = g.session->ret_probe(g.dom, "demo_recurse", e, r, RetProbeOptions{3, sizeof(CallData)});
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion());
  ProbeStats st = p->stats();
  EXPECT_EQ(st.hits, expected_calls(DEMO_FN_RECURSE, kIters));
  EXPECT_EQ(st.untracked_calls, 7 * kIters);
  EXPECT_EQ(st.returns, 6 * kIters);
  EXPECT_EQ(pairs.entries, 6 * kIters) << "the entry handler runs only for tracked calls";
  EXPECT_EQ(pairs.wrong_value, 0u);
  EXPECT_EQ(pairs.wrong_rip, 0u);
  EXPECT_EQ(st.reclaimed, 0u);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
}

TEST(RetProbe, DefaultMaxactiveFollowsTheVcpuCount) {
  ProbedGuest one(demo_config(1));
  auto a = one.session->ret_probe(one.dom, "sys_read", {}, [](HitContext&, std::span<std::byte>) {});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stats().maxactive, 10u);
  ProbedGuest eight(demo_config(8));
  auto b = eight.session->ret_probe(eight.dom, "sys_read", {}, [](HitContext&, std::span<std::byte>) {});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->stats().maxactive, 16u);
}

TEST(RetProbe, EntryHandlerCanDecline) {
  ProbedGuest g;
  std::uint64_t returns = 0;
  // Track only the outermost call of the deep recursion (n == 8, once per iteration).
  auto p = g.session->ret_probe(
      g.dom, "demo_recurse", [](HitContext& c, std::span<std::byte>) { return c.regs().rdi == 8 ? 0 : 1; },
      [&](HitContext& c, std::span<std::byte>) {
        EXPECT_EQ(c.regs().rax, demo_recurse_ref(8));
        ++returns;
      });
  ASSERT_TRUE(p);
  g.start();
  ASSERT_TRUE(g.run_to_completion());
  EXPECT_EQ(returns, 5u);
  EXPECT_EQ(p->stats().declined, expected_calls(DEMO_FN_RECURSE, 5) - 5);
  EXPECT_EQ(p->stats().untracked_calls, 0u);
}

TEST(RetProbe, StaleInstancesAreReclaimed) {
  // A call that leaves without returning through the trampoline (here: an XP probe puts the
  // real return address back, as a longjmp-like exit would leave the slot overwritten) must
  // not hold its instance forever.
  ProbedGuest g;
  std::uint64_t real_ret = 0;
  auto rp = g.session->ret_probe(
      g.dom, "sys_getppid",
      [&](HitContext& c, std::span<std::byte>) {
        real_ret = *c.read_u64(Gva{c.regs().rsp});
        return 0;
      },
      [](HitContext&, std::span<std::byte>) { ADD_FAILURE() << "no call returns through the trampoline"; },
      RetProbeOptions{2, 0});
  ASSERT_TRUE(rp) << rp.error().what;
  // sys_getppid+5 follows the 5-byte ftrace nop: [rsp] is still the return-address slot.
  auto xp = g.session->probe(g.dom, "sys_getppid+0x5", [&](HitContext& c) {
    std::uint64_t v = real_ret;
    EXPECT_TRUE(c.write(Gva{c.regs().rsp}, std::as_bytes(std::span(&v, 1))));
    return 0;
  });
  ASSERT_TRUE(xp) << xp.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  std::uint64_t calls = expected_calls(DEMO_FN_GETPPID, 5);
  ProbeStats st = rp->stats();
  EXPECT_EQ(st.hits, calls);
  EXPECT_EQ(st.untracked_calls, 0u) << "stale instances were reused";
  // Every call's instance was reclaimed (when all were taken, or when a later call reused its
  // stack slot) except those still held at the end, at most maxactive.
  EXPECT_EQ(st.reclaimed + st.active, calls);
  EXPECT_LE(st.active, 2u);
  EXPECT_GE(st.reclaimed, calls - 2);
  EXPECT_EQ(st.returns, 0u);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 5).checksum);
}

// Runs until the entry handler has seen `depth` nested demo_recurse calls in flight, then
// stops the loop: the vCPU is left with those calls on its stack (a channel may hand over a
// few more stops in the round that saw the stop request: at least `depth`).
struct InFlight {
  ProbedGuest g{demo_config(1, 3)};
  Probe probe;
  std::uint64_t entries = 0, returns = 0;
  Gva tramp;

  explicit InFlight(unsigned depth) {
    auto p = g.session->ret_probe(
        g.dom, "demo_recurse",
        [this, depth](HitContext& c, std::span<std::byte>) {
          if (++entries == depth) c.stop();
          return 0;
        },
        [this](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{32, 0});
    if (!p) throw std::runtime_error(p.error().what);
    probe = std::move(*p);
    tramp = probe.info()->trampoline;
    g.start();
    auto r = g.session->run();
    if (!r) throw std::runtime_error(r.error().what);
    // On the guest channel the guest module writes the last answered call's slot once its vCPU
    // takes the answer up (protocol.h "Return slots written by the module"), which the guest,
    // still running, does any moment now.
    auto end = std::chrono::steady_clock::now() + 10s;
    while (g.on_stacks(tramp.value) < entries - returns && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
  }
};

TEST(RetProbe, UnregisterWithCallsInFlightRestoresEveryStack) {
  InFlight f(5);
  ASSERT_GE(f.entries, 5u);
  ASSERT_LE(f.entries, 9u) << "still inside the first recursion";
  EXPECT_EQ(f.returns, 0u);
  EXPECT_EQ(f.probe.stats().active, f.entries);
  EXPECT_GE(f.g.on_stacks(f.tramp.value), f.entries) << "every call in flight returns through the trampoline";
  ASSERT_TRUE(f.probe.unregister());
  EXPECT_EQ(f.g.on_stacks(f.tramp.value), 0u);
  ASSERT_TRUE(f.g.run_to_completion()) << f.g.host->crash_reason(f.g.dom);
  EXPECT_EQ(f.g.stats(0).checksum, reference_stats(0, 3).checksum);
  EXPECT_EQ(f.g.stats(0).calls[DEMO_FN_RECURSE], expected_calls(DEMO_FN_RECURSE, 3));
}

TEST(RetProbe, SessionEndWithCallsInFlightLeavesTheGuestCorrect) {
  InFlight f(7);
  ASSERT_GE(f.entries, 7u);
  ASSERT_GE(f.g.on_stacks(f.tramp.value), f.entries - f.returns);
  f.probe.release();
  f.g.session.reset();  // detach: nobody will ever answer the trampoline again
  EXPECT_EQ(f.g.on_stacks(f.tramp.value), 0u);
  ASSERT_TRUE(f.g.finish_without_dom0(60s)) << f.g.host->crash_reason(f.g.dom);
  EXPECT_EQ(f.g.stats(0).checksum, reference_stats(0, 3).checksum);
}

TEST(RetProbe, CoexistsWithAnXpProbeOnTheSameAddress) {
  ProbedGuest g(demo_config(1, 3));
  std::uint64_t xp_hits = 0, entries = 0, returns = 0;
  auto xp = g.session->probe(g.dom, "demo_recurse", [&](HitContext&) {
    ++xp_hits;
    return 0;
  });
  auto rp = g.session->ret_probe(
      g.dom, "demo_recurse",
      [&](HitContext&, std::span<std::byte>) {
        ++entries;
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{16, 0});
  ASSERT_TRUE(xp && rp);
  g.start();
  ASSERT_TRUE(g.run_to_completion());
  std::uint64_t calls = expected_calls(DEMO_FN_RECURSE, 3);
  EXPECT_EQ(xp_hits, calls);
  EXPECT_EQ(entries, calls);
  EXPECT_EQ(returns, calls);
  // Removing one leaves the other working: the XrP goes, the XP stays armed.
  ASSERT_TRUE(rp->unregister());
  EXPECT_TRUE(xp->info());
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 3).checksum);
}

TEST(RetProbe, RefusalsSayWhy) {
  ProbedGuest g;
  auto mid = g.session->ret_probe(g.dom, "sys_read+0x5", {}, [](HitContext&, std::span<std::byte>) {});
  ASSERT_FALSE(mid);
  EXPECT_EQ(mid.error().code, Errc::InvalidArgument);
  EXPECT_NE(mid.error().what.find("first instruction"), std::string::npos) << mid.error().what;
  auto big = g.session->ret_probe(g.dom, "sys_read", {}, {}, RetProbeOptions{100000, 0});
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().what.find("maxactive 100000"), std::string::npos) << big.error().what;
  auto data = g.session->ret_probe(g.dom, "sys_read", {}, {}, RetProbeOptions{0, 1u << 20});
  ASSERT_FALSE(data);
  EXPECT_NE(data.error().what.find("data_size"), std::string::npos) << data.error().what;
}

TEST(RetProbe, FaultAtEveryHypervisorCallDuringRegistrationChangesNothing) {
  ProbedGuest g(demo_config(1, 2));
  auto layout = g.host->layout(g.dom);
  auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  auto oea = g.peek(layout->oea_addr, layout->oea_size);
  unsigned failures = 0;
  // By address: a name's lookup first looks at the guest's module list, a best-effort look
  // whose failure keeps what was known (it would take the fault instead of the registration).
  const Gva fn{g.sym("demo_recurse")};
  for (std::uint64_t n = 0; n < 200; ++n) {
    g.host->fail_nth_call(n, Errc::Io);
    auto p = g.session->ret_probe(
        g.dom, fn, {}, [](HitContext&, std::span<std::byte>) {}, RetProbeOptions{16, 0});
    g.host->clear_faults();
    if (p) {  // the fault was past the last call: the probe must work
      g.start();
      ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
      EXPECT_EQ(p->stats().returns, expected_calls(DEMO_FN_RECURSE, 2));
      break;
    }
    ++failures;
    // Transactional: not even the trampoline stays behind.
    EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "fault at call " << n;
    EXPECT_EQ(g.peek(layout->oea_addr, oea.size()), oea) << "fault at call " << n;
    EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "fault at call " << n << " left a pause behind";
  }
  EXPECT_GT(failures, 3u);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 2).checksum);
}

TEST(RetProbe, ReturnsPairByStackSlotNotByVcpu) {
  // A call that sleeps returns on whichever vCPU runs its task next. Stops made by hand on a
  // paused guest: two calls entered on vCPU 0 (two tasks' stacks) return on vCPU 1, in the
  // opposite order; each return finds its own call.
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config(2, 1);
  c.start_paused = true;
  DomId dom = *host->create_domain(c);
  auto hv = host->open();
  auto ch = channel::DebuggerChannel::open(*hv);
  ASSERT_TRUE(ch) << ch.error().what;
  probe::Engine engine(*hv, **ch);
  ASSERT_TRUE(engine.set_symbols(dom, *symbols::SymbolTable::load(demo_map())));
  const std::uint64_t fn = *host->symbol(dom, "sys_getppid");
  struct Seen {
    unsigned vcpu;
    std::uint64_t tag, rip;
  };
  std::vector<Seen> entries, returns;
  auto id = engine.add_ret(
      dom, Gva{fn},
      [&](HitContext& x, std::span<std::byte> d) {
        std::uint64_t tag = x.regs().rbx;  // which "task"
        std::memcpy(d.data(), &tag, 8);
        entries.push_back({x.vcpu().value, tag, x.regs().rip});
        return 0;
      },
      [&](HitContext& x, std::span<std::byte> d) {
        std::uint64_t tag;
        std::memcpy(&tag, d.data(), 8);
        returns.push_back({x.vcpu().value, tag, x.regs().rip});
      },
      RetProbeOptions{4, 8});
  ASSERT_TRUE(id) << id.error().what;
  Gva tramp = engine.info(*id)->trampoline;
  const Gva at = engine.info(*id)->address;  // past the ftrace nop at fn
  auto gv = GuestView::open(*hv, dom);
  ASSERT_TRUE(gv);
  const std::uint64_t stacks = *host->symbol(dom, DEMO_SYM_STACKS);
  const std::uint64_t rsp_a = stacks + DEMO_STACK_SIZE - 64, rsp_b = stacks + 2 * DEMO_STACK_SIZE - 64;
  const std::uint64_t ret_a = fn + 0x1000, ret_b = fn + 0x2000;  // distinct made-up return addresses
  ASSERT_TRUE((*gv)->write(Gva{rsp_a}, std::as_bytes(std::span(&ret_a, 1))));
  ASSERT_TRUE((*gv)->write(Gva{rsp_b}, std::as_bytes(std::span(&ret_b, 1))));
  hv::VcpuRegs base = *hv->get_vcpu_regs(dom, VcpuId{0});
  auto stop = [&](unsigned vcpu, Gva trap, std::uint64_t rsp, std::uint64_t tag) {
    hv::VcpuRegs r = base;
    r.rsp = rsp;
    r.rbx = tag;
    channel::Stop s{dom, VcpuId{vcpu}, trap, r};
    EXPECT_EQ(engine.on_stop(s), channel::Verdict::Resume);
    return s.regs;
  };
  stop(0, at, rsp_a, 0xa);
  stop(0, at, rsp_b, 0xb);
  EXPECT_EQ(*(*gv)->read_u64(Gva{rsp_a}), tramp.value);
  EXPECT_EQ(*(*gv)->read_u64(Gva{rsp_b}), tramp.value);
  // A vCPU at the trampoline whose return no call of ours knows (its instance reclaimed and
  // forgotten, or a stray jump): sent away once, never stopped there again and again.
  {
    hv::VcpuRegs r = base;
    r.rsp = stacks + DEMO_STACK_SIZE - 256;
    channel::Stop lost{dom, VcpuId{0}, tramp, r};
    EXPECT_EQ(engine.on_stop(lost), channel::Verdict::Resume);
    EXPECT_EQ(lost.regs.rip, 0u) << "not back onto the trampoline's trap";
  }
  hv::VcpuRegs back_b = stop(1, tramp, rsp_b + 8, 0);  // the ret popped the slot
  hv::VcpuRegs back_a = stop(1, tramp, rsp_a + 8, 0);
  EXPECT_EQ(back_b.rip, ret_b);
  EXPECT_EQ(back_a.rip, ret_a);
  ASSERT_EQ(entries.size(), 2u);
  ASSERT_EQ(returns.size(), 2u);
  EXPECT_EQ(returns[0].tag, 0xbu);
  EXPECT_EQ(returns[1].tag, 0xau);
  for (const Seen& r : returns) EXPECT_EQ(r.vcpu, 1u);
  for (const Seen& e : entries) EXPECT_EQ(e.vcpu, 0u);
  EXPECT_EQ(engine.stats(*id).active, 0u);
  ASSERT_TRUE(engine.remove(*id));
}

}  // namespace
}  // namespace xenprobes::testing
