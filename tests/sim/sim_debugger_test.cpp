// The simulated Xen under debugging mode: int3, ICEBP and the trap flag with and without GDBSX,
// as docs/simulated-xen.md says Xen 4.17 behaves.
#include "sim/sim_fixture.hpp"

namespace xenprobes::testing {
namespace {

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

}  // namespace
}  // namespace xenprobes::testing
