#include "kernel/tables.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/bytes.hpp"
#include "common/log.hpp"
#include "kernel/btf.hpp"
#include "kernel/modules.hpp"

namespace xenprobes::kernel {
namespace {

std::optional<std::uint64_t> address_of(const symbols::SymbolTable& s, std::string_view name) {
  auto r = s.lookup(name);
  if (!r || r->empty()) return std::nullopt;
  return r->front().address.value;
}

// [start, end) from two symbols, or nullopt (either is missing, or they are reversed).
std::optional<Range> bounds(const symbols::SymbolTable& s, std::string_view start, std::string_view end) {
  auto a = address_of(s, start), b = address_of(s, end);
  if (!a || !b || *b < *a) return std::nullopt;
  return Range{*a, *b};
}

// The bytes of the table bounded by two symbols, in entries of `esize` bytes; the status says
// why not when it cannot be read.
std::optional<std::vector<std::byte>> read_table(const symbols::SymbolTable& syms, const ReadFn& read,
                                                 std::string_view start, std::string_view stop, std::size_t esize,
                                                 const Limits& limits, TableStatus& st, std::uint64_t* base) {
  auto a = address_of(syms, start), b = address_of(syms, stop);
  if (!a || !b) {
    st.why = std::string("no ") + std::string(!a ? start : stop) + " in the symbols (" + syms.source() + ")";
    return std::nullopt;
  }
  if (*b < *a) {
    st.why = std::string(stop) + " is below " + std::string(start);
    return std::nullopt;
  }
  const std::uint64_t bytes = *b - *a;
  if (bytes % esize != 0) {
    st.why = std::to_string(bytes) + " bytes is not a whole number of " + std::to_string(esize) + "-byte entries";
    return std::nullopt;
  }
  if (bytes / esize > limits.max_entries) {
    st.why = std::to_string(bytes / esize) + " entries is more than the limit of " + std::to_string(limits.max_entries);
    return std::nullopt;
  }
  auto out = entries::read_bytes(read, *a, bytes, limits, st);
  if (!out) return std::nullopt;
  *base = *a;
  st.found = true;
  return out;
}

}  // namespace

namespace entries {

void decode_ex(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep, std::vector<ExEntry>& out) {
  for (std::size_t off = 0; off + kExSize <= raw.size(); off += kExSize) {
    const std::byte* e = raw.data() + off;
    ExEntry x;
    x.insn = base + off + load<std::int32_t>(e);
    x.fixup = base + off + 4 + load<std::int32_t>(e + 4);
    x.data = load<std::int32_t>(e + 8);
    if (keep(x.insn)) out.push_back(x);
  }
}

void decode_jumps(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep, std::vector<Site>& out) {
  for (std::size_t off = 0; off + kJumpSize <= raw.size(); off += kJumpSize) {
    const std::byte* e = raw.data() + off;
    Site s{base + off + load<std::int32_t>(e), (base + off + 8 + load<std::int64_t>(e + 8)) & ~3ull,
           base + off + 4 + load<std::int32_t>(e + 4)};
    if (keep(s.addr)) out.push_back(s);
  }
}

void decode_static_calls(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep,
                         std::vector<Site>& out) {
  for (std::size_t off = 0; off + kStaticCallSize <= raw.size(); off += kStaticCallSize) {
    const std::byte* e = raw.data() + off;
    Site s{base + off + load<std::int32_t>(e), (base + off + 4 + load<std::int32_t>(e + 4)) & ~3ull};
    if (keep(s.addr)) out.push_back(s);
  }
}

KeepFn classifier(Range text, Range init, TableStatus& st) {
  return [text, init, &st](std::uint64_t a) {
    if (text.contains(a)) return true;
    if (init.contains(a)) ++st.init_entries;
    else ++st.invalid;
    return false;
  };
}

std::optional<std::vector<std::byte>> read_bytes(const ReadFn& read, std::uint64_t addr, std::uint64_t bytes,
                                                 const Limits& limits, TableStatus& st) {
  std::vector<std::byte> out(bytes);
  const std::uint64_t chunk = std::max<std::uint64_t>(limits.chunk_bytes, 1);
  for (std::uint64_t off = 0; off < bytes; off += chunk) {
    std::uint64_t n = std::min<std::uint64_t>(chunk, bytes - off);
    if (auto r = read(Gva{addr + off}, std::span(out.data() + off, n)); !r) {
      st.why = "cannot read it at " + std::to_string(addr + off) + ": " + r.error().what;
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace entries

KernelTables KernelTables::read(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits) {
  KernelTables t;
  if (auto r = bounds(syms, "_stext", "_etext")) t.text_ = *r;
  if (auto r = bounds(syms, "_sinittext", "_einittext")) t.init_text_ = *r;
  auto inside = [&](std::optional<Range> r) -> std::optional<Range> {
    // A section outside the kernel's text is a lie: treat its bounds as unknown.
    if (!r || t.text_.empty() || r->start < t.text_.start || r->end > t.text_.end) return std::nullopt;
    return r;
  };
  t.entry_ = inside(bounds(syms, "__entry_text_start", "__entry_text_end"));
  t.noinstr_ = inside(bounds(syms, "__noinstr_text_start", "__noinstr_text_end"));
  t.kprobes_ = inside(bounds(syms, "__kprobes_text_start", "__kprobes_text_end"));

  // Where a decoded address may point: the kernel's text (kept), its init text (freed after
  // boot: dropped, counted), anything else (a corrupt or hostile entry: dropped, counted).
  auto classify = [&](std::uint64_t a, TableStatus& st) { return entries::classifier(t.text_, t.init_text_, st)(a); };
  const bool have_text = !t.text_.empty();
  auto no_text = [&](TableStatus& st) {
    st.found = false;
    st.why = "the kernel's text bounds (_stext, _etext) are not in the symbols";
  };

  std::uint64_t base = 0;
  if (auto raw = read_table(syms, read, "__start___ex_table", "__stop___ex_table", entries::kExSize, limits,
                            t.ex_status_, &base)) {
    if (!have_text) no_text(t.ex_status_);
    if (have_text) entries::decode_ex(base, *raw, entries::classifier(t.text_, t.init_text_, t.ex_status_), t.ex_);
  }
  if (auto raw = read_table(syms, read, "__start___jump_table", "__stop___jump_table", entries::kJumpSize, limits,
                            t.jump_status_, &base)) {
    if (!have_text) no_text(t.jump_status_);
    if (have_text)
      entries::decode_jumps(base, *raw, entries::classifier(t.text_, t.init_text_, t.jump_status_), t.jumps_);
  }
  if (auto raw = read_table(syms, read, "__start_static_call_sites", "__stop_static_call_sites",
                            entries::kStaticCallSize, limits, t.sc_status_, &base)) {
    if (!have_text) no_text(t.sc_status_);
    if (have_text)
      entries::decode_static_calls(base, *raw, entries::classifier(t.text_, t.init_text_, t.sc_status_), t.calls_);
  }
  // .smp_locks lives in init memory. Linux frees it after boot exactly when it will never
  // rewrite a lock prefix again: when it booted with its SMP alternatives in place or can
  // only ever have one CPU (alternative_instructions(): free_init_pages("SMP alternatives")
  // if !uniproc_patched || num_possible_cpus() == 1), and x86-64 unmaps freed init memory
  // from the kernel image's mapping. So a table whose bounds are known but whose bytes are
  // unmapped lists no site that can change; it is not "unknown".
  auto locks = read_table(syms, read, "__smp_locks", "__smp_locks_end", 4, limits, t.locks_status_, &base);
  if (!locks && t.locks_status_.why.starts_with("cannot read")) {
    t.locks_status_.found = true;
    t.locks_status_.freed = true;
    t.locks_status_.why = "freed after boot (its memory is unmapped): the kernel rewrites no lock prefix any more";
  }
  if (auto& raw = locks) {
    if (!have_text) no_text(t.locks_status_);
    for (std::size_t off = 0; have_text && off < raw->size(); off += 4) {
      // The section is padded to a page with zeros; once booted SMP the kernel frees it as
      // init memory (poisoned, then reused): garbage points anywhere and is dropped, and the
      // rule also checks the prefix byte itself (address_rules.cpp).
      if (load<std::int32_t>(raw->data() + off) == 0) continue;
      std::uint64_t a = base + off + load<std::int32_t>(raw->data() + off);
      if (classify(a, t.locks_status_)) t.locks_.push_back(a);
    }
  }

  t.read_blacklist(syms, read, limits);
  t.index();
  for (TableStatus* st : {&t.ex_status_, &t.jump_status_, &t.sc_status_, &t.locks_status_, &t.bl_status_})
    if (st->invalid)
      XP_LOG(Warn, "guest kernel table %s: %zu entries point outside the kernel's text (dropped)", st->name,
             st->invalid);
  return t;
}

// kprobe_blacklist, walked again from its head: the core kernel's ranges and, set aside in
// bl_outside_, those a loaded module added (set_modules sorts them out).
void KernelTables::read_blacklist(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits) {
  bl_status_ = named("kprobe_blacklist");
  blacklist_.clear();
  bl_outside_.clear();
  // kprobe_blacklist: a list_head whose nodes start with their own list_head, so `next`
  // points at the next node itself. Walked with a bound; a repeated node ends the walk.
  if (auto head = address_of(syms, "kprobe_blacklist"); !head) {
    bl_status_.why = "no kprobe_blacklist in the symbols (" + syms.source() + ")";
  } else if (text_.empty()) {
    bl_status_.why = "the kernel's text bounds (_stext, _etext) are not in the symbols";
  } else {
    std::set<std::uint64_t> seen;
    std::uint64_t node = 0;
    std::byte buf[40];
    bool ok = true;
    if (auto r = read(Gva{*head}, std::span(buf, 8)); !r) {
      bl_status_.why = "cannot read its head: " + r.error().what;
      ok = false;
    } else {
      node = load<std::uint64_t>(buf);
    }
    while (ok && node != *head) {
      if (node < symbols::kKernelHalfStart || !seen.insert(node).second || seen.size() > limits.max_blacklist) {
        bl_status_.why = seen.size() > limits.max_blacklist ? "more nodes than the limit"
                         : node < symbols::kKernelHalfStart ? "a node outside the kernel's half"
                                                            : "the list loops without returning to its head";
        ok = false;
        break;
      }
      if (auto r = read(Gva{node}, std::span(buf, sizeof buf)); !r) {
        bl_status_.why = "cannot read a node: " + r.error().what;
        ok = false;
        break;
      }
      Range r{load<std::uint64_t>(buf + 16), load<std::uint64_t>(buf + 24)};
      if (r.start < r.end && r.end - r.start <= (64u << 20) && text_.contains(r.start) && r.end <= text_.end)
        blacklist_.push_back(r);
      else if (!r.empty() && init_text_.contains(r.start)) ++bl_status_.init_entries;
      else {
        ++bl_status_.invalid;
        // A module's, perhaps (the kernel lists their NOKPROBE functions here too): kept aside
        // until the modules are known (set_modules).
        if (r.start < r.end && r.end - r.start <= (64u << 20) && r.start >= symbols::kKernelHalfStart)
          bl_outside_.push_back(r);
      }
      node = load<std::uint64_t>(buf);
    }
    bl_status_.found = ok;
    if (!ok) {
      blacklist_.clear();  // a list we could not walk to its end is not trusted in part
      bl_outside_.clear();
    }
  }
}

KernelTables KernelTables::from_parts(Range text, std::vector<ExEntry> ex, std::vector<Site> jumps,
                                      std::vector<Site> calls, std::vector<std::uint64_t> locks,
                                      std::vector<Range> blacklist) {
  KernelTables t;
  t.text_ = text;
  t.ex_ = std::move(ex);
  t.jumps_ = std::move(jumps);
  t.calls_ = std::move(calls);
  t.locks_ = std::move(locks);
  t.blacklist_ = std::move(blacklist);
  for (TableStatus* st : {&t.ex_status_, &t.jump_status_, &t.sc_status_, &t.locks_status_, &t.bl_status_})
    st->found = true;
  t.index();
  return t;
}

void KernelTables::index() {
  // Hostile input is never trusted to be sorted (Linux sorts __ex_table at build time).
  std::sort(ex_.begin(), ex_.end(), [](const ExEntry& a, const ExEntry& b) { return a.insn < b.insn; });
  auto by_addr = [](const Site& a, const Site& b) { return a.addr < b.addr; };
  std::sort(jumps_.begin(), jumps_.end(), by_addr);
  std::sort(calls_.begin(), calls_.end(), by_addr);
  std::sort(locks_.begin(), locks_.end());
  ex_status_.entries = ex_.size();
  jump_status_.entries = jumps_.size();
  sc_status_.entries = calls_.size();
  locks_status_.entries = locks_.size();
  merge_blacklist();
}

void KernelTables::merge_blacklist() {
  // Blacklist ranges merged, so one binary search answers.
  std::sort(blacklist_.begin(), blacklist_.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  std::vector<Range> merged;
  for (const Range& r : blacklist_) {
    if (!merged.empty() && r.start <= merged.back().end) merged.back().end = std::max(merged.back().end, r.end);
    else merged.push_back(r);
  }
  bl_status_.entries = blacklist_.size();
  blacklist_ = std::move(merged);
}

struct KernelTables::LayoutCache {
  Result<ModuleLayout> layout;
};

const Module* KernelTables::live_module_at(std::uint64_t addr) const {
  return modules_ && !text_.contains(addr) ? modules_->live_module_at(addr) : nullptr;
}

void KernelTables::set_modules(ModuleTables m) {
  modules_ = std::make_shared<const ModuleTables>(std::move(m));
  // The blacklist ranges the core walk set aside: those inside a live module's text are its
  // NOKPROBE functions and .kprobes.text (the kernel adds both when the module comes).
  module_bl_.clear();
  for (const Range& r : bl_outside_)
    if (const Module* mod = modules_->live_module_at(r.start); mod && r.end <= mod->text.end) module_bl_.push_back(r);
  std::sort(module_bl_.begin(), module_bl_.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  std::vector<Range> merged;
  for (const Range& r : module_bl_) {
    if (!merged.empty() && r.start <= merged.back().end) merged.back().end = std::max(merged.back().end, r.end);
    else merged.push_back(r);
  }
  module_bl_ = std::move(merged);
}

bool KernelTables::refresh_modules(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits) {
  if (modules_ && !modules_->changed(syms, read)) return false;
  // No struct module layout (no BTF): no module can ever be read, nothing to walk again.
  if (modules_ && layout_ && !layout_->layout) return false;
  if (!layout_) {
    // The layout of struct module, once: from the guest's own BTF (4-5 MiB, checked by libbpf).
    auto cache = std::make_shared<LayoutCache>(LayoutCache{fail(Errc::NotFound, "")});
    if (auto blob = read_kernel_btf(syms, read); !blob)
      cache->layout = fail(blob.error().code, "no BTF to read struct module's layout from: " + blob.error().what);
    else cache->layout = module_layout_from_btf(*blob);
    layout_ = std::move(cache);
  }
  // A module adds its NOKPROBE functions to kprobe_blacklist when it comes and takes them
  // out when it goes: the list is walked again with the modules.
  read_blacklist(syms, read, limits);
  merge_blacklist();
  if (!layout_->layout) {
    set_modules(ModuleTables::unavailable(layout_->layout.error().what));
  } else {
    set_modules(ModuleTables::read(syms, read, *layout_->layout, text_, limits));
  }
  XP_LOG(Debug, "guest kernel %s", modules_->summary().c_str());
  return true;
}

const ExEntry* KernelTables::exception_entry(std::uint64_t insn) const {
  const std::vector<ExEntry>* v = &ex_;
  if (const Module* m = live_module_at(insn)) v = &m->ex;
  auto it = std::lower_bound(v->begin(), v->end(), insn, [](const ExEntry& e, std::uint64_t a) { return e.insn < a; });
  return it != v->end() && it->insn == insn ? &*it : nullptr;
}

const ExEntry* KernelTables::exception_entry_in(std::uint64_t lo, std::uint64_t hi) const {
  const std::vector<ExEntry>* v = &ex_;
  if (const Module* m = live_module_at(lo)) v = &m->ex;
  auto it = std::lower_bound(v->begin(), v->end(), lo, [](const ExEntry& e, std::uint64_t a) { return e.insn < a; });
  return it != v->end() && it->insn < hi ? &*it : nullptr;
}

const Site* KernelTables::site_in(const std::vector<Site>& v, std::uint64_t len, std::uint64_t lo, std::uint64_t hi) {
  // A site [addr, addr + len) overlaps [lo, hi) when addr < hi and addr + len > lo.
  const std::uint64_t from = lo >= len ? lo - len + 1 : 0;
  auto it = std::lower_bound(v.begin(), v.end(), from, [](const Site& s, std::uint64_t a) { return s.addr < a; });
  return it != v.end() && it->addr < hi ? &*it : nullptr;
}

// (A range is looked up in the table of whoever holds `lo`: an instruction never spans the
// core kernel and a module, and the rules refuse one that runs past its module's end.)
const Site* KernelTables::jump_label_in(std::uint64_t lo, std::uint64_t hi) const {
  const Module* m = live_module_at(lo);
  return site_in(m ? m->jumps : jumps_, kJumpSiteLen, lo, hi);
}
const Site* KernelTables::static_call_in(std::uint64_t lo, std::uint64_t hi) const {
  const Module* m = live_module_at(lo);
  return site_in(m ? m->calls : calls_, kStaticCallSiteLen, lo, hi);
}

std::optional<std::uint64_t> KernelTables::smp_lock_in(std::uint64_t lo, std::uint64_t hi) const {
  auto it = std::lower_bound(locks_.begin(), locks_.end(), lo);
  if (it != locks_.end() && *it < hi) return *it;
  return std::nullopt;
}

const Range* KernelTables::blacklisted(std::uint64_t addr) const {
  const std::vector<Range>& v = live_module_at(addr) ? module_bl_ : blacklist_;
  auto it = std::upper_bound(v.begin(), v.end(), addr, [](std::uint64_t a, const Range& r) { return a < r.start; });
  if (it == v.begin()) return nullptr;
  --it;
  return it->contains(addr) ? &*it : nullptr;
}

std::string KernelTables::summary() const {
  std::string s;
  for (const TableStatus* st : {&ex_status_, &jump_status_, &sc_status_, &locks_status_, &bl_status_}) {
    if (!s.empty()) s += ", ";
    s += st->name;
    if (!st->found) {
      s += " not read (" + st->why + ")";
      continue;
    }
    s += " " + std::to_string(st->entries);
    if (st->init_entries) s += " (+" + std::to_string(st->init_entries) + " init)";
    if (st->invalid) s += " (" + std::to_string(st->invalid) + " invalid dropped)";
  }
  if (modules_) s += ", " + modules_->summary();
  return s;
}

}  // namespace xenprobes::kernel
