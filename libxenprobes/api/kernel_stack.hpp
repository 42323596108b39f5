// What Session::kernel_stack() keeps per domain: the guest kernel's ORC tables (kernel/orc.hpp),
// read from its memory through the kernel's own page tables: the core kernel's once, its live
// modules' again whenever the engine's module list changes (docs/guest-symbols.md "When modules
// come and go").
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kernel/modules.hpp"
#include "kernel/orc.hpp"
#include "symbols/symbol_table.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::api {

class KernelStacks {
 public:
  // Reads the domain's tables (again, if it had them): the kernel's, and those of the usable
  // modules of `mods` (null: no module list), which is the engine's list at symbols generation
  // `generation`. A summary for logs, or why not. A failure is kept: walk() answers it until
  // the next load().
  [[nodiscard]] Result<std::string> load(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms,
                                         const kernel::ModuleTables* mods, std::uint64_t generation);
  // The modules' tables only, for the list `mods` at `generation`: a module still there with
  // the same struct module, text and table keeps the table read before; one that went is
  // dropped; one that came is read (what fails is left to the frame-pointer fallback).
  void update_modules(hv::Hypervisor& hv, DomId dom, const symbols::SymbolTable& syms, const kernel::ModuleTables* mods,
                      std::uint64_t generation);
  bool tried(DomId dom) const { return by_dom_.contains(dom); }
  bool loaded(DomId dom) const;  // load() succeeded
  std::uint64_t generation(DomId dom) const;
  // The hit vCPU's kernel stack, read through its own view of memory.
  [[nodiscard]] Result<KernelStack> walk(HitContext& hit, unsigned max_frames) const;

 private:
  // A module's table as read, by what identifies it (a module unloaded and another loaded in
  // its place differs in one of these).
  struct ModuleTable {
    kernel::ModuleIdentity id;
    std::uint64_t ip = 0, orc = 0, num = 0;
    std::optional<kernel::orc::Table> table;  // none: refused (or no table), the fallback unwinds it
  };
  struct PerDomain {
    std::unique_ptr<kernel::orc::Unwinder> unwinder;
    Error why{Errc::NotFound, ""};
    std::uint64_t generation = 0;
    std::map<std::uint64_t, ModuleTable> modules;  // by struct module
  };
  std::string set_modules(PerDomain& d, const kernel::ModuleTables* mods, const kernel::ReadFn* read);
  std::map<DomId, PerDomain> by_dom_;
};

}  // namespace xenprobes::api
