// SymbolTable's loaded-module functions (symbol_table.hpp, set_module_functions): how their
// names resolve next to the core kernel's.
#include <algorithm>
#include <set>

#include "common/hex.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::symbols {
namespace {

bool valid_part(std::string_view s, bool module) {
  if (s.empty() || s.size() > kMaxNameLen) return false;
  return std::all_of(s.begin(), s.end(), [module](char c) {
    if (module)
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
             c == '.';
    return c > 0x20 && c < 0x7f && c != ':';
  });
}

}  // namespace

Result<void> SymbolTable::set_module_functions(std::vector<ModuleFunction> fns) {
  for (const ModuleFunction& f : fns) {
    if (!valid_part(f.module, true) || !valid_part(f.name, false) || f.size == 0 || f.start < kKernelHalfStart ||
        f.start + f.size < f.start)
      return fail(Errc::InvalidArgument,
                  "module function " + f.module + ":" + f.name.substr(0, 64) + " at " + hex(f.start) + " is malformed");
  }
  std::sort(fns.begin(), fns.end(), [](const ModuleFunction& a, const ModuleFunction& b) {
    return a.start != b.start ? a.start < b.start : a.name < b.name;
  });
  for (std::size_t i = 1; i < fns.size(); ++i) {
    const ModuleFunction& p = fns[i - 1];
    const ModuleFunction& f = fns[i];
    // Aliases (one function, two names) share an address in one module; nothing else overlaps.
    const bool alias = f.start == p.start && f.module == p.module;
    if (!alias && f.start < p.start + p.size)
      return fail(Errc::InvalidArgument, "module function " + f.module + ":" + f.name + " at " + hex(f.start) +
                                             " overlaps " + p.module + ":" + p.name);
  }
  mods_ = std::move(fns);
  mods_by_name_.resize(mods_.size());
  for (std::size_t k = 0; k < mods_.size(); ++k) mods_by_name_[k] = static_cast<std::uint32_t>(k);
  std::stable_sort(mods_by_name_.begin(), mods_by_name_.end(), [this](std::uint32_t a, std::uint32_t b) {
    return std::tie(mods_[a].name, mods_[a].module) < std::tie(mods_[b].name, mods_[b].module);
  });
  return {};
}

std::vector<Symbol> SymbolTable::module_lookup(std::string_view name) const {
  std::string_view module;
  const std::size_t colon = name.find(':');
  if (colon != std::string_view::npos) {
    module = name.substr(0, colon);
    name = name.substr(colon + 1);
  }
  auto lo = std::lower_bound(mods_by_name_.begin(), mods_by_name_.end(), name,
                             [this](std::uint32_t i, std::string_view n) { return mods_[i].name < n; });
  std::vector<Symbol> out;
  for (auto it = lo; it != mods_by_name_.end() && mods_[*it].name == name; ++it) {
    const ModuleFunction& f = mods_[*it];
    if (colon != std::string_view::npos && f.module != module) continue;
    out.push_back(Symbol{f.name, Gva{f.start}, f.type, SymbolKind::Text, f.size, f.module});
  }
  std::stable_sort(out.begin(), out.end(), [](const Symbol& a, const Symbol& b) { return a.address < b.address; });
  return out;
}

const ModuleFunction* SymbolTable::module_function_at(std::uint64_t addr) const {
  auto it = std::upper_bound(mods_.begin(), mods_.end(), addr,
                             [](std::uint64_t a, const ModuleFunction& f) { return a < f.start; });
  if (it == mods_.begin()) return nullptr;
  --it;
  return addr - it->start < it->size ? &*it : nullptr;
}

Result<Gva> SymbolTable::resolve_module(std::string_view target, std::uint64_t off, bool has_off) const {
  const std::vector<Symbol> m = module_lookup(target);
  std::set<std::string> modules;
  std::set<std::uint64_t> addrs;
  for (const Symbol& s : m) {
    modules.insert(s.module);
    addrs.insert(s.address.value);
  }
  if (modules.size() > 1) {
    std::string list;
    for (const std::string& mod : modules) list += (list.empty() ? "" : ", ") + mod;
    return fail(Errc::InvalidArgument, "function '" + std::string(target) + "' is in several loaded modules (" + list +
                                           "): name one, e.g. '" + *modules.begin() + ":" + std::string(target) + "'");
  }
  if (addrs.size() > 1)
    return fail(Errc::InvalidArgument, "function '" + std::string(target) + "' is at " + std::to_string(addrs.size()) +
                                           " addresses in module " + *modules.begin() +
                                           "; pass the address instead, e.g. '" + hex(*addrs.begin()) +
                                           (has_off ? "+" + hex(off) : std::string{}) + "'");
  const Symbol& s = m.front();
  if (off >= s.size && off != 0)
    return fail(Errc::Range, "offset " + hex(off) + " is beyond the end of function '" + s.name + "' [" + s.module +
                                 "] (size " + hex(s.size) + ")");
  return Gva{s.address.value + off};
}

}  // namespace xenprobes::symbols
