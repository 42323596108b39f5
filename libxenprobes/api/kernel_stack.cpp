// Session::kernel_stack()'s tables and walk (kernel_stack.hpp).
#include "api/kernel_stack.hpp"

#include "common/log.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes::api {

Result<std::string> KernelStacks::load(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms) {
  PerDomain& d = by_dom_[dom];
  d.unwinder.reset();
  auto read_tables = [&]() -> Result<kernel::orc::Table> {
    hv::DomainInfo info = XP_TRY(hv.domain_info(dom));
    hv::VcpuRegs regs = XP_TRY(hv.get_vcpu_regs(dom, VcpuId{0}));
    mem::PagingContext ctx = XP_TRY(mem::paging_context(info, regs));
    mem::HypervisorFrameSource source(hv, dom);
    mem::GuestMemory memory(source);
    // The tables are kernel data: read through page tables that map the kernel (with page-table
    // isolation a vCPU in user mode holds tables that map almost none of it).
    const Gva text = syms.resolve("_stext").value_or(Gva{0});
    XP_TRY(mem::use_kernel_page_tables(memory, ctx, info.type, text));
    return kernel::orc::read_kernel_table(
        syms, [&memory](Gva a, std::span<std::byte> out) { return memory.read(a, out); });
  };
  auto t = read_tables();
  if (!t) {
    d.why = Error{t.error().code, "domain " + std::to_string(dom.value) + ": cannot unwind its kernel's stacks: " +
                                      t.error().what};
    return fail(d.why.code, d.why.what);
  }
  std::string summary = "ORC table of the kernel: " + t->summary();
  d.unwinder = std::make_shared<const kernel::orc::Unwinder>(std::move(*t));
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
