// xpe2e-probe jump-module (its usage: xpe2e_probe.cpp): jump probes in a loaded module's text
// (docs/probes.md "Jump probes in a module's text") on Debian's loop.ko, guest channel, the
// DomU started with xpe2e.victim=2 (tools/e2e/domu/init).
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

namespace {

using Clock = std::chrono::steady_clock;
constexpr long kCalls = 40;  // the DomU's loopctl: LOOP_GET_STATUS64 ioctls per round
// LOOP_GET_STATUS64 (linux/loop.h): lo_ioctl's `unsigned int cmd`, in edx (the ABI leaves the
// upper half of rdx undefined for it).
constexpr std::uint64_t kGetStatus64 = 0x4c05;

// Writes `go`, serves the session until the guest writes `done` (read between hits, as
// run_workload does); its value, or nullopt after `seconds`.
std::optional<std::string> serve_until(Session& s, DomId dom, const std::string& go, const std::string& done,
                                       int seconds) {
  if (!go.empty()) must(s.hypervisor().xs_write(dom_path(dom, go), "1"), "write " + go);
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    auto r = s.run_once(100);
    if (!r) {
      check("run_once", false, r.error().what);
      return std::nullopt;
    }
    if (*r > 0) continue;
    if (auto d = s.hypervisor().xs_read(dom_path(dom, done))) {
      (void)s.run_once(0);
      return *d;
    }
  }
  return std::nullopt;
}

// The jump of a written jump probe: e9 to its detour at the point or up to 4 bytes before it.
std::optional<Gva> jump_at(hv::Hypervisor& hv, DomId dom, const ProbeInfo& i) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  for (std::uint64_t back = 0; back <= 4; ++back) {
    std::array<std::byte, 5> b{};
    if (!view->read(Gva{i.address.value - back}, b)) return std::nullopt;
    std::int32_t rel = 0;
    std::memcpy(&rel, b.data() + 1, 4);
    if (b[0] == std::byte{0xe9} &&
        i.address.value - back + 5 + static_cast<std::uint64_t>(std::int64_t{rel}) == i.slot.value)
      return Gva{i.address.value - back};
  }
  return std::nullopt;
}

// 16 bytes at `at` as the guest's page tables map them now ("unmapped: ..." when they do not).
std::string bytes_at(hv::Hypervisor& hv, DomId dom, Gva at) {
  auto view = GuestView::open(hv, dom);
  if (!view) return "no view: " + view.error().what;
  std::vector<std::byte> b(16);
  if (auto r = (*view)->read(at, b); !r) return "unmapped: " + r.error().what;
  return hexbytes(b, b.size());
}

}  // namespace

// jump-module: loop.ko's lo_ioctl, which the DomU's loopctl calls exactly 40 times a round.
//  1. a jump probe: registered as a jump, the jump written (e9 to the detour read back), every
//     call counted, the module's text byte-identical after unregistering;
//  2. an async probe there: one record per call, each with rdx (lo_ioctl's cmd) =
//     LOOP_GET_STATUS64, nothing dropped, the text byte-identical after;
//  3. a jump probe again, its jump written, then `rmmod loop` in the guest while it is: the
//     session goes on, unregistering succeeds and writes nothing where the module's text was
//     (the bytes there, read before and after with the domain paused, are the same; the
//     scenario also checks the library's "nothing written" line and the guest module's
//     "went while probed"); the guest module then unloads cleanly.
int cmd_jump_module(const Args& a) {
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  const Gva fn = must(s->resolve(a.dom, "loop:lo_ioctl"), "resolve loop:lo_ioctl");
  say("XPE2E-INFO: loop:lo_ioctl at 0x%" PRIx64, fn.value);
  const std::vector<std::pair<std::string, Gva>> fns{{"loop:lo_ioctl", fn}};
  auto before = snapshot(hv, a.dom, fns);

  // 1. A jump probe.
  {
    std::uint64_t hits = 0, other_cmd = 0;
    auto p = s->probe(
        a.dom, "loop:lo_ioctl",
        [&](HitContext& c) {
          ++hits;
          other_cmd += (c.regs().rdx & 0xffffffff) != kGetStatus64;
          return 0;
        },
        {}, ProbeOptions{ProbeMethod::Jump});
    if (!check("jump.register", p.has_value(), p ? "registered" : p.error().what)) return 1;
    auto i = must(p->info(), "info");
    say("XPE2E-INFO: lo_ioctl: %s at 0x%" PRIx64 ", detour 0x%" PRIx64 ", %s", probe_method_name(i.method),
        i.address.value, i.slot.value, i.instruction.c_str());
    check("jump.method", i.method == ProbeMethod::Jump && i.mode == ExecMode::Detour, probe_method_name(i.method));
    std::vector<Probe> ps;
    ps.push_back(std::move(*p));
    const JumpsWritten jw = wait_for_jumps(*s, ps);
    check("jump.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
    auto j = jump_at(hv, a.dom, i);
    check("text.jump", j.has_value(), j ? fmt("e9 at 0x%" PRIx64 " to the detour", j->value) : "no e9 to the detour");
    auto r = serve_until(*s, a.dom, "data/xpe2e/loop_go-1", "data/xpe2e/loop_done-1", a.timeout_s);
    check("loopctl.1", r.has_value() && num(kv(*r), "ok") == 1 && num(kv(*r), "calls") == kCalls,
          r ? *r : "no data/xpe2e/loop_done-1");
    check("jump.count", (long)hits == kCalls && other_cmd == 0,
          fmt("jump probe %" PRIu64 " hits (%" PRIu64 " with another cmd), the guest made %ld ioctls", hits, other_cmd,
              kCalls));
    auto u = ps.front().unregister();
    check("jump.unregister", u.has_value(), u ? "ok" : u.error().what);
    const std::string diff = compare(hv, a.dom, before);
    check("text.restored.1", diff.empty(),
          diff.empty() ? fmt("lo_ioctl's first %zu bytes identical", kSnapBytes) : diff);
  }

  // 2. An async probe.
  {
    std::uint64_t records = 0, other_cmd = 0;
    auto p = s->probe_async(a.dom, "loop:lo_ioctl", [&](const AsyncHit& h) {
      ++records;
      other_cmd += (h.regs.rdx & 0xffffffff) != kGetStatus64;
    });
    if (check("async.register", p.has_value(), p ? "registered" : p.error().what)) {
      std::vector<Probe> ps;
      ps.push_back(std::move(*p));
      const JumpsWritten jw = wait_for_jumps(*s, ps);
      check("async.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
      auto r = serve_until(*s, a.dom, "data/xpe2e/loop_go-2", "data/xpe2e/loop_done-2", a.timeout_s);
      check("loopctl.2", r.has_value() && num(kv(*r), "ok") == 1 && num(kv(*r), "calls") == kCalls,
            r ? *r : "no data/xpe2e/loop_done-2");
      auto rs = s->ring_stats(a.dom);  // reads what is left in the rings
      const RingStats st = rs.value_or(RingStats{});
      check("async.count", (long)records == kCalls && other_cmd == 0 && st.drops == 0,
            fmt("%" PRIu64 " records (%" PRIu64 " with another cmd), %" PRIu64 " drops, the guest made %ld ioctls",
                records, other_cmd, st.drops, kCalls));
      auto u = ps.front().unregister();
      check("async.unregister", u.has_value(), u ? "ok" : u.error().what);
      const std::string diff = compare(hv, a.dom, before);
      check("text.restored.2", diff.empty(),
            diff.empty() ? fmt("lo_ioctl's first %zu bytes identical", kSnapBytes) : diff);
    }
  }

  // 3. The module unloaded while the jump is written.
  {
    auto p = s->probe(
        a.dom, "loop:lo_ioctl", [](HitContext&) { return 0; }, {}, ProbeOptions{ProbeMethod::Jump});
    if (!check("gone.register", p.has_value(), p ? "registered" : p.error().what)) return 1;
    const ProbeInfo i = must(p->info(), "info");
    std::vector<Probe> ps;
    ps.push_back(std::move(*p));
    const JumpsWritten jw = wait_for_jumps(*s, ps);
    check("gone.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
    const std::optional<Gva> j = jump_at(hv, a.dom, i);
    check("gone.text.jump", j.has_value(), j ? fmt("e9 at 0x%" PRIx64, j->value) : "no e9 to the detour");
    auto v = serve_until(*s, a.dom, "data/xpe2e/victim_unload", "data/xpe2e/victim", 120);
    // The key exists from the load ("loaded"): wait for its change.
    const auto end = Clock::now() + std::chrono::seconds(120);
    while (v && *v == "loaded" && Clock::now() < end) {
      (void)s->run_once(100);
      if (auto r = hv.xs_read(dom_path(a.dom, "data/xpe2e/victim"))) v = *r;
    }
    check("gone.rmmod", v && *v == "unloaded", v ? "data/xpe2e/victim " + *v : "no data/xpe2e/victim");
    const Gva at = j.value_or(i.address);
    must(hv.pause(a.dom), "pause");
    const std::string was = bytes_at(hv, a.dom, at);
    auto u = ps.front().unregister();
    const std::string now = bytes_at(hv, a.dom, at);
    must(hv.unpause(a.dom), "unpause");
    check("gone.unregister", u.has_value(), u ? "ok" : u.error().what);
    say("XPE2E-INFO: where lo_ioctl's jump was (0x%" PRIx64 "), after rmmod: %s", at.value, was.c_str());
    check("gone.nothing_written", was == now, "before unregistering: " + was + "; after: " + now);
  }
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG jump-module %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
