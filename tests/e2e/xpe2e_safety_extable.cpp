// xpe2e-probe safety --hazards extable and slotunload: the instructions the guest's exception
// table covers, probed (their copies go into the guest module's fixup slots), under the guest's
// bad user pointers, and the module's unload while a copy sleeps in a fixup slot.
#include <algorithm>
#include <cinttypes>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"
#include "xpe2e_safety.hpp"

namespace xpe2e::probe {

namespace {

struct ExFn {
  const char* name;
  std::uint64_t start = 0, end = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sites;  // insn, fixup
};

// The user copies' instructions the guest's exception table covers, and the module's fixup
// slots [*fx_lo, *fx_hi) where their copies must go; false (checks failed under `tag`) when
// either cannot be found.
bool extable_sites(SafetyCtx& x, const std::string& tag, std::vector<ExFn>& fns, std::uint64_t* fx_lo,
                   std::uint64_t* fx_hi) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::uint64_t base = 0;
  std::string why;
  auto t = read_table(hv, x.dom, x.syms, "__start___ex_table", "__stop___ex_table", &base, &why);
  if (!check("safety." + tag + ".table", t && t->size() % 12 == 0 && !t->empty(),
             t ? fmt("%zu entries of 12 bytes", t->size() / 12) : why))
    return false;
  // 6.1's user copies, and 6.12's (rep_movs_alternative, for CPUs without fast rep movsb).
  for (const char* n : {"strncpy_from_user", "copy_user_enhanced_fast_string", "copy_user_generic_string",
                        "copy_user_generic_unrolled", "rep_movs_alternative", "__get_user_8"})
    fns.push_back(ExFn{n, 0, 0, {}});
  for (auto& f : fns)
    if (auto a = x.ks.addr(f.name)) f.start = *a, f.end = x.ks.end_of(*a);
  // {s32 insn, s32 fixup, s32 data}: each offset relative to its own field.
  for (std::size_t off = 0; off + 12 <= t->size(); off += 12) {
    std::uint64_t e = base + off;
    std::uint64_t insn = e + static_cast<std::int64_t>(s32_at(*t, off));
    std::uint64_t fixup = e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4));
    for (auto& f : fns)
      if (f.start && insn >= f.start && insn < f.end) f.sites.emplace_back(insn, fixup);
  }
  std::string found;
  std::size_t total = 0;
  for (auto& f : fns) {
    std::sort(f.sites.begin(), f.sites.end());
    found += fmt("%s%s: %s", found.empty() ? "" : "; ", f.name,
                 !f.start ? "not in this kernel"
                          : fmt("%zu in [%#" PRIx64 ", %#" PRIx64 ")", f.sites.size(), f.start, f.end).c_str());
    for (auto& [i, fx] : f.sites)
      say("XPE2E-INFO: __ex_table: %s (%#" PRIx64 ") -> fixup %s", x.ks.describe(i).c_str(), i,
          x.ks.describe(fx).c_str());
    total += f.sites.size();
  }
  if (!check("safety." + tag + ".sites", total > 0, fmt("%zu covered instructions: ", total) + found)) return false;

  // The module's fixup slots (protocol.h): where every copy must go.
  {
    auto a = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_ADDR));
    auto n = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_COUNT));
    if (!check("safety." + tag + ".fixup_slots", a && n, "the module publishes fixup-slots/addr and /count"))
      return false;
    *fx_lo = std::stoull(*a, nullptr, 16);
    *fx_hi = *fx_lo + std::stoull(*n) * XENPROBES_FIXUP_SLOT_SIZE;
    say("XPE2E-INFO: fixup slots [%#" PRIx64 ", %#" PRIx64 ")", *fx_lo, *fx_hi);
  }
  return true;
}

}  // namespace

// 1. Instructions covered by the exception table: their faults are fixed up by the faulting
// address; run in an ordinary slot the fault finds no entry and oopses. The guest module's
// fixup slots have entries of their own: every one of these instructions must register
// (boosted, in a fixup slot), count exactly, and the guest's bad pointers must give it what
// an unprobed kernel gives (EFAULT, a short read) without an oops.
void hazard_extable(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::vector<ExFn> fns;
  std::uint64_t fx_lo = 0, fx_hi = 0;
  if (!extable_sites(x, "extable", fns, &fx_lo, &fx_hi)) return;
  std::vector<Armed> armed;
  std::map<std::string, std::vector<std::size_t>> by_fn;  // indices into armed
  must(x.s.begin_batch(), "begin_batch");
  for (auto& f : fns) {
    if (f.sites.empty()) continue;
    std::size_t in_fixup = 0;
    std::string bad;
    for (auto& [i, fx] : f.sites) {
      auto r = x.s.probe(x.dom, Gva{i}, safety_counter());
      std::string what = x.ks.describe(i);
      if (!r) {
        bad += fmt(" %s: %s %s;", what.c_str(), errc_name(r.error().code), r.error().what.c_str());
        continue;
      }
      auto inf = r->info();
      if (inf && inf->mode == ExecMode::Boosted && inf->slot.value >= fx_lo && inf->slot.value < fx_hi) ++in_fixup;
      else
        bad += fmt(" %s: mode=%s slot=%#" PRIx64 ";", what.c_str(), inf ? mode_name(inf->mode) : "?",
                   inf ? inf->slot.value : 0);
      by_fn[f.name].push_back(armed.size());
      armed.push_back(Armed{what, Gva{i}, std::move(*r)});
    }
    check(fmt("safety.extable.fixup_slot.%s", f.name), in_fixup == f.sites.size(),
          fmt("%zu of %zu registered, boosted, in a fixup slot", in_fixup, f.sites.size()) +
              (bad.empty() ? "" : ";" + bad));
  }
  must(x.s.end_batch(), "end_batch");
  // openat((char *)16) -> EFAULT, a read() cut short at a PROT_NONE page, open() and execve() of
  // paths ending at a page's end, execve() with argv at address 16.
  auto res = safety_phase(x.s, x.dom, ++x.phase, "extable", x.timeout_s);
  // Every hit went through the handler, none around it; the routines the guest's phase must
  // use (a path copy for every open and execve, a get_user per argv pointer) were hit.
  for (auto& [fn, idx] : by_fn) {
    std::uint64_t hits = 0, handler = 0, unhandled = 0;
    for (std::size_t k : idx) {
      auto st = armed[k].probe.stats();
      hits += st.hits;
      unhandled += st.unhandled;
      handler += g_safety_hits[armed[k].at.value];
    }
    const bool must_hit = fn == "strncpy_from_user" || fn == "__get_user_8";
    check("safety.extable.hits." + fn, hits == handler && unhandled == 0 && (!must_hit || hits > 0),
          fmt("handler %" PRIu64 ", ProbeStats.hits %" PRIu64 ", unhandled %" PRIu64 "%s", handler, hits, unhandled,
              must_hit ? " (at least one expected)" : ""));
  }
  unregister_all(armed, "extable");
  x.dead = !phase_checks(hv, x.dom, "extable", res);
}

// 5. The module's slots at unload (stock_pv_slot_unload): the user copies' exception-table
// instructions probed (their copies run in fixup slots) and __x64_sys_getppid (an OEA copy).
// In the guest a pread() sleeps in a userfaultfd fault its copy took in a fixup slot while a
// process keeps calling getppid, and the guest detaches the module: the detach must fail with
// EBUSY and rmmod with it (the slot is the module's text: freed, the reader would return into
// freed memory), and once the fault is resolved and the read has left the slot, both succeed.
// The module is gone afterwards: this hazard comes last.
void hazard_slotunload(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::vector<ExFn> fns;
  std::uint64_t fx_lo = 0, fx_hi = 0;
  if (!extable_sites(x, "slotunload", fns, &fx_lo, &fx_hi)) return;
  std::vector<Armed> armed;
  std::size_t sites = 0, in_fixup = 0;
  must(x.s.begin_batch(), "begin_batch");
  for (auto& f : fns)
    for (auto& [i, fx] : f.sites) {
      ++sites;
      auto r = x.s.probe(x.dom, Gva{i}, safety_counter());
      if (!r) continue;
      auto inf = r->info();
      if (inf && inf->mode == ExecMode::Boosted && inf->slot.value >= fx_lo && inf->slot.value < fx_hi) ++in_fixup;
      armed.push_back(Armed{x.ks.describe(i), Gva{i}, std::move(*r)});
    }
  const char* name = "__x64_sys_getppid";
  auto g = x.s.probe(x.dom, std::string_view(name), safety_counter());
  check("safety.slotunload.getppid", g.has_value(), g ? std::string("registered") : g.error().what);
  if (g) {
    auto inf = g->info();
    armed.push_back(Armed{name, inf ? inf->address : Gva{0}, std::move(*g)});
  }
  must(x.s.end_batch(), "end_batch");
  check("safety.slotunload.fixup_slots", sites > 0 && in_fixup == sites,
        fmt("%zu of %zu covered instructions registered, boosted, in a fixup slot", in_fixup, sites));
  // The guest: the reader asleep in its fault, detach (EBUSY) and rmmod (refused), the fault
  // resolved, the read checked, detach and rmmod again (both succeed).
  auto res = safety_phase(x.s, x.dom, ++x.phase, "slotunload", x.timeout_s);
  // Counted by the handlers: once the module went, the library forgot the guest's probes
  // and their ProbeStats with them (run 20261128-042613-2960 read 0 there, handlers 35).
  std::uint64_t hits = 0;
  for (auto& a : armed) hits += g_safety_hits[a.at.value];
  check("safety.slotunload.hits", hits > 0, fmt("%" PRIu64 " handler calls before the module went", hits));
  if (res) {
    auto m = kv(*res);
    auto val = [&m](const char* k) { return m.count(k) ? m[k] : std::string("(none)"); };
    check("safety.slotunload.held",
          val("faulted") == "1" && val("first_detach") == "EBUSY" && val("held_rmmod") != "unloaded",
          "the reader asleep in its fault: detach " + val("first_detach") + ", rmmod " + val("held_rmmod"));
    check("safety.slotunload.read", val("read_ok") == "1", "the reader's pread() returned " + val("read"));
    check("safety.slotunload.unloaded", val("second_detach") == "ok" && val("rmmod") == "unloaded",
          "after the read: detach " + val("second_detach") + ", rmmod " + val("rmmod"));
  }
  // The module withdrew: the library forgot the guest's probes (unregistering says so).
  unregister_all(armed, "slotunload");
  x.unloaded = true;
  x.dead = !phase_checks(hv, x.dom, "slotunload", res);
}

}  // namespace xpe2e::probe
