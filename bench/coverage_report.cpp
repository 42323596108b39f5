// The figures (coverage.hpp): what was read and analysed, the shares of all instructions, and
// per-reason counts; docs/benchmarks.md "Coverage of a real kernel" quotes them.
#include <algorithm>
#include <cstdio>

#include "common/hex.hpp"
#include "coverage.hpp"

namespace xenprobes::coverage {

double pct(std::size_t a, std::size_t b) { return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; }

namespace {

void print(const char* title, const Counter& c, std::size_t total, bool examples) {
  std::vector<std::pair<std::size_t, std::string>> v;
  for (const auto& [key, n] : c.n) v.emplace_back(n, key);
  std::sort(v.rbegin(), v.rend());
  std::printf("  %s\n", title);
  for (const auto& [n, key] : v) {
    std::printf("    %9zu  %6.2f%%  %s\n", n, pct(n, total), key.c_str());
    if (examples) std::printf("               e.g. %s\n", c.example.at(key).c_str());
  }
}

void line(const char* what, std::size_t n, std::size_t total) {
  std::printf("%-58s %9zu  %6.2f%%\n", what, n, pct(n, total));
}

void share(const char* what, std::size_t n, const Tally& t) {
  std::printf("%-58s %9zu  %6.2f%%  (%.2f%% of probe-able)\n", what, n, pct(n, t.total), pct(n, t.probeable));
}

void short_jumps(const Placed& p, const Tally& t) {
  std::printf(
      "%-58s %9zu  %6.2f%%  (%zu starting earlier; island in its own padding %zu, the previous "
      "function's %zu)\n",
      "    of which short jumps to islands", p.island, pct(p.island, t.total), p.island_earlier, p.island_own,
      p.island_prev);
}

void padding(const char* what, const PaddingListed& p) {
  std::printf(
      "%s: own %zu, the previous function's %zu; own cut before a function without __pfx_ (call-depth "
      "tracking) %zu, dropped for a boot-time patch site %zu\n",
      what, p.own, p.previous, p.trimmed, p.dropped);
}

}  // namespace

void report(const Kernel& k, const Options& o, const Tally& t, double secs) {
  std::printf("kernel: %s\n", o.vmlinux.c_str());
  std::printf("symbols: %s (%zu functions in [_stext, _etext) %s-%s)\n", o.system_map.c_str(), k.fns.size(),
              hex(k.text.start).c_str(), hex(k.text.end).c_str());
  std::printf("tables: %s\n", k.tables.summary().c_str());
  std::printf(
      "jump context: %zu reserved sites, %zu exception fixups, %zu jump-label targets, %zu branches from "
      "other functions (%zu not from a cold part), %zu retpoline thunks, IBT build: %s\n",
      k.reserved.size(), k.entries.size() - k.cross - k.label_targets, k.label_targets, k.cross, k.cross_not_cold,
      k.thunks.size(), k.jc.endbr_marks_indirect_targets ? "yes" : "no");
  std::printf(
      "analysed: %zu functions (every %zu%s), %zu instructions; skipped: %zu __pfx_ padding, %zu too "
      "large or unsized, %zu unreadable, %zu undecodable (%zu bytes)\n",
      k.decoded.size(), o.every, o.max_functions ? ", capped" : "", t.total, k.padding_fns, k.too_large, k.unreadable,
      k.undecodable, k.undecodable_bytes);
  if (o.examples && !k.undecodable_example.empty())
    std::printf("  e.g. undecodable: %s\n", k.undecodable_example.c_str());
  std::printf(
      "functions with an indirect jump of unknown targets: %zu (%zu of them only leaving it: no address "
      "inside them formed anywhere); jump tables read: %zu\n",
      t.fn_with_unknown, t.fn_relaxed, k.tables_read);
  std::printf("interior code addresses formed: %zu (found in %.1f s); boot-time patch sites: %zu\n", k.taken.size(),
              k.taken_secs, k.patched.size());
  padding("dead padding the engine lists for the functions analysed", t.pad);
  padding("  with the tail-call proof", t.pad_proof);
  if (o.examples && t.pad.dropped)
    std::printf("  e.g. dead padding with a boot-time patch site: %s\n", t.pad.dropped_example.c_str());
  if (o.examples)
    for (const std::string& u : t.still_unknown) std::printf("  indirect jumps not proven to leave: %s\n", u.c_str());
  std::printf("\n");
  line("probe-able (vmevent channel, module slots)", t.probeable, t.total);
  line("boostable (slot copy + jmp back: boost, boost-riprel)", t.boostable, t.total);
  line("agentless-safe (Xen's emulator runs it as the CPU does)", t.agentless, t.total);
  share("jump-optimizable, 5-byte regions", t.jump_ok, t);
  line("  its own region", t.jump_own, t.total);
  line("  a region starting earlier in its basic block", t.jump_earlier, t.total);
  std::printf("with the engine's two rules (jump-optimizable as the engine places it):\n");
  share("  + tail calls proven (the engine, given the vmlinux)", t.jump_ok + t.proof, t);
  share("  + short jumps to islands (a module with jump islands)", t.jump_ok + t.islands.added, t);
  short_jumps(t.islands, t);
  share("  + both", t.jump_ok + t.both.added, t);
  short_jumps(t.both, t);
  std::printf("\n(percentages of all %zu instructions)\n", t.total);
  print("not probe-able, by first refusal:", t.refused, t.total, o.examples);
  print("probe-able, by plan:", t.plans, t.total, o.examples);
  print("probe-able but not jump-optimizable today, by the own region's first refusal:", t.jump_refused, t.total,
        o.examples);
  print("served by an earlier region; why the own region was refused:", t.jump_earlier_why, t.total, o.examples);
  print("short jumps to islands: served by a short jump; why the 5-byte region was refused:", t.islands.island_why,
        t.total, o.examples);
  print("short jumps to islands: still traps, by the own 5-byte region's first refusal:", t.islands.refused, t.total,
        o.examples);
  print("short jumps to islands: still traps, what the own short region lacks:", t.islands.short_refused, t.total,
        o.examples);
  print("both rules: served by a short jump; why the 5-byte region was refused:", t.both.island_why, t.total,
        o.examples);
  print("both rules: still traps, by the own 5-byte region's first refusal:", t.both.refused, t.total, o.examples);
  print("both rules: still traps, what the own short region lacks:", t.both.short_refused, t.total, o.examples);
  std::printf("\ntime: %.1f s\n", secs);
}

}  // namespace xenprobes::coverage
