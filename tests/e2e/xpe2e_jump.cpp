// xpe2e-probe jump and async (their usage: xpe2e_probe.cpp): jump probes and async jump probes
// (issue 14) on the guest channel.
#include <array>
#include <cinttypes>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

// jump: jump probes (issue 14) through the guest channel. A jump probe on __x64_sys_getppid
// and on do_unlinkat, and a Fastest one on __x64_sys_openat: each registered as a jump (the
// module publishes its jump entry), the jump written once the module confirmed quiescence (the
// bytes read back: e9 to the detour), every call of the workload counted exactly, no hit the
// module resumed without Dom0, and the text byte-identical after unregistering.
int cmd_jump(const Args& a) {
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  std::vector<std::pair<std::string, Gva>> fns;
  for (const char* n : {"__x64_sys_getppid", "do_unlinkat", "__x64_sys_openat"})
    fns.emplace_back(n, must(s->resolve(a.dom, n), std::string("resolve ") + n));
  auto before = snapshot(hv, a.dom, fns);
  auto keys = hv.xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_JUMP_ENTRY));
  check("module.jump_entry", keys.has_value(), keys ? "jump-entry " + *keys : "the module publishes no jump-entry");
  std::uint64_t n_getppid = 0, n_unlink = 0, n_openat = 0;
  struct Want {
    const char* fn;
    ProbeMethod method;
    std::uint64_t* count;
  };
  std::vector<Probe> probes;
  for (const Want& w :
       {Want{"__x64_sys_getppid", ProbeMethod::Jump, &n_getppid}, Want{"do_unlinkat", ProbeMethod::Jump, &n_unlink},
        Want{"__x64_sys_openat", ProbeMethod::Fastest, &n_openat}}) {
    std::uint64_t* c = w.count;
    auto p = s->probe(
        a.dom, w.fn,
        [c](HitContext&) {
          ++*c;
          return 0;
        },
        {}, ProbeOptions{w.method});
    if (!check(fmt("jump.register.%s", w.fn), p.has_value(), p ? "registered" : p.error().what)) continue;
    auto i = must(p->info(), "info");
    say("XPE2E-INFO: %s: %s at 0x%" PRIx64 ", detour 0x%" PRIx64 ", %s%s", w.fn, probe_method_name(i.method),
        i.address.value, i.slot.value, i.instruction.c_str(),
        i.not_jump_because.empty() ? "" : ("; not a jump: " + i.not_jump_because).c_str());
    check(fmt("jump.method.%s", w.fn), i.method == ProbeMethod::Jump && i.mode == ExecMode::Detour,
          i.not_jump_because.empty() ? probe_method_name(i.method) : i.not_jump_because);
    probes.push_back(std::move(*p));
  }
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("jump.written", jw.waiting == 0,
        fmt("%ld of %zu jumps still wait after %.1f s", jw.waiting, probes.size(), jw.seconds));
  auto view = must(GuestView::open(hv, a.dom), "GuestView::open");
  for (Probe& p : probes) {
    auto i = p.info();
    if (!i) continue;
    // The jump starts at the point, or up to 4 bytes before it (an earlier start in its block).
    bool found = false;
    for (std::uint64_t back = 0; back <= 4 && !found; ++back) {
      std::array<std::byte, 5> b{};
      if (!view->read(Gva{i->address.value - back}, b)) break;
      std::int32_t rel = 0;
      std::memcpy(&rel, b.data() + 1, 4);
      found = b[0] == std::byte{0xe9} &&
              i->address.value - back + 5 + static_cast<std::uint64_t>(std::int64_t{rel}) == i->slot.value;
    }
    check(fmt("text.jump.%" PRIx64, i->address.value), found, "e9 <rel32 to the detour> in the guest's text");
  }

  auto done = run_workload(*s, a.dom, a.timeout_s);
  check("workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  check("workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");
  const long getppid = num(w, "getppid"), openat = num(w, "openat"),
             unl = num(w, "unlink_ok") + num(w, "unlink_enoent");
  check("jump.getppid", (long)n_getppid == getppid,
        fmt("jump probe %" PRIu64 ", guest made %ld calls", n_getppid, getppid));
  check("jump.unlinkat", (long)n_unlink == unl,
        fmt("jump probe %" PRIu64 ", guest made %ld unlink calls", n_unlink, unl));
  check("jump.openat", (long)n_openat == openat + num(w, "unlink_ok"),
        fmt("probe %" PRIu64 ", guest made %ld openat calls", n_openat, openat + num(w, "unlink_ok")));
  auto h = ctl_header(hv, a.dom);
  say("XPE2E-INFO: module after the workload: %s", describe(h).c_str());
  check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  for (Probe& p : probes) {
    auto r = p.unregister();
    check(fmt("unregister.%" PRIu64, p.id()), r.has_value(), r ? "ok" : r.error().what);
  }
  std::string diff = compare(hv, a.dom, before);
  check("text.restored", diff.empty(),
        diff.empty() ? fmt("%zu functions x %zu bytes byte-identical", before.size(), kSnapBytes) : diff);
  probes.clear();
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG jump %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

// async: async jump probes (issue 14): the guest module writes each hit into the vCPU's ring
// and goes on; Dom0 reads the rings between events. An async probe on __x64_sys_getppid (no
// captures) and one on the first of do_sys_openat2 / getname_flags that can be one, capturing
// the user filename, the return address at [rsp] and 8 bytes 1 GiB below the probed address
// (no mapping there: a fault every time). Every call is exactly one record, in order per vCPU
// (seq), with a clock that never goes back; the filename is the workload's; nothing is dropped;
// the text is byte-identical after unregistering; the module unloads.
int cmd_async(const Args& a) {
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  auto rings = hv.xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RINGS_COUNT));
  check("module.rings", rings.has_value(), rings ? "rings/count " + *rings : "the module publishes no rings");
  const Gva text = must(s->resolve(a.dom, "_text"), "resolve _text");
  const Gva etext = must(s->resolve(a.dom, "_etext"), "resolve _etext");
  struct Seen {
    std::uint64_t records = 0, bad = 0, target = 0, other = 0, not_ok = 0, ret_outside = 0, no_fault = 0;
    std::map<unsigned, std::uint32_t> next_seq;
    std::map<unsigned, std::uint64_t> last_time;
    std::string first_bad;
  };
  Seen getppid, open;
  auto order = [](Seen& z, const AsyncHit& h) {
    ++z.records;
    const unsigned v = h.vcpu.value;
    const bool seq_ok = !z.next_seq.contains(v) || h.seq == z.next_seq[v];
    const bool time_ok = !z.last_time.contains(v) || h.time_ns >= z.last_time[v];
    if (!seq_ok || !time_ok || h.regs.rip != h.address.value) {
      if (!z.bad++)
        z.first_bad = fmt("vcpu %u seq %u (want %u) time %" PRIu64 " (last %" PRIu64 ") rip %#" PRIx64, v, h.seq,
                          z.next_seq[v], h.time_ns, z.last_time[v], h.regs.rip);
    }
    z.next_seq[v] = h.seq + 1;
    z.last_time[v] = h.time_ns;
  };
  std::vector<std::pair<std::string, Gva>> fns{
      {"__x64_sys_getppid", must(s->resolve(a.dom, "__x64_sys_getppid"), "resolve")}};
  for (const char* fn : {"do_sys_openat2", "getname_flags"})
    if (auto at = s->resolve(a.dom, fn)) fns.emplace_back(fn, *at);
  auto before = snapshot(hv, a.dom, fns);  // the text as the guest has it, before any probe
  std::vector<Probe> probes;
  auto p1 = s->probe_async(a.dom, "__x64_sys_getppid", [&](const AsyncHit& h) { order(getppid, h); });
  if (check("async.register.getppid", p1.has_value(), p1 ? "registered" : p1.error().what))
    probes.push_back(std::move(*p1));
  AsyncOptions o;
  std::string open_fn;
  for (const char* fn : {"do_sys_openat2", "getname_flags"}) {
    o.captures = {
        Capture::string(std::string(fn) == "do_sys_openat2" ? CaptureBase::Rsi : CaptureBase::Rdi, 0, 64, true),
        Capture::bytes(CaptureBase::Rsp, 0, 8), Capture::bytes(CaptureBase::Rip, -0x40000000, 8)};
    auto p = s->probe_async(
        a.dom, fn,
        [&](const AsyncHit& h) {
          order(open, h);
          if (h.captures.size() != 3) return;
          if (h.captures[0].status != CaptureStatus::Ok) ++open.not_ok;
          else ++(h.captures[0].text() == kTarget ? open.target : open.other);
          std::uint64_t ret = 0;
          if (h.captures[1].bytes.size() == 8) std::memcpy(&ret, h.captures[1].bytes.data(), 8);
          if (ret < text.value || ret >= etext.value) ++open.ret_outside;
          if (h.captures[2].status != CaptureStatus::Fault) ++open.no_fault;
        },
        o);
    say("XPE2E-INFO: async probe on %s: %s", fn, p ? "registered" : p.error().what.c_str());
    if (!p) continue;
    open_fn = fn;
    probes.push_back(std::move(*p));
    break;
  }
  check("async.register.open", !open_fn.empty(),
        open_fn.empty() ? "neither do_sys_openat2 nor getname_flags" : open_fn);
  for (Probe& p : probes)
    if (auto i = p.info())
      say("XPE2E-INFO: async probe %" PRIu64 ": %s, detour 0x%" PRIx64 ", async=%d", p.id(), i->instruction.c_str(),
          i->slot.value, i->async);
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("async.written", jw.waiting == 0,
        fmt("%ld of %zu jumps still wait after %.1f s", jw.waiting, probes.size(), jw.seconds));
  // Counted from here: the workload starts now.
  getppid = Seen{};
  open = Seen{};
  auto done = run_workload(*s, a.dom, a.timeout_s);
  check("workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  check("workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");
  auto rs = s->ring_stats(a.dom);  // reads what is left in the rings
  check("async.ring_stats", rs.has_value(), rs ? "read" : rs.error().what);
  const RingStats st = rs.value_or(RingStats{});
  say("XPE2E-INFO: rings: %u, records %" PRIu64 ", orphans %" PRIu64 ", missed %" PRIu64 ", resyncs %" PRIu64
      ", drops %" PRIu64 ", nested %" PRIu64 ", bad keys %" PRIu64,
      st.rings, st.records, st.orphans, st.missed, st.resyncs, st.drops, st.nested, st.bad_keys);
  const long n_getppid = num(w, "getppid"), n_openat = num(w, "openat");
  check("async.getppid", (long)getppid.records == n_getppid && getppid.bad == 0,
        fmt("records %" PRIu64 ", guest made %ld calls; out of order %" PRIu64 "%s", getppid.records, n_getppid,
            getppid.bad, getppid.first_bad.empty() ? "" : (" (" + getppid.first_bad + ")").c_str()));
  if (!open_fn.empty())
    check("async.open",
          (long)open.target == n_openat && open.not_ok == 0 && open.ret_outside == 0 && open.no_fault == 0 &&
              open.bad == 0,
          fmt("%s: %s captured %" PRIu64 " times (guest opened it %ld times), other names %" PRIu64
              ", unreadable %" PRIu64 ", return addresses outside the kernel's text %" PRIu64
              ", unmapped reads that did not fault %" PRIu64 ", out of order %" PRIu64 "%s",
              open_fn.c_str(), kTarget, open.target, n_openat, open.other, open.not_ok, open.ret_outside, open.no_fault,
              open.bad, open.first_bad.empty() ? "" : (" (" + open.first_bad + ")").c_str()));
  check("async.rings", st.drops == 0 && st.missed == 0 && st.resyncs == 0 && st.bad_keys == 0 && st.rings > 0,
        "no drop, no record missing, no resync, no key refused");
  auto h = ctl_header(hv, a.dom);
  say("XPE2E-INFO: module after the workload: %s", describe(h).c_str());
  check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  for (Probe& p : probes) {
    auto r = p.unregister();
    check(fmt("unregister.%" PRIu64, p.id()), r.has_value(), r ? "ok" : r.error().what);
  }
  std::string diff = compare(hv, a.dom, before);
  check("text.restored", diff.empty(),
        diff.empty() ? fmt("%zu functions x %zu bytes byte-identical", before.size(), kSnapBytes) : diff);
  probes.clear();
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG async %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
