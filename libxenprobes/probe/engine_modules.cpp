// Loaded modules that come and go while a domain is probed: the module list walked again when
// it changed, and the domain's symbols given the functions of the modules live now
// (docs/guest-symbols.md "When modules come and go").
#include "probe/engine_internal.hpp"

#include "kernel/module_symbols.hpp"

namespace xenprobes::probe {

namespace {

// "+ext4 -xfs" (at most a few names; the counts say the rest).
std::string difference(const std::vector<kernel::ModuleIdentity>& was, const std::vector<kernel::ModuleIdentity>& now) {
  auto in = [](const std::vector<kernel::ModuleIdentity>& v, const kernel::ModuleIdentity& m) {
    return std::find(v.begin(), v.end(), m) != v.end();
  };
  std::string s;
  std::size_t shown = 0, more = 0;
  for (const auto& [from, to, sign] : {std::tuple{&now, &was, '+'}, std::tuple{&was, &now, '-'}})
    for (const kernel::ModuleIdentity& m : *from)
      if (!in(*to, m)) {
        if (shown++ < 8) s += std::string(s.empty() ? "" : " ") + sign + m.name;
        else ++more;
      }
  if (more) s += " and " + std::to_string(more) + " more";
  return s.empty() ? "none" : s;
}

}  // namespace

void Engine::update_modules(Domain& d) {
  if (!d.tables || !d.syms) return;
  d.modules_checked = clock_ ? clock_() : std::chrono::steady_clock::now();
  mem::GuestMemory& m = *d.memory;
  const kernel::ReadFn read = [&m](Gva a, std::span<std::byte> out) { return m.read(a, out); };
  if (!d.tables->refresh_modules(*d.syms, read) && d.generation_ready) return;
  // The list changed (or may have: a pointer that moved, a node that could not be read): which
  // modules are live and usable now. A list that could not be walked trusts none of them.
  const kernel::ModuleTables* mods = d.tables->modules();
  std::vector<kernel::ModuleIdentity> now;
  if (mods && mods->status().found)
    for (const kernel::Module& mod : mods->modules())
      if (mod.usable) now.push_back(kernel::ModuleIdentity::of(mod));
  if (d.generation_ready && now == d.module_set) return;
  std::vector<symbols::ModuleFunction> fns;
  std::string read_what = "no module functions";
  if (!now.empty()) {
    kernel::ModuleSymbolsResult r = kernel::read_all_module_symbols(read, *mods);
    read_what = std::to_string(r.functions.size()) + " functions of " + std::to_string(r.modules_read) + " modules (" +
                r.stats.describe() + "; " + std::to_string(r.refused.size()) + " modules refused)";
    fns = std::move(r.functions);
  }
  if (auto s = d.syms->set_module_functions(std::move(fns)); !s) {
    XP_LOG(Warn, "domain %u: the loaded modules' functions are not used: %s", d.id.value, s.error().what.c_str());
    d.syms->clear_module_functions();
    read_what = "no module functions";
  }
  if (d.generation_ready)
    XP_LOG(Info, "domain %u: loaded modules changed (%s): %s", d.id.value, difference(d.module_set, now).c_str(),
           read_what.c_str());
  else if (!now.empty()) XP_LOG(Info, "domain %u: %s from its memory", d.id.value, read_what.c_str());
  if (mods && !mods->status().found) XP_LOG(Debug, "domain %u: %s", d.id.value, mods->summary().c_str());
  prune_module_jump_indexes(d, now);  // a module that went, or came again, decodes afresh
  d.module_set = std::move(now);
  d.generation_ready = true;
  ++d.symbols_generation;
}

Result<std::uint64_t> Engine::refresh_modules(DomId id, std::chrono::milliseconds min_interval) {
  Domain* d = XP_TRY(domain(id));
  if (!d->tables || !d->syms) return d->symbols_generation;
  const auto now = clock_ ? clock_() : std::chrono::steady_clock::now();
  if (min_interval.count() > 0 && d->modules_checked && now - *d->modules_checked < min_interval)
    return d->symbols_generation;
  // The list is read through vCPU 0's page tables, as a registration reads it (inside a batch's
  // pause, through the ones the pause took).
  if (d->pause_depth == 0) {
    if (auto r = refresh_context(*d); !r) {
      d->modules_checked = now;  // rated all the same: a vCPU in user space is not asked every hit
      return std::unexpected(r.error());
    }
  }
  update_modules(*d);
  return d->symbols_generation;
}

std::uint64_t Engine::symbols_generation(DomId id) const {
  auto it = domains_.find(id);
  return it == domains_.end() ? 0 : it->second->symbols_generation;
}

const kernel::ModuleTables* Engine::modules(DomId id) const {
  auto it = domains_.find(id);
  return it != domains_.end() && it->second->tables ? it->second->tables->modules() : nullptr;
}

}  // namespace xenprobes::probe
