// xpe2e-probe jump-island (issue 14): a short jump to an island on a function of the
// workload's paths, written, counted and given back (protocol.h "Short jumps to islands").
#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"
#include "xpe2e_text.hpp"

namespace xpe2e::probe {

// jump-island: a short jump to an island (protocol.h "Short jumps to islands"). The first
// instruction of kIslandCandidates (or of --functions; --island own|previous checks which
// function's padding holds the island) (functions on the workload's openat, unlink and close paths;
// bench/kernel_coverage --islands found points of each on Debian 12's 6.1.0-50 whose island is
// in the function's own dead padding) that the engine places as a short jump gets a counting
// probe: its eb rel8 to the island and the island's e9 to the detour are read back, it counts
// hits while the workload runs (at least one per openat + unlink of the workload for putname,
// which each of them calls once; other processes call it too), the workload's results are
// unchanged, the module timed nothing out, and after unregistering the region at once and the
// island after the module's quiescence are byte-identical to before; the module unloads.
constexpr const char* kIslandCandidates[] = {
    "putname",           "pick_file",           "filp_close", "__x64_sys_close", "may_open", "security_path_unlink",
    "strncpy_from_user", "lookup_one_qstr_excl"};

namespace {

struct IslandProbe {
  std::optional<Probe> probe;
  std::string fn, why;
  std::uint64_t tried = 0;
  std::uint64_t island = 0;    // the island's address (from not_jump_because)
  std::uint64_t fn_start = 0;  // fn's address
};

// The functions to look in: --functions (comma-separated), or kIslandCandidates.
std::vector<std::string> island_candidates(const Args& a) {
  std::vector<std::string> candidates(std::begin(kIslandCandidates), std::end(kIslandCandidates));
  if (!a.functions.empty()) {
    candidates.clear();
    for (std::size_t b = 0; b <= a.functions.size();) {
      const std::size_t e = std::min(a.functions.find(',', b), a.functions.size());
      if (e > b) candidates.push_back(a.functions.substr(b, e - b));
      b = e + 1;
    }
  }
  return candidates;
}

// The first instruction of `candidates` that the engine places as a short jump, with
// `handler` (the module publishes the feature: checked by the caller).
IslandProbe find_island_probe(Session& s, DomId dom, GuestView& view, const std::vector<std::string>& candidates,
                              std::function<int(HitContext&)> handler) {
  IslandProbe out;
  for (const std::string& name : candidates) {
    auto at = s.resolve(dom, name);
    if (!at) continue;
    std::vector<std::byte> bytes;
    std::string err;
    if (!read_guest(view, at->value, 512, &bytes, &err)) continue;
    std::uint64_t end = 0;
    for (const Decoded& d : decode(bytes, at->value, &end)) {
      ++out.tried;
      auto p = s.probe(dom, Gva{d.addr}, handler, {}, ProbeOptions{ProbeMethod::Jump});
      if (!p) continue;
      auto i = p->info();
      if (i && i->address.value == d.addr && i->not_jump_because.rfind("a short jump", 0) == 0) {
        out.probe = std::move(*p);
        out.fn = name;
        out.fn_start = at->value;
        out.why = i->not_jump_because;
        out.island =
            std::strtoull(out.why.c_str() + std::strlen("a short jump (eb rel8) to an island at "), nullptr, 16);
        return out;
      }
      (void)p->unregister();
    }
  }
  return out;
}

void check_island_feature(hv::Hypervisor& hv, DomId dom) {
  auto feat = hv.xs_read(dom_path(dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FEATURES));
  const unsigned long bits = feat ? std::strtoul(feat->c_str(), nullptr, 16) : 0;
  check("module.jump_island", (bits & XENPROBES_FEATURE_JUMP_ISLAND) != 0,
        feat ? "features " + *feat : std::string("the module publishes no features"));
}

// The eb rel8 at the region and the island's e9 to the detour, read back.
void check_short_jump_written(GuestView& view, const ProbeInfo& info, std::uint64_t island) {
  std::array<std::byte, 5> isl{};
  std::array<std::byte, 2> eb{};
  const bool read_ok = view.read(Gva{island}, isl).has_value() && view.read(info.address, eb).has_value();
  std::int32_t rel = 0;
  std::memcpy(&rel, isl.data() + 1, 4);
  check("text.island",
        read_ok && isl[0] == std::byte{0xe9} &&
            island + 5 + static_cast<std::uint64_t>(std::int64_t{rel}) == info.slot.value,
        "e9 <rel32 to the detour> at the island");
  check(
      "text.short_jump",
      read_ok && eb[0] == std::byte{0xeb} &&
          info.address.value + 2 + static_cast<std::uint64_t>(std::int64_t{static_cast<std::int8_t>(eb[1])}) == island,
      "eb <rel8 to the island> at the region");
}

}  // namespace

int cmd_jump_island(const Args& a) {
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  check_island_feature(hv, a.dom);
  must(s->prepare_jump_probes(a.dom), "prepare_jump_probes");
  auto view = must(GuestView::open(hv, a.dom), "GuestView::open");
  std::uint64_t hits = 0;
  IslandProbe found = find_island_probe(*s, a.dom, *view, island_candidates(a), [&hits](HitContext&) {
    ++hits;
    return 0;
  });
  std::optional<Probe>& probe = found.probe;
  const std::string &fn = found.fn, &why = found.why;
  const std::uint64_t tried = found.tried;
  if (!check("island.found", probe.has_value(),
             probe ? fn + ": " + why : fmt("no short jump among %" PRIu64 " instructions tried", tried)))
    return 1;
  const ProbeInfo info = must(probe->info(), "info");
  const std::uint64_t island = found.island;
  say("XPE2E-INFO: %s: a short jump at 0x%" PRIx64 " (%s), island 0x%" PRIx64 ", detour 0x%" PRIx64, fn.c_str(),
      info.address.value, info.instruction.c_str(), island, info.slot.value);
  check("island.method", info.method == ProbeMethod::Jump && info.mode == ExecMode::Detour,
        probe_method_name(info.method));
  // Which padding it is in: before the function's start is the previous function's (past its
  // __pfx_ symbol on 6.2+); at or after it, the function's own.
  if (!a.island_in.empty())
    check("island.in_" + a.island_in, (a.island_in == "previous") == (island < found.fn_start),
          fmt("island 0x%" PRIx64 ", %s starts at 0x%" PRIx64, island, fn.c_str(), found.fn_start));
  std::vector<Probe> probes;
  probes.push_back(std::move(*probe));
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("island.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
  check_short_jump_written(*view, info, island);

  auto done = run_workload(*s, a.dom, a.timeout_s);
  check("workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  check("workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");
  const long lower = fn == "putname" ? num(w, "openat") + num(w, "unlink_ok") + num(w, "unlink_enoent") : 1;
  check("island.hits", (long)hits >= lower, fmt("%" PRIu64 " hits, at least %ld expected", hits, lower));
  auto h = ctl_header(hv, a.dom);
  check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  // Unregistered: the region at once, the island after a quiescence (the loop gives it back).
  auto r = probes.front().unregister();
  check("unregister", r.has_value(), r ? "ok" : r.error().what);
  probes.clear();
  bool back = false;
  for (int k = 0; k < 1000 && !back; ++k) {
    (void)s->run_once(10);
    std::array<std::byte, 5> now{};
    back = view->read(Gva{island}, now).has_value() && now[0] != std::byte{0xe9};
  }
  check("text.island_restored", back, "the island's padding back after the module's quiescence");
  std::array<std::byte, 2> now{};
  check("text.region_restored",
        view->read(info.address, now).has_value() && now[0] != std::byte{0xeb} && now[0] != std::byte{0xcc},
        "the region's bytes back");
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG jump-island %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

// kill-island: kill -9 with a short jump to an island armed (issue 14; the guest module's own
// restore, protocol.h "Short jumps to islands"). The text around every candidate (its first 512
// bytes and the 256 before it, where the previous function's padding may hold its island) is
// saved to --snapshot before anything is written; the short jump jump-island finds goes in, its
// eb rel8 and the island's e9 are read back; then the workload runs and this process SIGKILLs
// itself inside the probe's handler on its --die-after-hits'th hit after the jump was written
// (a vCPU waits in the module's jump entry for that answer). What the scenario checks then
// (verify-text against the snapshot): the module put back the region and, after its
// quiescence, the island.
int cmd_kill_island(const Args& a) {
  if (a.snapshot.empty()) fatal("--snapshot is required");
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  check_island_feature(hv, a.dom);
  const std::vector<std::string> candidates = island_candidates(a);
  std::vector<std::pair<std::string, Gva>> around;
  for (const std::string& name : candidates)
    if (auto at = s->resolve(a.dom, name)) {
      around.emplace_back(name + "-0x100", Gva{at->value - 0x100});
      around.emplace_back(name, *at);
    }
  const std::vector<TextRange> before = snapshot(hv, a.dom, around);
  must(s->prepare_jump_probes(a.dom), "prepare_jump_probes");
  auto view = must(GuestView::open(hv, a.dom), "GuestView::open");
  static bool killing = false;  // from when the short jump is written
  static std::uint64_t hits = 0;
  g_die_after = a.die_after;
  g_die_in = "island";
  IslandProbe found = find_island_probe(*s, a.dom, *view, candidates, [](HitContext&) {
    if (killing) maybe_die("island", ++hits);
    return 0;
  });
  if (!check("island.found", found.probe.has_value(),
             found.probe ? found.fn + ": " + found.why
                         : fmt("no short jump among %" PRIu64 " instructions tried", found.tried)))
    return 1;
  const ProbeInfo info = must(found.probe->info(), "info");
  say("XPE2E-INFO: %s: a short jump at 0x%" PRIx64 " (%s), island 0x%" PRIx64 ", detour 0x%" PRIx64, found.fn.c_str(),
      info.address.value, info.instruction.c_str(), found.island, info.slot.value);
  // Only the found function's ranges go to the snapshot: they hold the region and the island.
  std::vector<TextRange> kept;
  for (const TextRange& r : before)
    if (r.name == found.fn || r.name == found.fn + "-0x100") kept.push_back(r);
  auto covered = [&](std::uint64_t lo, std::uint64_t len) {
    return std::any_of(kept.begin(), kept.end(), [&](const TextRange& r) {
      return lo >= r.addr.value && lo + len <= r.addr.value + r.bytes.size();
    });
  };
  if (!check("snapshot.covers", kept.size() == 2 && covered(info.address.value, 2) && covered(found.island, 5),
             fmt("the region at 0x%" PRIx64 " and the island at 0x%" PRIx64 " in the %zu saved ranges of %s",
                 info.address.value, found.island, kept.size(), found.fn.c_str())))
    return 1;
  save(kept, a.snapshot);
  std::vector<Probe> probes;
  probes.push_back(std::move(*found.probe));
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("island.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
  check_short_jump_written(*view, info, found.island);
  killing = true;
  auto done = run_workload(*s, a.dom, a.timeout_s);
  // Only reached when the probe was hit fewer times than --die-after-hits.
  check("killed", false,
        fmt("the workload finished (%s) before %u hits", done.value_or("no done").c_str(), a.die_after));
  say("XPE2E-PROG kill-island FAIL %d", g_failed);
  return 1;
}

}  // namespace xpe2e::probe
