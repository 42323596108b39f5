// The simulated guest module's text, the parts of it Dom0 reads (protocol.h): its fixup slots
// with their exception-table entries, and its jump entry, made with the domain before it runs;
// and the bounds its own code (xp_logic.c) is told about.
#include <algorithm>
#include <cstring>

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
    const std::int32_t fields[3] = {static_cast<std::int32_t>(last - entry), static_cast<std::int32_t>(last - (entry + 4)),
                                    1 /* EX_TYPE_DEFAULT */};
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
