// The real Xen backend's vm_event side, checked against hand-built Xen structs: requests
// translated (hostile ones refused), responses built, and the back ring with the test playing
// Xen's part on a plain page.

#include "unit/hv_xen/xen_backend_fixture.hpp"

namespace xenprobes::hv {
namespace {

using namespace xen;

// ---- vm_event -----------------------------------------------------------------------------

vm_event_request_t make_request(std::uint32_t reason) {
  vm_event_request_t q;
  std::memset(&q, 0, sizeof q);
  q.version = VM_EVENT_INTERFACE_VERSION;
  q.vcpu_id = 1;
  q.flags = VM_EVENT_FLAG_VCPU_PAUSED;
  q.reason = reason;
  auto& x = q.data.regs.x86;
  x.rax = 0x11;
  x.rbx = 0x12;
  x.rcx = 0x13;
  x.rdx = 0x14;
  x.rsp = 0x15;
  x.rbp = 0x16;
  x.rsi = 0x17;
  x.rdi = 0x18;
  x.r8 = 0x19;
  x.r15 = 0x20;
  x.rip = 0xffffffff81000000;  // vm_event: RIP is the breakpoint address itself
  x.rflags = 0x246;
  x.cr0 = 0x80050033;
  x.cr2 = 0x7000;
  x.cr3 = 0x10a000;
  x.cr4 = 0x3706f0;
  x.msr_efer = 0xd01;
  x.dr6 = 0xffff0ff0;
  x.dr7 = 0x400;
  x.fs_base = 0x7f0000;
  x.gs_base = 0xffff888000000000;
  x.cs_sel = 0x10;
  x.ss_sel = 0x18;
  x.ss.ar = kArData64Dpl0;
  return q;
}

TEST(VmEventRequest, DebugExceptionFromIcebp) {
  auto q = make_request(VM_EVENT_REASON_DEBUG_EXCEPTION);
  q.flags |= VM_EVENT_FLAG_ALTERNATE_P2M;  // Xen-only flag: must not leak into hv flags
  q.u.debug_exception.gfn = 0x1234;
  q.u.debug_exception.type = 5;  // privileged software exception (ICEBP)
  q.u.debug_exception.insn_length = 1;
  q.u.debug_exception.pending_dbg = 0x4000;
  auto r = vm_event_request_from_xen(q);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->reason, VmEventReason::DebugException);
  EXPECT_EQ(r->vcpu, 1u);
  EXPECT_EQ(r->flags, kVmEventFlagVcpuPaused);
  EXPECT_EQ(r->gfn, 0x1234u);
  EXPECT_EQ(r->type, 5);
  EXPECT_EQ(r->insn_length, 1);
  EXPECT_EQ(r->pending_dbg, 0x4000u);
  EXPECT_EQ(r->regs.rip, 0xffffffff81000000u);
  EXPECT_EQ(r->regs.rax, 0x11u);
  EXPECT_EQ(r->regs.rbx, 0x12u);
  EXPECT_EQ(r->regs.rcx, 0x13u);
  EXPECT_EQ(r->regs.rdx, 0x14u);
  EXPECT_EQ(r->regs.rsp, 0x15u);
  EXPECT_EQ(r->regs.rbp, 0x16u);
  EXPECT_EQ(r->regs.rsi, 0x17u);
  EXPECT_EQ(r->regs.rdi, 0x18u);
  EXPECT_EQ(r->regs.r8, 0x19u);
  EXPECT_EQ(r->regs.r15, 0x20u);
  EXPECT_EQ(r->regs.rflags, 0x246u);
  EXPECT_EQ(r->regs.cr3, 0x10a000u);
  EXPECT_EQ(r->regs.efer, 0xd01u);
  EXPECT_EQ(r->regs.dr6, 0xffff0ff0u);
  EXPECT_EQ(r->regs.gs_base, 0xffff888000000000u);
  EXPECT_EQ(r->regs.cs, 0x10);
  EXPECT_TRUE(r->regs.kernel_mode);
}

TEST(VmEventRequest, SoftwareBreakpointFromInt3InUserMode) {
  auto q = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  q.u.software_breakpoint.gfn = 0x999;
  q.u.software_breakpoint.type = 6;  // software exception
  q.u.software_breakpoint.insn_length = 1;
  q.data.regs.x86.ss.ar = kArData64Dpl3;
  auto r = vm_event_request_from_xen(q);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->reason, VmEventReason::SoftwareBreakpoint);
  EXPECT_EQ(r->gfn, 0x999u);
  EXPECT_EQ(r->type, 6);
  EXPECT_EQ(r->insn_length, 1);
  EXPECT_FALSE(r->regs.kernel_mode);
}

TEST(VmEventRequest, Singlestep) {
  auto q = make_request(VM_EVENT_REASON_SINGLESTEP);
  q.u.singlestep.gfn = 0x55;
  auto r = vm_event_request_from_xen(q);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->reason, VmEventReason::Singlestep);
  EXPECT_EQ(r->gfn, 0x55u);
}

TEST(VmEventRequest, WrongVersionIsHostileInput) {
  auto q = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  q.version = VM_EVENT_INTERFACE_VERSION - 1;
  auto r = vm_event_request_from_xen(q);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

TEST(VmEventRequest, ImpossibleInstructionLengthIsHostileInput) {
  auto q = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  q.u.software_breakpoint.insn_length = 16;
  auto r = vm_event_request_from_xen(q);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

TEST(VmEventRequest, ReasonsLibxenprobesDoesNotUseAreNotSupported) {
  // CPUID (10) in particular must not be mistaken for a debug exception (9).
  const std::uint32_t reasons[] = {VM_EVENT_REASON_CPUID, VM_EVENT_REASON_MEM_ACCESS, VM_EVENT_REASON_GUEST_REQUEST,
                                   9999};
  for (std::uint32_t reason : reasons) {
    auto r = vm_event_request_from_xen(make_request(reason));
    ASSERT_FALSE(r) << reason;
    EXPECT_EQ(r.error().code, Errc::NotSupported) << reason;
  }
}

TEST(VmEventResponse, SetRegisters) {
  VmEventResponse rsp;
  rsp.vcpu = 3;
  rsp.reason = VmEventReason::DebugException;
  rsp.flags = kVmEventFlagVcpuPaused | kVmEventFlagSetRegisters;
  rsp.regs.rip = 0xffffffffc0001000;  // the slot
  rsp.regs.rax = 1;
  rsp.regs.rsp = 2;
  rsp.regs.r15 = 3;
  rsp.regs.rflags = 0x202;
  vm_event_response_t out;
  std::memset(&out, 0xee, sizeof out);
  ASSERT_TRUE(vm_event_response_to_xen(rsp, out));
  EXPECT_EQ(out.version, static_cast<std::uint32_t>(VM_EVENT_INTERFACE_VERSION));
  EXPECT_EQ(out.vcpu_id, 3u);
  EXPECT_EQ(out.reason, static_cast<std::uint32_t>(VM_EVENT_REASON_DEBUG_EXCEPTION));
  EXPECT_EQ(out.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED | VM_EVENT_FLAG_SET_REGISTERS));
  EXPECT_EQ(out.altp2m_idx, 0);
  EXPECT_EQ(out.data.regs.x86.rip, 0xffffffffc0001000u);
  EXPECT_EQ(out.data.regs.x86.rax, 1u);
  EXPECT_EQ(out.data.regs.x86.rsp, 2u);
  EXPECT_EQ(out.data.regs.x86.r15, 3u);
  EXPECT_EQ(out.data.regs.x86.rflags, 0x202u);
}

TEST(VmEventResponse, EmulateWithInstructionBytes) {
  VmEventResponse rsp;
  rsp.vcpu = 0;
  rsp.reason = VmEventReason::SoftwareBreakpoint;
  rsp.flags = kVmEventFlagVcpuPaused | kVmEventFlagEmulate | kVmEventFlagSetEmulInsnData;
  const std::uint8_t orig[16] = {0x0f, 0x1f, 0x44, 0x00, 0x00,  // nopl 0x0(%rax,%rax,1)
                                 0x55,                          // push %rbp
                                 0x48, 0x89, 0xe5};             // mov %rsp,%rbp
  std::memcpy(rsp.emul_insn, orig, sizeof orig);
  vm_event_response_t out;
  ASSERT_TRUE(vm_event_response_to_xen(rsp, out));
  EXPECT_EQ(out.reason, static_cast<std::uint32_t>(VM_EVENT_REASON_SOFTWARE_BREAKPOINT));
  EXPECT_EQ(out.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED | VM_EVENT_FLAG_EMULATE |
                                                  VM_EVENT_FLAG_SET_EMUL_INSN_DATA));
  EXPECT_EQ(0, std::memcmp(out.data.emul.insn.data, orig, sizeof orig));
}

TEST(VmEventResponse, ToggleSinglestepFlag) {
  VmEventResponse rsp;
  rsp.reason = VmEventReason::Singlestep;
  rsp.flags = kVmEventFlagVcpuPaused | kVmEventFlagToggleSinglestep;
  vm_event_response_t out;
  ASSERT_TRUE(vm_event_response_to_xen(rsp, out));
  EXPECT_EQ(out.reason, static_cast<std::uint32_t>(VM_EVENT_REASON_SINGLESTEP));
  EXPECT_EQ(out.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED | VM_EVENT_FLAG_TOGGLE_SINGLESTEP));
}

TEST(VmEventResponse, RegistersAndInstructionBytesShareAUnion) {
  VmEventResponse rsp;
  rsp.flags = kVmEventFlagVcpuPaused | kVmEventFlagSetRegisters | kVmEventFlagEmulate | kVmEventFlagSetEmulInsnData;
  vm_event_response_t out;
  auto r = vm_event_response_to_xen(rsp, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(VmEventResponse, UnknownFlagsAreRejected) {
  VmEventResponse rsp;
  rsp.flags = kVmEventFlagVcpuPaused | (1u << 20);
  vm_event_response_t out;
  auto r = vm_event_response_to_xen(rsp, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(VmEventResponse, RoundTripsThroughTheRequestFlags) {
  // What a consumer does: echo VCPU_PAUSED from the request into the response.
  auto q = make_request(VM_EVENT_REASON_DEBUG_EXCEPTION);
  auto req = vm_event_request_from_xen(q);
  ASSERT_TRUE(req);
  VmEventResponse rsp;
  rsp.vcpu = req->vcpu;
  rsp.reason = req->reason;
  rsp.flags = req->flags & kVmEventFlagVcpuPaused;
  vm_event_response_t out;
  ASSERT_TRUE(vm_event_response_to_xen(rsp, out));
  EXPECT_EQ(out.flags, q.flags);
  EXPECT_EQ(out.reason, q.reason);
  EXPECT_EQ(out.vcpu_id, q.vcpu_id);
}

// ---- the vm_event back ring, with the test playing Xen's part on a plain page -------------

class XenFront {
 public:
  XenFront() : page_(static_cast<std::uint8_t*>(std::aligned_alloc(4096, 4096))) {
    std::memset(page_, 0xff, 4096);  // garbage: the back ring must initialise the page
  }
  ~XenFront() { std::free(page_); }
  void* page() const { return page_; }
  vm_event_sring_t* sring() const { return reinterpret_cast<vm_event_sring_t*>(page_); }

  void push(const vm_event_request_t& q) {
    auto* s = sring();
    std::memcpy(&s->ring[s->req_prod % 8].req, &q, sizeof q);
    s->req_prod = s->req_prod + 1;
  }
  vm_event_response_t response(unsigned idx) const {
    vm_event_response_t r;
    std::memcpy(&r, &sring()->ring[idx % 8].rsp, sizeof r);
    return r;
  }

 private:
  std::uint8_t* page_;
};

TEST(VmEventBackRing, InitialisesThePageAndStartsEmpty) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  EXPECT_EQ(ring.size(), 8u);  // 400-byte slots in one 4 KiB page
  EXPECT_EQ(xen.sring()->req_prod, 0u);
  EXPECT_EQ(xen.sring()->rsp_prod, 0u);
  bool answered = false;
  auto r = ring.take_request(answered);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(answered);
  EXPECT_EQ(xen.sring()->req_event, 1u);  // "notify me at the next request"
}

TEST(VmEventBackRing, TakesRequestsInOrderAndAnswersEachOnce) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  auto a = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  a.vcpu_id = 0;
  auto b = make_request(VM_EVENT_REASON_DEBUG_EXCEPTION);
  b.vcpu_id = 1;
  xen.push(a);
  xen.push(b);

  bool answered = false;
  auto ra = ring.take_request(answered);
  auto rb = ring.take_request(answered);
  auto none = ring.take_request(answered);
  ASSERT_TRUE(ra && *ra && rb && *rb && none);
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(answered);
  EXPECT_EQ((*ra)->vcpu, 0u);
  EXPECT_EQ((*ra)->reason, VmEventReason::SoftwareBreakpoint);
  EXPECT_EQ((*rb)->vcpu, 1u);
  EXPECT_EQ((*rb)->reason, VmEventReason::DebugException);
  EXPECT_EQ(xen.sring()->req_event, 3u);

  VmEventResponse rsp;
  rsp.vcpu = 1;
  rsp.reason = VmEventReason::DebugException;
  rsp.flags = kVmEventFlagVcpuPaused | kVmEventFlagSetRegisters;
  rsp.regs = (*rb)->regs;
  rsp.regs.rip += 1;
  ASSERT_TRUE(ring.push_response(rsp));
  EXPECT_EQ(xen.sring()->rsp_prod, 1u);  // pushed, visible to Xen
  rsp.vcpu = 0;
  rsp.reason = VmEventReason::SoftwareBreakpoint;
  rsp.flags = kVmEventFlagVcpuPaused;
  ASSERT_TRUE(ring.push_response(rsp));
  EXPECT_EQ(xen.sring()->rsp_prod, 2u);

  auto r0 = xen.response(0);
  EXPECT_EQ(r0.version, static_cast<std::uint32_t>(VM_EVENT_INTERFACE_VERSION));
  EXPECT_EQ(r0.vcpu_id, 1u);
  EXPECT_EQ(r0.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED | VM_EVENT_FLAG_SET_REGISTERS));
  EXPECT_EQ(r0.data.regs.x86.rip, 0xffffffff81000001u);
  auto r1 = xen.response(1);
  EXPECT_EQ(r1.vcpu_id, 0u);
  EXPECT_EQ(r1.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED));

  // A third response has no request to answer.
  auto extra = ring.push_response(rsp);
  ASSERT_FALSE(extra);
  EXPECT_EQ(extra.error().code, Errc::NoSpace);
  EXPECT_EQ(xen.sring()->rsp_prod, 2u);
}

TEST(VmEventBackRing, WrapsAroundTheEightSlots) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  for (unsigned i = 0; i < 21; ++i) {
    auto q = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
    q.vcpu_id = i;
    xen.push(q);
    bool answered = false;
    auto r = ring.take_request(answered);
    ASSERT_TRUE(r && *r) << i;
    EXPECT_EQ((*r)->vcpu, i);
    VmEventResponse rsp;
    rsp.vcpu = i;
    rsp.flags = kVmEventFlagVcpuPaused;
    ASSERT_TRUE(ring.push_response(rsp)) << i;
    EXPECT_EQ(xen.response(i).vcpu_id, i);
  }
  EXPECT_EQ(xen.sring()->rsp_prod, 21u);
}

TEST(VmEventBackRing, AnswersAndSkipsReasonsItDoesNotUse) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  auto cpuid = make_request(VM_EVENT_REASON_CPUID);
  cpuid.vcpu_id = 2;
  xen.push(cpuid);
  auto bp = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  bp.vcpu_id = 3;
  xen.push(bp);

  bool answered = false;
  testing::internal::CaptureStderr();  // the skip is logged at warn level
  auto r = ring.take_request(answered);
  std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->vcpu, 3u);  // the CPUID request was skipped...
  EXPECT_TRUE(answered);      // ...and answered: the caller must notify
  EXPECT_NE(err.find("resuming vCPU 2"), std::string::npos) << err;
  EXPECT_EQ(xen.sring()->rsp_prod, 1u);
  auto rsp = xen.response(0);
  EXPECT_EQ(rsp.vcpu_id, 2u);
  EXPECT_EQ(rsp.reason, static_cast<std::uint32_t>(VM_EVENT_REASON_CPUID));
  EXPECT_EQ(rsp.flags, static_cast<std::uint32_t>(VM_EVENT_FLAG_VCPU_PAUSED));
  EXPECT_EQ(rsp.version, static_cast<std::uint32_t>(VM_EVENT_INTERFACE_VERSION));
}

TEST(VmEventBackRing, BadRequestIsIoAndItsSlotIsConsumed) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  auto bad = make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT);
  bad.version = 0x1234;
  xen.push(bad);
  xen.push(make_request(VM_EVENT_REASON_SOFTWARE_BREAKPOINT));
  bool answered = false;
  auto r = ring.take_request(answered);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
  auto next = ring.take_request(answered);
  ASSERT_TRUE(next && *next);
  EXPECT_FALSE(answered);
}

TEST(VmEventBackRing, ProducerIndexBeyondTheRingIsIo) {
  XenFront xen;
  VmEventBackRing ring(xen.page(), DomId{5});
  xen.sring()->req_prod = 9;  // 9 outstanding requests in an 8-slot ring
  bool answered = false;
  auto r = ring.take_request(answered);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

}  // namespace
}  // namespace xenprobes::hv
