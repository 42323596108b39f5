// What Session::kernel_stack() keeps per domain: the guest kernel's ORC tables
// (kernel/orc.hpp), read once from its memory through the kernel's own page tables.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kernel/orc.hpp"
#include "symbols/symbol_table.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::api {

class KernelStacks {
 public:
  // Reads the domain's tables (again, if it had them); a summary for logs, or why not. A
  // failure is kept: walk() answers it until the next load().
  [[nodiscard]] Result<std::string> load(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms);
  bool tried(DomId dom) const { return by_dom_.contains(dom); }
  // The hit vCPU's kernel stack, read through its own view of memory.
  [[nodiscard]] Result<KernelStack> walk(HitContext& hit, unsigned max_frames) const;

 private:
  struct PerDomain {
    std::shared_ptr<const kernel::orc::Unwinder> unwinder;
    Error why{Errc::NotFound, ""};
  };
  std::map<DomId, PerDomain> by_dom_;
};

}  // namespace xenprobes::api
