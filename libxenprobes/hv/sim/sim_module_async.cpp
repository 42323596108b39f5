// The simulated guest module's async rings (protocol.h "Async jump probes"): one ring per vCPU
// in the guest's vmalloc area, published with the other keys, and the record an async jump
// hit writes there with the module's own producer (guest-module/xp_ring.c): no mailbox, no
// wait, no Dom0.
#include <chrono>
#include <cstring>

#include "hv/sim/page_table_builder.hpp"
#include "hv/sim/sim_host_impl.hpp"
#include "xp_logic.h"

namespace xenprobes::hv::sim {

namespace {

// An async capture's reads, as the module's no-fault copies make them: what is not mapped is a
// fault, and so is a user read of an upper-half address or a kernel read of a lower-half one
// (copy_from_user_nofault's access_ok and copy_from_kernel_nofault_allowed refuse those). The
// sim's guest has no user process: its lower half holds DomainConfig::user_image_va at most.
int read_guest(void* ctx, void* dst, std::uint64_t addr, std::uint32_t len, bool user) {
  const bool lower = addr < XENPROBES_CAP_USER_TOP && len <= XENPROBES_CAP_USER_TOP - addr;
  if (user != lower) return -XP_EFAULT;
  const std::uint8_t* p = guest_ptr(*static_cast<Domain*>(ctx), addr, len);
  if (!p) return -XP_EFAULT;
  std::memcpy(dst, p, len);
  return 0;
}

long read_guest_string(void* ctx, void* dst, std::uint64_t addr, std::uint32_t max, bool user) {
  const xp_read_ops bytes{&read_guest, nullptr, ctx};
  return xp_read_str_pieces(&bytes, dst, addr, max, user);  // the module's own string reads
}

}  // namespace

Result<void> SimHostImpl::module_create_rings(Domain& d, PageTableBuilder& pt, std::uint64_t va, std::uint64_t gpa) {
  const unsigned order = d.cfg.module_ring_order;
  if (order < XENPROBES_RING_MIN_ORDER || order > XENPROBES_RING_MAX_ORDER)
    return fail(Errc::InvalidArgument, "sim: module_ring_order " + std::to_string(order) + " is outside " +
                                           std::to_string(XENPROBES_RING_MIN_ORDER) + ".." +
                                           std::to_string(XENPROBES_RING_MAX_ORDER) + " (0: no rings)");
  std::uint64_t stride = 0, total = 0;
  if (xp_rings_size(d.cfg.vcpus, order, &stride, &total) != 0)
    return fail(Errc::InvalidArgument, "sim: no rings for " + std::to_string(d.cfg.vcpus) + " vCPUs");
  if (gpa % kPageSize || gpa + total > d.ram->size)
    return fail(Errc::InvalidArgument, "sim: the guest module's async rings do not fit in guest RAM");
  // vmalloc'd memory in a real module: writable, not executable.
  XP_TRY(pt.map_4k(va, gpa, total, PageTableBuilder::kGlobal | PageTableBuilder::kWrite | PageTableBuilder::kNx));
  d.aliases.push_back({va, gpa, total});
  std::memset(d.ram->base + gpa, 0, total);
  ModuleState& m = d.module;
  m.rings.assign(d.cfg.vcpus, xp_ring{});
  for (unsigned v = 0; v < d.cfg.vcpus; ++v)
    if (xp_ring_init(&m.rings[v], d.ram->base + gpa + v * stride, order, v) != 0)
      return fail(Errc::InvalidArgument, "sim: ring " + std::to_string(v) + " refused by xp_ring_init");
  m.rings_va = va;
  m.ring_order = order;
  return {};
}

void SimHostImpl::module_async_locked(Domain& d, Vcpu& v, const xenprobes_trap& e, const VcpuRegs& r) {
  ModuleState& m = d.module;
  // What xp_async_hit does in the module, with the specs read through the guest's mappings
  // (the module reads its own OEA in place).
  const xp_bounds b = module_bounds(d);
  xp_async_key k{};
  xenprobes_capture_spec specs[XENPROBES_RING_CAPS_MAX];
  if (m.rings.empty() || v.id >= m.rings.size() || xp_jump_async_key(&b, &e, &k) != 0) {
    ++m.async_bad;
    return publish_counters(d);
  }
  const std::uint8_t* at = k.ncaps ? guest_ptr(d, k.specs, k.ncaps * sizeof(xenprobes_capture_spec)) : nullptr;
  if (k.ncaps && !at) {
    ++m.async_bad;
    return publish_counters(d);
  }
  if (k.ncaps) xp_specs_snapshot(specs, reinterpret_cast<const xenprobes_capture_spec*>(at), k.ncaps);
  if (xp_ring_specs_check(specs, k.ncaps) != 0) {
    ++m.async_bad;
    return publish_counters(d);
  }
  const xp_read_ops ops{&read_guest, &read_guest_string, &d};
  const xenprobes_regs x = to_protocol(r);
  const std::uint64_t now = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->now().time_since_epoch()).count());
  const enum xp_ring_result res = xp_ring_write_hit(&m.rings[v.id], k.probe, now, &x, specs, k.ncaps, &ops);
  if (res == XP_RING_NOTIFY)
    if (auto gp = d.guest_ports.find(m.port); gp != d.guest_ports.end() && gp->second.peer)
      gp->second.peer->raise_port(gp->second.peer_port);
}

}  // namespace xenprobes::hv::sim
