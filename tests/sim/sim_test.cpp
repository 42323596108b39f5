// The simulated Xen: the demo guest runs, pause reference counts, and guest memory through the
// guest's own page tables are what docs/simulated-xen.md says they are (the Xen 4.17 behaviour
// the channels depend on; debugging mode: sim_debugger_test.cpp; event channels, xenstore,
// domains, fault injection: sim_host_test.cpp).
#include <set>

#include "sim/sim_fixture.hpp"

namespace xenprobes::testing {
namespace {

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

// Counting executions (DomainConfig::count_executions, the sweeps' reference runs) changes
// nothing the guest does: each vCPU resumes a quantum at the block it had not run yet. (With
// the counting hook, Unicorn 2.0.1's RIP at a quantum's end is the last instruction already
// run: resuming there ran the call before the stop twice and the workload crashed in its third
// iteration.) Short quanta as well, to stop at many more points.
TEST(SimGuest, CountingExecutionsChangesNothingTheGuestDoes) {
  for (GuestType type : {GuestType::Pv, GuestType::Hvm})
    for (unsigned quantum : {512u, 5u}) {
      SCOPED_TRACE(std::string(type == GuestType::Pv ? "PV" : "HVM") + ", quantum " + std::to_string(quantum));
      SimOptions o;
      o.quantum_blocks = quantum;
      Dom0Guest plain(finite(2, 12, type), o);
      ASSERT_TRUE(plain.host->wait_halted(plain.dom, 30s)) << plain.host->crash_reason(plain.dom);
      DomainConfig c = finite(2, 12, type);
      c.count_executions = {plain.sym("demo_dispatch"), plain.sym("demo_kstack_entry")};
      Dom0Guest counted(c, o);
      ASSERT_TRUE(counted.host->wait_halted(counted.dom, 30s)) << counted.host->crash_reason(counted.dom);
      expect_workload_complete(counted, 2, 12);
      for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(counted.stats(v).checksum, plain.stats(v).checksum) << "vcpu " << v;
      EXPECT_EQ(*counted.host->executions(counted.dom, plain.sym("demo_dispatch")),
                2 * expected_calls(DEMO_FN_DISPATCH, 12));
      EXPECT_EQ(*counted.host->executions(counted.dom, plain.sym("demo_kstack_entry")), 2 * 12u);
    }
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

}  // namespace
}  // namespace xenprobes::testing
