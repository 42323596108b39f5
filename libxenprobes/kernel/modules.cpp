// The walk of the guest's module list and what is read from it (struct module's layout from
// BTF is in modules_layout.cpp).
#include "kernel/modules.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/bytes.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "kernel/modules_internal.hpp"

namespace xenprobes::kernel {
namespace {

std::uint64_t load_field(const std::vector<std::byte>& s, Field f) {
  const std::byte* p = s.data() + f.offset;
  switch (f.size) {
    case 1: return load<std::uint8_t>(p);
    case 2: return load<std::uint16_t>(p);
    case 4: return load<std::uint32_t>(p);
    default: return load<std::uint64_t>(p);
  }
}

bool valid_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

ModuleState state_of(const ModuleLayout& l, std::uint64_t v) {
  if (v == l.state_live) return ModuleState::Live;
  if (v == l.state_coming) return ModuleState::Coming;
  if (v == l.state_going) return ModuleState::Going;
  if (v == l.state_unformed) return ModuleState::Unformed;
  return ModuleState::Unknown;
}

constexpr std::uint64_t kMaxModuleText = 1ull << 30;  // the whole module area is 1 GiB (x86-64)

}  // namespace

std::optional<std::string> layout_error(const ModuleLayout& l) {
  if (l.struct_size == 0 || l.struct_size > kMaxStructBytes) return "struct module has no sane size";
  if (l.list.size != 16 || l.name.size < 2 || l.core_base.size != 8 || l.init_base.size != 8)
    return "struct module's list, name or text base has the wrong shape";
  std::vector<Field> all = {l.state,
                            l.list,
                            l.name,
                            l.core_base,
                            l.core_text_size,
                            l.init_base,
                            l.init_text_size,
                            l.extable,
                            l.num_exentries,
                            l.jump_entries,
                            l.num_jump_entries,
                            l.static_call_sites,
                            l.num_static_call_sites};
  for (const auto& f : {l.kprobes_text_start, l.kprobes_text_size, l.noinstr_text_start, l.noinstr_text_size,
                        l.ksym_symtab, l.ksym_num_symtab, l.ksym_strtab, l.ksym_typetab, l.btf_data, l.btf_data_size,
                        l.orc_num, l.orc_ip, l.orc_unwind})
    if (f) all.push_back(*f);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Field& f = all[i];
    if (std::uint64_t{f.offset} + f.size > l.struct_size)
      return "a member of struct module at +" + std::to_string(f.offset) + " lies outside its " +
             std::to_string(l.struct_size) + " bytes";
    // (list and name are read by their own rules; an absent table member has size 0.)
    if (i != 1 && i != 2 && f.size != 0 && f.size != 1 && f.size != 2 && f.size != 4 && f.size != 8)
      return "a member of struct module at +" + std::to_string(f.offset) + " is " + std::to_string(f.size) + " bytes";
  }
  return std::nullopt;
}

const char* to_string(ModuleState s) {
  switch (s) {
    case ModuleState::Live: return "LIVE";
    case ModuleState::Coming: return "COMING";
    case ModuleState::Going: return "GOING";
    case ModuleState::Unformed: return "UNFORMED";
    case ModuleState::Unknown: break;
  }
  return "unknown";
}

// ---- the walk

ModuleTables ModuleTables::unavailable(std::string why) {
  ModuleTables m;
  m.status_.name = "modules";
  m.status_.why = std::move(why);
  return m;
}

namespace {

// One struct module, decoded and its tables read; `why` set when it is not usable.
// entries_left: what the walk may still read of all the modules' tables together.
Module read_module(const ReadFn& read, const ModuleLayout& l, std::uint64_t addr, const std::vector<std::byte>& s,
                   const Limits& limits, std::size_t& entries_left) {
  Module m;
  m.address = addr;
  m.link_next = load_field(s, {l.list.offset, 8});
  m.link_prev = load_field(s, {l.list.offset + 8, 8});
  m.state = state_of(l, load_field(s, l.state));
  m.ex_status.name = "__ex_table";
  m.jump_status.name = "__jump_table";
  m.sc_status.name = ".static_call_sites";

  const char* raw = reinterpret_cast<const char*>(s.data() + l.name.offset);
  const std::size_t len = strnlen(raw, l.name.size);
  const std::string_view name(raw, len);
  if (len == 0 || len == l.name.size || !std::all_of(name.begin(), name.end(), valid_name_char)) {
    m.name = "?";
    m.why = "its name is empty, unterminated or has characters no module name has";
    return m;
  }
  m.name = std::string(name);

  const std::uint64_t base = load_field(s, l.core_base), size = load_field(s, l.core_text_size);
  if (base < symbols::kKernelHalfStart || size == 0 || size > kMaxModuleText || base + size < base) {
    m.why = "its text (" + hex(base) + ", " + std::to_string(size) + " bytes) is no range in the kernel's half";
    return m;
  }
  m.text = {base, base + size};
  const std::uint64_t ib = load_field(s, l.init_base), is = load_field(s, l.init_text_size);
  if (ib >= symbols::kKernelHalfStart && is > 0 && is <= kMaxModuleText && ib + is > ib) m.init_text = {ib, ib + is};
  auto clip = [&](const std::optional<Field>& fs, const std::optional<Field>& fn) -> std::optional<Range> {
    if (!fs || !fn) return std::nullopt;
    const std::uint64_t a = load_field(s, *fs), n = load_field(s, *fn);
    if (n == 0 || a + n < a || a >= m.text.end || a + n <= m.text.start) return std::nullopt;
    return Range{std::max(a, m.text.start), std::min(a + n, m.text.end)};
  };
  m.kprobes_text = clip(l.kprobes_text_start, l.kprobes_text_size);
  m.noinstr_text = clip(l.noinstr_text_start, l.noinstr_text_size);
  if (l.ksym_symtab && l.ksym_num_symtab && l.ksym_strtab && l.ksym_typetab) {
    m.ksym_symtab = load_field(s, *l.ksym_symtab);
    m.ksym_num = load_field(s, *l.ksym_num_symtab);
    m.ksym_strtab = load_field(s, *l.ksym_strtab);
    m.ksym_typetab = load_field(s, *l.ksym_typetab);
  }
  if (l.btf_data && l.btf_data_size) {
    m.btf_data = load_field(s, *l.btf_data);
    m.btf_size = load_field(s, *l.btf_data_size);
  }
  if (l.orc_num && l.orc_ip && l.orc_unwind) {
    m.orc_num = load_field(s, *l.orc_num);
    m.orc_ip = load_field(s, *l.orc_ip);
    m.orc_unwind = load_field(s, *l.orc_unwind);
  }

  if (m.state != ModuleState::Live) {
    m.why = std::string("it is ") + to_string(m.state) +
            (m.state == ModuleState::Coming  ? " (still loading: its init runs and its jump labels are being set up)"
             : m.state == ModuleState::Going ? " (being unloaded: its text is about to be freed)"
                                             : " (not a loaded module yet)");
    return m;
  }

  // One table: `count` entries of `esize` bytes at the pointer, decoded by `decode`.
  auto table = [&](const Field& pf, const Field& nf, std::size_t esize, TableStatus& st, auto decode, auto& out) {
    if (!pf.size) {  // the kernel has no such member: no such sites
      st.found = true;
      st.why = "not in this kernel";
      return;
    }
    const std::uint64_t ptr = load_field(s, pf), count = load_field(s, nf);
    if (count == 0) {
      st.found = true;
      return;
    }
    if (count > limits.max_entries) {
      st.why = std::to_string(count) + " entries is more than the limit of " + std::to_string(limits.max_entries);
      return;
    }
    if (count > entries_left) {
      st.why = "with its " + std::to_string(count) + " entries the loaded modules' tables pass their limit of " +
               std::to_string(limits.max_module_entries) + " entries in all";
      return;
    }
    entries_left -= count;
    if (ptr < symbols::kKernelHalfStart || ptr + count * esize < ptr) {
      st.why = "its address " + hex(ptr) + " is outside the kernel's half";
      return;
    }
    auto raw = entries::read_bytes(read, ptr, count * esize, limits, st);
    if (!raw) return;
    st.found = true;
    decode(ptr, std::span<const std::byte>(*raw), entries::classifier(m.text, m.init_text, st), out);
  };
  table(l.extable, l.num_exentries, entries::kExSize, m.ex_status, entries::decode_ex, m.ex);
  table(l.jump_entries, l.num_jump_entries, entries::kJumpSize, m.jump_status, entries::decode_jumps, m.jumps);
  table(l.static_call_sites, l.num_static_call_sites, entries::kStaticCallSize, m.sc_status,
        entries::decode_static_calls, m.calls);
  for (const TableStatus* st : {&m.ex_status, &m.jump_status, &m.sc_status})
    if (!st->found) {
      m.why = std::string("its ") + st->name + " could not be read: " + st->why;
      return m;
    }
  std::sort(m.ex.begin(), m.ex.end(), [](const ExEntry& a, const ExEntry& b) { return a.insn < b.insn; });
  auto by_addr = [](const Site& a, const Site& b) { return a.addr < b.addr; };
  std::sort(m.jumps.begin(), m.jumps.end(), by_addr);
  std::sort(m.calls.begin(), m.calls.end(), by_addr);
  m.ex_status.entries = m.ex.size();
  m.jump_status.entries = m.jumps.size();
  m.sc_status.entries = m.calls.size();
  m.usable = true;
  return m;
}

}  // namespace

ModuleTables ModuleTables::read(const symbols::SymbolTable& syms, const ReadFn& read, const ModuleLayout& layout,
                                Range core_text, const Limits& limits) {
  if (auto why = layout_error(layout)) return unavailable("struct module's layout is unusable: " + *why);
  ModuleTables t;
  t.status_.name = "modules";
  t.layout_ = layout;
  auto head = syms.lookup("modules");
  if (!head || head->empty()) {
    t.status_.why = "no `modules` list head in the symbols (" + syms.source() + ")";
    return t;
  }
  if (head->size() != 1) {
    t.status_.why = "`modules` is at several addresses in " + syms.source();
    return t;
  }
  t.head_ = head->front().address.value;
  std::byte hb[16];
  if (auto r = read(Gva{t.head_}, hb); !r) {
    t.status_.why = "cannot read the list head: " + r.error().what;
    return t;
  }
  t.head_next_ = load<std::uint64_t>(hb);
  t.head_prev_ = load<std::uint64_t>(hb + 8);

  std::set<std::uint64_t> seen;
  std::vector<std::byte> buf(layout.struct_size);
  std::size_t entries_left = limits.max_module_entries;
  std::uint64_t node = t.head_next_, prev = t.head_;
  std::string broken;
  while (node != t.head_) {
    if (node < symbols::kKernelHalfStart || node < layout.list.offset) {
      broken = "a node outside the kernel's half (" + hex(node) + ")";
      break;
    }
    if (!seen.insert(node).second) {
      broken = "the list loops without returning to its head";
      break;
    }
    if (seen.size() > limits.max_modules) {
      broken = "more than " + std::to_string(limits.max_modules) + " modules";
      break;
    }
    const std::uint64_t mod = node - layout.list.offset;
    if (auto r = read(Gva{mod}, buf); !r) {
      broken = "cannot read the struct module at " + hex(mod) + ": " + r.error().what;
      break;
    }
    Module m = read_module(read, layout, mod, buf, limits, entries_left);
    if (m.link_prev != prev) {
      // Corrupt, or changed under us while the guest ran: either way not this list.
      broken = "the node at " + hex(node) + " does not point back at its predecessor";
      break;
    }
    prev = node;
    node = m.link_next;
    t.modules_.push_back(std::move(m));
  }
  if (broken.empty() && t.head_prev_ != prev) broken = "the head's prev is not the last node";
  if (!broken.empty()) {
    t.status_.why = "the module list could not be walked: " + broken;
    t.modules_.clear();
    return t;
  }
  t.status_.found = true;
  t.walked_ = true;

  // Index: by text start; a module overlapping the core kernel or another one is no module.
  std::sort(t.modules_.begin(), t.modules_.end(),
            [](const Module& a, const Module& b) { return a.text.start < b.text.start; });
  for (std::size_t i = 0; i < t.modules_.size(); ++i) {
    Module& m = t.modules_[i];
    if (m.text.empty()) continue;
    if (m.text.overlaps(core_text.start, core_text.end) && m.usable) {
      m.usable = false;
      m.why = "its text overlaps the core kernel's";
    }
    for (std::size_t j = i + 1; j < t.modules_.size() && t.modules_[j].text.start < m.text.end; ++j) {
      Module& o = t.modules_[j];
      if (o.text.empty()) continue;
      for (Module* x : {&m, &o}) {
        if (x->usable || x->why.empty()) x->why = "its text overlaps module " + (x == &m ? o.name : m.name) + "'s";
        x->usable = false;
      }
    }
  }
  for (std::size_t i = 0; i < t.modules_.size(); ++i) {
    const Module& m = t.modules_[i];
    if (m.usable) {
      t.live_.push_back(i);
    } else {
      ++t.status_.invalid;
    }
    for (const TableStatus* st : {&m.ex_status, &m.jump_status, &m.sc_status})
      if (st->invalid)
        XP_LOG(Warn, "guest module %s: %zu %s entries point outside its text (dropped)", m.name.c_str(), st->invalid,
               st->name);
  }
  t.status_.entries = t.live_.size();
  return t;
}

const Module* ModuleTables::live_module_at(std::uint64_t addr) const {
  auto it = std::upper_bound(live_.begin(), live_.end(), addr,
                             [this](std::uint64_t a, std::size_t i) { return a < modules_[i].text.start; });
  if (it == live_.begin()) return nullptr;
  const Module& m = modules_[*std::prev(it)];
  return m.text.contains(addr) ? &m : nullptr;
}

const Module* ModuleTables::module_at(std::uint64_t addr) const {
  if (const Module* m = live_module_at(addr)) return m;
  for (const Module& m : modules_)
    if (m.text.contains(addr) || m.init_text.contains(addr)) return &m;
  return nullptr;
}

bool ModuleTables::changed(const symbols::SymbolTable& syms, const ReadFn& read) const {
  if (!walked_) return true;
  auto head = syms.lookup("modules");
  if (!head || head->size() != 1 || head->front().address.value != head_) return true;
  std::byte hb[16];
  if (!read(Gva{head_}, hb) || load<std::uint64_t>(hb) != head_next_ || load<std::uint64_t>(hb + 8) != head_prev_)
    return true;
  // A module going away changes its state first (GOING), then its neighbours' links.
  const std::uint32_t lo = std::min(layout_.state.offset, layout_.list.offset);
  const std::uint32_t hi = std::max(layout_.state.offset + layout_.state.size, layout_.list.offset + 16);
  std::vector<std::byte> buf(layout_.struct_size);
  // A module that was still loading (COMING) goes LIVE without its neighbours' links changing.
  for (const Module& m : modules_) {
    if (m.usable || (m.state != ModuleState::Coming && m.state != ModuleState::Unformed)) continue;
    Field f = layout_.state;
    if (!read(Gva{m.address + f.offset}, std::span(buf.data() + f.offset, f.size))) return true;
    if (state_of(layout_, load_field(buf, f)) != m.state) return true;
  }
  for (std::size_t i : live_) {
    const Module& m = modules_[i];
    if (!read(Gva{m.address + lo}, std::span(buf.data() + lo, hi - lo))) return true;
    if (state_of(layout_, load_field(buf, layout_.state)) != m.state ||
        load_field(buf, {layout_.list.offset, 8}) != m.link_next ||
        load_field(buf, {layout_.list.offset + 8, 8}) != m.link_prev)
      return true;
    // Another module whose struct landed where an unloaded one's was, between the same
    // neighbours: its text is elsewhere (or of another size).
    for (Field f : {layout_.core_base, layout_.core_text_size})
      if (!read(Gva{m.address + f.offset}, std::span(buf.data() + f.offset, f.size))) return true;
    if (load_field(buf, layout_.core_base) != m.text.start ||
        load_field(buf, layout_.core_text_size) != m.text.end - m.text.start)
      return true;
    // Or even at the same text: another name says another module (its code is not ours).
    const Field nf = layout_.name;
    if (!read(Gva{m.address + nf.offset}, std::span(buf.data() + nf.offset, nf.size))) return true;
    const char* raw = reinterpret_cast<const char*>(buf.data() + nf.offset);
    if (std::string_view(raw, strnlen(raw, nf.size)) != m.name) return true;
  }
  return false;
}

ModuleIdentity ModuleIdentity::of(const Module& m) { return ModuleIdentity{m.name, m.address, m.text}; }

std::optional<std::string> module_replaced(const ModuleTables& now, std::uint64_t addr, const ModuleIdentity& was) {
  if (!now.status().found) return std::nullopt;
  const Module* m = now.module_at(addr);
  if (m && ModuleIdentity::of(*m) == was) return std::nullopt;
  if (!m) return "module " + was.name + " was unloaded";
  return "module " + was.name + " was unloaded and " + m->name + " loaded over its text";
}

std::string ModuleTables::summary() const {
  if (!status_.found) return "modules not read (" + status_.why + ")";
  std::string s = "modules " + std::to_string(live_.size()) + " live";
  if (status_.invalid) {
    s += " (" + std::to_string(status_.invalid) + " kept out:";
    std::size_t shown = 0;
    for (const Module& m : modules_) {
      if (m.usable) continue;
      if (shown++ == 3) {
        s += " ...";
        break;
      }
      s += " " + m.name + " " + (m.state == ModuleState::Live ? "invalid" : to_string(m.state)) + ";";
    }
    s += ")";
  }
  return s;
}

}  // namespace xenprobes::kernel
