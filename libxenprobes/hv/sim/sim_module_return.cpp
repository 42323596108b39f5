// The simulated guest module's return-slot writes (protocol.h, "Return slots written by the
// module"; DomainConfig::module_ret_write): step 1 tells Dom0 the u64 at the hit's rsp, and a
// taken answer that asks for it has the trampoline written there by the module's own rules
// (guest-module/xp_fallback.c, xp_ret_write()), so Dom0 maps no stack for a return probe.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "hv/sim/sim_host_impl.hpp"
#include "xp_ret_write.h"

namespace xenprobes::hv::sim {

void SimHostImpl::module_ret_publish_locked(Domain& d, std::uint8_t* mb, std::uint64_t rsp) {
  if (!d.cfg.module_ret_write) return;  // a module before it: both stay as the area was zeroed
  std::uint64_t top = 0;
  if (const std::uint8_t* p = guest_ptr(d, rsp, 8)) std::memcpy(&top, p, 8);  // 0: not readable
  shm_store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, stack_top), top);
  shm_store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_slot), 0);
}

void SimHostImpl::module_ret_apply_locked(Domain& d, std::uint8_t* mb, std::uint64_t hit_rsp) {
  if (!d.cfg.module_ret_write) return;  // a module before it never reads what Dom0 wrote there
  xp_ret_request q{};
  // Taken once, atomically: a request Dom0 withdrew (protocol.h, "Cancelling") reads 0.
  q.slot = std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(mb + offsetof(xenprobes_mailbox, ret_slot)))
               .exchange(0, std::memory_order_acq_rel);
  q.expect = shm_load<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_expect));
  q.value = shm_load<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_value));
  const xp_mem_ops m = module_mem_ops(d);
  ModuleState& s = d.module;
  const auto* table = reinterpret_cast<const xenprobes_trap*>(area(d) + s.trap_offset);
  const auto* n = reinterpret_cast<const std::uint32_t*>(header_at(d, offsetof(xenprobes_ctl_header, nr_traps)));
  switch (xp_ret_write(&q, hit_rsp, table, n, s.trap_capacity, &m)) {
    case XP_RET_NONE: return;
    case XP_RET_WRITTEN: ++s.ret_written; return;
    default:
      ++s.ret_refused;
      publish_counters(d);
      return;
  }
}

}  // namespace xenprobes::hv::sim
