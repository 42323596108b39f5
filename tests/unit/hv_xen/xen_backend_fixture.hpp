// Shared by the real Xen backend's tests (xen_backend_test.cpp, xen_backend_state_test.cpp,
// xen_backend_vm_event_test.cpp): Xen's public headers for the structs the shim translates,
// and a hand-built HVM CPU record with its segment access rights.
#pragma once

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

inline constexpr std::uint32_t kArCode64Dpl0 = 0xa9b;  // P=1 S=1 type=0xb L=1 G=1, DPL 0
inline constexpr std::uint32_t kArData64Dpl0 = 0xc93;
inline constexpr std::uint32_t kArData64Dpl3 = 0xcf3;  // DPL 3 (bits 5-6)

inline hvm_hw_cpu make_hvm_cpu(std::uint64_t base) {
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

}  // namespace xenprobes::hv
