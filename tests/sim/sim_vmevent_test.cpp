// The simulated vm_event monitor (HVM/PVH guests): per-vCPU pause, registers in the request,
// RIP = the breakpoint address, SET_REGISTERS and EMULATE responses, a ring that fills up.
#include <poll.h>

#include <map>
#include <set>

#include "hv/hypervisor.hpp"
#include "demo_guest.hpp"

namespace xenprobes::testing {
namespace {

using hv::GuestType;
using hv::VmEventReason;
using hv::VmEventRequest;
using hv::VmEventResponse;
using hv::sim::DomainConfig;

DomainConfig hvm(unsigned vcpus, std::uint64_t iterations) {
  DomainConfig c;
  c.type = GuestType::Hvm;
  c.vcpus = vcpus;
  c.iterations = iterations;
  return c;
}

std::optional<VmEventRequest> next_request(hv::VmEventRing& ring, int ms = 10000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto r = ring.get_request();
    if (!r) return std::nullopt;
    if (*r) return **r;
    pollfd p{ring.fd(), POLLIN, 0};
    poll(&p, 1, 10);
  }
  return std::nullopt;
}

VmEventResponse emulate_original(const VmEventRequest& req, std::span<const std::uint8_t> orig) {
  VmEventResponse rsp;
  rsp.vcpu = req.vcpu;
  rsp.reason = req.reason;
  rsp.flags = (req.flags & hv::kVmEventFlagVcpuPaused) | hv::kVmEventFlagEmulate | hv::kVmEventFlagSetEmulInsnData;
  std::copy(orig.begin(), orig.end(), rsp.emul_insn);
  return rsp;
}

// Enables the monitor ring, turns on the given monitoring and patches `trap_byte` over the
// first byte of `fn` (under a pause). Returns the ring and the original bytes.
struct Monitored {
  std::unique_ptr<hv::VmEventRing> ring;
  std::array<std::uint8_t, 16> orig{};
  std::uint64_t fn = 0;
};

Monitored monitor(Dom0Guest& g, const char* fn, std::uint8_t trap_byte) {
  Monitored m;
  auto ring = g.hv->monitor_enable(g.dom);
  EXPECT_TRUE(ring) << ring.error().what;
  if (!ring) return m;
  m.ring = std::move(*ring);
  if (trap_byte == 0xcc) EXPECT_TRUE(g.hv->monitor_software_breakpoint(g.dom, true));
  else EXPECT_TRUE(g.hv->monitor_debug_exceptions(g.dom, true, true));
  m.fn = g.sym(fn);
  auto gm = g.memory_view();
  EXPECT_TRUE(gm->read(Gva{m.fn}, std::as_writable_bytes(std::span(m.orig))));
  EXPECT_TRUE(g.hv->pause(g.dom));
  EXPECT_TRUE(gm->write_u8(Gva{m.fn}, trap_byte));
  EXPECT_TRUE(g.hv->unpause(g.dom));
  return m;
}

TEST(SimVmEvent, PvDomainsHaveNoMonitor) {
  Dom0Guest g;  // PV
  auto ring = g.hv->monitor_enable(g.dom);
  ASSERT_FALSE(ring);
  EXPECT_EQ(ring.error().code, Errc::NotSupported);
  EXPECT_NE(ring.error().what.find("HVM or PVH"), std::string::npos);
}

// int3 + software-breakpoint monitoring, every hit answered with EMULATE of the original
// bytes: the guest's results are exactly those of an unprobed run.
TEST(SimVmEvent, SoftwareBreakpointWithEmulationIsTransparent) {
  Dom0Guest ref(hvm(2, 30));
  ASSERT_TRUE(ref.host->wait_halted(ref.dom, 30s));

  DomainConfig c = hvm(2, 30);
  c.start_paused = true;
  Dom0Guest g(c);
  auto ring = g.hv->monitor_enable(g.dom);
  ASSERT_TRUE(ring) << ring.error().what;
  ASSERT_TRUE(g.hv->monitor_software_breakpoint(g.dom, true));
  std::uint64_t fn = g.sym("sys_read");
  auto gm = g.memory_view();
  std::array<std::uint8_t, 16> orig{};
  ASSERT_TRUE(gm->read(Gva{fn}, std::as_writable_bytes(std::span(orig))));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));

  std::map<unsigned, unsigned> hits;
  unsigned total = 0;
  const unsigned expected = 2 * static_cast<unsigned>(expected_calls(DEMO_FN_READ, 30));
  while (total < expected) {
    auto req = next_request(**ring);
    ASSERT_TRUE(req) << "after " << total << " hits: " << g.host->crash_reason(g.dom);
    EXPECT_EQ(req->reason, VmEventReason::SoftwareBreakpoint);
    EXPECT_EQ(req->regs.rip, fn) << "RIP is the breakpoint address itself";
    EXPECT_EQ(req->type, 6);
    EXPECT_EQ(req->insn_length, 1);
    EXPECT_TRUE(req->flags & hv::kVmEventFlagVcpuPaused);
    std::uint64_t stacks = g.sym(DEMO_SYM_STACKS);
    EXPECT_GE(req->regs.rsp, stacks + req->vcpu * DEMO_STACK_SIZE) << "registers come in the request";
    EXPECT_LT(req->regs.rsp, stacks + (req->vcpu + 1) * DEMO_STACK_SIZE);
    hits[req->vcpu]++;
    ++total;
    ASSERT_TRUE((*ring)->put_response(emulate_original(*req, orig)));
    ASSERT_TRUE((*ring)->notify());
  }
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits[0], expected_calls(DEMO_FN_READ, 30));
  EXPECT_EQ(hits[1], expected_calls(DEMO_FN_READ, 30));
  for (unsigned v = 0; v < 2; ++v) {
    EXPECT_EQ(g.stats(v).checksum, ref.stats(v).checksum);
    EXPECT_EQ(g.stats(v).calls[DEMO_FN_READ], expected_calls(DEMO_FN_READ, 30));
  }
}

// While one vCPU waits on its request, the others keep running (and trapping).
TEST(SimVmEvent, OnlyTheTrappingVcpuPauses) {
  Dom0Guest g(hvm(2, 0));
  Monitored mon = monitor(g, "sys_write", 0xcc);
  ASSERT_TRUE(mon.ring);
  auto* ring = &mon.ring;
  std::uint64_t fn = mon.fn;
  const auto& orig = mon.orig;

  auto first = next_request(**ring);
  ASSERT_TRUE(first);
  unsigned held = first->vcpu, other = 1 - held;
  auto held_iters = g.stats(held).iterations;
  // Answer only the other vCPU, many times; the held one stays where it is.
  for (int i = 0; i < 20; ++i) {
    auto req = next_request(**ring);
    ASSERT_TRUE(req);
    ASSERT_EQ(req->vcpu, other);
    ASSERT_TRUE((*ring)->put_response(emulate_original(*req, orig)));
    ASSERT_TRUE((*ring)->notify());
  }
  EXPECT_EQ(g.stats(held).iterations, held_iters);
  EXPECT_FALSE(g.hv->domain_info(g.dom)->paused) << "vm_event never pauses the whole domain";
  auto regs = g.hv->get_vcpu_regs(g.dom, VcpuId{held});
  ASSERT_TRUE(regs);
  EXPECT_EQ(regs->rip, fn);
}

TEST(SimVmEvent, SetRegistersRedirectsTheVcpu) {
  DomainConfig c = hvm(1, 10);
  c.start_paused = true;  // probe before the first iteration
  Dom0Guest g(c);
  auto ring = g.hv->monitor_enable(g.dom);
  ASSERT_TRUE(ring);
  ASSERT_TRUE(g.hv->monitor_software_breakpoint(g.dom, true));
  std::uint64_t fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.hv->unpause(g.dom));  // the creation pause
  // Every hit returns 7 at once through SET_REGISTERS (rip = return address, rsp += 8).
  for (std::uint64_t i = 0; i < expected_calls(DEMO_FN_GETPPID, 10); ++i) {
    auto req = next_request(**ring);
    ASSERT_TRUE(req) << g.host->crash_reason(g.dom);
    VmEventResponse rsp;
    rsp.vcpu = req->vcpu;
    rsp.reason = req->reason;
    rsp.flags = hv::kVmEventFlagVcpuPaused | hv::kVmEventFlagSetRegisters;
    rsp.regs = req->regs;
    rsp.regs.rip = *gm->read_u64(Gva{req->regs.rsp});
    rsp.regs.rsp += 8;
    rsp.regs.rax = 7;
    ASSERT_TRUE((*ring)->put_response(rsp));
    ASSERT_TRUE((*ring)->notify());
  }
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "the function body never ran";
  EXPECT_EQ(g.stats(0).iterations, 10u);

  VmEventResponse both;
  both.flags = hv::kVmEventFlagSetRegisters | hv::kVmEventFlagSetEmulInsnData;
  EXPECT_EQ((*ring)->put_response(both).error().code, Errc::InvalidArgument);
}

TEST(SimVmEvent, IcebpWithDebugExceptionMonitoring) {
  DomainConfig c = hvm(1, 5);
  c.start_paused = true;  // probe before the first iteration
  Dom0Guest g(c);
  Monitored mon = monitor(g, "sys_unlink", 0xf1);
  ASSERT_TRUE(mon.ring);
  auto* ring = &mon.ring;
  std::uint64_t fn = mon.fn;
  const auto& orig = mon.orig;
  ASSERT_TRUE(g.hv->unpause(g.dom));  // the creation pause
  // Xen emulates supplied bytes only in answer to a software breakpoint
  // (vm_event_emulate_check): after an ICEBP the vCPU resumes on the ICEBP and traps again.
  for (int i = 0; i < 3; ++i) {
    auto req = next_request(**ring);
    ASSERT_TRUE(req) << g.host->crash_reason(g.dom);
    EXPECT_EQ(req->reason, VmEventReason::DebugException);
    EXPECT_EQ(req->regs.rip, fn) << "RIP = the ICEBP address (not + 1)";
    EXPECT_EQ(req->type, 5);
    EXPECT_EQ(req->insn_length, 1);
    EXPECT_EQ(g.stats(0).calls[DEMO_FN_UNLINK], 0u) << "nothing was emulated";
    ASSERT_TRUE((*ring)->put_response(emulate_original(*req, orig)));
    ASSERT_TRUE((*ring)->notify());
  }
  // Put the byte back and answer the last stop plainly: the vCPU re-executes the original.
  auto req = next_request(**ring);
  ASSERT_TRUE(req);
  auto gm = g.memory_view();
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, orig[0]));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  VmEventResponse plain;
  plain.vcpu = req->vcpu;
  plain.reason = req->reason;
  plain.flags = hv::kVmEventFlagVcpuPaused;
  ASSERT_TRUE((*ring)->put_response(plain));
  ASSERT_TRUE((*ring)->notify());
  ASSERT_TRUE(g.host->wait_halted(g.dom, 30s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_UNLINK], expected_calls(DEMO_FN_UNLINK, 5));
}

// More vCPUs trapping than ring slots: the extra vCPUs wait until a slot is answered.
TEST(SimVmEvent, FullRingMakesVcpusWait) {
  hv::sim::SimOptions o;
  o.ring_slots = 2;
  Dom0Guest g(hvm(4, 0), o);
  Monitored mon = monitor(g, "demo_classify", 0xcc);
  ASSERT_TRUE(mon.ring);
  auto* ring = &mon.ring;
  const auto& orig = mon.orig;

  // Let all four vCPUs reach the breakpoint; only two requests fit.
  std::this_thread::sleep_for(200ms);
  std::vector<VmEventRequest> got;
  while (auto r = next_request(**ring, 100)) got.push_back(*r);
  ASSERT_EQ(got.size(), 2u);
  std::set<unsigned> vcpus;
  for (auto& r : got) vcpus.insert(r.vcpu);
  for (auto& r : got) ASSERT_TRUE((*ring)->put_response(emulate_original(r, orig)));
  ASSERT_TRUE((*ring)->notify());
  // The waiting vCPUs now post theirs (possibly with new hits of the answered ones).
  for (int i = 0; i < 6; ++i) {
    auto r = next_request(**ring);
    ASSERT_TRUE(r);
    vcpus.insert(r->vcpu);
    ASSERT_TRUE((*ring)->put_response(emulate_original(*r, orig)));
    ASSERT_TRUE((*ring)->notify());
  }
  EXPECT_EQ(vcpus.size(), 4u);
}

}  // namespace
}  // namespace xenprobes::testing
