// The real Xen backend, on a machine without Xen: opening fails cleanly and quietly, and the
// pure Xen <-> hv translations of the shim are checked against hand-built Xen structs.

#include "unit/hv_xen/xen_backend_fixture.hpp"

namespace xenprobes::hv {
namespace {

using namespace xen;

bool has_privcmd() { return ::access("/dev/xen/privcmd", F_OK) == 0 || ::access("/proc/xen/privcmd", F_OK) == 0; }

// ---- opening ------------------------------------------------------------------------------

TEST(OpenXenHypervisor, FailsWithNotSupportedOutsideDom0) {
  if (has_privcmd()) GTEST_SKIP() << "privcmd present: this is a Xen Dom0 (or DomU)";
  auto r = open_xen_hypervisor();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NotSupported);
  EXPECT_EQ(r.error().what, kNoPrivcmdMessage);
  EXPECT_TRUE(r.error().what.starts_with("no /dev/xen/privcmd: not running in a Xen Dom0")) << r.error().what;
}

TEST(OpenXenHypervisor, PrintsNothingEvenAtDebugLevel) {
  if (has_privcmd()) GTEST_SKIP() << "privcmd present: this is a Xen Dom0 (or DomU)";
  auto saved = log::level();
  log::set_level(log::Level::Debug);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {  // no hidden state: every attempt fails the same way
    auto r = open_xen_hypervisor();
    EXPECT_FALSE(r);
    if (!r) { EXPECT_EQ(r.error().code, Errc::NotSupported); }
  }
  std::string err = testing::internal::GetCapturedStderr();
  log::set_level(saved);
  EXPECT_EQ(err, "");
}

void log_through(xentoollog_logger* l, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  l->vmessage(l, XTL_ERROR, ENOENT, "xc", fmt, ap);
  va_end(ap);
}

TEST(QuietLogger, KeepsLibxcMessagesOffStderrByDefault) {
  auto saved = log::level();
  log::set_level(log::Level::Warn);
  xentoollog_logger* l = quiet_logger();
  ASSERT_NE(l, nullptr);
  testing::internal::CaptureStderr();
  log_through(l, "Could not obtain handle on privileged command interface: %s", "ENOENT");
  if (l->progress) l->progress(l, "xc", "doing", 50, 1, 2);
  std::string err = testing::internal::GetCapturedStderr();
  log::set_level(saved);
  EXPECT_EQ(err, "");
}

TEST(QuietLogger, ForwardsToXpLogAtDebug) {
  auto saved = log::level();
  log::set_level(log::Level::Debug);
  testing::internal::CaptureStderr();
  log_through(quiet_logger(), "hello %d", 42);
  std::string err = testing::internal::GetCapturedStderr();
  log::set_level(saved);
  EXPECT_NE(err.find("hello 42"), std::string::npos) << err;
}

// ---- PV registers -------------------------------------------------------------------------

TEST(PvCr3, DecodesTheXenEncodingToAMachineAddress) {
  // ctrlreg[3] = xen_pfn_to_cr3(L4 MFN); hv wants the machine address (cr3 >> 12 == MFN).
  EXPECT_EQ(pv_cr3_to_maddr(xen_pfn_to_cr3_x86_64(0x12345)), 0x12345000u);
  EXPECT_EQ(pv_cr3_to_maddr(xen_pfn_to_cr3_x86_64(0xfffffffffULL)), 0xfffffffff000ULL);
  EXPECT_EQ(maddr_to_pv_cr3(0x12345000u), xen_pfn_to_cr3_x86_64(0x12345));
  EXPECT_EQ(pv_cr3_to_maddr(maddr_to_pv_cr3(0xabcdef000ULL)), 0xabcdef000ULL);
}

vcpu_guest_context_x86_64 make_pv_context(bool in_kernel) {
  vcpu_guest_context_x86_64 c;
  std::memset(&c, 0, sizeof c);
  auto& u = c.user_regs;
  u.rax = 0x1000;
  u.rbx = 0x1001;
  u.rcx = 0x1002;
  u.rdx = 0x1003;
  u.rsi = 0x1004;
  u.rdi = 0x1005;
  u.rbp = 0x1006;
  u.rsp = 0xffffc90000003f00;
  u.r8 = 0x1008;
  u.r9 = 0x1009;
  u.r10 = 0x100a;
  u.r11 = 0x100b;
  u.r12 = 0x100c;
  u.r13 = 0x100d;
  u.r14 = 0x100e;
  u.r15 = 0x100f;
  u.rip = 0xffffffff81000001;  // int3 at ...000 trapped: RIP = probe + 1
  u.rflags = 0x246;
  u.cs = FLAT_KERNEL_CS64_X86_64;  // 64-bit PV kernels run in ring 3
  u.ss = FLAT_KERNEL_SS64_X86_64;
  c.flags = VGCF_i387_valid_X86_64 | (in_kernel ? VGCF_in_kernel_X86_64 : 0) | VGCF_online_X86_64;
  c.ctrlreg[0] = 0x80050033;
  c.ctrlreg[1] = xen_pfn_to_cr3_x86_64(0x4321);  // user L4
  c.ctrlreg[2] = 0xdead000;
  c.ctrlreg[3] = xen_pfn_to_cr3_x86_64(0x1234);  // kernel L4 MFN
  c.ctrlreg[4] = 0x3406f0;
  c.debugreg[6] = 0xffff4ff0;  // BS set: a single step completed
  c.debugreg[7] = 0x400;
  c.gdt_frames[0] = 0x777;
  c.gdt_ents = 512;
  c.ldt_base = 0x5550000;
  c.ldt_ents = 3;
  c.fs_base = 0x7f0000001000;
  c.gs_base_kernel = 0xffff888000010000;
  c.gs_base_user = 0x7f0000002000;
  return c;
}

TEST(PvRegs, FromContextInKernelMode) {
  auto c = make_pv_context(true);
  VcpuRegs r = regs_from_pv(c);
  EXPECT_EQ(r.rax, 0x1000u);
  EXPECT_EQ(r.rbx, 0x1001u);
  EXPECT_EQ(r.rcx, 0x1002u);
  EXPECT_EQ(r.rdx, 0x1003u);
  EXPECT_EQ(r.rsi, 0x1004u);
  EXPECT_EQ(r.rdi, 0x1005u);
  EXPECT_EQ(r.rbp, 0x1006u);
  EXPECT_EQ(r.rsp, 0xffffc90000003f00u);
  EXPECT_EQ(r.r8, 0x1008u);
  EXPECT_EQ(r.r9, 0x1009u);
  EXPECT_EQ(r.r10, 0x100au);
  EXPECT_EQ(r.r11, 0x100bu);
  EXPECT_EQ(r.r12, 0x100cu);
  EXPECT_EQ(r.r13, 0x100du);
  EXPECT_EQ(r.r14, 0x100eu);
  EXPECT_EQ(r.r15, 0x100fu);
  EXPECT_EQ(r.rip, 0xffffffff81000001u);
  EXPECT_EQ(r.rflags, 0x246u);
  EXPECT_EQ(r.cr0, 0x80050033u);
  EXPECT_EQ(r.cr2, 0xdead000u);
  EXPECT_EQ(r.cr3, 0x1234000u);  // the kernel L4, as a machine address
  EXPECT_EQ(r.cr4, 0x3406f0u);
  EXPECT_EQ(r.efer, 0x501u);  // LMA|LME|SCE: 64-bit PV is long mode by definition
  EXPECT_EQ(r.efer, kPvEfer);
  EXPECT_EQ(r.dr6, 0xffff4ff0u);
  EXPECT_EQ(r.dr7, 0x400u);
  EXPECT_EQ(r.fs_base, 0x7f0000001000u);
  EXPECT_EQ(r.gs_base, 0xffff888000010000u);  // kernel mode: the kernel GS base is active
  EXPECT_EQ(r.cs, FLAT_KERNEL_CS64_X86_64);
  EXPECT_EQ(r.ss, FLAT_KERNEL_SS64_X86_64);
  EXPECT_TRUE(r.kernel_mode);
}

TEST(PvRegs, FromContextInUserModeUsesTheUserGsBase) {
  VcpuRegs r = regs_from_pv(make_pv_context(false));
  EXPECT_FALSE(r.kernel_mode);
  EXPECT_EQ(r.gs_base, 0x7f0000002000u);
  EXPECT_EQ(r.cr3, 0x1234000u);  // still ctrlreg[3]; the user L4 stays in ctrlreg[1]
}

TEST(PvRegs, ToContextChangesOnlyGprsRipRflagsAndDebugRegs) {
  auto before = make_pv_context(true);
  auto c = before;
  VcpuRegs r = regs_from_pv(c);
  r.rax = 0xa;
  r.rbx = 0xb;
  r.rcx = 0xc;
  r.rdx = 0xd;
  r.rsi = 0xe;
  r.rdi = 0xf;
  r.rbp = 0x10;
  r.rsp = 0x11;
  r.r8 = 0x18;
  r.r9 = 0x19;
  r.r10 = 0x1a;
  r.r11 = 0x1b;
  r.r12 = 0x1c;
  r.r13 = 0x1d;
  r.r14 = 0x1e;
  r.r15 = 0x1f;
  r.rip = 0xffffffff81000000;  // back to the probe address
  r.rflags = 0x346;            // TF set
  r.dr6 = 0xffff0ff0;          // BS cleared
  r.dr7 = 0;
  // Fields hv may not change through set_vcpu_regs: they must be echoed, not taken from r.
  r.cr0 = r.cr2 = r.cr3 = r.cr4 = 0;
  r.fs_base = r.gs_base = 0;
  r.cs = r.ss = 0;
  r.kernel_mode = false;
  regs_to_pv(r, c);

  const auto& u = c.user_regs;
  EXPECT_EQ(u.rax, 0xau);
  EXPECT_EQ(u.rbx, 0xbu);
  EXPECT_EQ(u.rcx, 0xcu);
  EXPECT_EQ(u.rdx, 0xdu);
  EXPECT_EQ(u.rsi, 0xeu);
  EXPECT_EQ(u.rdi, 0xfu);
  EXPECT_EQ(u.rbp, 0x10u);
  EXPECT_EQ(u.rsp, 0x11u);
  EXPECT_EQ(u.r8, 0x18u);
  EXPECT_EQ(u.r9, 0x19u);
  EXPECT_EQ(u.r10, 0x1au);
  EXPECT_EQ(u.r11, 0x1bu);
  EXPECT_EQ(u.r12, 0x1cu);
  EXPECT_EQ(u.r13, 0x1du);
  EXPECT_EQ(u.r14, 0x1eu);
  EXPECT_EQ(u.r15, 0x1fu);
  EXPECT_EQ(u.rip, 0xffffffff81000000u);
  EXPECT_EQ(u.rflags, 0x346u);
  EXPECT_EQ(c.debugreg[6], 0xffff0ff0u);
  EXPECT_EQ(c.debugreg[7], 0u);

  // Everything Xen checks on setvcpucontext (CR3, user L4, GDT, LDT) and the rest: as read.
  EXPECT_EQ(u.cs, before.user_regs.cs);
  EXPECT_EQ(u.ss, before.user_regs.ss);
  EXPECT_EQ(c.flags, before.flags);
  EXPECT_EQ(0, std::memcmp(c.ctrlreg, before.ctrlreg, sizeof c.ctrlreg));
  EXPECT_EQ(0, std::memcmp(c.gdt_frames, before.gdt_frames, sizeof c.gdt_frames));
  EXPECT_EQ(c.gdt_ents, before.gdt_ents);
  EXPECT_EQ(c.ldt_base, before.ldt_base);
  EXPECT_EQ(c.ldt_ents, before.ldt_ents);
  EXPECT_EQ(0, std::memcmp(&c.fpu_ctxt, &before.fpu_ctxt, sizeof c.fpu_ctxt));
  EXPECT_EQ(c.fs_base, before.fs_base);
  EXPECT_EQ(c.gs_base_kernel, before.gs_base_kernel);
  EXPECT_EQ(c.gs_base_user, before.gs_base_user);

  // And the round trip reads back what was written.
  VcpuRegs back = regs_from_pv(c);
  EXPECT_EQ(back.rip, r.rip);
  EXPECT_EQ(back.rflags, r.rflags);
  EXPECT_EQ(back.r15, r.r15);
  EXPECT_EQ(back.cr3, 0x1234000u);
}

// ---- HVM registers ------------------------------------------------------------------------

TEST(HvmRegs, FromCpuRecord) {
  VcpuRegs r = regs_from_hvm(make_hvm_cpu(0x2000));
  EXPECT_EQ(r.rax, 0x2000u);
  EXPECT_EQ(r.rbx, 0x2001u);
  EXPECT_EQ(r.rcx, 0x2002u);
  EXPECT_EQ(r.rdx, 0x2003u);
  EXPECT_EQ(r.rbp, 0x2004u);
  EXPECT_EQ(r.rsi, 0x2005u);
  EXPECT_EQ(r.rdi, 0x2006u);
  EXPECT_EQ(r.rsp, 0x2007u);
  EXPECT_EQ(r.r8, 0x2008u);
  EXPECT_EQ(r.r15, 0x200fu);
  EXPECT_EQ(r.rip, 0xffffffff81234567u);
  EXPECT_EQ(r.rflags, 0x202u);
  EXPECT_EQ(r.cr0, 0x80050033u);
  EXPECT_EQ(r.cr2, 0x1000u);
  EXPECT_EQ(r.cr3, 0x10a000u);  // guest-physical: not decoded like PV
  EXPECT_EQ(r.cr4, 0x3706f0u);
  EXPECT_EQ(r.efer, 0xd01u);
  EXPECT_EQ(r.dr6, 0xffff0ff0u);
  EXPECT_EQ(r.dr7, 0x400u);
  EXPECT_EQ(r.fs_base, 0x7f00aa000000u);
  EXPECT_EQ(r.gs_base, 0xffff88807fc00000u);  // the active base, not shadow_gs
  EXPECT_EQ(r.cs, 0x10);
  EXPECT_EQ(r.ss, 0x18);
  EXPECT_TRUE(r.kernel_mode);
}

TEST(HvmRegs, UserModeIsSsDplThree) {
  auto c = make_hvm_cpu(0);
  c.ss_arbytes = kArData64Dpl3;
  c.ss_sel = 0x2b;
  EXPECT_FALSE(regs_from_hvm(c).kernel_mode);
}

TEST(HvmRegs, ToCpuRecordChangesOnlyGprsRipRflagsAndDebugRegs) {
  auto before = make_hvm_cpu(0x3000);
  auto c = before;
  VcpuRegs r = regs_from_hvm(c);
  r.rax = 0xaa;
  r.r15 = 0xff;
  r.rsp = 0x77;
  r.rip = 0xffffffff81234566;
  r.rflags = 0x302;
  r.dr6 = 0;
  r.dr7 = 0x1;
  r.cr3 = 0;
  r.efer = 0;
  r.cs = 0;
  r.fs_base = 0;  // not applied
  regs_to_hvm(r, c);
  EXPECT_EQ(c.rax, 0xaau);
  EXPECT_EQ(c.r15, 0xffu);
  EXPECT_EQ(c.rsp, 0x77u);
  EXPECT_EQ(c.rip, 0xffffffff81234566u);
  EXPECT_EQ(c.rflags, 0x302u);
  EXPECT_EQ(c.dr6, 0u);
  EXPECT_EQ(c.dr7, 0x1u);
  EXPECT_EQ(c.cr3, before.cr3);
  EXPECT_EQ(c.msr_efer, before.msr_efer);
  EXPECT_EQ(c.cs_sel, before.cs_sel);
  EXPECT_EQ(c.fs_base, before.fs_base);
  EXPECT_EQ(c.flags, before.flags);
  EXPECT_EQ(0, std::memcmp(c.fpu_regs, before.fpu_regs, sizeof c.fpu_regs));
}

}  // namespace
}  // namespace xenprobes::hv
