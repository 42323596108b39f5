// The simulated Xen: the demo guest runs, and the Xen 4.17 behaviour the channels depend on
// (pause reference counts, int3/ICEBP/TF under debugging mode with and without GDBSX, event
// channels, xenstore, domain death, fault injection) is what docs/simulated-xen.md says it is.
#include <poll.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "hv/hypervisor.hpp"
#include "demo_guest.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

using hv::GuestType;
using hv::sim::DomainConfig;
using hv::sim::Op;
using hv::sim::SimOptions;

DomainConfig finite(unsigned vcpus, std::uint64_t iterations, GuestType type = GuestType::Pv) {
  DomainConfig c;
  // A finite workload finishes in milliseconds: tests that probe it create it paused.
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.type = type;
  return c;
}

void expect_workload_complete(Dom0Guest& g, unsigned vcpus, std::uint64_t iterations) {
  for (unsigned v = 0; v < vcpus; ++v) {
    demo_stats st = g.stats(v);
    EXPECT_EQ(st.done, 1u) << "vcpu " << v;
    EXPECT_EQ(st.iterations, iterations) << "vcpu " << v;
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f)
      EXPECT_EQ(st.calls[f], expected_calls(f, iterations)) << "vcpu " << v << " fn " << f;
  }
}

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

// ---- the demo guest runs ----

TEST(SimGuest, RunsToCompletionOnOneVcpu) {
  Dom0Guest g(finite(1, 40));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  expect_workload_complete(g, 1, 40);
  EXPECT_NE(g.stats(0).checksum, 0u);
  EXPECT_NE(g.host->console(g.dom).find("demo: vcpu 0 start"), std::string::npos);
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
}

TEST(SimGuest, RunsOnSeveralVcpusAndIsDeterministic) {
  Dom0Guest a(finite(4, 25)), b(finite(4, 25));
  ASSERT_TRUE(a.host->wait_halted(a.dom, 30s)) << a.host->crash_reason(a.dom);
  ASSERT_TRUE(b.host->wait_halted(b.dom, 30s)) << b.host->crash_reason(b.dom);
  expect_workload_complete(a, 4, 25);
  for (unsigned v = 0; v < 4; ++v) EXPECT_EQ(a.stats(v).checksum, b.stats(v).checksum) << "vcpu " << v;
}

TEST(SimGuest, CountersAdvanceWhileUnpaused) {
  Dom0Guest g(finite(2, 0));
  ASSERT_TRUE(eventually([&] { return g.stats(1).iterations > 3; }));
  auto before = g.stats(0).iterations;
  ASSERT_TRUE(eventually([&] { return g.stats(0).iterations > before + 3; }));
}

// ---- pause reference counting ----

TEST(SimPause, TwoPausesNeedTwoUnpauses) {
  Dom0Guest g(finite(2, 0));
  ASSERT_TRUE(eventually([&] { return g.stats(0).iterations > 0; }));
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(g.hv->pause(g.dom));
  EXPECT_TRUE(g.hv->domain_info(g.dom)->paused);
  auto frozen = g.stats(0).iterations;
  ASSERT_TRUE(g.hv->unpause(g.dom));
  EXPECT_TRUE(g.hv->domain_info(g.dom)->paused);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(g.stats(0).iterations, frozen) << "one unpause released a domain paused twice";
  ASSERT_TRUE(g.hv->unpause(g.dom));
  EXPECT_FALSE(g.hv->domain_info(g.dom)->paused);
  EXPECT_TRUE(eventually([&] { return g.stats(0).iterations > frozen; }));
  auto extra = g.hv->unpause(g.dom);
  ASSERT_FALSE(extra);
  EXPECT_EQ(extra.error().code, Errc::InvalidArgument);
}

TEST(SimPause, StartPausedDomainDoesNotRun) {
  DomainConfig c = finite(1, 5);
  c.start_paused = true;
  Dom0Guest g(c);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(g.stats(0).iterations, 0u);
  auto regs = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
  ASSERT_TRUE(regs);
  EXPECT_EQ(regs->rip, g.sym(DEMO_SYM_ENTRY));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s));
  expect_workload_complete(g, 1, 5);
}

// Pausing is transparent to the guest, however often it lands and wherever the vCPUs are
// (mid-`rep movsb` in memcpy, in a call chain): the checksums match an undisturbed run. Before
// the sim stopped engines only from their own thread, this storm corrupted the guest (wrong
// checksums, a `ret` onto a smashed stack) in nearly every run on a loaded machine.
TEST(SimPause, PauseStormLeavesTheGuestUntouched) {
  Dom0Guest ref(finite(2, 1000));
  ASSERT_TRUE(ref.host->wait_halted(ref.dom, 60s)) << ref.host->crash_reason(ref.dom);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    Dom0Guest g(finite(2, 1000));
    unsigned pauses = 0;
    while (!(g.stats(0).done && g.stats(1).done) && g.host->crash_reason(g.dom).empty()) {
      ASSERT_TRUE(g.hv->pause(g.dom));
      ASSERT_TRUE(g.hv->unpause(g.dom));
      ++pauses;
      std::this_thread::sleep_for(100us);
    }
    ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
    EXPECT_GT(pauses, 10u) << "the storm must land while the guest runs";
    for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(g.stats(v).checksum, ref.stats(v).checksum) << "vcpu " << v;
  }
}

// ---- guest memory through the guest's own page tables ----

TEST(SimMemory, LibraryWalkReadsWhatTheGuestRuns) {
  for (GuestType type : {GuestType::Pv, GuestType::Hvm}) {
    Dom0Guest g(finite(1, 0, type));
    auto gm = g.memory_view();
    std::uint64_t fn = g.sym("sys_getppid");
    std::array<std::byte, 32> via_walk{}, via_sim{};
    ASSERT_TRUE(gm->read(Gva{fn}, via_walk));
    ASSERT_TRUE(g.host->peek(g.dom, fn, via_sim));
    EXPECT_EQ(via_walk, via_sim);
    EXPECT_EQ(std::to_integer<int>(via_walk[0]), 0x0f) << "functions start with the ftrace nop5";

    auto tr = gm->translate(Gva{fn});
    ASSERT_TRUE(tr);
    auto regs = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
    if (type == GuestType::Pv) {
      // PV page tables and CR3 hold machine frames, which differ from the guest's own
      // pseudo-physical numbering.
      EXPECT_NE(tr->address.value, fn - 0xffffffff80000000ull);
    } else {
      EXPECT_EQ(tr->address.value, fn - 0xffffffff80000000ull);
    }
    EXPECT_EQ(tr->table_frames[0].value, regs->cr3 >> 12);
    EXPECT_FALSE(tr->writable) << "kernel text is mapped read-only";
    EXPECT_FALSE(tr->nx);

    // The direct map uses 2 MiB pages and reaches the same frame.
    auto layout = g.host->layout(g.dom);
    auto direct = gm->translate(Gva{layout->physmap_base + (fn - 0xffffffff80000000ull)});
    ASSERT_TRUE(direct);
    EXPECT_EQ(direct->page_size, 2u << 20);
    EXPECT_EQ(direct->address, tr->address);
  }
}

TEST(SimMemory, ForeignFramesOutsideTheDomainAreRefused) {
  Dom0Guest g(finite(1, 0));
  Frame bogus{1};  // PV machine frames of domain 1 start at 0x100000
  auto m = g.hv->map_frames(g.dom, std::span(&bogus, 1), hv::MapAccess::Read);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, Errc::Fault);
}

// Code written through a foreign mapping is what every vCPU executes next, even vCPUs that
// already translated (and cached) the old code.
TEST(SimMemory, CodePatchedThroughMappingIsSeenByEveryVcpu) {
  Dom0Guest g(finite(4, 0));
  ASSERT_TRUE(eventually([&] {
    for (unsigned v = 0; v < 4; ++v)
      if (g.stats(v).iterations < 3) return false;
    return true;
  }));
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true));
  std::uint64_t fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));

  // Each vCPU must stop at the int3. Handle a stop by returning from the function at once
  // (rip = return address, rax = 1), one unpause per stop found.
  std::set<unsigned> seen;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (seen.size() < 4 && std::chrono::steady_clock::now() < deadline) {
    if (!g.hv->domain_info(g.dom)->paused) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    unsigned found = 0;
    for (unsigned v = 0; v < 4; ++v) {
      auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{v});
      ASSERT_TRUE(r);
      if (r->rip != fn + 1) continue;
      auto ret = gm->read_u64(Gva{r->rsp});
      ASSERT_TRUE(ret);
      r->rip = *ret;
      r->rsp += 8;
      r->rax = 1;
      ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{v}, *r));
      seen.insert(v);
      ++found;
    }
    while (g.hv->gdbsx_domstatus(g.dom)->vcpu) {}
    for (unsigned i = 0; i < found; ++i) ASSERT_TRUE(g.hv->unpause(g.dom));
    if (!found) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(seen.size(), 4u) << "a vCPU kept executing stale code";
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
}

// ---- debugging mode: int3, ICEBP, single step ----

struct Stop {
  unsigned vcpu;
  hv::VcpuRegs regs;
};

// Waits until the domain is paused by a debug stop, then returns the vCPUs sitting at `rip`.
std::vector<Stop> wait_stops(Dom0Guest& g, unsigned vcpus, std::uint64_t rip) {
  std::vector<Stop> out;
  eventually([&] { return g.hv->domain_info(g.dom)->paused; });
  for (unsigned v = 0; v < vcpus; ++v) {
    auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{v});
    if (r && r->rip == rip) out.push_back({v, *r});
  }
  return out;
}

TEST(SimDebugger, Int3PausesTheDomainWithoutVirq) {
  DomainConfig c = finite(1, 30);
  c.start_paused = true;  // probe before the first iteration
  Dom0Guest g(c);
  auto virq = g.hv->evtchn_bind_virq(hv::kVirqDebugger);
  ASSERT_TRUE(virq);
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true));
  std::uint64_t fn = g.sym("sys_open");
  auto gm = g.memory_view();
  std::uint8_t orig = *gm->read_u8(Gva{fn});
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.hv->unpause(g.dom));  // the creation pause

  auto stops = wait_stops(g, 1, fn + 1);
  ASSERT_EQ(stops.size(), 1u) << "int3 must leave RIP = address + 1";
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u);
  EXPECT_FALSE(readable(g.hv->evtchn_fd(), 50)) << "an int3 stop raises no VIRQ_DEBUGGER";
  auto st = g.hv->gdbsx_domstatus(g.dom);
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->paused);
  ASSERT_TRUE(st->vcpu.has_value());
  EXPECT_EQ(*st->vcpu, 0u);
  EXPECT_EQ(st->event, 3u);
  EXPECT_FALSE(g.hv->gdbsx_domstatus(g.dom)->vcpu.has_value()) << "domstatus clears the record";

  // Take the probe out, rewind, resume: the guest finishes as if nothing happened.
  ASSERT_TRUE(gm->write_u8(Gva{fn}, orig));
  stops[0].regs.rip = fn;
  ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{0}, stops[0].regs));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  expect_workload_complete(g, 1, 30);
}

TEST(SimDebugger, IcebpRaisesVirqOnEveryHit) {
  DomainConfig c = finite(1, 30);
  c.start_paused = true;  // probe before the first iteration
  Dom0Guest g(c);
  auto virq = g.hv->evtchn_bind_virq(hv::kVirqDebugger);
  ASSERT_TRUE(virq);
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true));
  std::uint64_t fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  std::uint8_t orig = *gm->read_u8(Gva{fn});
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xf1));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.hv->unpause(g.dom));  // the creation pause

  // Three hits: each one pauses the domain and raises the VIRQ.
  for (int hit = 0; hit < 3; ++hit) {
    ASSERT_TRUE(readable(g.hv->evtchn_fd(), 10000)) << "hit " << hit;
    auto port = g.hv->evtchn_pending();
    ASSERT_TRUE(port && port->has_value());
    EXPECT_EQ(**port, *virq);
    auto stops = wait_stops(g, 1, fn + 1);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_FALSE(g.hv->gdbsx_domstatus(g.dom)->vcpu.has_value()) << "#DB records no gdbsx event";
    EXPECT_EQ(stops[0].regs.dr6 & 0x4000, 0u) << "ICEBP sets no DR6.BS";
    // Skip the function (return 1 at once).
    auto r = stops[0].regs;
    r.rip = *gm->read_u64(Gva{r.rsp});
    r.rsp += 8;
    r.rax = 1;
    ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{0}, r));
    ASSERT_TRUE(g.hv->evtchn_unmask(*virq));
    ASSERT_TRUE(g.hv->unpause(g.dom));
  }
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, orig));
  // A hit may have landed before our pause: rewind it.
  for (auto& s : wait_stops(g, 1, fn + 1)) {
    s.regs.rip = fn;
    ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{s.vcpu}, s.regs));
    ASSERT_TRUE(g.hv->unpause(g.dom));
  }
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, 30) - 3);
}

TEST(SimDebugger, TrapFlagStepsOneInstructionAndRaisesVirq) {
  DomainConfig c = finite(1, 20);
  c.start_paused = true;  // step the first instruction of the entry point
  Dom0Guest g(c);
  auto virq = g.hv->evtchn_bind_virq(hv::kVirqDebugger);
  ASSERT_TRUE(virq);
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true));
  auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
  ASSERT_TRUE(r);
  std::uint64_t before = r->rip;
  r->rflags |= 0x100;
  r->dr6 = 0xffff0ff0;
  ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{0}, *r));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 10000));
  ASSERT_TRUE(eventually([&] { return g.hv->domain_info(g.dom)->paused; }));
  auto after = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
  ASSERT_TRUE(after);
  EXPECT_NE(after->rip, before);
  EXPECT_EQ(after->dr6 & 0x4000, 0x4000u) << "a single step sets DR6.BS";
  EXPECT_EQ(after->rflags & 0x100, 0x100u) << "Xen leaves TF set until the debugger clears it";
  after->rflags &= ~0x100ull;
  after->dr6 = 0xffff0ff0;
  ASSERT_TRUE(g.hv->set_vcpu_regs(g.dom, VcpuId{0}, *after));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  expect_workload_complete(g, 1, 20);
}

TEST(SimDebugger, SeveralVcpusCanTrapBeforeThePauseLands) {
  Dom0Guest g(finite(4, 0));
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true));
  std::uint64_t fn = g.sym("demo_classify");
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  // The nosync pause lets the other vCPUs run a little longer; each of them that traps adds
  // its own pause reference. The count always equals the number of vCPUs stopped at the int3.
  ASSERT_TRUE(eventually([&] { return g.hv->domain_info(g.dom)->paused; }));
  std::this_thread::sleep_for(100ms);
  auto stops = wait_stops(g, 4, fn + 1);
  EXPECT_GE(stops.size(), 1u);
  EXPECT_EQ(*g.host->pause_count(g.dom), stops.size());
  unsigned records = 0;
  while (g.hv->gdbsx_domstatus(g.dom)->vcpu) ++records;
  EXPECT_EQ(records, stops.size());
}

TEST(SimDebugger, WithoutGdbsxInt3IsSwallowedAndTheGuestOopses) {
  SimOptions o;
  o.gdbsx = false;
  Dom0Guest g(finite(1, 0), o);
  auto caps = g.hv->capabilities();
  ASSERT_TRUE(caps);
  EXPECT_FALSE(caps->gdbsx);
  ASSERT_TRUE(g.hv->set_debugging(g.dom, true)) << "setdebugging succeeds without GDBSX too";
  auto st = g.hv->gdbsx_domstatus(g.dom);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::NoSys);
  std::uint64_t fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));  // over the first byte of 0f 1f 44 00 00
  ASSERT_TRUE(g.hv->unpause(g.dom));
  // No pause: the vCPU runs on at address + 1 (1f 44 00 00: not valid in 64-bit mode).
  ASSERT_TRUE(eventually([&] { return !g.host->crash_reason(g.dom).empty(); }));
  EXPECT_NE(g.host->crash_reason(g.dom).find("invalid opcode"), std::string::npos) << g.host->crash_reason(g.dom);
  EXPECT_EQ(*g.host->pause_count(g.dom), 0u);
  EXPECT_TRUE(g.hv->domain_info(g.dom)->crashed);
}

TEST(SimDebugger, Int3WithoutDebuggerIsDeliveredToTheGuest) {
  Dom0Guest g(finite(1, 0));
  std::uint64_t fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(eventually([&] { return !g.host->crash_reason(g.dom).empty(); }));
  EXPECT_NE(g.host->crash_reason(g.dom).find("#BP"), std::string::npos) << g.host->crash_reason(g.dom);
}

// ---- event channels ----

TEST(SimEvtchn, GlobalVirqHasOneBinderPerHost) {
  Dom0Guest g(finite(1, 1));
  auto other = g.host->open();
  ASSERT_TRUE(g.hv->evtchn_bind_virq(hv::kVirqDebugger));
  auto second = other->evtchn_bind_virq(hv::kVirqDebugger);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::Exists);
  EXPECT_NE(second.error().what.find("one binder per host"), std::string::npos);
}

TEST(SimEvtchn, InterdomainPendingMaskAndCoalescing) {
  Dom0Guest g(finite(1, 1));
  auto gport = g.host->guest_evtchn_alloc_unbound(g.dom);
  ASSERT_TRUE(gport);
  auto port = g.hv->evtchn_bind_interdomain(g.dom, *gport);
  ASSERT_TRUE(port);
  EXPECT_FALSE(*g.hv->evtchn_pending());

  // Two notifications before Dom0 looks coalesce into one.
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *port);
  EXPECT_FALSE(*g.hv->evtchn_pending());
  // While masked an event stays pending and is delivered on unmask.
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  EXPECT_FALSE(*g.hv->evtchn_pending());
  ASSERT_TRUE(g.hv->evtchn_unmask(*port));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *port);
  ASSERT_TRUE(g.hv->evtchn_unmask(*port));

  ASSERT_TRUE(g.hv->evtchn_notify(*port));
  ASSERT_TRUE(g.hv->evtchn_notify(*port));
  EXPECT_EQ(*g.host->guest_evtchn_notifications(g.dom, *gport), 2u);
  EXPECT_EQ(g.hv->evtchn_bind_interdomain(g.dom, *gport).error().code, Errc::Busy);
  EXPECT_EQ(g.hv->evtchn_bind_interdomain(g.dom, 999).error().code, Errc::InvalidArgument);
}

// Two ports pending at once are read one per call, in the order they fired; the fd stays
// readable until the last is read, and each stays masked (a new event on it queues nothing)
// until it is unmasked, as libxenevtchn's xenevtchn_pending/xenevtchn_unmask behave.
TEST(SimEvtchn, PendingPortsAreReadOneAtATimeAndStayMaskedUntilUnmasked) {
  Dom0Guest g(finite(1, 1));
  auto g1 = g.host->guest_evtchn_alloc_unbound(g.dom), g2 = g.host->guest_evtchn_alloc_unbound(g.dom);
  ASSERT_TRUE(g1 && g2);
  auto p1 = g.hv->evtchn_bind_interdomain(g.dom, *g1), p2 = g.hv->evtchn_bind_interdomain(g.dom, *g2);
  ASSERT_TRUE(p1 && p2);
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g2));
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g1));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p2);
  EXPECT_TRUE(readable(g.hv->evtchn_fd(), 0)) << "one port read, one still queued";
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g2));  // masked: stays pending, not queued
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p1);
  EXPECT_FALSE(*g.hv->evtchn_pending());
  EXPECT_FALSE(readable(g.hv->evtchn_fd(), 0));
  ASSERT_TRUE(g.hv->evtchn_unmask(*p1));
  EXPECT_FALSE(*g.hv->evtchn_pending()) << "nothing came on p1 while it was masked";
  ASSERT_TRUE(g.hv->evtchn_unmask(*p2));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000)) << "p2's event while masked comes with the unmask";
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p2);
  ASSERT_TRUE(g.hv->evtchn_unmask(*p2));
  ASSERT_TRUE(g.hv->evtchn_unbind(*p1));
  ASSERT_TRUE(g.hv->evtchn_unbind(*p2));
}

// ---- xenstore ----

TEST(SimXenstore, ModuleKeysArePublished) {
  Dom0Guest g(finite(2, 1));
  std::string dir = "/local/domain/" + std::to_string(g.dom.value) + "/" XENPROBES_XS_DIR "/";
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_VERSION), std::to_string(XENPROBES_PROTOCOL_VERSION));
  EXPECT_EQ(std::stoull(*g.hv->xs_read(dir + XENPROBES_XS_KERNEL_TEXT), nullptr, 16), g.sym("_text"));
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_NR_CPUS), "2");
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_STATE), XENPROBES_XS_STATE_READY);
  auto oea = std::stoull(*g.hv->xs_read(dir + "oea/0/addr"), nullptr, 16);
  auto text = g.sym("_text");
  EXPECT_LT(oea > text ? oea - text : text - oea, 1ull << 31) << "OEA within rel32 reach of text";
  EXPECT_EQ(*g.hv->xs_read("/local/domain/" + std::to_string(g.dom.value) + "/name"), "demo");
}

TEST(SimXenstore, WatchesFireOnceAtOnceThenOnChanges) {
  Dom0Guest g(finite(1, 1));
  ASSERT_TRUE(g.hv->xs_write("/test/a", "1"));
  ASSERT_TRUE(g.hv->xs_watch("/test", "tok"));
  ASSERT_TRUE(readable(g.hv->xs_fd(), 1000));
  auto ev = g.hv->xs_read_watches();
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].path, "/test");
  EXPECT_EQ((*ev)[0].token, "tok");
  ASSERT_TRUE(g.hv->xs_write("/test/a/b", "2"));
  ASSERT_TRUE(g.hv->xs_write("/other", "3"));
  ev = g.hv->xs_read_watches();
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].path, "/test/a/b");
  auto dir = g.hv->xs_directory("/test/a");
  ASSERT_TRUE(dir);
  EXPECT_EQ(*dir, std::vector<std::string>{"b"});
  ASSERT_TRUE(g.hv->xs_rm("/test/a"));
  EXPECT_EQ(g.hv->xs_read("/test/a/b").error().code, Errc::NotFound);
  EXPECT_EQ(g.hv->xs_read_watches()->size(), 1u);
  ASSERT_TRUE(g.hv->xs_unwatch("/test", "tok"));
  ASSERT_TRUE(g.hv->xs_write("/test/c", "4"));
  EXPECT_TRUE(g.hv->xs_read_watches()->empty());
  EXPECT_EQ(g.hv->xs_write("relative", "x").error().code, Errc::InvalidArgument);
}

TEST(SimXenstore, DomainLifecycleWatches) {
  Dom0Guest g(finite(1, 0));
  ASSERT_TRUE(g.hv->xs_watch("@introduceDomain", "intro"));
  ASSERT_TRUE(g.hv->xs_watch("@releaseDomain", "release"));
  ASSERT_TRUE(g.hv->xs_read_watches());  // the initial firing
  auto second = g.host->create_domain(finite(1, 0));
  ASSERT_TRUE(second);
  auto ev = g.hv->xs_read_watches();
  ASSERT_TRUE(std::any_of(ev->begin(), ev->end(), [](auto& e) { return e.token == "intro"; }));
  ASSERT_TRUE(g.host->destroy_domain(*second));
  ev = g.hv->xs_read_watches();
  ASSERT_TRUE(std::any_of(ev->begin(), ev->end(), [](auto& e) { return e.token == "release"; }));
}

// ---- domain death ----

TEST(SimDomain, DestroyWhileRunning) {
  Dom0Guest g(finite(2, 0));
  ASSERT_TRUE(eventually([&] { return g.stats(0).iterations > 0; }));
  auto fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  auto before = gm->read_u64(Gva{fn});
  ASSERT_TRUE(before);
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
  EXPECT_EQ(g.hv->domain_info(g.dom).error().code, Errc::NoSuchDomain);
  EXPECT_EQ(g.hv->pause(g.dom).error().code, Errc::NoSuchDomain);
  EXPECT_EQ(g.hv->get_vcpu_regs(g.dom, VcpuId{0}).error().code, Errc::NoSuchDomain);
  // Frames mapped before the death stay readable (Xen keeps mapped pages referenced).
  auto after = gm->read_u64(Gva{fn});
  ASSERT_TRUE(after);
  EXPECT_EQ(*after, *before);
  EXPECT_FALSE(g.host->destroy_domain(g.dom));
}

TEST(SimDomain, ListsDom0AndGuests) {
  Dom0Guest g(finite(3, 1));
  auto doms = g.hv->list_domains();
  ASSERT_TRUE(doms);
  ASSERT_EQ(doms->size(), 2u);
  EXPECT_EQ((*doms)[0].domid.value, 0u);
  EXPECT_EQ((*doms)[1].domid, g.dom);
  EXPECT_EQ((*doms)[1].vcpus, 3u);
  EXPECT_EQ((*doms)[1].type, GuestType::Pv);
  EXPECT_EQ((*doms)[1].guest_width, 8u);
}

TEST(SimDomain, BadImagesAreRefusedWithTheReason) {
  auto host = hv::sim::SimHost::create();
  DomainConfig c;
  c.image = "/nonexistent/vmlinux";
  auto r = host->create_domain(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what.find("/nonexistent/vmlinux"), std::string::npos);
  c.image = "/proc/self/status";  // not an ELF
  r = host->create_domain(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what.find("ELF"), std::string::npos);
}

// ---- fault injection ----

TEST(SimFaults, InjectedFaultsSurfaceAsErrors) {
  Dom0Guest g(finite(1, 0));
  g.host->fail_op(Op::Pause, Errc::Io);
  auto r = g.hv->pause(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
  EXPECT_NE(r.error().what.find("injected"), std::string::npos);
  EXPECT_FALSE(g.hv->domain_info(g.dom)->paused) << "a failed pause changes nothing";
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(g.hv->unpause(g.dom));

  g.host->fail_op(Op::MapFrames, Errc::Fault, 1, 1);  // the second map fails
  Frame f{0x100000 * g.dom.value + 0x1000};
  EXPECT_TRUE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));
  EXPECT_FALSE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));
  EXPECT_TRUE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));

  g.host->fail_nth_call(2, Errc::Again);
  EXPECT_TRUE(g.hv->version());
  EXPECT_TRUE(g.hv->version());
  EXPECT_EQ(g.hv->version().error().code, Errc::Again);
  EXPECT_TRUE(g.hv->version());

  // A fault in every kind of operation in turn never crashes the library or the guest.
  for (unsigned op = 0; op < static_cast<unsigned>(Op::Count_); ++op) {
    g.host->fail_op(static_cast<Op>(op), Errc::Io);
    (void)g.hv->domain_info(g.dom);
    (void)g.hv->xs_read("/local/domain/0/name");
    (void)g.hv->get_vcpu_regs(g.dom, VcpuId{0});
    g.host->clear_faults();
  }
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
  EXPECT_GT(g.host->op_count(Op::GetRegs), 0u);
}

// ---- selecting the backend ----

TEST(OpenHypervisor, BackendComesFromTheEnvironment) {
  ::setenv("XENPROBES_BACKEND", "bogus", 1);
  auto bad = hv::open_hypervisor();
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::InvalidArgument);
  EXPECT_NE(bad.error().what.find("'xen' or 'sim'"), std::string::npos);

  ::setenv("XENPROBES_BACKEND", "sim", 1);
  auto sim = hv::open_hypervisor();
  ASSERT_TRUE(sim) << sim.error().what;
  EXPECT_EQ((*sim)->name(), "sim");
  auto info = (*sim)->domain_info(DomId{1});
  ASSERT_TRUE(info);
  EXPECT_EQ(info->name, "demo");
  EXPECT_EQ(info->vcpus, 2u);
  ASSERT_NE(hv::sim::sim_host_of(**sim), nullptr);
  ::unsetenv("XENPROBES_BACKEND");
}

}  // namespace
}  // namespace xenprobes::testing
