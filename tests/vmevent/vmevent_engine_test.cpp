// The real probe engine over the vm_event channel, on an HVM demo guest running the guest
// module's side (OEA published): XP probes with pre- and post-handlers count exactly the
// guest's own calls, in both modes, and the workload's results are unchanged.
#include <poll.h>

#include <map>

#include "channel/vmevent.hpp"
#include "probe/engine.hpp"
#include "demo_guest.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::testing {
namespace {

using channel::VmEventChannel;
using Mode = VmEventChannel::Mode;
using hv::sim::DomainConfig;

DomainConfig hvm_demo(unsigned vcpus, std::uint64_t iterations) {
  DomainConfig c;
  c.type = hv::GuestType::Hvm;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.publish_module = true;
  c.start_paused = true;  // probes go in before the first instruction runs
  return c;
}

// The workload without probes (same guest type and vCPU count).
std::vector<demo_stats> reference(unsigned vcpus, std::uint64_t iterations) {
  std::vector<demo_stats> out;
  for (unsigned v = 0; v < vcpus; ++v) out.push_back(reference_stats(v, iterations, vcpus, hv::GuestType::Hvm));
  return out;
}

// A host, an HVM demo domain, the channel and the engine on one Dom0 handle, and the loop
// Session::run_once would run.
struct EngineRig {
  Dom0Guest g;
  std::unique_ptr<VmEventChannel> ch;
  std::unique_ptr<probe::Engine> engine;

  EngineRig(DomainConfig c, Mode mode) : g(c) {
    auto r = VmEventChannel::open(*g.hv, mode);
    if (!r) throw std::runtime_error(r.error().what);
    ch = std::move(*r);
    engine = std::make_unique<probe::Engine>(*g.hv, *ch);
    auto t = symbols::SymbolTable::load(hv::sim::default_guest_dir() + "/System.map");
    if (!t) throw std::runtime_error(t.error().what);
    auto s = engine->set_symbols(g.dom, std::move(*t));  // attaches the engine and the channel
    if (!s) throw std::runtime_error(s.error().what);
  }
  ~EngineRig() {
    engine.reset();  // restores every byte while the channel still exists
    ch.reset();
  }

  probe::ProbeId add(std::uint64_t addr, PreHandler pre, PostHandler post = {}) {
    auto id = engine->add(g.dom, Gva{addr}, std::move(pre), std::move(post));
    if (!id) throw std::runtime_error(id.error().what);
    return *id;
  }
  void start() { ASSERT_TRUE(g.hv->unpause(g.dom)); }  // the creation pause

  bool run_once(int timeout_ms) {
    pollfd p{ch->fd(), POLLIN, 0};
    int iv = ch->poll_interval_ms();
    ::poll(&p, 1, iv > 0 && iv < timeout_ms ? iv : timeout_ms);
    auto n = ch->process(*engine);
    if (!n) {
      ADD_FAILURE() << "process: " << n.error().what;
      return false;
    }
    auto a = engine->after_dispatch();
    if (!a) {
      ADD_FAILURE() << "after_dispatch: " << a.error().what;
      return false;
    }
    return true;
  }
  bool run_to_completion(std::chrono::milliseconds timeout = 120s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (!g.host->crash_reason(g.dom).empty()) return false;
      if (g.host->wait_halted(g.dom, 0ms)) return true;
      if (!run_once(20)) return false;
    }
    return false;
  }
};

class VmEventEngine : public ::testing::TestWithParam<Mode> {};

// Hits counted per vCPU, to compare with the guest's own per-vCPU call counters.
struct Counts {
  std::map<unsigned, std::uint64_t> pre, post;
  std::uint64_t total_pre() const {
    std::uint64_t n = 0;
    for (auto& [v, c] : pre) n += c;
    return n;
  }
};

TEST_P(VmEventEngine, XpHitsEqualTheGuestsCallsAndTheGuestIsUnchanged) {
  const unsigned vcpus = 2;
  const std::uint64_t iters = 4;
  auto ref = reference(vcpus, iters);
  EngineRig r(hvm_demo(vcpus, iters), GetParam());
  const std::uint64_t getppid = r.g.sym("sys_getppid");

  // Function entries (ftrace nop, boosted through a slot; a post-handler adds the trap
  // after the copy), a RIP-relative load, a 1-byte ret right before the next function
  // (emulated in Dom0; the debugger channel must refuse it), a recursive function and the
  // jump-table dispatcher.
  Counts open, load, ret, recurse, dispatch;
  r.add(
      r.g.sym("sys_open"),
      [&](HitContext& c) {
        EXPECT_EQ(c.regs().rip, c.address().value);
        open.pre[c.vcpu().value]++;
        return 0;
      },
      [&](HitContext& c) { open.post[c.vcpu().value]++; });
  r.add(
      getppid + 0x38,  // movslq demo_ppid(%rip), %rax
      [&](HitContext& c) {
        load.pre[c.vcpu().value]++;
        return 0;
      },
      [&](HitContext& c) {
        EXPECT_EQ(c.regs().rax, 1u) << "post-handlers see the load's effect";
        EXPECT_EQ(c.regs().rip, getppid + 0x3f);
        load.post[c.vcpu().value]++;
      });
  r.add(
      getppid + 0x3f,  // ret
      [&](HitContext& c) {
        ret.pre[c.vcpu().value]++;
        return 0;
      },
      [&](HitContext& c) {
        EXPECT_NE(c.regs().rip, getppid + 0x40) << "the ret went back to the caller";
        ret.post[c.vcpu().value]++;
      });
  r.add(r.g.sym("demo_recurse"), [&](HitContext& c) {
    recurse.pre[c.vcpu().value]++;
    return 0;
  });
  r.add(
      r.g.sym("demo_dispatch"),
      [&](HitContext& c) {
        dispatch.pre[c.vcpu().value]++;
        return 0;
      },
      [&](HitContext& c) { dispatch.post[c.vcpu().value]++; });

  r.start();
  ASSERT_TRUE(r.run_to_completion()) << r.g.host->crash_reason(r.g.dom);

  for (unsigned v = 0; v < vcpus; ++v) {
    const demo_stats st = r.g.stats(v);
    EXPECT_EQ(st.checksum, ref[v].checksum) << "vcpu " << v;
    EXPECT_EQ(st.iterations, iters);
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f) EXPECT_EQ(st.calls[f], ref[v].calls[f]) << "vcpu " << v << " fn " << f;
    EXPECT_EQ(open.pre[v], st.calls[DEMO_FN_OPEN]) << "vcpu " << v;
    EXPECT_EQ(open.post[v], st.calls[DEMO_FN_OPEN]);
    EXPECT_EQ(load.pre[v], st.calls[DEMO_FN_GETPPID]);
    EXPECT_EQ(load.post[v], st.calls[DEMO_FN_GETPPID]);
    EXPECT_EQ(ret.pre[v], st.calls[DEMO_FN_GETPPID]);
    EXPECT_EQ(ret.post[v], st.calls[DEMO_FN_GETPPID]);
    EXPECT_EQ(recurse.pre[v], st.calls[DEMO_FN_RECURSE]);
    EXPECT_EQ(dispatch.pre[v], st.calls[DEMO_FN_DISPATCH]);
    EXPECT_EQ(dispatch.post[v], st.calls[DEMO_FN_DISPATCH]);
  }
  EXPECT_EQ(open.total_pre(), vcpus * expected_calls(DEMO_FN_OPEN, iters));
  EXPECT_EQ(recurse.total_pre(), vcpus * expected_calls(DEMO_FN_RECURSE, iters));
  EXPECT_EQ(r.ch->counters().injected, 0u) << "no trap was taken for the guest's own";
}

// Detaching while the guest runs into armed probes: every pending stop is resumed, the bytes
// go back, the ring goes away, and the guest finishes as if never probed.
TEST_P(VmEventEngine, DetachWhileTheGuestRunsLeavesItIntact) {
  const unsigned vcpus = 2;
  const std::uint64_t iters = 30;
  auto ref = reference(vcpus, iters);
  EngineRig r(hvm_demo(vcpus, iters), GetParam());
  std::uint64_t hits = 0;
  const std::uint64_t read = r.g.sym("sys_read"), write = r.g.sym("sys_write");
  r.add(
      read, [&](HitContext&) { return ++hits, 0; }, [](HitContext&) {});
  r.add(write, [&](HitContext&) { return ++hits, 0; });
  r.start();
  auto end = std::chrono::steady_clock::now() + 60s;
  while (hits < 20 && std::chrono::steady_clock::now() < end) ASSERT_TRUE(r.run_once(20));
  ASSERT_GE(hits, 20u);
  // The vCPUs keep trapping while nobody processes; then the engine lets go.
  std::this_thread::sleep_for(20ms);
  auto d = r.engine->detach(r.g.dom);
  ASSERT_TRUE(d) << d.error().what;
  EXPECT_EQ(r.g.host->op_count(hv::sim::Op::MonitorDisable), 1u);
  ASSERT_TRUE(r.g.host->wait_halted(r.g.dom, 120s)) << "a vCPU stayed stopped: " << r.g.host->crash_reason(r.g.dom);
  std::uint8_t b = 0;
  ASSERT_TRUE(r.g.host->peek(r.g.dom, read, std::as_writable_bytes(std::span(&b, 1))));
  EXPECT_EQ(b, 0x0f) << "the original byte is back";
  for (unsigned v = 0; v < vcpus; ++v) {
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_READ], ref[v].calls[DEMO_FN_READ]);
  }
}

// No guest module, so no slots: in int3 mode the hypervisor runs the original instructions
// (EMULATE), a pre-handler's register edit costs a second answer, the guest is unchanged.
TEST(VmEventEngineAgentless, PreHandlersCountEveryCallAndTheGuestIsUnchanged) {
  const unsigned vcpus = 2;
  const std::uint64_t iters = 4;
  auto ref = reference(vcpus, iters);
  DomainConfig c = hvm_demo(vcpus, iters);
  c.publish_module = false;
  EngineRig r(c, Mode::Int3);
  const std::uint64_t getppid = r.g.sym("sys_getppid");
  std::map<unsigned, std::uint64_t> open, load, ret;
  // (The ftrace nops at function entries are skipped in Dom0: probe the instruction after.)
  r.add(r.g.sym("sys_open") + 5, [&](HitContext& c) {  // mov %rsp,%rax: emulated by Xen
    open[c.vcpu().value]++;
    return 0;
  });
  r.add(getppid + 5, [&](HitContext& c) {  // mov %rsp,%rax, with an edit first (r11: caller-saved, dead)
    c.regs().r11 = 0x5a5a;
    return 0;
  });
  r.add(getppid + 0x38, [&](HitContext& c) {  // movslq demo_ppid(%rip), %rax: emulated by Xen
    load[c.vcpu().value]++;
    return 0;
  });
  r.add(getppid + 0x3f, [&](HitContext& c) {  // ret: emulated in Dom0
    ret[c.vcpu().value]++;
    return 0;
  });
  auto post = r.engine->add(r.g.dom, Gva{r.g.sym("sys_read")}, {}, [](HitContext&) {});
  ASSERT_FALSE(post) << "no stop follows an emulated instruction";
  EXPECT_EQ(post.error().code, Errc::NotSupported);

  r.start();
  ASSERT_TRUE(r.run_to_completion()) << r.g.host->crash_reason(r.g.dom);
  std::uint64_t getppid_calls = 0;
  for (unsigned v = 0; v < vcpus; ++v) {
    const demo_stats st = r.g.stats(v);
    EXPECT_EQ(st.checksum, ref[v].checksum) << "vcpu " << v;
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f) EXPECT_EQ(st.calls[f], ref[v].calls[f]);
    EXPECT_EQ(open[v], st.calls[DEMO_FN_OPEN]);
    EXPECT_EQ(load[v], st.calls[DEMO_FN_GETPPID]);
    EXPECT_EQ(ret[v], st.calls[DEMO_FN_GETPPID]);
    getppid_calls += st.calls[DEMO_FN_GETPPID];
  }
  const std::uint64_t open_calls = vcpus * expected_calls(DEMO_FN_OPEN, iters);
  EXPECT_EQ(r.ch->counters().two_step, getppid_calls);
  EXPECT_EQ(r.ch->counters().emulated, open_calls + 2 * getppid_calls);
}

INSTANTIATE_TEST_SUITE_P(Modes, VmEventEngine, ::testing::Values(Mode::Icebp, Mode::Int3),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return i.param == Mode::Icebp ? std::string("Icebp") : std::string("Int3");
                         });

}  // namespace
}  // namespace xenprobes::testing
