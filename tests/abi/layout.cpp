// Prints the layout of every struct and class the installed headers define: size and alignment,
// and for the C API's structs the offset of every member (the size too, unless the struct may
// grow at its end). tests/abi/check-layout.sh compares the
// output with libxenprobes/xenprobes.layout and checks that no public type is missing here
// (docs/architecture.md "ABI").
#include <cstddef>
#include <cstdio>

#include "xenprobes/doctor.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/result.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/types.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

namespace {

void type(const char* name, std::size_t size, std::size_t align) {
  std::printf("%s size %zu align %zu\n", name, size, align);
}

void member(const char* type_name, const char* name, std::size_t offset) {
  std::printf("%s.%s offset %zu\n", type_name, name, offset);
}

}  // namespace

#define XP_TYPE(name, ...) type(name, sizeof(__VA_ARGS__), alignof(__VA_ARGS__))
#define XP_C(T) type(#T, sizeof(struct T), alignof(struct T))
// A C struct that may grow at its end: an out-struct whose caller states its version (the
// library serves every version it knows and refuses the others), or one the library fills and
// lends to a handler. Its size is not part of the layout; its members' offsets are.
#define XP_C_GROWS(T) std::printf("%s grows align %zu\n", #T, alignof(struct T))
#define XP_M(T, m) member(#T, #m, offsetof(struct T, m))

int main() {
  using namespace xenprobes;
  // The C API (include/xenprobes/xenprobes.h): every member's offset.
  XP_C(cpu_user_regs);
  XP_M(cpu_user_regs, r15);
  XP_M(cpu_user_regs, rbp);
  XP_M(cpu_user_regs, rax);
  XP_M(cpu_user_regs, rdi);
  XP_M(cpu_user_regs, error_code);
  XP_M(cpu_user_regs, rip);
  XP_M(cpu_user_regs, cs);
  XP_M(cpu_user_regs, saved_upcall_mask);
  XP_M(cpu_user_regs, rflags);
  XP_M(cpu_user_regs, rsp);
  XP_M(cpu_user_regs, ss);
  XP_M(cpu_user_regs, es);
  XP_M(cpu_user_regs, ds);
  XP_M(cpu_user_regs, fs);
  XP_M(cpu_user_regs, gs);
  XP_C_GROWS(xenprobe_stats);
  XP_M(xenprobe_stats, version);
  XP_M(xenprobe_stats, hits);
  XP_M(xenprobe_stats, unhandled);
  XP_M(xenprobe_stats, returns);
  XP_M(xenprobe_stats, untracked_calls);
  XP_M(xenprobe_stats, declined);
  XP_M(xenprobe_stats, reclaimed);
  XP_M(xenprobe_stats, maxactive);
  XP_M(xenprobe_stats, active);
  XP_C_GROWS(xenprobe_info);
  XP_M(xenprobe_info, version);
  XP_M(xenprobe_info, method);
  XP_M(xenprobe_info, mode);
  XP_M(xenprobe_info, jump_pending);
  XP_M(xenprobe_info, async);
  XP_M(xenprobe_info, ret);
  XP_M(xenprobe_info, address);
  XP_M(xenprobe_info, requested);
  XP_M(xenprobe_info, slot);
  XP_M(xenprobe_info, trampoline);
  XP_M(xenprobe_info, instruction);
  XP_M(xenprobe_info, moved_because);
  XP_M(xenprobe_info, not_jump_because);
  XP_C(xenprobe_capture);
  XP_M(xenprobe_capture, kind);
  XP_M(xenprobe_capture, base);
  XP_M(xenprobe_capture, user);
  XP_M(xenprobe_capture, flags);
  XP_M(xenprobe_capture, offset);
  XP_M(xenprobe_capture, max);
  XP_C(xenprobe_capture_value);
  XP_M(xenprobe_capture_value, status);
  XP_M(xenprobe_capture_value, length);
  XP_M(xenprobe_capture_value, data);
  XP_C_GROWS(xenprobe_async_hit);
  XP_M(xenprobe_async_hit, handle);
  XP_M(xenprobe_async_hit, domid);
  XP_M(xenprobe_async_hit, vcpu);
  XP_M(xenprobe_async_hit, seq);
  XP_M(xenprobe_async_hit, address);
  XP_M(xenprobe_async_hit, time_ns);
  XP_M(xenprobe_async_hit, regs);
  XP_M(xenprobe_async_hit, ncaptures);
  XP_M(xenprobe_async_hit, captures);
  XP_C_GROWS(xenprobe_ring_stats);
  XP_M(xenprobe_ring_stats, version);
  XP_M(xenprobe_ring_stats, rings);
  XP_M(xenprobe_ring_stats, records);
  XP_M(xenprobe_ring_stats, orphans);
  XP_M(xenprobe_ring_stats, missed);
  XP_M(xenprobe_ring_stats, resyncs);
  XP_M(xenprobe_ring_stats, corrupt_bytes);
  XP_M(xenprobe_ring_stats, drops);
  XP_M(xenprobe_ring_stats, nested);
  XP_M(xenprobe_ring_stats, bad_keys);
  XP_M(xenprobe_ring_stats, bad_records);
  XP_M(xenprobe_ring_stats, notify_skipped);

  // The C++ API: sizes and alignments (most of these hold std::string or std::vector, whose
  // member offsets the language does not promise to expose).
  XP_TYPE("HitContext", HitContext);
  XP_TYPE("RetProbeOptions", RetProbeOptions);
  XP_TYPE("ProbeStats", ProbeStats);
  XP_TYPE("ProbeOptions", ProbeOptions);
  XP_TYPE("Capture", Capture);
  XP_TYPE("CaptureValue", CaptureValue);
  XP_TYPE("AsyncHit", AsyncHit);
  XP_TYPE("AsyncOptions", AsyncOptions);
  XP_TYPE("RingStats", RingStats);
  XP_TYPE("ProbeInfo", ProbeInfo);
  XP_TYPE("SymbolInfo", SymbolInfo);
  XP_TYPE("ModuleBtf", ModuleBtf);
  XP_TYPE("KernelStack", KernelStack);
  XP_TYPE("Probe", Probe);
  XP_TYPE("SessionLimits", SessionLimits);
  XP_TYPE("SessionOptions", SessionOptions);
  XP_TYPE("Session", Session);
  XP_TYPE("ChannelCheck", ChannelCheck);
  XP_TYPE("DomainReport", DomainReport);
  XP_TYPE("DoctorReport", DoctorReport);
  XP_TYPE("GuestView", GuestView);
  XP_TYPE("Error", Error);
  XP_TYPE("Strong", DomId);
  XP_TYPE("DomainInfo", hv::DomainInfo);
  XP_TYPE("VcpuRegs", hv::VcpuRegs);
  XP_TYPE("ForeignMapping", hv::ForeignMapping);
  XP_TYPE("WatchEvent", hv::WatchEvent);
  XP_TYPE("GdbsxStatus", hv::GdbsxStatus);
  XP_TYPE("VmEventRequest", hv::VmEventRequest);
  XP_TYPE("VmEventResponse", hv::VmEventResponse);
  XP_TYPE("VmEventRing", hv::VmEventRing);
  XP_TYPE("Capabilities", hv::Capabilities);
  XP_TYPE("Hypervisor", hv::Hypervisor);
  XP_TYPE("SimOptions", hv::sim::SimOptions);
  XP_TYPE("DomainConfig", hv::sim::DomainConfig);
  XP_TYPE("GuestLayout", hv::sim::GuestLayout);
  XP_TYPE("SimHost", hv::sim::SimHost);
  XP_TYPE("ModuleNotifications", hv::sim::SimHost::ModuleNotifications);
  return 0;
}
