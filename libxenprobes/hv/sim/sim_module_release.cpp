// The simulated guest module letting go of the pages Dom0 maps (protocol.h "Letting go"): its
// detach looks at Dom0's hold (xp_release.h, the module's own decision), its rmmod frees the
// control area and the rings only after a release, and remembers what it freed, so that a test
// sees any later write of Dom0 there.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>

#include "hv/sim/sim_host_impl.hpp"

namespace xenprobes::hv::sim {
namespace {

SimHost::ModuleRelease to_public(xp_release r) {
  switch (r) {
    case XP_RELEASE_RELEASED: return SimHost::ModuleRelease::Released;
    case XP_RELEASE_KILLED: return SimHost::ModuleRelease::Killed;
    case XP_RELEASE_TIMEOUT: return SimHost::ModuleRelease::TimedOut;
    case XP_RELEASE_NONE:
    case XP_RELEASE_WAIT: break;
  }
  return SimHost::ModuleRelease::NoDom0;
}

// The pages Dom0 maps that the module frees itself: the control area, then the rings.
std::vector<std::uint64_t> dom0_pages(const Domain& d) {
  const ModuleState& m = d.module;
  std::vector<std::uint64_t> out;
  for (unsigned p = 0; p < m.ctl_pages; ++p) out.push_back(m.ctl_va + std::uint64_t{p} * kPageSize);
  if (m.rings_va) {
    const std::uint64_t bytes = m.rings.size() * (XENPROBES_RING_DATA_OFFSET + (std::uint64_t{1} << m.ring_order));
    for (std::uint64_t off = 0; off < bytes; off += kPageSize) out.push_back(m.rings_va + off);
  }
  return out;
}

}  // namespace

// As the module's xp_release_wait(): the port's status first, then dom0_hold.
void SimHostImpl::module_release_look_locked(Domain& d) {
  ModuleState& m = d.module;
  if (m.release) return;
  auto gp = d.guest_ports.find(m.port);
  const bool bound = gp != d.guest_ports.end() && gp->second.peer != nullptr;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const auto hold = std::atomic_ref<std::uint32_t>(
                        *reinterpret_cast<std::uint32_t*>(header_at(d, offsetof(xenprobes_ctl_header, dom0_hold))))
                        .load(std::memory_order_seq_cst);
  const xp_release r = xp_release_look(&m.release_state, bound, hold, clock_->now() >= m.release_deadline);
  if (r == XP_RELEASE_WAIT) return;
  m.release = r;
  d.console += std::string("xenprobesU: control area and rings: ") + xp_release_name(r) + "\n";
}

Result<void> SimHostImpl::set_module_release_wait(DomId id, std::chrono::milliseconds wait) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  if (!d->module.present)
    return fail(Errc::InvalidArgument, "sim: " + std::to_string(id.value) + " has no guest module");
  if (wait.count() < 0 || wait.count() > XP_RELEASE_WAIT_MAX_MS)
    return fail(Errc::InvalidArgument,
                "sim: the release wait must be 0 .. " + std::to_string(XP_RELEASE_WAIT_MAX_MS) + " ms");
  d->module.release_wait = wait;
  return {};
}

Result<SimHost::ModuleRelease> SimHostImpl::module_unload(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  ModuleState& m = d->module;
  if (!m.present) return fail(Errc::InvalidArgument, "sim: " + std::to_string(id.value) + " has no guest module");
  if (!m.detaching) return fail(Errc::Busy, "sim: the guest module holds a reference on itself until it is detached");
  module_release_look_locked(*d);
  if (!m.release)
    return fail(Errc::Busy,
                "sim: the guest module's detach still waits for Dom0 to release its control area and rings");
  m.present = false;  // gone: its hook, its scheduler work (an int3 now is the kernel's own)
  if (xp_release_frees(*m.release)) {
    for (std::uint64_t va : dom0_pages(*d)) {
      const std::uint8_t* p = guest_ptr(*d, va, kPageSize);
      if (p) m.freed.emplace_back(va, std::vector<std::uint8_t>(p, p + kPageSize));
    }
  }
  d->console += std::string("xenprobesU: unloaded (Dom0's areas: ") + xp_release_name(*m.release) + ")\n";
  return to_public(*m.release);
}

Result<std::uint64_t> SimHostImpl::module_freed_bytes_written(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  std::uint64_t n = 0;
  for (const auto& [va, bytes] : d->module.freed) {
    const std::uint8_t* p = guest_ptr(*d, va, kPageSize);
    if (!p) continue;
    for (std::size_t i = 0; i < bytes.size(); ++i) n += p[i] != bytes[i];
  }
  return n;
}

}  // namespace xenprobes::hv::sim
