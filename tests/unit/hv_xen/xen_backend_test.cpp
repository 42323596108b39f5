// The real Xen backend, on a machine without Xen: opening fails cleanly and quietly, and the
// pure Xen <-> hv translations of the shim are checked against hand-built Xen structs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Xen's public headers only (never xenctrl.h): the structs the shim translates.
#ifndef __XEN_TOOLS__
#define __XEN_TOOLS__ 1  // domctl.h and vm_event.h are tools-only
#endif
extern "C" {
#include <xentoollog.h>
#include <xen/xen.h>
#include <xen/domctl.h>
#include <xen/sched.h>
#include <xen/foreign/x86_64.h>
#include <xen/hvm/save.h>
#include <xen/vm_event.h>
}

#include "common/log.hpp"
#include "hv/xen/xen_hypervisor.hpp"
#include "hv/xen/xen_internal.hpp"

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

constexpr std::uint32_t kArCode64Dpl0 = 0xa9b;  // P=1 S=1 type=0xb L=1 G=1, DPL 0
constexpr std::uint32_t kArData64Dpl0 = 0xc93;
constexpr std::uint32_t kArData64Dpl3 = 0xcf3;  // DPL 3 (bits 5-6)

hvm_hw_cpu make_hvm_cpu(std::uint64_t base) {
  hvm_hw_cpu c;
  std::memset(&c, 0, sizeof c);
  c.rax = base + 0;
  c.rbx = base + 1;
  c.rcx = base + 2;
  c.rdx = base + 3;
  c.rbp = base + 4;
  c.rsi = base + 5;
  c.rdi = base + 6;
  c.rsp = base + 7;
  c.r8 = base + 8;
  c.r9 = base + 9;
  c.r10 = base + 10;
  c.r11 = base + 11;
  c.r12 = base + 12;
  c.r13 = base + 13;
  c.r14 = base + 14;
  c.r15 = base + 15;
  c.rip = 0xffffffff81234567;
  c.rflags = 0x202;
  c.cr0 = 0x80050033;
  c.cr2 = 0x1000;
  c.cr3 = 0x10a000;
  c.cr4 = 0x3706f0;
  c.dr6 = 0xffff0ff0;
  c.dr7 = 0x400;
  c.cs_sel = 0x10;
  c.ss_sel = 0x18;
  c.cs_arbytes = kArCode64Dpl0;
  c.ss_arbytes = kArData64Dpl0;
  c.fs_base = 0x7f00aa000000;
  c.gs_base = 0xffff88807fc00000;
  c.shadow_gs = 0x7f00bb000000;
  c.msr_efer = 0xd01;  // LMA|LME|NXE|SCE
  c.flags = XEN_X86_FPU_INITIALISED;
  std::memset(c.fpu_regs, 0x3c, sizeof c.fpu_regs);
  return c;
}

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

// ---- patching a full HVM context ---------------------------------------------------------
//
//   [HEADER][hvm_save_header] [CPU/0][hvm_hw_cpu] [CPU/1][hvm_hw_cpu] [XSAVE/0][64 B]
//   [XSAVE/1][64 B] [END]

void put_record(std::vector<std::uint8_t>& blob, std::uint16_t type, std::uint16_t inst, const void* data,
                std::uint32_t len) {
  hvm_save_descriptor d{type, inst, len};
  auto* p = reinterpret_cast<const std::uint8_t*>(&d);
  blob.insert(blob.end(), p, p + sizeof d);
  auto* q = static_cast<const std::uint8_t*>(data);
  blob.insert(blob.end(), q, q + len);
}

std::vector<std::uint8_t> make_hvm_context(unsigned vcpus) {
  std::vector<std::uint8_t> blob;
  hvm_save_header h{HVM_FILE_MAGIC, HVM_FILE_VERSION, 0, 0x906ea, 2400000};
  put_record(blob, HVM_SAVE_CODE(HEADER), 0, &h, sizeof h);
  for (unsigned v = 0; v < vcpus; ++v) {
    auto c = make_hvm_cpu(0x1000 * (v + 1));
    put_record(blob, HVM_SAVE_CODE(CPU), v, &c, sizeof c);
  }
  for (unsigned v = 0; v < vcpus; ++v) {
    std::uint8_t xsave[64];
    std::memset(xsave, 0xa0 + v, sizeof xsave);
    put_record(blob, CPU_XSAVE_CODE, v, xsave, sizeof xsave);
  }
  put_record(blob, HVM_SAVE_CODE(END), 0, nullptr, 0);
  return blob;
}

// Offset of vCPU v's CPU payload in make_hvm_context's layout.
std::size_t cpu_payload_offset(unsigned v) {
  return sizeof(hvm_save_descriptor) + sizeof(hvm_save_header) +
         v * (sizeof(hvm_save_descriptor) + sizeof(hvm_hw_cpu)) + sizeof(hvm_save_descriptor);
}

TEST(HvmContext, PatchesOnlyTheCpuRecordOfThatVcpu) {
  auto blob = make_hvm_context(2);
  const auto before = blob;
  hvm_hw_cpu c1;
  std::memcpy(&c1, blob.data() + cpu_payload_offset(1), sizeof c1);
  VcpuRegs r = regs_from_hvm(c1);
  r.rip = 0xffffffff8100dead;
  r.rax = 0x42;
  ASSERT_TRUE(hvm_context_set_cpu_regs(blob, 1, r));

  std::memcpy(&c1, blob.data() + cpu_payload_offset(1), sizeof c1);
  EXPECT_EQ(c1.rip, 0xffffffff8100deadu);
  EXPECT_EQ(c1.rax, 0x42u);

  // Every byte outside vCPU 1's rax..rflags and dr6/dr7 is unchanged: the other vCPU, the
  // header, and the XSAVE records that restore the extended state after the CPU records.
  ASSERT_EQ(blob.size(), before.size());
  const std::size_t gprs = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, rax);
  const std::size_t gprs_end = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, cr0);
  const std::size_t drs = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, dr6);
  const std::size_t drs_end = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, cs_sel);
  for (std::size_t i = 0; i < blob.size(); ++i) {
    if ((i >= gprs && i < gprs_end) || (i >= drs && i < drs_end)) continue;
    ASSERT_EQ(blob[i], before[i]) << "byte " << i;
  }
}

TEST(HvmContext, NoCpuRecordForAnOfflineVcpu) {
  auto blob = make_hvm_context(2);
  auto r = hvm_context_set_cpu_regs(blob, 5, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(HvmContext, TruncatedBlobIsIo) {
  auto blob = make_hvm_context(2);
  blob.resize(cpu_payload_offset(1) + 100);  // vCPU 1's record claims more than is left
  auto r = hvm_context_set_cpu_regs(blob, 1, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

TEST(HvmContext, UnexpectedCpuRecordLengthIsIo) {
  std::vector<std::uint8_t> blob;
  hvm_save_header h{HVM_FILE_MAGIC, HVM_FILE_VERSION, 0, 0, 0};
  put_record(blob, HVM_SAVE_CODE(HEADER), 0, &h, sizeof h);
  std::vector<std::uint8_t> short_cpu(sizeof(hvm_hw_cpu) - 8, 0);
  put_record(blob, HVM_SAVE_CODE(CPU), 0, short_cpu.data(), short_cpu.size());
  put_record(blob, HVM_SAVE_CODE(END), 0, nullptr, 0);
  auto r = hvm_context_set_cpu_regs(blob, 0, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

// ---- domain info --------------------------------------------------------------------------

// ---- XEN_DOMCTL_{get,set}vcpuextstate buffers ----------------------------------------------
// Xen's part is played by hand: an AVX host (xfeature_mask x87|SSE|YMM, CPUID 0xD size 832).

constexpr std::uint64_t kAvxMask = 0x7;
constexpr std::size_t kAvxMax = 16 + 832;

ExtStateHost avx_host() {
  xen_domctl_vcpuextstate q{};
  q.vcpu = 1;
  q.xfeature_mask = kAvxMask;
  q.size = kAvxMax;
  auto h = ext_state_host_from_query(q);
  EXPECT_TRUE(h) << h.error().what;
  return h ? *h : ExtStateHost{};
}

void put64(std::vector<std::uint8_t>& b, std::size_t off, std::uint64_t v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// A getvcpuextstate answer: the domctl as copied back and the buffer as filled.
struct ExtAnswer {
  xen_domctl_vcpuextstate dc{};
  std::vector<std::uint8_t> buf;
};

ExtAnswer answer(unsigned vcpu, std::uint64_t xcr0, std::uint64_t accum, std::uint64_t bv, std::size_t size = kAvxMax) {
  ExtAnswer a;
  ext_state_prepare_get(a.dc, vcpu, avx_host());
  a.buf.assign(kAvxMax, 0);
  put64(a.buf, 0, xcr0);
  put64(a.buf, 8, accum);
  if (size > 16) {
    a.buf[16] = 0x7f;            // FCW, just to have some payload
    put64(a.buf, 16 + 512, bv);  // xstate_bv
    a.buf[16 + 576] = 0xa5;      // first YMM_Hi128 byte
  }
  a.dc.size = size;  // Xen writes back the size it filled
  return a;
}

Result<ExtStateImage> parse(const ExtAnswer& a, unsigned vcpu = 1) {
  return ext_state_parse(a.dc, vcpu, avx_host(), a.buf);
}

TEST(ExtState, SizeQueryAsksWithZeroSizeMaskAndNullBuffer) {
  xen_domctl_vcpuextstate q;
  std::memset(&q, 0xff, sizeof q);
  ext_state_prepare_query(q, 3);
  EXPECT_EQ(q.vcpu, 3u);
  EXPECT_EQ(q.xfeature_mask, 0u);
  EXPECT_EQ(q.size, 0u);
  EXPECT_EQ(q.buffer.p, nullptr);
}

TEST(ExtState, HostFromQuery) {
  auto h = avx_host();
  EXPECT_TRUE(h.has_xsave());
  EXPECT_EQ(h.xfeature_mask, kAvxMask);
  EXPECT_EQ(h.max_size, kAvxMax);

  xen_domctl_vcpuextstate q{};  // no XSAVE: PV_XSAVE_SIZE(0) = 16
  q.size = 16;
  auto none = ext_state_host_from_query(q);
  ASSERT_TRUE(none) << none.error().what;
  EXPECT_FALSE(none->has_xsave());
}

TEST(ExtState, ImplausibleQueryAnswersAreIo) {
  struct Case {
    std::uint64_t mask, size;
  };
  for (auto c : {Case{0, 848},              // no XSAVE, yet a size
                 Case{0x5, kAvxMax},        // YMM without SSE
                 Case{0x1, kAvxMax},        // no SSE
                 Case{0x27, kAvxMax},       // OPMASK without ZMM/HI_ZMM
                 Case{kAvxMask, 16 + 512},  // smaller than legacy + header
                 Case{kAvxMask, 16 + 1024 * 1024}, Case{kAvxMask, ~0ull}}) {
    xen_domctl_vcpuextstate q{};
    q.xfeature_mask = c.mask;
    q.size = c.size;
    auto h = ext_state_host_from_query(q);
    ASSERT_FALSE(h) << std::hex << c.mask << " " << c.size;
    EXPECT_EQ(h.error().code, Errc::Io);
  }
}

TEST(ExtState, GetAsksWithTheHostMaskAndTheMaximumSize) {
  xen_domctl_vcpuextstate g;
  std::memset(&g, 0xff, sizeof g);
  ext_state_prepare_get(g, 2, avx_host());
  EXPECT_EQ(g.vcpu, 2u);
  EXPECT_EQ(g.xfeature_mask, kAvxMask);
  EXPECT_EQ(g.size, kAvxMax);
}

TEST(ExtState, ParsesAnAvxImageAndSetsItBackWithTheSameSize) {
  auto a = answer(1, 0x7, 0x7, 0x6);
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_EQ(img->xcr0, 0x7u);
  EXPECT_EQ(img->xcr0_accum, 0x7u);
  EXPECT_EQ(img->xstate_bv, 0x6u);
  EXPECT_EQ(img->size, kAvxMax);
  EXPECT_TRUE(img->needs_restore());

  xen_domctl_vcpuextstate s;
  std::memset(&s, 0xff, sizeof s);
  ext_state_prepare_set(s, 1, *img);
  EXPECT_EQ(s.vcpu, 1u);
  EXPECT_EQ(s.xfeature_mask, 0u);  // ignored by SET
  EXPECT_EQ(s.size, kAvxMax);      // PV_XSAVE_SIZE(xcr0_accum), as Xen reported it
}

TEST(ExtState, SubsetOfTheHostMaskMayBeSmaller) {
  auto a = answer(1, 0x3, 0x3, 0x3, 16 + 576);  // guest never enabled AVX
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_EQ(img->size, 16u + 576u);
  EXPECT_TRUE(img->needs_restore());
}

TEST(ExtState, NoImageBeforeTheFirstXsetbvNeedsNoRestore) {
  auto a = answer(1, 0, 0, 0, 16);
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_FALSE(img->needs_restore());
  EXPECT_EQ(img->size, 16u);
}

TEST(ExtState, HostileAnswersAreIo) {
  struct Case {
    const char* name;
    ExtAnswer a;
  };
  std::vector<Case> cases;
  cases.push_back({"size beyond the buffer", answer(1, 7, 7, 7, kAvxMax + 8)});
  cases.push_back({"size below the header", answer(1, 7, 7, 7, 8)});
  cases.push_back({"image too small", answer(1, 3, 3, 3, 16 + 575)});
  cases.push_back({"full mask, wrong size", answer(1, 7, 7, 7, kAvxMax - 64)});
  cases.push_back({"accum 0 with xcr0", answer(1, 7, 0, 0, 16)});
  cases.push_back({"accum 0 with an image", answer(1, 0, 0, 0, kAvxMax)});
  cases.push_back({"accum beyond the host", answer(1, 0x7, 0x207, 0x7)});
  cases.push_back({"xcr0 beyond accum", answer(1, 0x7, 0x3, 0x3, 16 + 576)});
  cases.push_back({"xcr0 without FP", answer(1, 0x6, 0x7, 0x7)});
  cases.push_back({"xstate_bv beyond accum", answer(1, 0x3, 0x3, 0x7, 16 + 576)});
  {
    auto a = answer(1, 7, 7, 7);
    put64(a.buf, 16 + 512 + 8, 1ull << 63 | 7);  // compacted: not the toolstack ABI
    cases.push_back({"compacted", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    put64(a.buf, 16 + 512 + 16 + 5 * 8, 1);  // last reserved header word
    cases.push_back({"reserved word", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    a.dc.vcpu = 2;
    cases.push_back({"vcpu changed", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    a.dc.xfeature_mask = 0x3;
    cases.push_back({"mask changed", std::move(a)});
  }
  for (const auto& c : cases) {
    auto img = parse(c.a);
    ASSERT_FALSE(img) << c.name;
    EXPECT_EQ(img.error().code, Errc::Io) << c.name << ": " << img.error().what;
  }
}

TEST(ExtState, BufferSmallerThanTheQueryAnswerIsRefused) {
  auto a = answer(1, 7, 7, 7);
  a.buf.resize(kAvxMax - 1);
  auto img = parse(a);
  ASSERT_FALSE(img);
  EXPECT_EQ(img.error().code, Errc::InvalidArgument);
}

TEST(DomainInfo, FromGetdomaininfo) {
  xen_domctl_getdomaininfo x;
  std::memset(&x, 0, sizeof x);
  x.domain = 7;
  x.flags = XEN_DOMINF_hvm_guest | XEN_DOMINF_paused | XEN_DOMINF_debugged;
  x.max_vcpu_id = 3;
  x.nr_online_vcpus = 2;
  for (unsigned i = 0; i < 16; ++i) x.handle[i] = static_cast<std::uint8_t>(0xa0 + i);
  DomainInfo d = domain_info_from_xen(x);
  EXPECT_EQ(d.domid, DomId{7});
  EXPECT_EQ(d.handle, (DomainHandle{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad,
                                    0xae, 0xaf}))
      << "the domain's unique handle (xen_domain_handle_t)";
  EXPECT_EQ(d.type, GuestType::Hvm);
  EXPECT_EQ(d.vcpus, 4u);
  EXPECT_EQ(d.online_vcpus, 2u);
  EXPECT_TRUE(d.paused);
  EXPECT_TRUE(d.debugged);
  EXPECT_FALSE(d.dying);
  EXPECT_FALSE(d.shutdown);
  EXPECT_FALSE(d.crashed);
  EXPECT_EQ(d.name, "");
}

TEST(DomainInfo, CrashedIsShutdownWithReasonCrash) {
  xen_domctl_getdomaininfo x;
  std::memset(&x, 0, sizeof x);
  x.domain = 3;
  x.flags = XEN_DOMINF_shutdown | XEN_DOMINF_dying | (SHUTDOWN_crash << XEN_DOMINF_shutdownshift);
  x.max_vcpu_id = XEN_INVALID_MAX_VCPU_ID;
  DomainInfo d = domain_info_from_xen(x);
  EXPECT_EQ(d.type, GuestType::Pv);
  EXPECT_EQ(d.vcpus, 0u);
  EXPECT_TRUE(d.shutdown);
  EXPECT_TRUE(d.dying);
  EXPECT_TRUE(d.crashed);

  x.flags = XEN_DOMINF_shutdown | (SHUTDOWN_poweroff << XEN_DOMINF_shutdownshift);
  d = domain_info_from_xen(x);
  EXPECT_TRUE(d.shutdown);
  EXPECT_FALSE(d.crashed);
}

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
