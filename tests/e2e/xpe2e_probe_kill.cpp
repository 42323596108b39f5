// xpe2e-probe probe, kill, verify-text and refuse-debugger (their usage: xpe2e_probe.cpp): the
// probe set (xpe2e_probe_set.cpp) counted against the guest's workload; the same set with a
// SIGKILL to this process mid-hit; who restored the text afterwards; and the debugger channel
// refused where Xen has no GDBSX.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

int cmd_probe(const Args& a) {
  // Half the workload's time limit, at least 90 s: a guest slow enough to need a long workload
  // limit (page-table isolation under TCG) is as slow to detach and unload.
  int unload_wait = std::max(90, a.timeout_s / 2);
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  hv::Hypervisor& hv = s->hypervisor();
  ProbeSet ps;
  // Snapshot before registering (resolving needs no patching).
  std::vector<std::pair<std::string, Gva>> fns;
  for (const char* n : {"__x64_sys_getppid", "__x64_sys_openat", "do_filp_open", "do_unlinkat"})
    fns.emplace_back(n, must(s->resolve(a.dom, n), std::string("resolve ") + n));
  auto before = snapshot(hv, a.dom, fns);
  register_probes(*s, a.dom, ps);
  std::string d;
  check(
      "text.armed",
      first_bytes_are_traps(hv, a.dom, trap_points(ps), trap_byte_of(must(s->channel_name(a.dom), "channel_name")), &d),
      d);

  auto done = run_workload(*s, a.dom, a.timeout_s);
  check("workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  long n_getppid = num(w, "getppid"), n_openat = num(w, "openat"), ppid = num(w, "ppid");
  long n_unlink = num(w, "unlink_ok"), n_enoent = num(w, "unlink_enoent");
  check("workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");

  auto h = ctl_header(hv, a.dom);
  say("XPE2E-INFO: module after the workload: %s", describe(h).c_str());
  check("module.no_timeouts", h && h->timeouts == 0, describe(h));

  std::map<Probe*, ProbeStats> stats;  // taken before unregistering
  for (auto& p : ps.probes) stats[&p] = p.stats();
  auto stt_of = [&](Probe* p) { return p ? stats[p] : ProbeStats{}; };
  // Unregister everything at once (counts are final), then check them and the text.
  for (auto& p : ps.probes) {
    auto r = p.unregister();
    check(fmt("unregister.%" PRIu64, p.id()), r.has_value(), r ? "ok" : r.error().what);
  }

  check("xp.getppid.pre", (long)g_c.getppid_pre == n_getppid,
        fmt("pre-handler %" PRIu64 ", guest made %ld calls", g_c.getppid_pre, n_getppid));
  check(
      "xp.getppid.post", (long)g_c.getppid_post == n_getppid && g_c.post_rip_wrong == 0,
      fmt("post-handler %" PRIu64 ", guest %ld; post rip not at the next instruction: %" PRIu64 "%s", g_c.getppid_post,
          n_getppid, g_c.post_rip_wrong, g_c.first_post_rip.empty() ? "" : (" (" + g_c.first_post_rip + ")").c_str()));
  check("xp.getppid.stats", (long)stt_of(ps.getppid).hits == n_getppid && stt_of(ps.getppid).unhandled == 0,
        fmt("stats hits=%" PRIu64 " unhandled=%" PRIu64, stt_of(ps.getppid).hits, stt_of(ps.getppid).unhandled));
  if (ps.boosted)
    check("xp.boosted", (long)g_c.boosted == n_getppid,
          fmt("boosted probe hits %" PRIu64 ", guest %ld", g_c.boosted, n_getppid));
  if (ps.branch)
    check("xp.call", (long)g_c.branch == n_getppid,
          fmt("emulated call hits %" PRIu64 ", guest %ld", g_c.branch, n_getppid));
  // The workload's openat calls: n_openat on the target, n_unlink creating the files it unlinks.
  if (ps.openat2)
    check("xp.openat.post",
          g_c.openat2_pre == g_c.openat_hits && g_c.openat2_post == g_c.openat_hits &&
              (long)g_c.openat_hits == n_openat + n_unlink && g_c.openat2_post_rip_wrong == 0,
          fmt("second instruction pre %" PRIu64 " post %" PRIu64 ", first instruction %" PRIu64
              "; the guest made %ld openat "
              "calls; post rip not at the next instruction: %" PRIu64,
              g_c.openat2_pre, g_c.openat2_post, g_c.openat_hits, n_openat + n_unlink, g_c.openat2_post_rip_wrong));
  if (ps.openat)
    check("xp.openat.filename", (long)g_c.openat_target == n_openat && g_c.openat_read_errors == 0,
          fmt("user filename %s read %" PRIu64 " times, guest opened it %ld times; other names %" PRIu64
              ", read errors %" PRIu64 "%s",
              kTarget, g_c.openat_target, n_openat, g_c.openat_other, g_c.openat_read_errors,
              g_c.first_read_error.empty() ? "" : ("; first error: " + g_c.first_read_error).c_str()));
  if (ps.filp)
    check("xp.filp_open.filename",
          (long)g_c.filp_target == n_openat && (long)g_c.filp_other == n_unlink && g_c.filp_read_errors == 0,
          fmt("kernel copy of the name %" PRIu64 " times, guest %ld; other names %" PRIu64
              " (guest %ld); read errors %" PRIu64,
              g_c.filp_target, n_openat, g_c.filp_other, n_unlink, g_c.filp_read_errors));
  std::string rax;
  for (auto& [v, n] : g_c.getppid_rax) rax += fmt(" 0x%" PRIx64 " (x%" PRIu64 ")", v, n);
  if (ps.ret_getppid)
    check("xrp.getppid",
          (long)g_c.ret_getppid_entries == n_getppid && (long)g_c.ret_getppid_returns == n_getppid &&
              g_c.getppid_rax.size() == 1 && (long)g_c.getppid_rax.begin()->first == ppid,
          fmt("entries %" PRIu64 " returns %" PRIu64 ", guest %ld calls returning %ld; rax seen:%s",
              g_c.ret_getppid_entries, g_c.ret_getppid_returns, n_getppid, ppid, rax.c_str()));
  rax.clear();
  for (auto& [v, n] : g_c.unlink_rax) rax += fmt(" 0x%" PRIx64 " (x%" PRIu64 ")", v, n);
  // do_unlinkat returns int: only eax is defined (the upper half of rax is not sign-extended).
  std::uint64_t zero = 0, enoent = 0;
  for (auto& [v, n] : g_c.unlink_rax) {
    if (static_cast<std::int32_t>(v) == 0) zero += n;
    if (static_cast<std::int32_t>(v) == -ENOENT) enoent += n;
  }
  if (ps.ret_unlink)
    check("xrp.unlinkat", (long)zero == n_unlink && (long)enoent == n_enoent && g_c.ret_unlink_returns == zero + enoent,
          fmt("returns %" PRIu64 " (0 x%" PRIu64 ", -ENOENT x%" PRIu64 "), guest %ld ok + %ld ENOENT; rax seen:%s",
              g_c.ret_unlink_returns, zero, enoent, n_unlink, n_enoent, rax.c_str()));
  if (ps.ret_openat)
    check("xrp.openat",
          (long)g_c.ret_openat_entries == n_openat + n_unlink && g_c.ret_openat_returns == g_c.ret_openat_entries &&
              g_c.ret_openat_failed == 0 && stt_of(ps.ret_openat).untracked_calls == 0,
          fmt("entries %" PRIu64 " returns %" PRIu64 " (failed %" PRIu64 "), untracked calls %" PRIu64
              "; the guest made %ld openat calls",
              g_c.ret_openat_entries, g_c.ret_openat_returns, g_c.ret_openat_failed,
              stt_of(ps.ret_openat).untracked_calls, n_openat + n_unlink));
  if (ps.skipped)
    check("xp.skipped.hits", g_c.skipped_hits == 0 && stt_of(ps.skipped).hits == 0,
          fmt("handler %" PRIu64 ", stats hits %" PRIu64 " on padding the guest never runs", g_c.skipped_hits,
              stt_of(ps.skipped).hits));
  for (Probe* p : {ps.ret_getppid, ps.ret_unlink, ps.ret_openat}) {
    if (!p) continue;
    auto t = stt_of(p);
    say("XPE2E-INFO: return probe %" PRIu64 ": hits=%" PRIu64 " returns=%" PRIu64 " untracked_calls=%" PRIu64
        " reclaimed=%" PRIu64 " active=%u",
        p->id(), t.hits, t.returns, t.untracked_calls, t.reclaimed, t.active);
  }

  std::string diff = compare(hv, a.dom, before);
  check("text.restored", diff.empty(),
        diff.empty() ? fmt("%zu functions x %zu bytes byte-identical", before.size(), kSnapBytes) : diff);
  h = ctl_header(hv, a.dom);
  say("XPE2E-INFO: module after unregistering every probe: %s", describe(h).c_str());
  if (a.exercise_attached) {
    // The session stays open (its cached foreign mappings too) while the guest's processes
    // exit, fork and exec: freed frames become page tables and stacks of new processes.
    must(hv.xs_write(dom_path(a.dom, "data/xpe2e/exercise"), "1"), "write data/xpe2e/exercise");
    auto ex = wait_key(hv, dom_path(a.dom, "data/xpe2e/exercised"), 90);
    if (!check("guest.exercise_while_attached", ex && *ex == "0",
               ex ? "processes failed in the guest: " + *ex : "no data/xpe2e/exercised within 90 s"))
      unload_wait = 15;  // the guest is likely broken: do not wait long for its unload
  }
  ps.probes.clear();
  s.reset();  // detaches the channel

  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  h = ctl_header(*hvp, a.dom);
  check("module.traps_cleared", h && h->nr_traps == 0, "after the session closed: " + describe(h));
  // The module unloads the documented way (detach, rmmod) once Dom0 is gone.
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), unload_wait);
  check("module.unload", un && *un == "ok",
        un ? "detach + rmmod: " + *un : fmt("no data/xpe2e/unloaded within %d s", unload_wait));
  auto stt = hvp->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE));
  check("module.keys_removed", !stt, stt ? "state still " + *stt : "data/xenprobes/state removed");
  say("XPE2E-PROG probe %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

int cmd_kill(const Args& a) {
  if (a.snapshot.empty()) fatal("--snapshot is required");
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  ProbeSet ps;
  std::vector<std::pair<std::string, Gva>> fns;
  for (const char* n : {"__x64_sys_getppid", "__x64_sys_openat", "do_filp_open", "do_unlinkat"})
    fns.emplace_back(n, must(s->resolve(a.dom, n), std::string("resolve ") + n));
  save(snapshot(s->hypervisor(), a.dom, fns), a.snapshot);
  g_die_after = a.die_after;
  g_die_in = a.die_in;
  register_probes(*s, a.dom, ps);
  std::string d;
  check("text.armed",
        first_bytes_are_traps(s->hypervisor(), a.dom, trap_points(ps),
                              trap_byte_of(must(s->channel_name(a.dom), "channel_name")), &d),
        d);
  if (a.method == "fastest") {
    // The kill must find the jumps written (not their redirecting trap bytes): wait for them.
    const JumpsWritten jw = wait_for_jumps(*s, ps.probes);
    check("jump.written", jw.waiting == 0 && jw.written > 0,
          fmt("%ld jump probes written, %ld still wait", jw.written, jw.waiting));
  }
  auto done = run_workload(*s, a.dom, a.timeout_s);
  if (a.die_in == "unregister") {
    unsigned n = 0;
    for (auto& p : ps.probes) {
      if (auto r = p.unregister(); !r) check("unregister", false, r.error().what);
      maybe_die("unregister", ++n);
    }
  }
  // Only reached when the workload made fewer calls than --die-after-hits (or there were
  // fewer probes).
  check("killed", false,
        fmt("the workload finished (%s) before %u %s", done.value_or("no done").c_str(), a.die_after,
            a.die_in == "register" || a.die_in == "unregister" ? "probes" : "hits"));
  say("XPE2E-PROG kill FAIL %d", g_failed);
  return 1;
}

int cmd_verify_text(const Args& a) {
  if (a.snapshot.empty()) fatal("--snapshot is required");
  auto before = load(a.snapshot);
  auto hv = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto end = Clock::now() + std::chrono::seconds(a.timeout_s);
  std::string diff;
  do {
    diff = compare(*hv, a.dom, before);
    if (diff.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (Clock::now() < end);
  auto h = ctl_header(*hv, a.dom);
  if (a.channel == "debugger" || a.channel == "vmevent") {
    // No module fail-safe on these channels: the session's guardian restored the guest.
    check("text.restored_by_guardian", diff.empty(),
          diff.empty() ? "kernel text byte-identical to the snapshot" : "still different: " + diff);
    auto info = hv->domain_info(a.dom);
    check("guardian.domain_released", info && !info->paused && !info->debugged,
          info ? fmt("paused=%d debugged=%d", info->paused, info->debugged) : info.error().what);
    check("module.untouched", h && h->dom0_gone == 0 && h->timeouts == 0, describe(h));
    if (a.channel == "vmevent") {
      // The dead session's monitor is gone: a new one can be enabled (and is closed again).
      auto ring = hv->monitor_enable(a.dom);
      bool ok = ring.has_value();
      std::string detail = ok ? "a fresh monitor was enabled and disabled" : "monitor_enable: " + ring.error().what;
      if (ok) {
        if (auto off = hv->monitor_disable(a.dom); !off) {
          ok = false;
          detail = "a fresh monitor was enabled; monitor_disable: " + off.error().what;
        }
        ring->reset();
      }
      check("guardian.monitor_torn_down", ok, detail);
    }
  } else {
    check("text.restored_by_module", diff.empty(),
          diff.empty() ? "kernel text byte-identical to the snapshot" : "still different: " + diff);
    check("module.dom0_gone", h && h->dom0_gone == 1, describe(h));
    check("module.timeouts", h && h->timeouts >= XENPROBES_DEAD_AFTER, describe(h));
    // Every call that was in flight returned through the return table (the module clears an
    // entry as it uses it): none is left.
    std::string left = "control area unreadable";
    if (h) {
      auto a0 = hv->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_CONTROL_ADDR));
      auto view = GuestView::open(*hv, a.dom);
      std::vector<xenprobes_ret> rets(h->ret_capacity);
      if (a0 && view &&
          (*view)->read(Gva{std::stoull(*a0, nullptr, 16) + h->ret_offset}, std::as_writable_bytes(std::span(rets)))) {
        auto live = std::count_if(rets.begin(), rets.end(), [](const xenprobes_ret& r) { return r.slot != 0; });
        left = fmt("%td of %u return-table entries still in use", live, h->ret_capacity);
        check("module.returns_finished", live == 0, left);
      } else {
        check("module.returns_finished", false, left);
      }
    } else {
      check("module.returns_finished", false, left);
    }
  }
  say("XPE2E-PROG verify-text %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

int cmd_refuse_debugger(const Args& a) {
  auto hv = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto state = wait_key(*hv, dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  // The module is not needed for this check, but waiting for it means the guest has booted.
  say("XPE2E-INFO: module state: %s", state ? state->c_str() : "(none)");
  Gva fn{0};
  {
    // Resolve through a session that probes nothing (Auto attaches nothing until asked).
    auto syms = std::ifstream("/proc/kallsyms");
    std::string addr, type, name;
    while (syms >> addr >> type >> name)
      if (name == "__x64_sys_getppid") {
        fn = Gva{std::stoull(addr, nullptr, 16)};
        break;
      }
  }
  if (!fn.value) fatal("__x64_sys_getppid not in /proc/kallsyms");
  auto before = snapshot(*hv, a.dom, {{"__x64_sys_getppid", fn}});
  auto info0 = must(hv->domain_info(a.dom), "domain_info");
  auto s = Session::open(std::move(hv), SessionOptions{ChannelKind::Debugger});
  check("debugger.refused", !s.has_value(),
        s ? "Session::open(Debugger) succeeded on a hypervisor without GDBSX" : "refused: " + s.error().what);
  if (!s) {
    check("debugger.message",
          s.error().what.find("CONFIG_GDBSX") != std::string::npos && s.error().code == Errc::NotSupported,
          fmt("errc=%s, names CONFIG_GDBSX and what to use instead", errc_name(s.error().code)));
  }
  s = std::unexpected(Error{});  // closes the session if one was opened
  hv = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  std::string diff = compare(*hv, a.dom, before);
  check("debugger.text_untouched", diff.empty(), diff.empty() ? "__x64_sys_getppid unchanged" : diff);
  auto info = must(hv->domain_info(a.dom), "domain_info");
  check("debugger.domain_untouched", !info.debugged && !info.paused && info.debugged == info0.debugged,
        fmt("debugged=%d paused=%d", info.debugged, info.paused));
  say("XPE2E-PROG refuse-debugger %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
