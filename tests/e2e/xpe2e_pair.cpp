// xpe2e-probe pair (its usage: xpe2e_probe.cpp): one session probes two domains at once, and
// one of them is destroyed while probed.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

namespace {

// ---- pair: two domains in one session; one of them destroyed while probed ----------------

struct PairCounters {
  std::uint64_t pre = 0, post = 0, post_rip_wrong = 0;
  std::uint64_t ret_entries = 0, ret_returns = 0, unlink_returns = 0;
  std::map<std::uint64_t, std::uint64_t> getppid_rax, unlink_rax;
  std::uint64_t wrong_domain = 0;  // a handler registered for this domain saw another one
};
// By HitContext::domain(): each hit is counted for the domain the session says it came from.
std::map<std::uint32_t, PairCounters> g_pc;

struct PairSide {
  const char* tag;  // "a" (kept), "b" (destroyed)
  DomId dom;
  Gva getppid, unlink;
  Probe xp, xrp, xrp_unlink;
};

// Waits for the guest module, checks it runs Dom0's kernel build.
void pair_module_ready(hv::Hypervisor& hv, const PairSide& p) {
  auto state = wait_key(hv, dom_path(p.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  check(fmt("%s.module.state", p.tag), state && *state == XENPROBES_XS_STATE_READY,
        fmt("domain %u: ", p.dom.value) + (state ? "state=" + *state : "no data/xenprobes/state within 120 s"));
  if (!state) fatal(fmt("domain %u: the guest module never published its keys", p.dom.value));
  auto rel = hv.xs_read(dom_path(p.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RELEASE));
  std::string dom0_rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, dom0_rel);
  check(fmt("%s.module.release", p.tag), rel && *rel == dom0_rel,
        "guest " + (rel ? *rel : std::string("?")) + ", Dom0 " + dom0_rel);
}

void pair_register(Session& s, PairSide& p) {
  p.getppid = must(s.resolve(p.dom, "__x64_sys_getppid"), "resolve __x64_sys_getppid");
  p.unlink = must(s.resolve(p.dom, "do_unlinkat"), "resolve do_unlinkat");
  const DomId mine = p.dom;
  auto placed = std::make_shared<std::uint64_t>(p.getppid.value);  // past the ftrace site, once registered
  auto count = [mine](HitContext& c) -> PairCounters& {
    if (c.domain() != mine) ++g_pc[mine.value].wrong_domain;
    return g_pc[c.domain().value];
  };
  p.xp = must(s.probe(
                  p.dom, p.getppid,
                  [count](HitContext& c) {
                    ++count(c).pre;
                    return 0;
                  },
                  [count, placed](HitContext& c) {
                    auto& k = count(c);
                    ++k.post;
                    if (c.regs().rip == *placed) ++k.post_rip_wrong;
                  }),
              fmt("%s: XP on __x64_sys_getppid", p.tag));
  *placed = p.xp.info()->address.value;
  p.xrp = must(s.ret_probe(
                   p.dom, p.getppid,
                   [count](HitContext& c, std::span<std::byte>) {
                     ++count(c).ret_entries;
                     return 0;
                   },
                   [count](HitContext& c, std::span<std::byte>) {
                     auto& k = count(c);
                     ++k.ret_returns;
                     ++k.getppid_rax[c.regs().rax];
                   }),
               fmt("%s: XrP on __x64_sys_getppid", p.tag));
  p.xrp_unlink = must(s.ret_probe(p.dom, p.unlink, {},
                                  [count](HitContext& c, std::span<std::byte>) {
                                    auto& k = count(c);
                                    ++k.unlink_returns;
                                    ++k.unlink_rax[c.regs().rax];
                                  }),
                      fmt("%s: XrP on do_unlinkat", p.tag));
  for (Probe* pr : {&p.xp, &p.xrp, &p.xrp_unlink})
    if (auto i = pr->info())
      say("XPE2E-INFO: domain %u (%s) probe %" PRIu64 ": %s mode=%s trampoline=%#" PRIx64, p.dom.value, p.tag, pr->id(),
          i->instruction.c_str(), mode_name(i->mode), i->trampoline.value);
}

// `xl destroy <dom>` in a child process: the caller keeps serving hits meanwhile.
pid_t spawn_xl_destroy(DomId dom) {
  std::string id = std::to_string(dom.value);
  const char* argv[] = {"xl", "destroy", id.c_str(), nullptr};
  pid_t pid = -1;
  int e = posix_spawnp(&pid, "xl", nullptr, nullptr, const_cast<char* const*>(argv), environ);
  if (e) {
    say("XPE2E-INFO: posix_spawnp(xl destroy %s): %s", id.c_str(), std::strerror(e));
    return -1;
  }
  return pid;
}

std::string rax_list(const std::map<std::uint64_t, std::uint64_t>& m) {
  std::string r;
  for (auto& [v, n] : m) r += fmt(" 0x%" PRIx64 " (x%" PRIu64 ")", v, n);
  return r;
}

}  // namespace

int cmd_pair(const Args& a) {
  PairSide A{"a", a.dom, {}, {}, {}, {}, {}};
  PairSide B{"b", a.dom2, {}, {}, {}, {}, {}};
  g_pc[A.dom.value];
  g_pc[B.dom.value];
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  pair_module_ready(*hvp, A);
  pair_module_ready(*hvp, B);
  auto s = must(Session::open(std::move(hvp), SessionOptions{ChannelKind::Guest}), "Session::open");
  hv::Hypervisor& hv = s->hypervisor();
  for (PairSide* p : {&A, &B}) {
    must(s->load_symbols(p->dom, "/proc/kallsyms"), fmt("load_symbols(%u, /proc/kallsyms)", p->dom.value));
    auto ch = s->channel_name(p->dom);
    check(fmt("%s.channel", p->tag), ch && *ch == "guest",
          fmt("domain %u: ", p->dom.value) + (ch ? "serving channel: " + *ch : "channel_name: " + ch.error().what));
  }
  // A workload that gave up waiting for its go (slow boots of the other DomU on a loaded
  // host) has written `done` already: say so plainly, before anything is armed.
  for (PairSide* p : {&A, &B})
    if (auto d = hv.xs_read(dom_path(p->dom, "data/xpe2e/done")))
      fatal(fmt("domain %u (%s): the workload stopped waiting before the go (done: %s)", p->dom.value, p->tag,
                d->c_str()));
  std::vector<std::pair<std::string, Gva>> fns;
  for (const char* n : {"__x64_sys_getppid", "do_unlinkat"})
    fns.emplace_back(n, must(s->resolve(A.dom, n), std::string("resolve ") + n));
  auto before = snapshot(hv, A.dom, fns);
  pair_register(*s, A);
  pair_register(*s, B);
  for (PairSide* p : {&A, &B}) {
    std::string d;
    // Where the library placed them (past each function's ftrace site).
    bool armed = first_bytes_are_traps(hv, p->dom, {p->xp.info()->address, p->xrp_unlink.info()->address}, 0xcc, &d);
    check(fmt("%s.text.armed", p->tag), armed, fmt("domain %u: ", p->dom.value) + d);
  }

  // Both workloads at once; B is destroyed once it has had some hits; A goes on.
  for (PairSide* p : {&A, &B}) must(hv.xs_write(dom_path(p->dom, "data/xpe2e/go"), "1"), "write data/xpe2e/go");
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::seconds(a.timeout_s);
  auto secs = [](Clock::time_point from) { return std::chrono::duration<double>(Clock::now() - from).count(); };
  PairCounters& ca = g_pc[A.dom.value];
  PairCounters& cb = g_pc[B.dom.value];
  pid_t xl = -1;
  int xl_status = -1;
  std::optional<Clock::time_point> t_destroy, t_xl_done, t_noticed;
  std::uint64_t a_at_destroy = 0, a_at_noticed = 0, b_at_destroy = 0, b_at_noticed = 0;
  std::optional<Error> b_info_error;
  std::optional<std::string> done;
  unsigned run_errors = 0;
  std::string first_run_error;
  // A's progress: hits seen recently; a long standstill before its `done` is worth a look.
  std::uint64_t a_last = 0;
  auto a_last_t = Clock::now();
  unsigned stall_dumps = 0;
  while (Clock::now() < end) {
    if (ca.pre + ca.ret_returns != a_last) {
      a_last = ca.pre + ca.ret_returns;
      a_last_t = Clock::now();
    } else if (!done && stall_dumps < 3 && secs(a_last_t) > 20.0 * (stall_dumps + 1)) {
      ++stall_dumps;
      dump_stall(hv, A.dom,
                 fmt("no hit for %.0f s, workload not done (pre %" PRIu64 ", returns %" PRIu64 ")", secs(a_last_t),
                     ca.pre, ca.ret_returns)
                     .c_str());
    }
    auto r = s->run_once(100);
    if (!r) {
      if (++run_errors <= 5)
        say("XPE2E-INFO: run_once failed (%s after the go): %s", fmt("%.1f s", secs(t0)).c_str(),
            r.error().what.c_str());
      if (first_run_error.empty()) first_run_error = r.error().what;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!t_destroy && cb.pre >= a.destroy_after) {
      t_destroy = Clock::now();
      a_at_destroy = ca.pre;
      b_at_destroy = cb.pre;
      say("XPE2E-INFO: domain %u (b) had %" PRIu64 " getppid hits, domain %u (a) %" PRIu64 ": xl destroy %u",
          B.dom.value, cb.pre, A.dom.value, ca.pre, B.dom.value);
      xl = spawn_xl_destroy(B.dom);
      if (xl < 0) break;
    }
    if (xl > 0) {
      int st = 0;
      pid_t w = ::waitpid(xl, &st, WNOHANG);
      if (w == xl) {
        xl = -1;
        xl_status = st;
        t_xl_done = Clock::now();
        say("XPE2E-INFO: xl destroy returned after %.1f s (status %d); domain %u (a) had %" PRIu64
            " more getppid hits meanwhile",
            secs(*t_destroy), st, A.dom.value, ca.pre - a_at_destroy);
      } else if (secs(*t_destroy) > 120) {
        say("XPE2E-INFO: xl destroy still running after 120 s: killing it");
        ::kill(xl, SIGKILL);
        ::waitpid(xl, &st, 0);
        xl = -1;
        t_xl_done = Clock::now();
      }
    }
    if (t_destroy && !t_noticed) {
      if (auto i = B.xp.info(); !i) {
        t_noticed = Clock::now();
        a_at_noticed = ca.pre;
        b_at_noticed = cb.pre;
        b_info_error = i.error();
        say("XPE2E-INFO: the session dropped domain %u %.1f s after xl destroy: info() says %s (%s)", B.dom.value,
            secs(*t_destroy), i.error().what.c_str(), errc_name(i.error().code));
      } else if (secs(*t_destroy) > 120) {
        break;
      }
    }
    if (!done)
      if (auto d = hv.xs_read(dom_path(A.dom, "data/xpe2e/done"))) {
        done = *d;
        say("XPE2E-INFO: domain %u (a) workload done %.1f s after the go", A.dom.value, secs(t0));
      }
    if (done && t_noticed && t_xl_done) break;
    if (done && !t_destroy) break;  // B never reached its hits: nothing more will happen
  }
  (void)s->run_once(0);
  say("XPE2E-INFO: probing window %.1f s", secs(t0));

  // The destroyed domain.
  check("b.hits_before_destroy", t_destroy.has_value(),
        t_destroy ? fmt("domain %u had %" PRIu64 " getppid hits when xl destroy started", B.dom.value, b_at_destroy)
                  : fmt("domain %u had only %" PRIu64 " getppid hits (want %u) by the end", B.dom.value, cb.pre,
                        a.destroy_after));
  check("b.xl_destroy", t_xl_done && WIFEXITED(xl_status) && WEXITSTATUS(xl_status) == 0,
        t_xl_done ? fmt("xl destroy %u: status %d, %.1f s", B.dom.value, xl_status,
                        std::chrono::duration<double>(*t_xl_done - *t_destroy).count())
                  : "xl destroy did not run or did not return");
  check("b.probes_dropped", t_noticed && b_info_error && b_info_error->code == Errc::NotFound,
        t_noticed ? fmt("Probe::info() failed %.1f s after xl destroy: %s (%s)",
                        std::chrono::duration<double>(*t_noticed - *t_destroy).count(), b_info_error->what.c_str(),
                        errc_name(b_info_error->code))
                  : "Probe::info() still succeeds: the session never dropped the destroyed domain");
  check("pair.run_once", run_errors == 0,
        run_errors ? fmt("%u failures; first: %s", run_errors, first_run_error.c_str())
                   : "no failure while serving both domains");
  say("XPE2E-INFO: domain %u (b) before it died: pre %" PRIu64 " post %" PRIu64 " xrp entries %" PRIu64
      " returns %" PRIu64 " (%" PRIu64 " pre hits after xl destroy started, %" PRIu64 " by the drop)",
      B.dom.value, cb.pre, cb.post, cb.ret_entries, cb.ret_returns, cb.pre - b_at_destroy, b_at_noticed - b_at_destroy);
  for (Probe* p : {&B.xp, &B.xrp, &B.xrp_unlink}) {
    auto st = p->stats();
    auto i = p->info();
    check(fmt("b.info.%" PRIu64, p->id()), !i && i.error().code == Errc::NotFound,
          i ? "info() still succeeds"
            : fmt("%s (%s); stats() hits=%" PRIu64 " returns=%" PRIu64, i.error().what.c_str(),
                  errc_name(i.error().code), st.hits, st.returns));
  }
  if (t_noticed) {
    // Not registered any more: a new probe in the dead domain is refused, not attached.
    auto np = s->probe(B.dom, B.getppid, [](HitContext&) { return 0; });
    check("b.new_probe_refused", !np && np.error().code == Errc::NoSuchDomain,
          np ? "a new probe in the destroyed domain was registered"
             : fmt("%s (%s)", np.error().what.c_str(), errc_name(np.error().code)));
    for (Probe* p : {&B.xp, &B.xrp, &B.xrp_unlink}) {
      auto id = p->id();
      auto r = p->unregister();
      check(fmt("b.unregister.%" PRIu64, id), r.has_value() && !*p,
            r ? "ok (nothing left to restore in a dead domain)" : "failed: " + r.error().what);
    }
    // The session holds no mapping of the dead domain's frames: Xen can free it.
    std::optional<Error> gone;
    auto wend = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < wend) {
      (void)s->run_once(100);  // A's guest is idle now; keep serving anyway
      auto i = hv.domain_info(B.dom);
      if (!i) {
        gone = i.error();
        break;
      }
    }
    auto i = hv.domain_info(B.dom);
    check("b.domain_released", gone && gone->code == Errc::NoSuchDomain,
          gone ? fmt("domain_info: %s (%s)", gone->what.c_str(), errc_name(gone->code))
               : fmt("domain %u still exists 60 s later (dying=%d): something holds its memory", B.dom.value,
                     i ? int(i->dying) : -1));
  }

  // The domain kept.
  check("a.kept_probing", t_noticed && ca.pre > a_at_noticed,
        fmt("domain %u getppid hits: %" PRIu64 " when xl destroy started, %" PRIu64
            " when the session dropped domain %u, %" PRIu64 " at the end",
            A.dom.value, a_at_destroy, a_at_noticed, B.dom.value, ca.pre));
  check("a.workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  long n_getppid = num(w, "getppid"), ppid = num(w, "ppid"), n_unlink = num(w, "unlink_ok"),
       n_enoent = num(w, "unlink_enoent");
  check("a.workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");
  auto h = ctl_header(hv, A.dom);
  check("a.module.no_timeouts", h && h->timeouts == 0, describe(h));
  auto st_xp = A.xp.stats(), st_xrp = A.xrp.stats();
  std::vector<std::pair<std::uint64_t, Result<void>>> unreg;
  for (Probe* p : {&A.xp, &A.xrp, &A.xrp_unlink}) {
    auto id = p->id();
    unreg.emplace_back(id, p->unregister());
  }
  for (auto& [id, r] : unreg) check(fmt("a.unregister.%" PRIu64, id), r.has_value(), r ? "ok" : r.error().what);
  check("a.xp.getppid.pre", (long)ca.pre == n_getppid,
        fmt("pre-handler %" PRIu64 ", guest made %ld calls", ca.pre, n_getppid));
  check("a.xp.getppid.post", (long)ca.post == n_getppid,
        fmt("post-handler %" PRIu64 ", guest %ld; post rip still at the probe: %" PRIu64, ca.post, n_getppid,
            ca.post_rip_wrong));
  check("a.xp.getppid.stats", (long)st_xp.hits == n_getppid && st_xp.unhandled == 0,
        fmt("stats hits=%" PRIu64 " unhandled=%" PRIu64, st_xp.hits, st_xp.unhandled));
  check("a.xrp.getppid",
        (long)ca.ret_entries == n_getppid && (long)ca.ret_returns == n_getppid && ca.getppid_rax.size() == 1 &&
            (long)ca.getppid_rax.begin()->first == ppid && st_xrp.untracked_calls == 0,
        fmt("entries %" PRIu64 " returns %" PRIu64
            ", guest %ld calls returning %ld; rax seen:%s; untracked calls %" PRIu64,
            ca.ret_entries, ca.ret_returns, n_getppid, ppid, rax_list(ca.getppid_rax).c_str(), st_xrp.untracked_calls));
  std::uint64_t zero = 0, enoent = 0;
  for (auto& [v, n] : ca.unlink_rax) {
    if (static_cast<std::int32_t>(v) == 0) zero += n;
    if (static_cast<std::int32_t>(v) == -ENOENT) enoent += n;
  }
  check("a.xrp.unlinkat", (long)zero == n_unlink && (long)enoent == n_enoent && ca.unlink_returns == zero + enoent,
        fmt("returns %" PRIu64 " (0 x%" PRIu64 ", -ENOENT x%" PRIu64 "), guest %ld ok + %ld ENOENT; rax seen:%s",
            ca.unlink_returns, zero, enoent, n_unlink, n_enoent, rax_list(ca.unlink_rax).c_str()));
  check("pair.hit_domains", ca.wrong_domain == 0 && cb.wrong_domain == 0,
        fmt("hits reported for another domain than the probe's: a %" PRIu64 ", b %" PRIu64, ca.wrong_domain,
            cb.wrong_domain));
  std::string diff = compare(hv, A.dom, before);
  check("a.text.restored", diff.empty(),
        diff.empty() ? fmt("%zu functions x %zu bytes byte-identical", before.size(), kSnapBytes) : diff);

  s.reset();  // detaches the channel from A
  auto hv2 = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  h = ctl_header(*hv2, A.dom);
  check("a.module.traps_cleared", h && h->nr_traps == 0, "after the session closed: " + describe(h));
  must(hv2->xs_write(dom_path(A.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hv2, dom_path(A.dom, "data/xpe2e/unloaded"), 90);
  check("a.module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG pair %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
