// xpe2e-probe safety (its usage: xpe2e_probe.cpp): the probe-safety hazard classes of issue 12,
// and what they share (xpe2e_safety.hpp).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_kallsyms.hpp"
#include "xpe2e_probe.hpp"
#include "xpe2e_safety.hpp"

namespace xpe2e::probe {

// ---- safety: the probe-safety hazard classes (issue 12) ----------------------------------
//
// Each class is found in the running guest from the kernel's own tables, read here through
// GuestView with Dom0's symbols: independent of the library's rules, so a rule that misses a
// point shows up as a probe that got registered (and, in the guest, as the hazard itself).

namespace {

// What a refusal must look like for each rule (the library's design, issue 12): runtime-patched
// sites are Busy, the rest InvalidArgument.
Errc rule_errc(const std::string& rule) {
  return rule == "jump-label" || rule == "static-call" || rule == "static-call-trampoline" || rule == "ftrace-site" ||
                 rule == "smp-lock"
             ? Errc::Busy
             : Errc::InvalidArgument;
}

// Diagnostics of a guest that stopped making progress, taken while the probes are still
// armed: what Dom0 sees (dump_stall), then scenarios/lib.sh's domu_diag (every vCPU's stack
// through xenctx, the guest's sysrq l/w/t, Xen's 'q', the guest's console) in a child
// process, while this process keeps serving hits (bounded: 180 s).
void guest_diag(Session& s, DomId dom, const std::string& why) {
  dump_stall(s.hypervisor(), dom, why.c_str());
  const std::string script = ". /usr/lib/xenprobes-e2e/scenarios/lib.sh && domu_diag \"$0\" \"$1\"";
  const std::string id = std::to_string(dom.value);
  const char* argv[] = {"sh", "-c", script.c_str(), id.c_str(), why.c_str(), nullptr};
  std::fflush(stdout);
  pid_t pid = -1;
  if (int e = posix_spawnp(&pid, "sh", nullptr, nullptr, const_cast<char* const*>(argv), environ)) {
    say("XPE2E-INFO: posix_spawnp(sh domu_diag): %s", std::strerror(e));
    return;
  }
  auto end = Clock::now() + std::chrono::seconds(180);
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) != pid) {
    if (Clock::now() > end) {
      say("XPE2E-INFO: domu_diag still running after 180 s: killing it");
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      break;
    }
    (void)s.run_once(100);
  }
}

}  // namespace

// The bytes of a linker-bounded table (__start_X .. __stop_X) in guest memory.
std::optional<std::vector<std::byte>> read_table(hv::Hypervisor& hv, DomId dom, const SymSource& syms,
                                                 const char* start_sym, const char* stop_sym, std::uint64_t* start,
                                                 std::string* why) {
  std::string f1, f2;
  auto b = syms.addr(start_sym, &f1), e = syms.addr(stop_sym, &f2);
  if (!b || !e || *e < *b || *e - *b > (64u << 20)) {
    *why = fmt("no usable %s/%s in %s or the System.map", start_sym, stop_sym, syms.kallsyms->source.c_str());
    return std::nullopt;
  }
  say("XPE2E-INFO: %s = %#" PRIx64 " (%s), %s = %#" PRIx64 " (%s): %" PRIu64 " bytes", start_sym, *b, f1.c_str(),
      stop_sym, *e, f2.c_str(), *e - *b);
  auto view = GuestView::open(hv, dom);
  if (!view) {
    *why = "GuestView::open: " + view.error().what;
    return std::nullopt;
  }
  std::vector<std::byte> out(*e - *b);
  // Page by page: a table is not guaranteed to be mapped as one run.
  for (std::uint64_t off = 0; off < out.size();) {
    std::size_t n = std::min<std::uint64_t>(4096 - ((*b + off) & 4095), out.size() - off);
    if (auto r = (*view)->read(Gva{*b + off}, std::span(out).subspan(off, n)); !r) {
      *why = fmt("read %s+%#" PRIx64 ": ", start_sym, off) + r.error().what;
      return std::nullopt;
    }
    off += n;
  }
  *start = *b;
  return out;
}

std::int32_t s32_at(const std::vector<std::byte>& t, std::size_t off) {
  std::int32_t v;
  std::memcpy(&v, t.data() + off, 4);
  return v;
}
std::int64_t s64_at(const std::vector<std::byte>& t, std::size_t off) {
  std::int64_t v;
  std::memcpy(&v, t.data() + off, 8);
  return v;
}

std::map<std::uint64_t, std::uint64_t> g_safety_hits;

PreHandler safety_counter() {
  return [](HitContext& c) {
    ++g_safety_hits[c.address().value];
    return 0;
  };
}

// A registration that must be refused by `rule`. What got registered anyway (a library
// without the rule) stays armed in `armed`: the guest's phase then shows the hazard itself.
bool expect_refused(const std::string& name, Result<Probe> r, const std::string& rule, const std::string& what, Gva at,
                    std::vector<Armed>& armed) {
  if (r) {
    std::string d = "registered";
    if (auto i = r->info())
      d += fmt(" at %#" PRIx64 " (%s, mode=%s)", i->address.value, i->instruction.c_str(), mode_name(i->mode));
    armed.push_back(Armed{what, at, std::move(*r)});
    return check(name, false, what + ": " + d + "; expected a refusal by rule '" + rule + "'");
  }
  bool named = r.error().what.find("rule '" + rule + "'") != std::string::npos;
  bool code = r.error().code == rule_errc(rule);
  return check(name, named && code,
               fmt("%s: refused (%s%s): ", what.c_str(), errc_name(r.error().code),
                   code ? "" : fmt(", expected %s", errc_name(rule_errc(rule))).c_str()) +
                   r.error().what);
}

// Phase i of the guest's safety loop: sends it and serves hits until its result. `cap`, when
// given, is called after every run_once (the vmevent control unregisters hot probes there).
std::optional<std::string> safety_phase(Session& s, DomId dom, int i, const std::string& phase, int seconds,
                                        const std::function<void()>& cap) {
  hv::Hypervisor& hv = s.hypervisor();
  must(hv.xs_write(dom_path(dom, fmt("data/xpe2e/safety/go-%d", i)), fmt("%s %d", phase.c_str(), seconds)),
       "write data/xpe2e/safety/go");
  say("XPE2E-STAGE safety phase %d: %s", i, phase.c_str());
  const std::string key = dom_path(dom, fmt("data/xpe2e/safety/result-%d", i));
  auto t0 = Clock::now(), last_alive = t0;
  // The guest bounds the phase itself (its child gets `seconds`); 30 s more for the rest.
  auto end = t0 + std::chrono::seconds(seconds + 30);
  unsigned errors = 0;
  while (Clock::now() < end) {
    auto r = s.run_once(100);
    if (!r && ++errors <= 3) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
    if (cap) cap();
    if (auto v = hv.xs_read(key)) {
      (void)s.run_once(0);
      say("XPE2E-INFO: phase %s: %.1f s: %s", phase.c_str(), std::chrono::duration<double>(Clock::now() - t0).count(),
          v->c_str());
      // The guest gave up on a phase child stuck in its kernel: where it stands, while it does.
      if (v->find("child=stuck") != std::string::npos) guest_diag(s, dom, "safety phase " + phase + ": " + *v);
      return *v;
    }
    if (Clock::now() - last_alive > std::chrono::seconds(1)) {
      last_alive = Clock::now();
      std::string st;
      if (!domain_alive(hv, dom, &st)) {
        say("XPE2E-INFO: phase %s: the domain is not running any more (%s)", phase.c_str(), st.c_str());
        return std::nullopt;
      }
    }
  }
  say("XPE2E-INFO: phase %s: no result within %d s", phase.c_str(), seconds + 30);
  guest_diag(s, dom, fmt("safety phase %s: no result within %d s", phase.c_str(), seconds + 30));
  return std::nullopt;
}

// After a phase: its result ok=1 and the guest still running.
bool phase_checks(hv::Hypervisor& hv, DomId dom, const std::string& tag, const std::optional<std::string>& res) {
  check("safety." + tag + ".guest", res && num(kv(*res), "ok") == 1,
        res ? "guest: " + *res : "no result from the guest's phase");
  std::string st;
  bool alive = domain_alive(hv, dom, &st);
  check("safety." + tag + ".alive", alive, st);
  return alive;
}

void unregister_all(std::vector<Armed>& armed, const std::string& tag) {
  for (auto& a : armed) {
    auto st = a.probe.stats();
    say("XPE2E-INFO: %s: probe at %s: %" PRIu64 " hits (handler %" PRIu64 ")", tag.c_str(), a.what.c_str(), st.hits,
        g_safety_hits[a.at.value]);
    if (auto r = a.probe.unregister(); !r)
      say("XPE2E-INFO: %s: unregister %s: %s", tag.c_str(), a.what.c_str(), r.error().what.c_str());
  }
  armed.clear();
}

int cmd_safety(const Args& a) {
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  hv::Hypervisor& hv = s->hypervisor();
  std::string channel = must(s->channel_name(a.dom), "channel_name");
  Kallsyms ks, map;
  if (!ks.load("/proc/kallsyms")) fatal("cannot read /proc/kallsyms");
  std::string rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, rel);
  // Linker symbols (table bounds) kallsyms may leave out: Debian ships the System.map.
  map.load("/boot/System.map-" + rel);
  say("XPE2E-INFO: symbols: %zu from /proc/kallsyms, %zu from %s", ks.all.size(), map.all.size(),
      map.all.empty() ? "(no System.map)" : map.source.c_str());
  SafetyCtx x{*s, a.dom, ks, SymSource{&ks, &map}, channel, a.timeout_s};
  auto ready = wait_key(hv, dom_path(a.dom, "data/xpe2e/safety/ready"), 120);
  if (!check("safety.ready", ready && *ready == "1",
             ready ? "guest: " + *ready : "no data/xpe2e/safety/ready within 120 s"))
    fatal("the guest's safety loop did not start");

  std::istringstream in(a.hazards);
  for (std::string h; !x.dead && std::getline(in, h, ',');) {
    say("XPE2E-STAGE safety hazard %s (%s channel)", h.c_str(), channel.c_str());
    if (h == "extable") hazard_extable(x);
    else if (h == "statickey") hazard_statickey(x);
    else if (h == "ftrace") hazard_ftrace(x);
    else if (h == "hookpath") hazard_hookpath(x, a.points);
    else if (h == "slotunload") hazard_slotunload(x);
    else fatal("unknown hazard " + h);
  }
  if (x.dead) {
    check("safety.guest_survived", false, "the guest stopped running; see its console");
    say("XPE2E-PROG safety FAIL %d", g_failed);
    return 1;
  }
  must(hv.xs_write(dom_path(a.dom, "data/xpe2e/safety/end"), "1"), "write data/xpe2e/safety/end");
  auto done = wait_key(hv, dom_path(a.dom, "data/xpe2e/done"), 60);
  check("workload.ok", done && num(kv(*done), "ok") == 1, done ? *done : "no data/xpe2e/done within 60 s");
  // A module a phase unloaded has no control area left to read.
  if (channel == "guest" && !x.unloaded) {
    auto h = ctl_header(hv, a.dom);
    check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  }
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  if (channel == "guest" && !x.unloaded) {
    auto h = ctl_header(*hvp, a.dom);
    check("module.traps_cleared", h && h->nr_traps == 0, "after the session closed: " + describe(h));
  }
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  const char* want = x.unloaded ? "gone" : "ok";
  check("module.unload", un && *un == want,
        un ? "detach + rmmod: " + *un + " (expected " + want + ")" : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG safety %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
