// Fuzz target: the guest kernel's tables (kernel/tables.cpp) read over a fuzzed symbol map and
// fuzzed guest memory, and the address rules (kernel/address_rules.cpp) over fuzzed
// instructions. The tables' bounds come from the symbols and their contents from the guest:
// both hostile.
//
// Input: the System.map text up to the first NUL byte, then: read limits, whether unmapped
// memory reads as zeros or faults, up to 4 memory regions (base, bytes), the module's text
// range, then probes (an address in or near the text and up to 15 instruction bytes).
//
// Invariants: read() never fails as a whole; a table is found exactly when its bounds are in
// the symbols, ordered, a whole number of entries within the limit and readable; its counts
// (kept, init, invalid) match a reference decoding written here; every kept entry lies in the
// text (queries never return one outside it) and every one is found by the lookups (so the
// index is sorted); blacklisted() holds exactly the kept ranges; summary() is printable.
// check_address() refuses with a known rule, the same on every channel except for the
// guest-channel-only rules (last in order), and what it accepts lies in the text, inside a
// function, on no exception-table entry, jump-label or static-call site.
#include <cinttypes>

#include "fuzz/fuzz_common.hpp"
#include "kernel/address_rules.hpp"
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
  Result<void> read(Gva a, std::span<std::byte> out) {
    ++reads;
    for (const auto& r : regions)  // the common case: all inside one region
      if (a.value - r.base < r.bytes.size() && out.size() <= r.bytes.size() - (a.value - r.base)) {
        std::memcpy(out.data(), r.bytes.data() + (a.value - r.base), out.size());
        return {};
      }
    for (std::size_t i = 0; i < out.size(); ++i) {
      auto b = at(a.value + i);
      if (!b && faults) return fail(Errc::Fault, "not mapped (fuzz)");
      out[i] = std::byte{b.value_or(0)};
    }
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

RefTable ref_table(const symbols::SymbolTable& syms, Memory& mem, const Limits& lim, std::string_view start,
                   std::string_view stop, std::size_t esize, Range text, Range init,
                   const std::function<std::optional<std::uint64_t>(std::uint64_t base, const std::uint8_t* e)>& addr_of) {
  RefTable t;
  auto a = sym(syms, start), b = sym(syms, stop);
  if (!a || !b || *b < *a || (*b - *a) % esize || (*b - *a) / esize > lim.max_entries) return t;
  std::vector<std::uint8_t> raw(*b - *a);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    auto v = mem.at(*a + i);
    if (!v && mem.faults) {
      t.unreadable = true;
      return t;
    }
    raw[i] = v.value_or(0);
  }
  t.found = true;
  if (text.empty()) return t;
  for (std::size_t off = 0; off < raw.size(); off += esize) {
    auto x = addr_of(*a + off, raw.data() + off);
    if (!x) continue;
    if (text.contains(*x))
      t.kept.push_back(*x);
    else if (init.contains(*x))
      ++t.init;
    else
      ++t.invalid;
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
  FUZZ_CHECK(st.found == (ref.found && have_text), w + "found " + std::to_string(st.found) + ", reference " + std::to_string(ref.found));
  if (!st.found) {
    FUZZ_CHECK(!st.why.empty() && fuzz::printable(st.why), w + st.why);
    return;
  }
  FUZZ_CHECK(st.entries == ref.kept.size() && st.init_entries == ref.init && st.invalid == ref.invalid,
             w + "kept/init/invalid " + std::to_string(st.entries) + "/" + std::to_string(st.init_entries) + "/" +
                 std::to_string(st.invalid) + ", reference " + std::to_string(ref.kept.size()) + "/" +
                 std::to_string(ref.init) + "/" + std::to_string(ref.invalid));
}

const char* const kRules[] = {"not-kernel-text", "module-text", "no-function", "entry-text", "static-call-trampoline",
                              "jump-label", "static-call", "smp-lock", "exception-table", "guest-hook-path",
                              "noinstr", "kprobes-text", "kprobe-blacklist"};

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
  const KernelTables t = KernelTables::read(syms, [&](Gva a, std::span<std::byte> o) { return mem.read(a, o); }, lim);
  FUZZ_CHECK(fuzz::printable(t.summary()), t.summary());
  FUZZ_TRACE("tables: %s", t.summary().c_str());
  const Range text = t.core_text(), init = t.init_text();

  // ---- the tables against the reference.
  const bool have_text = !text.empty();
  auto ex = ref_table(syms, mem, lim, "__start___ex_table", "__stop___ex_table", 12, text, init,
                      [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> { return e + s32(p); });
  auto jumps = ref_table(syms, mem, lim, "__start___jump_table", "__stop___jump_table", 16, text, init,
                         [](std::uint64_t e, const std::uint8_t* p) -> std::optional<std::uint64_t> { return e + s32(p); });
  auto calls = ref_table(syms, mem, lim, "__start_static_call_sites", "__stop_static_call_sites", 8, text, init,
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
          !u64_at(node + 16, &s0) || !u64_at(node + 24, &s1) || !u64_at(node + 32, &dummy) || !u64_at(node + 8, &dummy) ||
          !u64_at(node, &dummy)) {
        bl_ok = false;
        break;
      }
      if (s0 < s1 && s1 - s0 <= (64u << 20) && text.contains(s0) && s1 <= text.end) bl.push_back(Range{s0, s1});
      node = dummy;
    }
    FUZZ_CHECK(t.blacklist_status().found == bl_ok, "blacklist found " + std::to_string(t.blacklist_status().found) +
                                                        ", reference " + std::to_string(bl_ok) + ": " + t.blacklist_status().why);
  } else {
    FUZZ_CHECK(!t.blacklist_status().found);
  }
  auto in_bl = [&](std::uint64_t a) { return std::any_of(bl.begin(), bl.end(), [&](const Range& r) { return r.contains(a); }); };
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
      FUZZ_CHECK(std::any_of(std::begin(kRules), std::end(kRules), [&](const char* r) { return std::string_view(r) == rg->rule; }),
                 rg->rule);
      FUZZ_CHECK(rg->code == Errc::Busy || rg->code == Errc::InvalidArgument);
      const std::string m = rg->message(insn->describe());
      FUZZ_CHECK(fuzz::printable(m), m);
      if (rg->guest_channel_only)
        FUZZ_CHECK(!ro, std::string("a guest-channel-only refusal (") + rg->rule + ") on the other channels: " + ro->rule);
      else
        FUZZ_CHECK(ro && std::string_view(ro->rule) == rg->rule, std::string("the channels disagree on ") + rg->rule);
    } else {
      FUZZ_CHECK(!ro, std::string("refused on the other channels only: ") + ro->rule);
      const std::uint64_t end = insn->next().value;
      FUZZ_CHECK(have_text && text.contains(a) && text.contains(end - 1), "accepted outside the text: " + fuzz::hexs(a));
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
