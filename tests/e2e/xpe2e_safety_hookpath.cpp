// xpe2e-probe safety --hazards hookpath [--points P1,P2]: the guest module's own int3 path,
// refused on the guest channel, ordinary probes through vm_event.
#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"
#include "xpe2e_safety.hpp"

namespace xpe2e::probe {

// 4. The guest module's own int3 path: a probe there (the guest channel) traps again inside
// the int3 handling, recursively. Through vm_event the trap never reaches the guest's handler:
// the same points are ordinary probes there.
void hazard_hookpath(SafetyCtx& x, const std::string& only) {
  hv::Hypervisor& hv = x.s.hypervisor();
  const bool guest = x.channel == "guest";
  struct Point {
    std::string name;
    Gva at;
    std::string rule;
    std::uint64_t min_hits;  // vmevent: hits the phase guarantees (its user int3s reach notify_die)
    bool published = false;  // refused for the module's hook-path keys, not for a name Dom0 knows
  };
  std::vector<Point> pts;
  // notify_die too: on 6.1.0-50 it inlines the die chain's walk (atomic_notifier_call_chain
  // and notifier_call_chain), so the out-of-line notifier_call_chain is not on the int3 path.
  for (const char* n : {"__rcu_read_lock", "lookup_address", "notifier_call_chain", "notify_die"}) {
    auto a = x.ks.addr(n);
    if (!a) {
      check(fmt("safety.hookpath.symbol.%s", n), false, "not in " + x.ks.source);
      continue;
    }
    // Hits the activity guarantees: its 3 user int3s each reach notify_die (which walks the
    // die chain under rcu_read_lock); nothing there is sure to call lookup_address or the
    // out-of-line notifier_call_chain on a PVH guest.
    std::string sn = n;
    pts.push_back(Point{sn, Gva{*a}, "guest-hook-path", sn == "notify_die" ? 3u : sn == "__rcu_read_lock" ? 1u : 0u});
  }
  // A function the guest module publishes as its hit path (protocol.h "hook-path") and that Dom0
  // knows by no name: copy_from_user_nofault, which its async captures call. Only with a module
  // that publishes the keys.
  if (auto hp = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_HOOK_PATH_COUNT)); hp && *hp != "0") {
    if (auto a = x.ks.addr("copy_from_user_nofault"))
      pts.push_back(Point{"copy_from_user_nofault", Gva{*a}, "guest-hook-path", 0, true});
    else check("safety.hookpath.symbol.copy_from_user_nofault", false, "not in " + x.ks.source);
  }
  // The module's die notifier, as the guest's own kallsyms name it (Dom0's do not hold the
  // guest module's symbols): data/xpe2e/modfn = "0x<addr> <name>".
  auto modfn = wait_key(hv, dom_path(x.dom, "data/xpe2e/modfn"), 5);
  auto mt_start = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/module-text/start"));
  auto mt_end = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/module-text/end"));
  say("XPE2E-INFO: guest module function: %s; module-text keys: start %s end %s", modfn ? modfn->c_str() : "(none)",
      mt_start ? mt_start->c_str() : "(none)", mt_end ? mt_end->c_str() : "(none)");
  if (guest) {
    std::istringstream in(modfn.value_or(""));
    std::string a, n;
    if (check("safety.hookpath.module_symbol", static_cast<bool>(in >> a >> n),
              modfn ? "data/xpe2e/modfn: " + *modfn : "no data/xpe2e/modfn from the guest")) {
      std::uint64_t v = std::strtoull(a.c_str(), nullptr, 16);
      if (mt_start && mt_end) {
        std::uint64_t b = std::strtoull(mt_start->c_str(), nullptr, 16),
                      e = std::strtoull(mt_end->c_str(), nullptr, 16);
        check("safety.hookpath.module_text_keys", v >= b && v < e,
              fmt("%s at %#" PRIx64 " within the published module text [%#" PRIx64 ", %#" PRIx64 ")", n.c_str(), v, b,
                  e));
      }
      pts.push_back(Point{n + " [xenprobes]", Gva{v}, "module-text", 0});
    }
  }
  if (!only.empty())
    std::erase_if(pts, [&](const Point& p) {
      return ("," + only + ",").find("," + p.name.substr(0, p.name.find(' ')) + ",") == std::string::npos;
    });

  bool activity_ran = false;
  for (auto& p : pts) {
    std::vector<Armed> armed;
    auto r = x.s.probe(x.dom, p.at, safety_counter());
    if (guest && p.published && !r)
      check("safety.hookpath.published." + p.name, r.error().what.find(" in hook-path") != std::string::npos,
            p.name + ": refused naming the published entry? " + r.error().what);
    if (guest) {
      // Registered anyway (a library without the rule): armed while the guest runs its
      // activity, which is where the recursion shows.
      expect_refused("safety.hookpath.refused." + p.name.substr(0, p.name.find(' ')), std::move(r), p.rule,
                     fmt("%s (%#" PRIx64 ")", p.name.c_str(), p.at.value), p.at, armed);
    } else if (!check("safety.hookpath.registered." + p.name, r.has_value(),
                      r ? fmt("%s (%#" PRIx64 "): registered on the %s channel at %s", p.name.c_str(), p.at.value,
                              x.channel.c_str(), r->info() ? x.ks.describe(r->info()->address.value).c_str() : "?")
                        : fmt("%s: refused (%s): ", p.name.c_str(), errc_name(r.error().code)) + r.error().what)) {
      continue;
    } else {
      // The handler counts by the address the library placed the probe at: past the
      // function's ftrace site (docs/probes.md, "Entry placement"), e.g. __rcu_read_lock+0x5.
      if (auto i = r->info()) p.at = i->address;
      armed.push_back(Armed{p.name, p.at, std::move(*r)});
    }
    if (armed.empty()) continue;
    // A hot point (__rcu_read_lock) costs a round trip per call: once it has shown it counts,
    // it goes, and the rest of the activity runs unprobed.
    std::uint64_t frozen_hits = 0, frozen_handler = 0;
    bool frozen = false;
    auto cap = [&] {
      if (frozen || guest || armed.empty() || g_safety_hits[p.at.value] < 300) return;
      frozen = true;
      frozen_handler = g_safety_hits[p.at.value];
      frozen_hits = armed[0].probe.stats().hits;
      (void)armed[0].probe.unregister();
      say("XPE2E-INFO: hookpath: %s: %" PRIu64 " hits: unregistered early (a hot point)", p.name.c_str(),
          frozen_handler);
    };
    auto res = safety_phase(x.s, x.dom, ++x.phase, "activity", x.timeout_s, cap);
    activity_ran = true;
    if (!frozen) {
      frozen_hits = armed[0].probe.stats().hits;
      frozen_handler = g_safety_hits[p.at.value];
    }
    auto st = armed[0].probe.stats();
    unregister_all(armed, "hookpath");
    if (!guest)
      check(
          "safety.hookpath.hits." + p.name,
          frozen_hits == frozen_handler && frozen_hits >= p.min_hits && st.unhandled == 0,
          fmt("handler %" PRIu64 ", ProbeStats.hits %" PRIu64 ", unhandled %" PRIu64 " (at least %" PRIu64 " expected)",
              frozen_handler, frozen_hits, st.unhandled, p.min_hits));
    x.dead = !phase_checks(hv, x.dom, "hookpath." + p.name.substr(0, p.name.find(' ')), res);
    if (x.dead) {
      say("XPE2E-INFO: hookpath: the guest is dead after %s: the remaining points are not tried", p.name.c_str());
      return;
    }
  }
  // Every point refused: the guest's activity runs once, unprobed, and must be fine.
  if (!activity_ran) {
    auto res = safety_phase(x.s, x.dom, ++x.phase, "activity", x.timeout_s);
    x.dead = !phase_checks(hv, x.dom, "hookpath", res);
  }
}

}  // namespace xpe2e::probe
