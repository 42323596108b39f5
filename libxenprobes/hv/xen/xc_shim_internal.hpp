// Internal to the xc_shim*.cpp files, the ONLY files that include xenctrl.h (and, through it,
// the __XEN_TOOLS__-only public headers domctl.h and vm_event.h), all of them through this
// header. Everything that depends on the Xen 4.17 control ABI lives in them: libxenctrl calls,
// raw domctls through libxencall, the vm_event ring, and the pure translations between Xen's
// structs and hv types. Not installed.
//
//   xc_shim.cpp            XcShim: open, the ABI pins, domains, pause, vCPU registers, gdbsx,
//                          event injection; raw domctls; the quiet logger
//   xc_shim_translate.cpp  the pure translations between Xen's structs and hv types
//   xc_shim_ext_state.cpp  the XEN_DOMCTL_{get,set}vcpuextstate buffers
//   xc_shim_vm_event.cpp   the vm_event ring (VmEventBackRing, and the ring with its event
//                          channel) and XcShim's monitor calls
#pragma once

#include <string>

extern "C" {
#include <xenctrl.h>  // defines __XEN_TOOLS__ before the public headers, and xen_mb() & co.
#include <xencall.h>
#include <xendevicemodel.h>
#include <xentoollog.h>
#include <xen/hvm/save.h>
#include <xen/vm_event.h>
#include <xen/io/ring.h>
}

#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv::xen {

// ---- small helpers -------------------------------------------------------------------------

inline std::string on_dom(const char* call, DomId dom) {
  return std::string(call) + "(dom" + std::to_string(dom.value) + ")";
}

inline std::string on_vcpu(const char* call, DomId dom, VcpuId vcpu) {
  return std::string(call) + "(dom" + std::to_string(dom.value) + ", vcpu " + std::to_string(vcpu.value) + ")";
}

}  // namespace xenprobes::hv::xen
