// The simulated guest module's text, the parts of it Dom0 reads (protocol.h): its fixup slots
// with their exception-table entries, and its jump entry, made with the domain before it runs;
// the bounds its own code (xp_logic.c) is told about; and its restore pass, after Dom0 is
// gone or when it detaches.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

#include "hv/sim/page_table_builder.hpp"
#include "hv/sim/sim_host_impl.hpp"

namespace xenprobes::hv::sim {
namespace {

constexpr std::uint8_t kInt3 = 0xcc;

}  // namespace

Result<void> SimHostImpl::module_create_fixup_slots(Domain& d, PageTableBuilder& pt, std::uint64_t va,
                                                    std::uint64_t gpa) {
  ModuleState& m = d.module;
  constexpr unsigned kCount = kPageSize / XENPROBES_FIXUP_SLOT_SIZE;
  if (gpa % kPageSize || gpa + 2 * kPageSize > d.ram->size)
    return fail(Errc::InvalidArgument, "sim: the guest module's fixup slots do not fit in guest RAM");
  XP_TRY(pt.map_4k(va, gpa, kPageSize, PageTableBuilder::kGlobal));
  XP_TRY(pt.map_4k(va + kPageSize, gpa + kPageSize, kPageSize,
                   PageTableBuilder::kGlobal | PageTableBuilder::kWrite | PageTableBuilder::kNx));
  d.aliases.push_back({va, gpa, 2 * kPageSize});
  // Unused, as a real module leaves them (protocol.h): int3 bytes, and each entry's insn and
  // fixup on its slot's last byte. Before the domain exists: nobody else sees it yet.
  std::uint8_t* slots = d.ram->base + gpa;
  std::memset(slots, 0xcc, kPageSize);
  for (unsigned k = 0; k < kCount; ++k) {
    const std::uint64_t last = va + std::uint64_t{k + 1} * XENPROBES_FIXUP_SLOT_SIZE - 1;
    const std::uint64_t entry = va + kPageSize + std::uint64_t{k} * XENPROBES_FIXUP_ENTRY_SIZE;
    const std::int32_t fields[3] = {static_cast<std::int32_t>(last - entry),
                                    static_cast<std::int32_t>(last - (entry + 4)), 1 /* EX_TYPE_DEFAULT */};
    std::memcpy(slots + kPageSize + std::size_t{k} * XENPROBES_FIXUP_ENTRY_SIZE, fields, sizeof fields);
  }
  m.fixup_va = va;
  m.fixup_table_va = va + kPageSize;
  m.fixup_count = kCount;
  return {};
}

Result<void> SimHostImpl::module_create_jump_entry(Domain& d, PageTableBuilder& pt, std::uint64_t va,
                                                   std::uint64_t gpa) {
  if (gpa % kPageSize || gpa + kPageSize > d.ram->size)
    return fail(Errc::InvalidArgument, "sim: the guest module's jump entry does not fit in guest RAM");
  XP_TRY(pt.map_4k(va, gpa, kPageSize, PageTableBuilder::kGlobal));
  d.aliases.push_back({va, gpa, kPageSize});
  std::memset(d.ram->base + gpa, kInt3, kPageSize);  // see ModuleState::jump_entry
  d.module.jump_entry = va;
  return {};
}

namespace {

xenprobes_trap trap_at(Domain& d, const ModuleState& m, std::uint32_t i) {
  xenprobes_trap e;
  std::memcpy(&e, area(d) + m.trap_offset + std::size_t{i} * sizeof e, sizeof e);
  return e;
}

// The live ISLAND entry of a short region whose bytes are p (xp_text.c, xp_island_of()).
std::optional<xenprobes_trap> island_of(Domain& d, const ModuleState& m, std::uint32_t n, const xenprobes_trap& e,
                                        const std::uint8_t* p, std::size_t len) {
  std::uint64_t to = 0;
  const bool eb = xp_short_jump_target(e.addr, p, static_cast<std::uint32_t>(len), &to);
  if (!eb && p[0] != kInt3) return std::nullopt;
  for (std::uint32_t i = 0; i < n; ++i) {
    const xenprobes_trap t = trap_at(d, m, i);
    if (xp_island_pairs(&e, &t) && (!eb || t.addr == to)) return t;
  }
  return std::nullopt;
}

}  // namespace

void SimHostImpl::module_poked_locked(Domain& d, std::uint8_t* p, std::size_t len) {
  const std::uint64_t gpa = static_cast<std::uint64_t>(p - d.ram->base);
  for (const Alias& a : d.aliases) {
    if (gpa < a.gpa || gpa - a.gpa >= a.len) continue;
    const std::uint64_t va = a.va + (gpa - a.gpa);
    for (auto& vp : d.vcpus) uc_ctl_remove_cache(vp->uc, va, va + len);
  }
}

// The module's restore pass (xp_restore_traps): insn[0] back at every live trap-table address
// outside its OEA still holding the int3 (a jump's region whole), but those of modules that
// went; then (xp_restore_islands, after the module's quiescence: here, no vCPU stands in the
// island) the islands of short jumps no region jumps to any more. Returns how many it
// restored; m.gone_left: how many it left for that reason.
unsigned SimHostImpl::module_restore_locked(Domain& d) {
  ModuleState& m = d.module;
  std::uint32_t n = std::atomic_ref<std::uint32_t>(
                        *reinterpret_cast<std::uint32_t*>(header_at(d, offsetof(xenprobes_ctl_header, nr_traps))))
                        .load(std::memory_order_acquire);
  n = std::min(n, m.trap_capacity);
  unsigned restored = 0;
  m.gone_left = 0;
  {
    // stop_machine in a real module; here no vCPU of the domain runs meanwhile anyway (this
    // is its scheduler thread), and the translated blocks of the patched bytes are dropped.
    std::lock_guard emu(emulation_mutex());
    const xp_bounds b = module_bounds(d);
    const bool islands = d.cfg.module_jump_island;
    for (std::uint32_t i = 0; i < n; ++i) {
      const xenprobes_trap e = trap_at(d, m, i);
      if (in_oea(d, e.addr)) continue;  // slot traps: the slots are not text, vCPUs may be in them
      if (xp_gone_has(&m.gone, &e)) {
        ++m.gone_left;
        continue;
      }                                                // its module went (xp_modules.c)
      if (e.flags == XENPROBES_TRAP_ISLAND) continue;  // after every region, below
      // A jump's region goes back whole, from the int3 or from the jump to its detour (or, a
      // short one, to its island); any other trap its one byte.
      const bool region = e.flags == XENPROBES_TRAP_REDIRECT;
      const std::size_t len = region ? std::min<std::size_t>(e.len, sizeof e.insn) : 1;
      if (region && len < (islands ? 2 : 5)) continue;
      std::uint8_t* p = guest_ptr(d, e.addr, len);
      if (!p) continue;
      // The module's own decision (xp_logic.c): the int3, or the jump to this entry's detour.
      const auto isl = region && islands ? island_of(d, m, n, e, p, len) : std::nullopt;
      const bool ours =
          region ? xp_region_restore_ok_island(&b, &e, p, static_cast<std::uint32_t>(len), isl ? &*isl : nullptr)
                 : *p == kInt3;
      if (!ours) continue;  // already restored (or not a trap Dom0 wrote)
      std::memcpy(p, e.insn, len);
      module_poked_locked(d, p, len);
      ++restored;
    }
    for (std::uint32_t i = 0; islands && i < n; ++i) {
      const xenprobes_trap e = trap_at(d, m, i);
      if (e.flags != XENPROBES_TRAP_ISLAND || xp_gone_has(&m.gone, &e)) continue;
      std::uint8_t* p = guest_ptr(d, e.addr, 5);
      if (!p || !xp_island_restore_ok(&b, &e, p, 5)) continue;
      bool used = false;  // a region still jumps there (it was left alone): so is the island
      for (std::uint32_t k = 0; k < n && !used; ++k) {
        const xenprobes_trap r = trap_at(d, m, k);
        const std::uint8_t* rp = r.flags == XENPROBES_TRAP_REDIRECT ? guest_ptr(d, r.addr, 2) : nullptr;
        std::uint64_t to = 0;
        used = rp && r.fallback == e.fallback &&
               (rp[0] == kInt3 || (xp_short_jump_target(r.addr, rp, 2, &to) && to == e.addr));
      }
      for (auto& vp : d.vcpus) {
        std::uint64_t rip = 0;
        uc_reg_read(vp->uc, UC_X86_REG_RIP, &rip);
        used = used || (rip >= e.addr && rip < e.addr + 5);
      }
      if (used) continue;
      std::memcpy(p, e.insn, 5);
      module_poked_locked(d, p, 5);
      ++restored;
    }
  }
  return restored;
}

// The module's detach (xp_disarm_all in xp_main.c), in its order.
Result<unsigned> SimHostImpl::module_detach(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  ModuleState& m = d->module;
  if (!m.present) return fail(Errc::InvalidArgument, "sim: " + std::to_string(id.value) + " has no guest module");
  std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(header_at(*d, offsetof(xenprobes_ctl_header, closing))))
      .store(1, std::memory_order_seq_cst);
  const bool again = m.detaching;  // the module's detach is idempotent: its wait began at the first
  m.detaching = true;
  const auto now = clock_->now();
  for (auto& vp : d->vcpus)
    if (vp->module_wait) vp->module_deadline = std::min(vp->module_deadline, now);
  const std::string state = "/local/domain/" + std::to_string(id.value) + "/" XENPROBES_XS_DIR "/" XENPROBES_XS_STATE;
  store_.erase(state);
  fire_watches_locked(state, true);
  const unsigned restored = module_restore_locked(*d);
  d->console += "xenprobesU: detached: restored " + std::to_string(restored) + " trap bytes and jump regions\n";
  // protocol.h "Letting go": the first look at Dom0's hold; module_unload looks again.
  if (!again) m.release_deadline = clock_->now() + m.release_wait;
  module_release_look_locked(*d);
  cv_.notify_all();  // the scheduler gives the waiting vCPUs up
  return restored;
}

// What the module's own code (xp_logic.c) is told about the guest: its text, the module area,
// and its OEA pool, which in a real module holds every area it publishes (one static pool).
xp_bounds module_bounds(Domain& d) {
  xp_bounds b{};
  b.ktext = {d.layout.text_start, d.layout.text_end};
  b.modules = {kModulesVa, kModulesEnd};
  const unsigned areas = std::max(1u, d.oea_published);
  b.oea = {d.layout.oea_addr, d.layout.oea_addr + (areas - 1) * kOeaStride + d.cfg.oea_size};
  // The module asks the page tables whether the page is executable; here: mapped, and not the
  // control area (the one NX mapping inside the module area).
  b.is_exec = [](void* ctx, std::uint64_t va) {
    Domain& dom = *static_cast<Domain*>(ctx);
    const ModuleState& m = dom.module;
    if (m.present && va >= m.ctl_va && va - m.ctl_va < std::uint64_t{m.ctl_pages} * kPageSize) return false;
    return guest_ptr(dom, va, 1) != nullptr;
  };
  b.ctx = &d;
  return b;
}

}  // namespace xenprobes::hv::sim
