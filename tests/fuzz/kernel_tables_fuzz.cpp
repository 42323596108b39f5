// Fuzz target: the guest kernel's tables (kernel/tables.cpp) read over a fuzzed symbol map and
// fuzzed guest memory, and the address rules (kernel/address_rules.cpp) over fuzzed
// instructions. The tables' bounds come from the symbols and their contents from the guest:
// both hostile.
//
// Input: the System.map text up to the first NUL byte, then: read limits, whether unmapped
// memory reads as zeros or faults, up to 4 memory regions (base, bytes), [when the limits
// byte has 0x10: loaded modules, see read_modules()], the module's text range, then probes (an
// address in or near the text and up to 15 instruction bytes).
//
// Loaded modules (kernel/modules.cpp): up to 4 struct modules in 6.1's or 6.12's layout, each
// with a fuzzed state, name, text range, table entries (relative to its text, so many land
// outside it), and optionally broken links, a huge count or a wild table pointer; and fuzzed
// bytes given to module_layout_from_btf (kernel/modules_layout.cpp). Invariants: the walk
// never fails as a whole; with unbroken links it completes; a usable module is LIVE, has a
// valid name, a text range that overlaps neither the core kernel's nor another usable module's,
// and every entry it kept lies in its text and is found by KernelTables' lookups; what
// check_address accepts outside the core text lies wholly inside a usable module's text, on
// none of its sites.
//
// Invariants: read() never fails as a whole; a table is found exactly when its bounds are in
// the symbols, ordered, a whole number of entries within the limit and readable; its counts
// (kept, init, invalid) match a reference decoding written here; every kept entry lies in the
// text (queries never return one outside it) and every one is found by the lookups (so the
// index is sorted); blacklisted() holds exactly the kept ranges; summary() is printable.
// check_address() refuses with a known rule, the same on every channel except for the
// guest-channel-only rules (last in order), and what it accepts lies in the text, inside a
// function, on no exception-table entry, jump-label or static-call site.
#include <cctype>
#include <cinttypes>

#include "fuzz/fuzz_common.hpp"
#include "kernel/address_rules.hpp"
#include "kernel/modules.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/analysis.hpp"
#include "x86/insn.hpp"

using namespace xenprobes;
using namespace xenprobes::kernel;
using fuzz::Input;

namespace {

constexpr std::uint64_t kText = 0xffffffff81000000ull, kRodata = 0xffffffff81200000ull, kData = 0xffffffff81300000ull;

struct Memory {
  struct Region {
    std::uint64_t base;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Region> regions;
  bool faults = false;  // unmapped bytes fault (else read as zeros)
  std::size_t reads = 0;

  // One byte, or nullopt when unmapped.
  std::optional<std::uint8_t> at(std::uint64_t a) const {
    for (const auto& r : regions)
      if (a - r.base < r.bytes.size()) return r.bytes[a - r.base];
    return std::nullopt;
  }
  // Byte i of `out` is at(a + i) (addresses wrap): unmapped bytes fault or read as zeros.
  // Region by region, not byte by byte: the tables read are up to megabytes, and a per-byte
  // look-up made single inputs take seconds (slow units and a wall-clock timeout on a loaded
  // machine, none of it the library's time).
  Result<void> read(Gva a, std::span<std::byte> out) {
    ++reads;
    for (const auto& r : regions)  // the common case: all inside one region
      if (a.value - r.base < r.bytes.size() && out.size() <= r.bytes.size() - (a.value - r.base)) {
        std::memcpy(out.data(), r.bytes.data() + (a.value - r.base), out.size());
        return {};
      }
    std::vector<bool> mapped(out.size(), false);
    std::fill(out.begin(), out.end(), std::byte{0});
    for (const auto& r : regions) {  // the first region holding a byte gives it, as at() does
      // Region byte k is out[i] with i = r.base + k - a (mod 2^64).
      const std::uint64_t first_i = r.base - a.value;
      for (std::uint64_t k = 0; k < r.bytes.size();) {
        const std::uint64_t i = first_i + k;
        if (i >= out.size()) {                  // skip to where the region meets `out` again (wrapping)
          const std::uint64_t to_zero = 0 - i;  // distance to index 0, mod 2^64
          if (to_zero >= r.bytes.size() - k) break;
          k += to_zero;
          continue;
        }
        const std::uint64_t n = std::min<std::uint64_t>(r.bytes.size() - k, out.size() - i);
        for (std::uint64_t j = 0; j < n; ++j)
          if (!mapped[i + j]) mapped[i + j] = true, out[i + j] = std::byte{r.bytes[k + j]};
        k += n;
      }
    }
    if (faults && std::find(mapped.begin(), mapped.end(), false) != mapped.end())
      return fail(Errc::Fault, "not mapped (fuzz)");
    return {};
  }
};

std::optional<std::uint64_t> sym(const symbols::SymbolTable& s, std::string_view name) {
  auto r = s.lookup(name);
  if (!r || r->empty()) return std::nullopt;
  return r->front().address.value;
}

// The reference decoding of one table: what read() must have found, kept and dropped.
struct RefTable {
  bool found = false;
  bool unreadable = false;  // bounds fine, bytes not mapped
  std::size_t init = 0, invalid = 0;
  std::vector<std::uint64_t> kept;  // addresses
};

RefTable ref_table(
    const symbols::SymbolTable& syms, Memory& mem, const Limits& lim, std::string_view start, std::string_view stop,
    std::size_t esize, Range text, Range init,
    const std::function<std::optional<std::uint64_t>(std::uint64_t base, const std::uint8_t* e)>& addr_of) {
  RefTable t;
  auto a = sym(syms, start), b = sym(syms, stop);
  if (!a || !b || *b < *a || (*b - *a) % esize || (*b - *a) / esize > lim.max_entries) return t;
  std::vector<std::uint8_t> raw(*b - *a);
  if (!mem.read(Gva{*a}, std::as_writable_bytes(std::span(raw)))) {  // only when unmapped bytes fault
    t.unreadable = true;
    return t;
  }
  t.found = true;
  if (text.empty()) return t;
  for (std::size_t off = 0; off < raw.size(); off += esize) {
    auto x = addr_of(*a + off, raw.data() + off);
    if (!x) continue;
    if (text.contains(*x)) t.kept.push_back(*x);
    else if (init.contains(*x)) ++t.init;
    else ++t.invalid;
  }
  return t;
}

std::int64_t s32(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// `freed_ok`: an unreadable table counts as found and empty (.smp_locks: Linux frees it after
// boot exactly when no lock prefix will be rewritten again, tables.cpp).
void check_table(const char* what, const TableStatus& st, const RefTable& ref, bool have_text, bool freed_ok = false) {
  const std::string w = std::string(what) + ": ";
  if (freed_ok && ref.unreadable) {
    FUZZ_CHECK(st.found && st.entries == 0, w + "an unmapped table is not taken as freed");
    return;
  }
  FUZZ_CHECK(st.found == (ref.found && have_text),
             w + "found " + std::to_string(st.found) + ", reference " + std::to_string(ref.found));
  if (!st.found) {
    FUZZ_CHECK(!st.why.empty() && fuzz::printable(st.why), w + st.why);
    return;
  }
  FUZZ_CHECK(st.entries == ref.kept.size() && st.init_entries == ref.init && st.invalid == ref.invalid,
             w + "kept/init/invalid " + std::to_string(st.entries) + "/" + std::to_string(st.init_entries) + "/" +
                 std::to_string(st.invalid) + ", reference " + std::to_string(ref.kept.size()) + "/" +
                 std::to_string(ref.init) + "/" + std::to_string(ref.invalid));
}

const char* const kRules[] = {"not-kernel-text",        "module-text",     "no-function", "entry-text",
                              "static-call-trampoline", "jump-label",      "static-call", "smp-lock",
                              "exception-table",        "guest-hook-path", "noinstr",     "kprobes-text",
                              "kprobe-blacklist"};

// ---- loaded modules

constexpr std::uint64_t kModHead = 0xffffffffc3000000ull, kModText = 0xffffffffc0000000ull,
                        kModStructs = 0xffffffffc1000000ull, kModTables = 0xffffffffc2000000ull;

// struct module in Debian's 6.1 (core_layout) and 6.12 (mem[], MOD_TEXT 0, MOD_INIT_TEXT 4)
// layouts, as pahole prints them; the layout a BTF would give (modules_test.cpp checks that).
ModuleLayout fuzz_layout(bool mem) {
  ModuleLayout l;
  l.struct_size = mem ? 1280 : 896;
  l.state = {0, 4};
  l.list = {8, 16};
  l.name = {24, 56};
  l.mem_array = mem;
  l.core_base = {320, 8};
  l.core_text_size = {mem ? 328u : 332u, 4};
  l.init_base = {mem ? 320u + 4 * 72 : 400u, 8};
  l.init_text_size = {l.init_base.offset + (mem ? 8u : 12u), 4};
  l.num_exentries = {300, 4};
  l.extable = {304, 8};
  l.jump_entries = {mem ? 1048u : 696u, 8};
  l.num_jump_entries = {mem ? 1056u : 704u, 4};
  l.kprobes_text_start = Field{mem ? 1112u : 760u, 8};
  l.kprobes_text_size = Field{mem ? 1120u : 768u, 4};
  l.num_static_call_sites = {mem ? 1140u : 788u, 4};
  l.static_call_sites = {mem ? 1144u : 792u, 8};
  l.noinstr_text_start = Field{mem ? 968u : 624u, 8};
  l.noinstr_text_size = Field{mem ? 976u : 632u, 4};
  return l;
}

struct FuzzModules {
  ModuleLayout layout;
  bool links_intact = true;
  std::size_t count = 0;
};

// Lays out up to 4 modules from the input in two regions put first in `mem` (so they are what
// a read sees there).
FuzzModules read_modules(Input& in, Memory& mem) {
  FuzzModules f;
  const std::uint8_t flags = in.u8();
  f.layout = fuzz_layout(flags & 1);
  if (flags & 4) {  // fuzzed bytes as the guest's BTF: never crashes; a layout it gives is in bounds
    auto b = in.bytes(in.u16() % 4096);
    std::vector<std::byte> blob(b.size());
    if (!b.empty()) std::memcpy(blob.data(), b.data(), b.size());
    if (auto l = module_layout_from_btf(blob)) {
      FUZZ_CHECK(l->struct_size > 0 && l->core_base.offset + 8 <= l->struct_size, l->describe());
      FUZZ_CHECK(fuzz::printable(l->describe()));
    } else {
      FUZZ_CHECK(fuzz::printable(l.error().what), l.error().what);
    }
  }
  const ModuleLayout& l = f.layout;
  f.count = in.u8() % 5;
  Memory::Region structs{kModStructs, std::vector<std::uint8_t>(0x1000 * std::max<std::size_t>(f.count, 1))};
  Memory::Region tables{kModTables, std::vector<std::uint8_t>(0x1000 * std::max<std::size_t>(f.count, 1))};
  Memory::Region head{kModHead, std::vector<std::uint8_t>(16)};
  auto put = [](Memory::Region& r, std::uint64_t a, std::uint64_t v, unsigned n) {
    if (a - r.base <= r.bytes.size() && r.bytes.size() - (a - r.base) >= n) std::memcpy(&r.bytes[a - r.base], &v, n);
  };
  auto node = [&](std::size_t i) { return i >= f.count ? kModHead : kModStructs + 0x1000 * i + l.list.offset; };
  for (std::size_t i = 0; i < f.count; ++i) {
    const std::uint64_t s = kModStructs + 0x1000 * i, tab = kModTables + 0x1000 * i;
    const std::uint8_t st = in.u8() % 5;
    put(structs, s + l.state.offset, st == 4 ? 7 : st, 4);
    auto name = in.bytes(8);
    std::memcpy(&structs.bytes[0x1000 * i + l.name.offset], name.data(), name.size());
    const std::uint8_t sel = in.u8();
    const std::uint64_t text = sel < 4 ? kModText + 0x10000 * sel : sel == 0xff ? in.u64() : kModText + in.u16();
    put(structs, s + l.core_base.offset, text, 8);
    put(structs, s + l.core_text_size.offset, in.u16(), 4);
    put(structs, s + l.init_base.offset, text + 0x100000, 8);
    put(structs, s + l.init_text_size.offset, 0x1000, 4);
    put(structs, s + l.kprobes_text_start->offset, text + in.u16(), 8);
    put(structs, s + l.kprobes_text_size->offset, in.u8(), 4);
    // Tables: entries relative to their fields, pointing at the text start plus a fuzzed offset.
    struct T {
      Field ptr, num;
      std::size_t esize;
      std::uint64_t at;
    };
    const T ts[] = {{l.extable, l.num_exentries, 12, tab},
                    {l.jump_entries, l.num_jump_entries, 16, tab + 0x400},
                    {l.static_call_sites, l.num_static_call_sites, 8, tab + 0x800}};
    for (const T& t : ts) {
      const unsigned n = in.u8() % 8;
      put(structs, s + t.ptr.offset, t.at, 8);
      put(structs, s + t.num.offset, n, 4);
      for (unsigned j = 0; j < n; ++j) {
        const std::uint64_t e = t.at + t.esize * j;
        const bool in_init = in.flag();  // (one read per statement: the input's order is fixed)
        const std::uint64_t target = (in_init ? text + 0x100000 : text) + in.u16();
        put(tables, e, target - e, 4);
        put(tables, e + 4, kData + in.u8() - (e + 4), 4);
        if (t.esize >= 12) put(tables, e + 8, t.esize == 16 ? kData + 0x800 - (e + 8) : in.u8(), t.esize == 16 ? 8 : 4);
      }
    }
    const std::uint8_t evil = in.u8();
    if (evil & 1) put(structs, s + l.num_exentries.offset, in.u32(), 4);  // a huge count
    if (evil & 2) put(structs, s + l.extable.offset, in.u64(), 8);        // a wild table
    put(structs, s + l.list.offset, node(i + 1), 8);
    put(structs, s + l.list.offset + 8, i == 0 ? kModHead : node(i - 1), 8);
    if (evil & 4) {  // broken links
      put(structs, s + l.list.offset + ((evil & 8) ? 8 : 0), in.u64(), 8);
      f.links_intact = false;
    }
  }
  put(head, kModHead, f.count ? node(0) : kModHead, 8);
  put(head, kModHead + 8, f.count ? node(f.count - 1) : kModHead, 8);
  mem.regions.insert(mem.regions.begin(), {std::move(head), std::move(structs), std::move(tables)});
  return f;
}

bool valid_module_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

void check_modules(const KernelTables& t, const FuzzModules& f, const Limits& lim) {
  const ModuleTables* m = t.modules();
  FUZZ_CHECK(m && fuzz::printable(m->summary()), m ? m->summary() : "no modules");
  if (f.links_intact && f.count <= lim.max_modules)
    FUZZ_CHECK(m->status().found, "an intact module list not walked: " + m->status().why);
  if (!m->status().found) {
    FUZZ_CHECK(m->modules().empty() && !m->live_module_at(kModText));
    return;
  }
  const Module* prev = nullptr;
  std::size_t usable = 0;
  for (const Module& x : m->modules()) {
    if (!x.usable) {
      FUZZ_CHECK(!x.why.empty() && fuzz::printable(x.why), x.name);
      continue;
    }
    ++usable;
    FUZZ_CHECK(x.state == ModuleState::Live && valid_module_name(x.name) && !x.text.empty(), x.name);
    FUZZ_CHECK(!x.text.overlaps(t.core_text().start, t.core_text().end), x.name + " overlaps the core text");
    FUZZ_CHECK(!prev || prev->text.end <= x.text.start, x.name + " overlaps " + (prev ? prev->name : ""));
    prev = &x;
    FUZZ_CHECK(m->live_module_at(x.text.start) == &x && t.live_module_at(x.text.end - 1) == &x, x.name);
    for (const ExEntry& e : x.ex) {
      FUZZ_CHECK(x.text.contains(e.insn), x.name + ": an exception entry outside its text");
      FUZZ_CHECK(t.exception_entry(e.insn) && t.exception_entry(e.insn)->insn == e.insn, x.name);
    }
    for (const Site& s : x.jumps) {
      FUZZ_CHECK(x.text.contains(s.addr), x.name + ": a jump label outside its text");
      FUZZ_CHECK(t.jump_label_in(s.addr, s.addr + 1) != nullptr, x.name);
    }
    for (const Site& s : x.calls) {
      FUZZ_CHECK(x.text.contains(s.addr), x.name + ": a static call outside its text");
      FUZZ_CHECK(t.static_call_in(s.addr, s.addr + 1) != nullptr, x.name);
    }
    if (x.kprobes_text) FUZZ_CHECK(x.text.contains(x.kprobes_text->start) && x.kprobes_text->end <= x.text.end);
  }
  FUZZ_CHECK(usable == m->status().entries);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 32768) return 0;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return 0;
  auto syms_r = symbols::SymbolTable::parse(all.substr(0, nul), "fuzz System.map");
  if (!syms_r) return 0;
  const symbols::SymbolTable& syms = *syms_r;
  Input in(data + nul + 1, size - nul - 1);

  Limits lim;
  const std::uint8_t lb = in.u8();
  if (lb & 1) lim.max_entries = in.range(0, 4096);
  if (lb & 2) lim.chunk_bytes = in.range(1, 4096);
  if (lb & 4) lim.max_blacklist = in.range(0, 64);
  Memory mem;
  mem.faults = lb & 8;
  for (unsigned n = in.u8() % 5; n-- > 0;) {
    const std::uint8_t where = in.u8();
    const std::uint64_t bases[] = {kRodata, kData, kText, kRodata + 0x1000, kRodata + 0x2000, kRodata + 0x3000};
    Memory::Region r;
    r.base = where < 6 ? bases[where] : where == 0xff ? in.u64() : kRodata + in.u16();
    auto b = in.bytes(in.u16() % 16384);
    r.bytes.assign(b.begin(), b.end());
    mem.regions.push_back(std::move(r));
  }

  for (const auto& r : mem.regions) FUZZ_TRACE("region %s + %zu", fuzz::hexs(r.base).c_str(), r.bytes.size());
  FUZZ_TRACE("limits: %zu entries, %zu chunk, %zu blacklist, faults %d", lim.max_entries, lim.chunk_bytes,
             lim.max_blacklist, mem.faults);
  std::optional<FuzzModules> mods;
  std::optional<symbols::SymbolTable> mod_syms;
  if (lb & 0x10) {
    // The list head where read_modules() puts it (a `modules` in the fuzzed map too makes it
    // ambiguous: refused).
    auto r = symbols::SymbolTable::parse(std::string(all.substr(0, nul)) + "\nffffffffc3000000 D modules\n", "fuzz");
    if (r) {
      mod_syms = std::move(*r);
      mods = read_modules(in, mem);
    }
  }
  KernelTables t = KernelTables::read(
      syms, [&](Gva a, std::span<std::byte> o) { return mem.read(a, o); }, lim);
  if (mods) {
    t.set_modules(ModuleTables::read(
        *mod_syms, [&](Gva a, std::span<std::byte> o) { return mem.read(a, o); }, mods->layout, t.core_text(), lim));
    check_modules(t, *mods, lim);
    FUZZ_TRACE("%s", t.modules()->summary().c_str());
  }
  FUZZ_CHECK(fuzz::printable(t.summary()), t.summary());
  FUZZ_TRACE("tables: %s", t.summary().c_str());
  const Range text = t.core_text(), init = t.init_text();

  // ---- the tables against the reference.
  const bool have_text = !text.empty();
  auto ex =
      ref_table(syms, mem, lim, "__start___ex_table", "__stop___ex_table", 12, text, init,
                [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> { return e + s32(p); });
  auto jumps =
      ref_table(syms, mem, lim, "__start___jump_table", "__stop___jump_table", 16, text, init,
                [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> { return e + s32(p); });
  auto calls =
      ref_table(syms, mem, lim, "__start_static_call_sites", "__stop_static_call_sites", 8, text, init,
                [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> { return e + s32(p); });
  auto locks = ref_table(syms, mem, lim, "__smp_locks", "__smp_locks_end", 4, text, init,
                         [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> {
                           if (s32(p) == 0) return std::nullopt;  // padding
                           return e + s32(p);
                         });
  check_table("__ex_table", t.ex_status(), ex, have_text);
  check_table("__jump_table", t.jump_status(), jumps, have_text);
  check_table(".static_call_sites", t.static_call_status(), calls, have_text);
  check_table(".smp_locks", t.smp_locks_status(), locks, have_text, /*freed_ok=*/true);

  // Every kept entry is found by its lookup, and nothing a lookup returns is outside the text.
  if (t.ex_status().found)
    for (std::uint64_t a : ex.kept) {
      const ExEntry* e = t.exception_entry(a);
      FUZZ_CHECK(e && e->insn == a, "exception_entry(" + fuzz::hexs(a) + ") misses a kept entry");
      const ExEntry* in_range = t.exception_entry_in(a, a + 1);
      FUZZ_CHECK(in_range && in_range->insn == a);
    }
  if (t.jump_status().found)
    for (std::uint64_t a : jumps.kept) {
      const Site* s = t.jump_label_in(a, a + 1);
      FUZZ_CHECK(s && s->addr <= a && a - s->addr < KernelTables::kJumpSiteLen && text.contains(s->addr),
                 "jump_label_in misses the site at " + fuzz::hexs(a));
    }
  if (t.static_call_status().found)
    for (std::uint64_t a : calls.kept) {
      const Site* s = t.static_call_in(a, a + 1);
      FUZZ_CHECK(s && s->addr <= a && a - s->addr < KernelTables::kStaticCallSiteLen && text.contains(s->addr),
                 "static_call_in misses the site at " + fuzz::hexs(a));
    }
  if (t.smp_locks_status().found)
    for (std::uint64_t a : locks.kept) FUZZ_CHECK(t.smp_lock_in(a, a + 1) == a, "smp_lock_in misses " + fuzz::hexs(a));

  // Blacklist: exactly the kept ranges (reference walk of the list).
  std::vector<Range> bl;
  bool bl_ok = false;
  if (auto head = sym(syms, "kprobe_blacklist"); head && have_text) {
    auto u64_at = [&](std::uint64_t a, std::uint64_t* v) {
      std::uint8_t b[8];
      for (int i = 0; i < 8; ++i) {
        auto x = mem.at(a + i);
        if (!x && mem.faults) return false;
        b[i] = x.value_or(0);
      }
      std::memcpy(v, b, 8);
      return true;
    };
    std::set<std::uint64_t> seen;
    std::uint64_t node = 0, s0 = 0, s1 = 0, dummy = 0;
    bl_ok = u64_at(*head, &node);
    while (bl_ok && node != *head) {
      if (node < symbols::kKernelHalfStart || !seen.insert(node).second || seen.size() > lim.max_blacklist ||
          !u64_at(node + 16, &s0) || !u64_at(node + 24, &s1) || !u64_at(node + 32, &dummy) ||
          !u64_at(node + 8, &dummy) || !u64_at(node, &dummy)) {
        bl_ok = false;
        break;
      }
      if (s0 < s1 && s1 - s0 <= (64u << 20) && text.contains(s0) && s1 <= text.end) bl.push_back(Range{s0, s1});
      node = dummy;
    }
    FUZZ_CHECK(t.blacklist_status().found == bl_ok, "blacklist found " + std::to_string(t.blacklist_status().found) +
                                                        ", reference " + std::to_string(bl_ok) + ": " +
                                                        t.blacklist_status().why);
  } else {
    FUZZ_CHECK(!t.blacklist_status().found);
  }
  auto in_bl = [&](std::uint64_t a) {
    return std::any_of(bl.begin(), bl.end(), [&](const Range& r) { return r.contains(a); });
  };
  if (bl_ok)
    for (const Range& r : bl)
      for (std::uint64_t a : {r.start, r.end - 1, r.start + (r.end - r.start) / 2}) {
        const Range* got = t.blacklisted(a);
        FUZZ_CHECK(got && got->contains(a), "blacklisted(" + fuzz::hexs(a) + ") misses a kept range");
      }

  // ---- the rules, over fuzzed instructions.
  Range module_text;
  if (in.flag()) module_text = Range{kText + in.u16(), kText + in.u16()};
  for (unsigned probes = 0; probes < 16 && !in.empty(); ++probes) {
    const std::uint8_t how = in.u8();
    std::uint64_t a = how % 4 == 0 ? in.u64() : (have_text ? text.start : kText) + in.u32() % 0x20000;
    if (how % 4 == 1 && !ex.kept.empty()) a = ex.kept[in.u8() % ex.kept.size()];
    if (how % 4 == 2 && !locks.kept.empty()) a = locks.kept[in.u8() % locks.kept.size()];
    auto bytes = in.bytes(15);
    auto insn = x86::decode(bytes, Gva{a});
    if (!insn) continue;
    auto fn = syms.function_containing(Gva{a});
    const symbols::Function* f = fn ? &*fn : nullptr;
    RuleContext guest{&t, &syms, module_text, true}, other{&t, &syms, module_text, false};
    auto rg = check_address(guest, *insn, f);
    auto ro = check_address(other, *insn, f);
    FUZZ_TRACE("%s: guest %s, others %s", insn->describe().c_str(), rg ? rg->rule : "ok", ro ? ro->rule : "ok");
    if (rg) {
      FUZZ_CHECK(std::any_of(std::begin(kRules), std::end(kRules),
                             [&](const char* r) { return std::string_view(r) == rg->rule; }),
                 rg->rule);
      FUZZ_CHECK(rg->code == Errc::Busy || rg->code == Errc::InvalidArgument);
      const std::string m = rg->message(insn->describe());
      FUZZ_CHECK(fuzz::printable(m), m);
      if (rg->guest_channel_only)
        FUZZ_CHECK(!ro,
                   std::string("a guest-channel-only refusal (") + rg->rule + ") on the other channels: " + ro->rule);
      else
        FUZZ_CHECK(ro && std::string_view(ro->rule) == rg->rule, std::string("the channels disagree on ") + rg->rule);
    } else {
      FUZZ_CHECK(!ro, std::string("refused on the other channels only: ") + ro->rule);
      const std::uint64_t end = insn->next().value;
      const Module* in_mod = t.live_module_at(a);
      FUZZ_CHECK(
          have_text && ((text.contains(a) && text.contains(end - 1)) || (in_mod && in_mod->text.contains(end - 1))),
          "accepted outside the text and every live module's: " + fuzz::hexs(a));
      FUZZ_CHECK(f != nullptr, "accepted without a function");
      FUZZ_CHECK(module_text.empty() || !module_text.overlaps(a, end), "accepted in the module's text");
      FUZZ_CHECK(!t.ex_status().found || !t.exception_entry(a), "accepted on an exception-table entry");
      FUZZ_CHECK(!t.jump_status().found || !t.jump_label_in(a, end), "accepted over a jump label");
      FUZZ_CHECK(!t.static_call_status().found || !t.static_call_in(a, end), "accepted over a static call");
      FUZZ_CHECK(!(t.blacklist_status().found && in_bl(a)), "accepted in the kprobe blacklist");
    }
    // Entry placement over the bytes as a function starting at a.
    if (auto all = x86::decode_function(bytes, Gva{a}); all && !all->empty()) {
      const EntryPlacement p = place_entry_probe(guest, *all, Gva{a});
      FUZZ_CHECK(std::any_of(all->begin(), all->end(), [&](const x86::Insn& i) { return i.address == p.address; }),
                 "entry placement off an instruction boundary");
      FUZZ_CHECK(fuzz::printable(p.moved_because));
      (void)is_ftrace_site(guest, *all, all->front());
    }
  }
  return 0;
}
