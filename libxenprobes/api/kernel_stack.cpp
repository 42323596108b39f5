// Session::kernel_stack()'s tables and walk (kernel_stack.hpp).
#include "api/kernel_stack.hpp"

#include "common/log.hpp"
#include "kernel/btf.hpp"
#include "kernel/module_symbols.hpp"
#include "kernel/modules.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes::api {

namespace {

// The loaded modules' own tables (struct module's arch.orc_unwind_ip, orc_unwind, num_orcs), of
// the modules the kernel layer found usable; a module whose table cannot be read is left to the
// frame-pointer fallback. What happened is added to `summary`.
struct ModuleOrc {
  std::vector<kernel::orc::Table> tables;
  std::vector<kernel::Range> untabled;  // usable modules' text without a table
};

ModuleOrc module_tables(const symbols::SymbolTable& syms, const kernel::ReadFn& read, kernel::orc::Format format,
                        std::string& summary) {
  ModuleOrc out;
  auto btf = kernel::read_kernel_btf(syms, read);  // struct module's layout
  if (!btf) {
    summary += "; modules' tables not read (" + btf.error().what + ")";
    return out;
  }
  auto mods = kernel::walk_modules(syms, read, *btf);
  if (!mods) {
    summary += "; modules' tables not read (" + mods.error().what + ")";
    return out;
  }
  kernel::orc::Limits limits;
  std::size_t budget = limits.max_entries, refused = 0;
  std::string first;
  for (const kernel::Module& m : mods->modules()) {
    if (!m.usable) continue;
    if (m.orc_num == 0) {
      out.untabled.push_back(m.text);
      continue;
    }
    auto t = m.orc_num > budget ? Result<kernel::orc::Table>(fail(Errc::NoSpace, "over the entries left for modules"))
                                : kernel::orc::read_module_table(read, m.orc_ip, m.orc_unwind, m.orc_num, m.text, format,
                                                                 limits);
    if (!t) {
      ++refused;
      if (first.empty()) first = m.name + ": " + t.error().what;
      out.untabled.push_back(m.text);
      continue;
    }
    budget -= m.orc_num;
    out.tables.push_back(std::move(*t));
  }
  summary += "; " + std::to_string(out.tables.size()) + " module table(s)";
  if (refused) summary += ", " + std::to_string(refused) + " refused (first: " + first + ")";
  return out;
}

}  // namespace

Result<std::string> KernelStacks::load(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms) {
  PerDomain& d = by_dom_[dom];
  d.unwinder.reset();
  std::string summary;
  auto read_tables = [&]() -> Result<std::shared_ptr<const kernel::orc::Unwinder>> {
    hv::DomainInfo info = XP_TRY(hv.domain_info(dom));
    hv::VcpuRegs regs = XP_TRY(hv.get_vcpu_regs(dom, VcpuId{0}));
    mem::PagingContext ctx = XP_TRY(mem::paging_context(info, regs));
    mem::HypervisorFrameSource source(hv, dom);
    mem::GuestMemory memory(source);
    // The tables are kernel data: read through page tables that map the kernel (with page-table
    // isolation a vCPU in user mode holds tables that map almost none of it).
    const Gva text = syms.resolve("_stext").value_or(Gva{0});
    XP_TRY(mem::use_kernel_page_tables(memory, ctx, info.type, text));
    const kernel::ReadFn read = [&memory](Gva a, std::span<std::byte> out) { return memory.read(a, out); };
    kernel::orc::Table core = XP_TRY(kernel::orc::read_kernel_table(syms, read));
    summary = "ORC table of the kernel: " + core.summary();
    auto u = std::make_shared<kernel::orc::Unwinder>(std::move(core));
    ModuleOrc mods = module_tables(syms, read, u->core().format(), summary);
    u->set_modules(std::move(mods.tables), std::move(mods.untabled));
    return u;
  };
  auto u = read_tables();
  if (!u) {
    d.why = Error{u.error().code, "domain " + std::to_string(dom.value) + ": cannot unwind its kernel's stacks: " +
                                      u.error().what};
    return fail(d.why.code, d.why.what);
  }
  d.unwinder = std::move(*u);
  XP_LOG(Info, "domain %u: %s", dom.value, summary.c_str());
  return summary;
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
