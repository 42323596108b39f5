// The vm_event channel over the simulated Xen, with a fake engine (StopSink): what a stop
// carries, how it is answered, a full ring, foreign traps handed back, refusals, detach with
// stops pending, and the agentless EMULATE answer.
#include <poll.h>

#include <functional>
#include <map>
#include <set>

#include "channel/vmevent.hpp"
#include "demo_guest.hpp"
#include "vmevent/recording_hv.hpp"

namespace xenprobes::testing {
namespace {

using channel::Stop;
using channel::Verdict;
using channel::VmEventChannel;
using Mode = VmEventChannel::Mode;
using hv::GuestType;
using hv::sim::DomainConfig;
using hv::sim::Op;
using hv::sim::SimOptions;

constexpr std::uint32_t kPaused = hv::kVmEventFlagVcpuPaused;
constexpr std::uint32_t kEmulate = hv::kVmEventFlagEmulate | hv::kVmEventFlagSetEmulInsnData;

DomainConfig hvm(unsigned vcpus, std::uint64_t iterations) {
  DomainConfig c;
  c.type = GuestType::Hvm;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.start_paused = true;  // traps go in before the first instruction runs
  return c;
}

// The engine side, faked: owns the traps listed, records every stop, answers with `handler`.
struct FakeSink final : channel::StopSink {
  std::set<std::uint64_t> owned;
  bool own_everything = false;
  std::function<Verdict(Stop&)> handler;
  std::function<void()> on_failure;
  std::vector<Stop> stops;
  std::vector<Error> failures;

  bool owns_trap(DomId, Gva a) const override { return own_everything || owned.contains(a.value); }
  Verdict on_stop(Stop& s) override {
    stops.push_back(s);
    return handler ? handler(s) : Verdict::Resume;
  }
  void on_channel_failure(DomId, const Error& e) override {
    failures.push_back(e);
    if (on_failure) on_failure();
  }
};

// Every demo function starts with a 5-byte nopl (the ftrace nop): resuming after it is what
// a slot holding it would do.
Verdict skip_nop(Stop& s) {
  s.regs.rip = s.trap.value + 5;
  return Verdict::Resume;
}

struct Rig {
  Dom0Guest g;
  RecordingHv rec;
  std::unique_ptr<VmEventChannel> ch;
  std::unique_ptr<mem::GuestMemory> gm;

  Rig(DomainConfig c, Mode mode, SimOptions o = {}) : g(c, o), rec(*g.hv) {
    auto r = VmEventChannel::open(rec, mode);
    if (!r) throw std::runtime_error(r.error().what);
    ch = std::move(*r);
    gm = g.memory_view();
  }

  void attach() {
    auto r = ch->attach(g.dom);
    ASSERT_TRUE(r) << r.error().what;
  }
  void patch(std::uint64_t va, std::uint8_t b) {
    ASSERT_TRUE(g.hv->pause(g.dom));
    ASSERT_TRUE(gm->write_u8(Gva{va}, b));
    ASSERT_TRUE(g.hv->unpause(g.dom));
  }
  std::uint8_t byte_at(std::uint64_t va) {
    std::uint8_t b = 0;
    EXPECT_TRUE(g.host->peek(g.dom, va, std::as_writable_bytes(std::span(&b, 1))));
    return b;
  }
  void start() { ASSERT_TRUE(g.hv->unpause(g.dom)); }  // the creation pause

  // The event loop: waits on the channel's fd, processes, until `done` or the guest crashed.
  bool run(FakeSink& sink, const std::function<bool()>& done, std::chrono::milliseconds timeout = 60s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      if (!g.host->crash_reason(g.dom).empty()) return false;
      pollfd p{ch->fd(), POLLIN, 0};
      int iv = ch->poll_interval_ms();
      ::poll(&p, 1, iv > 0 ? iv : 20);
      auto r = ch->process(sink);
      if (!r) {
        ADD_FAILURE() << "process: " << r.error().what;
        return false;
      }
    }
    return done();
  }
  bool run_to_completion(FakeSink& sink) {
    return run(sink, [&] { return g.host->wait_halted(g.dom, 0ms); });
  }

  // Every vCPU of the domain stands at `va` (stopped there: paused by its request or waiting
  // for room in the ring).
  bool all_stopped_at(std::uint64_t va, unsigned vcpus) {
    for (unsigned v = 0; v < vcpus; ++v) {
      auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{v});
      if (!r || r->rip != va) return false;
    }
    return true;
  }
};

// Guest memory of any domain on the host, the way the library sees it.
struct DomMemory {
  std::unique_ptr<mem::HypervisorFrameSource> source;
  std::unique_ptr<mem::GuestMemory> gm;
  DomMemory(hv::Hypervisor& hv, DomId dom) {
    source = std::make_unique<mem::HypervisorFrameSource>(hv, dom);
    gm = std::make_unique<mem::GuestMemory>(*source);
    auto ctx = mem::paging_context(*hv.domain_info(dom), *hv.get_vcpu_regs(dom, VcpuId{0}));
    if (!ctx) throw std::runtime_error(ctx.error().what);
    gm->set_context(*ctx);
  }
};

// The workload without probes, as the reference; `ppid` is what sys_getppid returns.
std::vector<demo_stats> reference(unsigned vcpus, std::uint64_t iterations, std::int32_t ppid = 1) {
  Dom0Guest ref(hvm(vcpus, iterations));
  if (ppid != 1) {
    auto gm = ref.memory_view();
    EXPECT_TRUE(gm->write(Gva{ref.sym(DEMO_SYM_PPID)}, std::as_bytes(std::span(&ppid, 1))));
  }
  EXPECT_TRUE(ref.hv->unpause(ref.dom));
  EXPECT_TRUE(ref.host->wait_halted(ref.dom, 60s));
  std::vector<demo_stats> out;
  for (unsigned v = 0; v < vcpus; ++v) out.push_back(ref.stats(v));
  return out;
}

// ---- opening and attaching -----------------------------------------------------------

TEST(VmEventChannel, RefusesAHypervisorWithoutTheMonitor) {
  Dom0Guest g(hvm(1, 1));
  RecordingHv rec(*g.hv);
  rec.vm_event = false;
  auto ch = VmEventChannel::open(rec);
  ASSERT_FALSE(ch);
  EXPECT_EQ(ch.error().code, Errc::NotSupported);
  EXPECT_NE(ch.error().what.find("guest channel"), std::string::npos) << ch.error().what;
}

TEST(VmEventChannel, ModesPickTheirTrapByte) {
  Rig icebp(hvm(1, 1), Mode::Icebp);
  EXPECT_EQ(icebp.ch->traits().trap_byte, 0xf1);
  EXPECT_FALSE(icebp.ch->traits().can_emulate);
  EXPECT_FALSE(icebp.ch->traits().stops_found_by_rip);
  EXPECT_FALSE(icebp.ch->traits().guest_int3);
  EXPECT_EQ(icebp.ch->trap_table(), nullptr) << "the engine keeps no trap table for it";
  EXPECT_EQ(icebp.ch->poll_interval_ms(), 0);
  EXPECT_GE(icebp.ch->fd(), 0);
  auto dflt = VmEventChannel::open(*icebp.g.hv);
  ASSERT_TRUE(dflt);
  EXPECT_EQ((*dflt)->mode(), Mode::Icebp) << "ICEBP is the default";

  Rig int3(hvm(1, 1), Mode::Int3);
  EXPECT_EQ(int3.ch->traits().trap_byte, 0xcc);
  EXPECT_TRUE(int3.ch->traits().can_emulate);
  // The mode decides which monitoring goes on.
  int3.attach();
  icebp.attach();
  EXPECT_EQ(int3.g.host->op_count(Op::MonitorSoftwareBreakpoint), 1u);
  EXPECT_EQ(int3.g.host->op_count(Op::MonitorDebugExceptions), 0u);
  EXPECT_EQ(icebp.g.host->op_count(Op::MonitorDebugExceptions), 1u);
  EXPECT_EQ(icebp.g.host->op_count(Op::MonitorSoftwareBreakpoint), 0u);
}

TEST(VmEventChannel, PvDomainIsRefusedNamingWhatWouldWork) {
  DomainConfig c = hvm(1, 1);
  c.type = GuestType::Pv;
  Rig r(c, Mode::Icebp);
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::NotSupported);
  EXPECT_NE(a.error().what.find("PV"), std::string::npos) << a.error().what;
  EXPECT_NE(a.error().what.find("guest channel"), std::string::npos) << a.error().what;
  EXPECT_NE(a.error().what.find("debugger channel"), std::string::npos) << a.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorEnable), 0u) << "refused before touching the domain";
}

TEST(VmEventChannel, BusyMonitorIsRefused) {
  Rig r(hvm(1, 1), Mode::Icebp);
  auto other = r.g.host->open();  // another tool holds the domain's one monitor ring
  auto ring = other->monitor_enable(r.g.dom);
  ASSERT_TRUE(ring);
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::Busy);
  EXPECT_NE(a.error().what.find("already has a vm_event monitor"), std::string::npos) << a.error().what;
  ASSERT_TRUE(other->monitor_disable(r.g.dom));
  r.attach();  // free again: works
}

TEST(VmEventChannel, DomainInDebuggingModeIsRefused) {
  Rig r(hvm(1, 1), Mode::Int3);
  ASSERT_TRUE(r.g.hv->set_debugging(r.g.dom, true));
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::Busy);
  EXPECT_NE(a.error().what.find("debugging mode"), std::string::npos) << a.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorEnable), 0u);
}

TEST(VmEventChannel, FailedMonitoringSetupLeavesNoRing) {
  Rig r(hvm(1, 1), Mode::Icebp);
  r.g.host->fail_op(Op::MonitorDebugExceptions, Errc::Io);
  ASSERT_FALSE(r.ch->attach(r.g.dom));
  r.attach();  // the ring was disabled again: a second attach can enable it
}

// ---- stops ---------------------------------------------------------------------------

TEST(VmEventChannel, StopsCarryTheVcpuTheTrapAndTheRegisters) {
  const std::uint64_t iters = 4;
  auto ref = reference(2, iters);
  Rig r(hvm(2, iters), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_unlink"), stacks = r.g.sym(DEMO_SYM_STACKS);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);

  std::map<unsigned, unsigned> per_vcpu;
  for (const Stop& s : sink.stops) {
    EXPECT_EQ(s.domain, r.g.dom);
    EXPECT_EQ(s.trap.value, fn);
    EXPECT_EQ(s.regs.rip, fn) << "the stop is reported at the ICEBP, not after it";
    ASSERT_LT(s.vcpu.value, 2u);
    EXPECT_GE(s.regs.rsp, stacks + s.vcpu.value * DEMO_STACK_SIZE) << "the registers of that vCPU";
    EXPECT_LT(s.regs.rsp, stacks + (s.vcpu.value + 1) * DEMO_STACK_SIZE);
    EXPECT_NE(s.regs.cr3, 0u);
    per_vcpu[s.vcpu.value]++;
  }
  for (unsigned v = 0; v < 2; ++v) {
    EXPECT_EQ(per_vcpu[v], expected_calls(DEMO_FN_UNLINK, iters));
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_UNLINK], ref[v].calls[DEMO_FN_UNLINK]);
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.ch->counters().stops, sink.stops.size());
  EXPECT_TRUE(r.rec.injected.empty());
  // Each answer: unpause + SET_REGISTERS with the sink's rip.
  ASSERT_EQ(r.rec.responses.size(), sink.stops.size());
  for (const auto& rsp : r.rec.responses) {
    EXPECT_EQ(rsp.flags, kPaused | hv::kVmEventFlagSetRegisters);
    EXPECT_EQ(rsp.regs.rip, fn + 5);
    EXPECT_EQ(rsp.reason, hv::VmEventReason::DebugException);
  }
  EXPECT_EQ(r.ch->poll_interval_ms(), 0) << "nothing to poll for";
}

TEST(VmEventChannel, FdIsReadableWhileAStopWaits) {
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  pollfd p{r.ch->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "nothing yet";
  r.start();
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "a stop makes the channel's fd readable";
  EXPECT_TRUE(p.revents & POLLIN);
  ASSERT_TRUE(r.run_to_completion(sink));
  EXPECT_EQ(sink.stops.size(), expected_calls(DEMO_FN_READ, 2));
  ASSERT_TRUE(r.ch->process(sink));
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "quiet again once everything is answered";
}

// The sink's registers are what the vCPU resumes with: here sys_getppid returns 42 at once.
TEST(VmEventChannel, AnswersResumeWhereTheSinkSays) {
  auto ref42 = reference(1, 5, 42);
  Rig r(hvm(1, 5), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_getppid");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [&](Stop& s) {
    auto ra = r.gm->read_u64(Gva{s.regs.rsp});
    EXPECT_TRUE(ra);
    s.regs.rip = *ra;
    s.regs.rsp += 8;
    s.regs.rax = 42;
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), expected_calls(DEMO_FN_GETPPID, 5));
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "the body never ran";
  EXPECT_EQ(r.g.stats(0).checksum, ref42[0].checksum) << "the guest saw 42 every time";
}

// NotOurs: the engine put the original byte back; the vCPU re-executes it at the trap.
TEST(VmEventChannel, NotOursResumesAtTheTrapUnchanged) {
  auto ref = reference(1, 3);
  Rig r(hvm(1, 3), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_open");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [&](Stop& s) {
    EXPECT_TRUE(r.gm->write_u8(Gva{fn}, orig));  // disarmed while the vCPU was stopped on it
    s.regs.rax = 0xbad;                          // must not be applied
    return Verdict::NotOurs;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.stops.size(), 1u);
  ASSERT_EQ(r.rec.responses.size(), 1u);
  EXPECT_EQ(r.rec.responses[0].flags, kPaused) << "no registers set: the vCPU stays on the trap address";
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, 3));
}

// More vCPUs trapping at once than the ring has slots: the others wait for room, and every
// stop still arrives exactly once.
TEST(VmEventChannel, MoreStoppedVcpusThanRingSlots) {
  SimOptions o;
  o.ring_slots = 2;
  const std::uint64_t iters = 3;
  auto ref = reference(4, iters);
  Rig r(hvm(4, iters), Mode::Icebp, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("demo_classify");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  // Nothing answered yet: all four reach the trap, two in the ring and two waiting.
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 4); }));
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(r.all_stopped_at(fn, 4));
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  std::map<unsigned, unsigned> per_vcpu;
  for (const Stop& s : sink.stops) per_vcpu[s.vcpu.value]++;
  for (unsigned v = 0; v < 4; ++v) {
    EXPECT_EQ(per_vcpu[v], expected_calls(DEMO_FN_CLASSIFY, iters)) << "vcpu " << v;
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
}

// No room for an answer in the ring, even after a notify: it is kept and delivered on the
// next round, its vCPU stays paused meanwhile, and the sink is not asked twice.
TEST(VmEventChannel, AnswerWithoutRoomIsKeptNotLost) {
  auto ref = reference(2, 3);
  Rig r(hvm(2, 3), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 2); }));
  // The first answer gets in; the second finds no room, nor after the notify that follows.
  r.g.host->fail_op(Op::RingPutResponse, Errc::NoSpace, 1, 2);
  auto n = r.ch->process(sink);
  ASSERT_TRUE(n) << n.error().what;
  EXPECT_EQ(*n, 2u);
  ASSERT_EQ(sink.stops.size(), 2u);
  EXPECT_EQ(r.ch->counters().deferred, 1u);
  EXPECT_EQ(r.g.host->op_count(Op::RingNotify), 1u) << "a notify to make room before giving up";
  EXPECT_EQ(r.ch->poll_interval_ms(), 1) << "the loop must come back for the kept answer";
  const unsigned held = sink.stops[1].vcpu.value;
  std::this_thread::sleep_for(50ms);
  auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{held});
  EXPECT_EQ(regs->rip, fn) << "still paused: its answer is not in the ring";

  // An answer that fails otherwise is kept as well, and the error is reported.
  r.g.host->fail_op(Op::RingPutResponse, Errc::Io);
  auto bad = r.ch->process(sink);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::Io);
  EXPECT_EQ(r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{held})->rip, fn);

  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_WRITE, 3)) << "one stop per call, none twice";
  for (unsigned v = 0; v < 2; ++v) {
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_WRITE], expected_calls(DEMO_FN_WRITE, 3));
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.ch->poll_interval_ms(), 0);
}

// ---- traps that are not ours ---------------------------------------------------------

// The guest's own int3 (int3 mode intercepts them all): handed back as the #BP the guest
// would have taken. The demo guest has no IDT, so the simulated Xen crashes it on delivery.
TEST(VmEventChannel, ForeignInt3IsHandedBackToTheGuest) {
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xcc);
  FakeSink sink;  // owns nothing
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s))
      << "the guest took its #BP";
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  const Injected& i = r.rec.injected[0];
  EXPECT_EQ(i.vector, 3);
  EXPECT_EQ(i.type, 6) << "software exception: delivered with RIP after the int3";
  EXPECT_EQ(i.insn_len, 1);
  EXPECT_EQ(i.error_code, ~0u);
  EXPECT_EQ(r.ch->counters().injected, 1u);
  EXPECT_NE(r.g.host->crash_reason(r.g.dom).find("injected exception 3"), std::string::npos)
      << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(r.rec.responses.size(), 1u);
  EXPECT_EQ(r.rec.responses[0].flags, kPaused) << "unpaused, RIP left on the int3 for the injection";
}

TEST(VmEventChannel, ForeignIcebpIsHandedBackToTheGuest) {
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {r.g.sym("sys_read")};  // ours are elsewhere
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s));
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  EXPECT_EQ(r.rec.injected[0].vector, 1);
  EXPECT_EQ(r.rec.injected[0].type, 5) << "privileged software exception, as ICEBP raises it";
  EXPECT_EQ(r.rec.injected[0].insn_len, 1);
  EXPECT_NE(r.g.host->crash_reason(r.g.dom).find("injected exception 1"), std::string::npos);
}

// The guest single-steps itself (TF): a hardware #DB, trap-like, never ours.
TEST(VmEventChannel, GuestSingleStepIsHandedBack) {
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{0});
  ASSERT_TRUE(regs);
  regs->rflags |= 0x100;  // TF
  ASSERT_TRUE(r.g.hv->set_vcpu_regs(r.g.dom, VcpuId{0}, *regs));
  FakeSink sink;
  sink.own_everything = true;  // a #DB after a step is no stop, whatever the sink claims
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s));
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  EXPECT_EQ(r.rec.injected[0].vector, 1);
  EXPECT_EQ(r.rec.injected[0].type, 3);
  EXPECT_EQ(r.rec.injected[0].insn_len, 0);
}

// A stop whose trap the engine no longer knows, and whose byte is gone from memory (it was
// restored while the request waited): re-executed, not handed to the guest.
TEST(VmEventChannel, ForeignLookingTrapWhoseByteIsGoneIsReexecuted) {
  auto ref = reference(1, 2);
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xcc);
  FakeSink sink;  // the engine forgot the probe
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 1); }));
  r.patch(fn, orig);
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_TRUE(r.rec.injected.empty());
  EXPECT_EQ(r.ch->counters().retried, 1u);
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_READ], expected_calls(DEMO_FN_READ, 2));
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
}

// ---- detach and flush ----------------------------------------------------------------

// Without the channel's answers, disabling the ring would strand those vCPUs: Xen keeps a
// vCPU paused by an unanswered request paused (the control for the next test).
TEST(VmEventChannel, DisablingTheRingUnansweredStrandsTheVcpu) {
  Dom0Guest g(hvm(1, 0));
  auto ring = g.hv->monitor_enable(g.dom);
  ASSERT_TRUE(ring);
  ASSERT_TRUE(g.hv->monitor_software_breakpoint(g.dom, true));
  const std::uint64_t fn = g.sym("sys_read");
  auto gm = g.memory_view();
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(eventually([&] { return g.hv->get_vcpu_regs(g.dom, VcpuId{0})->rip == fn; }));
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0x0f));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.hv->monitor_disable(g.dom));
  auto before = g.stats(0).iterations;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(g.stats(0).iterations, before);
  EXPECT_EQ(g.hv->get_vcpu_regs(g.dom, VcpuId{0})->rip, fn) << "stuck";
}

// detach answers every pending request (also those of vCPUs waiting for ring room) before
// it disables the ring: no vCPU stays paused.
TEST(VmEventChannel, DetachWithStopsPendingLeavesNoVcpuPaused) {
  SimOptions o;
  o.ring_slots = 1;
  const std::uint64_t iters = 2;
  auto ref = reference(3, iters);
  Rig r(hvm(3, iters), Mode::Icebp, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_getppid");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  r.start();
  // Nobody processes: one vCPU in the ring, two waiting for room.
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 3); }));
  r.patch(fn, orig);  // the engine restores its bytes before the channel detaches
  auto d = r.ch->detach(r.g.dom);
  ASSERT_TRUE(d) << d.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorDisable), 1u);
  EXPECT_EQ(r.rec.responses.size(), 3u) << "one answer per stopped vCPU";
  for (const auto& rsp : r.rec.responses) EXPECT_EQ(rsp.flags, kPaused);
  ASSERT_TRUE(r.g.host->wait_halted(r.g.dom, 60s)) << "a vCPU stayed paused";
  for (unsigned v = 0; v < 3; ++v) {
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, iters));
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.g.host->pause_count(r.g.dom).value_or(99), 0u) << "the channel's own pause was released";
  // The ring is gone: another monitor can take the domain.
  EXPECT_TRUE(r.g.host->open()->monitor_enable(r.g.dom));
}

// flush (domain paused by the caller) hands the sink every stop still in the ring.
TEST(VmEventChannel, FlushHandlesEveryPendingStop) {
  SimOptions o;
  o.ring_slots = 1;
  Rig r(hvm(3, 2), Mode::Int3, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_unlink");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 3); }));
  ASSERT_TRUE(r.g.hv->pause(r.g.dom));
  auto n = r.ch->flush(r.g.dom, sink);
  ASSERT_TRUE(n) << n.error().what;
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(sink.stops.size(), 3u);
  for (unsigned v = 0; v < 3; ++v) {
    auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{v});
    EXPECT_EQ(regs->rip, fn + 5) << "resumed (and held by the caller's pause only)";
  }
  ASSERT_TRUE(r.g.hv->unpause(r.g.dom));
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
}

// Two domains on one handle: one fd for both, each served; detaching one leaves the other
// watched (the simulated Xen gives both rings the same fd).
TEST(VmEventChannel, TwoDomainsShareOneFd) {
  Rig r(hvm(1, 3), Mode::Icebp);
  auto dom2 = r.g.host->create_domain(hvm(1, 3));
  ASSERT_TRUE(dom2);
  r.attach();
  ASSERT_TRUE(r.ch->attach(*dom2));
  const std::uint64_t fn = r.g.sym("sys_open");  // the same kernel at the same address
  r.patch(fn, 0xf1);
  DomMemory m2(*r.g.hv, *dom2);
  ASSERT_TRUE(m2.gm->write_u8(Gva{fn}, 0xf1));
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  ASSERT_TRUE(r.g.hv->unpause(*dom2));
  ASSERT_TRUE(r.run(sink, [&] { return r.g.host->wait_halted(*dom2, 0ms); }));
  ASSERT_EQ(sink.stops.size(), expected_calls(DEMO_FN_OPEN, 3));
  for (const Stop& s : sink.stops) EXPECT_EQ(s.domain, *dom2);
  ASSERT_TRUE(r.ch->detach(*dom2));
  // Domain 1 still wakes the channel's fd.
  r.start();
  pollfd p{r.ch->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the shared fd was left in the poll set";
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_OPEN, 3));
  for (std::size_t i = expected_calls(DEMO_FN_OPEN, 3); i < sink.stops.size(); ++i)
    EXPECT_EQ(sink.stops[i].domain, r.g.dom);
}

// ---- agentless: Xen emulates the original bytes (int3 mode) --------------------------

TEST(VmEventChannel, AgentlessStopIsAnsweredWithEmulate) {
  auto ref = reference(2, 4);
  Rig r(hvm(2, 4), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;  // ret: emulated by Xen
  ASSERT_EQ(r.byte_at(ret), 0xc3);
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [](Stop& s) {
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_GETPPID, 4));
  EXPECT_EQ(r.ch->counters().emulated, sink.stops.size());
  EXPECT_EQ(r.ch->counters().two_step, 0u);
  ASSERT_EQ(r.rec.responses.size(), sink.stops.size());
  for (const auto& rsp : r.rec.responses) {
    EXPECT_EQ(rsp.flags, kPaused | kEmulate) << "no SET_REGISTERS: it shares the union with the bytes";
    EXPECT_EQ(rsp.emul_insn[0], 0xc3);
    EXPECT_EQ(rsp.reason, hv::VmEventReason::SoftwareBreakpoint);
  }
  for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  EXPECT_EQ(r.byte_at(ret), 0xcc) << "the breakpoint stayed armed throughout";
}

// A handler that edits registers and still wants the instruction emulated: the registers go
// first (SET_REGISTERS, rip on the int3), the vCPU traps again at once and that stop is
// answered with EMULATE without asking the sink again.
TEST(VmEventChannel, AgentlessWithEditedRegistersTakesTwoAnswers) {
  auto ref42 = reference(1, 4, 42);
  Rig r(hvm(1, 4), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [](Stop& s) {
    s.regs.rax = 42;  // sys_getppid now returns 42
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  const std::uint64_t calls = expected_calls(DEMO_FN_GETPPID, 4);
  EXPECT_EQ(sink.stops.size(), calls) << "the handler ran once per call";
  EXPECT_EQ(r.ch->counters().two_step, calls);
  EXPECT_EQ(r.ch->counters().emulated, calls);
  ASSERT_EQ(r.rec.responses.size(), 2 * calls);
  for (std::size_t i = 0; i < r.rec.responses.size(); i += 2) {
    EXPECT_EQ(r.rec.responses[i].flags, kPaused | hv::kVmEventFlagSetRegisters);
    EXPECT_EQ(r.rec.responses[i].regs.rax, 42u);
    EXPECT_EQ(r.rec.responses[i].regs.rip, ret);
    EXPECT_EQ(r.rec.responses[i + 1].flags, kPaused | kEmulate);
  }
  EXPECT_EQ(r.g.stats(0).checksum, ref42[0].checksum) << "the edit took effect before the ret ran";
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_GETPPID], calls);
}

// Xen emulates only in answer to a software breakpoint: in ICEBP mode the channel cannot, and
// gives the domain up to the engine (which disarms: the vCPU re-executes the original).
TEST(VmEventChannel, EmulateIsRefusedInIcebpMode) {
  auto ref = reference(1, 2);
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [](Stop& s) {
    s.emulate = Stop::Emulate{5, {0x0f, 0x1f, 0x44, 0x00, 0x00}};
    return Verdict::Resume;
  };
  sink.on_failure = [&] {
    EXPECT_TRUE(r.gm->write_u8(Gva{fn}, orig));
    sink.owned.clear();
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.failures.size(), 1u);
  EXPECT_EQ(sink.failures[0].code, Errc::NotSupported);
  EXPECT_NE(sink.failures[0].what.find("int3 mode"), std::string::npos) << sink.failures[0].what;
  EXPECT_EQ(r.ch->counters().emulated, 0u);
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
}

// Once the engine has removed a trap, a pending second half of a two-step emulation is
// forgotten: the next stop there goes to the sink again.
TEST(VmEventChannel, AForgottenTrapDropsThePendingEmulation) {
  Rig r(hvm(1, 0), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [&](Stop& s) {
    if (sink.stops.size() == 1) {
      s.regs.rax = 7;
      // Hold the domain so that the vCPU cannot come back before the trap is removed.
      EXPECT_TRUE(r.g.hv->pause(r.g.dom));
    }
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run(sink, [&] { return r.ch->counters().two_step == 1; }));
  EXPECT_EQ(r.ch->counters().emulated, 0u);
  r.ch->trap_forgotten(r.g.dom, Gva{ret});
  ASSERT_TRUE(r.g.hv->unpause(r.g.dom));
  ASSERT_TRUE(r.run(sink, [&] { return sink.stops.size() >= 2; }));
  EXPECT_EQ(sink.stops[1].vcpu, sink.stops[0].vcpu);
  EXPECT_EQ(sink.stops[1].regs.rax, 7u) << "the same vCPU, back on the int3 with the edited registers";
  ASSERT_TRUE(r.run(sink, [&] { return r.ch->counters().emulated >= 1; }));
  r.patch(ret, 0xc3);
}

}  // namespace
}  // namespace xenprobes::testing
