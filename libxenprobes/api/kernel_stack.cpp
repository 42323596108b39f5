// Session::kernel_stack()'s tables and walk (kernel_stack.hpp).
#include "api/kernel_stack.hpp"

#include "common/log.hpp"
#include "kernel/modules.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes::api {

namespace {

// Reads through page tables that map the kernel (with page-table isolation a vCPU in user mode
// holds tables that map almost none of it): vCPU 0's, or their kernel half.
template <typename F>
auto with_kernel_memory(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms, F&& f)
    -> decltype(f(std::declval<const kernel::ReadFn&>())) {
  hv::DomainInfo info = XP_TRY(hv.domain_info(dom));
  hv::VcpuRegs regs = XP_TRY(hv.get_vcpu_regs(dom, VcpuId{0}));
  mem::PagingContext ctx = XP_TRY(mem::paging_context(info, regs));
  mem::HypervisorFrameSource source(hv, dom);
  mem::GuestMemory memory(source);
  const Gva text = syms.resolve("_stext").value_or(Gva{0});
  XP_TRY(mem::use_kernel_page_tables(memory, ctx, info.type, text));
  const kernel::ReadFn read = [&memory](Gva a, std::span<std::byte> out) { return memory.read(a, out); };
  return f(read);
}

bool same(const kernel::ModuleIdentity& a, const kernel::ModuleIdentity& b) {
  return a.address == b.address && a.name == b.name && a.text.start == b.text.start && a.text.end == b.text.end;
}

}  // namespace

// The loaded modules' own tables (struct module's arch.orc_unwind_ip, orc_unwind, num_orcs), of
// the modules the kernel layer found usable, into the unwinder: kept from before when the same
// module still has the same table, else read with `read` (none: left to the frame-pointer
// fallback until the next update). A module whose table cannot be read is unwound by the
// fallback. Returns what happened, for the summary.
std::string KernelStacks::set_modules(PerDomain& d, const kernel::ModuleTables* mods, const kernel::ReadFn* read) {
  std::map<std::uint64_t, ModuleTable> now;
  std::vector<kernel::orc::Table> tables;
  std::vector<kernel::Range> untabled;
  kernel::orc::Limits limits;
  std::size_t budget = limits.max_entries, refused = 0, kept = 0;
  std::string first;
  const kernel::orc::Format format = d.unwinder->core().format();
  if (mods && mods->status().found) {
    for (const kernel::Module& m : mods->modules()) {
      if (!m.usable) continue;
      ModuleTable t{kernel::ModuleIdentity::of(m), m.orc_ip, m.orc_unwind, m.orc_num, std::nullopt};
      auto was = d.modules.find(m.address);
      if (was != d.modules.end() && was->second.table && same(was->second.id, t.id) && was->second.ip == t.ip &&
          was->second.orc == t.orc && was->second.num == t.num) {
        t.table = std::move(was->second.table);
        ++kept;
      } else if (m.orc_num != 0 && read) {
        auto r = m.orc_num > budget
                     ? Result<kernel::orc::Table>(fail(Errc::NoSpace, "over the entries left for modules"))
                     : kernel::orc::read_module_table(*read, m.orc_ip, m.orc_unwind, m.orc_num, m.text, format, limits);
        if (r) {
          t.table = std::move(*r);
        } else {
          ++refused;
          if (first.empty()) first = m.name + ": " + r.error().what;
        }
      }
      if (t.table && t.table->size() <= budget) {
        budget -= t.table->size();
        tables.push_back(*t.table);
      } else {
        t.table.reset();
        untabled.push_back(m.text);
      }
      now.emplace(m.address, std::move(t));
    }
  }
  d.modules = std::move(now);
  d.unwinder->set_modules(std::move(tables), std::move(untabled));
  std::string s = std::to_string(d.unwinder->module_tables()) + " module table(s)";
  if (kept) s += " (" + std::to_string(kept) + " kept from before)";
  if (refused) s += ", " + std::to_string(refused) + " refused (first: " + first + ")";
  if (!mods) s += " (no module list)";
  else if (!mods->status().found) s += " (" + mods->summary() + ")";
  return s;
}

Result<std::string> KernelStacks::load(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms,
                                       const kernel::ModuleTables* mods, std::uint64_t generation) {
  PerDomain& d = by_dom_[dom];
  d.unwinder.reset();
  d.modules.clear();
  auto read_tables = [&]() -> Result<std::string> {
    return with_kernel_memory(hv, dom, syms, [&](const kernel::ReadFn& read) -> Result<std::string> {
      kernel::orc::Table core = XP_TRY(kernel::orc::read_kernel_table(syms, read));
      std::string summary = "ORC table of the kernel: " + core.summary();
      d.unwinder = std::make_unique<kernel::orc::Unwinder>(std::move(core));
      return summary + "; " + set_modules(d, mods, &read);
    });
  };
  auto summary = read_tables();
  if (!summary) {
    d.unwinder.reset();
    d.why = Error{summary.error().code, "domain " + std::to_string(dom.value) +
                                            ": cannot unwind its kernel's stacks: " + summary.error().what};
    return fail(d.why.code, d.why.what);
  }
  d.generation = generation;
  XP_LOG(Info, "domain %u: %s", dom.value, summary->c_str());
  return summary;
}

void KernelStacks::update_modules(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms,
                                  const kernel::ModuleTables* mods, std::uint64_t generation) {
  auto it = by_dom_.find(dom);
  if (it == by_dom_.end() || !it->second.unwinder) return;
  PerDomain& d = it->second;
  auto r = with_kernel_memory(
      hv, dom, syms, [&](const kernel::ReadFn& read) -> Result<std::string> { return set_modules(d, mods, &read); });
  // Without kernel page tables now, modules that stayed keep their tables; new ones wait.
  std::string s = r ? *r : set_modules(d, mods, nullptr) + " (new ones not read: " + r.error().what + ")";
  d.generation = generation;
  XP_LOG(Info, "domain %u: loaded modules changed: %s", dom.value, s.c_str());
}

bool KernelStacks::loaded(DomId dom) const {
  auto it = by_dom_.find(dom);
  return it != by_dom_.end() && it->second.unwinder;
}

std::uint64_t KernelStacks::generation(DomId dom) const {
  auto it = by_dom_.find(dom);
  return it == by_dom_.end() ? 0 : it->second.generation;
}

Result<KernelStack> KernelStacks::walk(HitContext& hit, unsigned max_frames) const {
  auto it = by_dom_.find(hit.domain());
  if (it == by_dom_.end()) return fail(Errc::NotFound, "the domain's unwind tables were not loaded");
  if (!it->second.unwinder) return fail(it->second.why.code, it->second.why.what);
  const Regs& r = hit.regs();
  kernel::orc::StartRegs s;
  s.rip = r.rip, s.rsp = r.rsp, s.rbp = r.rbp, s.r10 = r.r10, s.r13 = r.r13, s.rdi = r.rdi, s.rdx = r.rdx;
  // Not cs: a 64-bit PV kernel runs in ring 3; Xen says which mode the vCPU is in.
  s.user_mode = !r.kernel_mode;
  kernel::orc::Walk w = it->second.unwinder->walk(
      s, [&hit](Gva a, std::span<std::byte> out) { return hit.read(a, out); }, max_frames);
  KernelStack out;
  out.frames.reserve(w.ips.size());
  for (std::uint64_t ip : w.ips) out.frames.push_back(Gva{ip});
  out.stopped = kernel::orc::to_string(w.stop);
  out.guessed = w.fallback;
  return out;
}

}  // namespace xenprobes::api
