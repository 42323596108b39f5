// xpe2e-probe jump-image (issue 14): the tail-call proof from the guest's own kernel image, on a
// real guest (docs/probes.md "Tail calls proven from the kernel image").
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

// The point: the entry of dentry_unlink_inode (past its ftrace site). Every successful unlink
// of the workload kills its dentry through it (d_delete tail-jumps there on Debian 12's
// 6.1.0-50). Its only indirect jump is a tail call through the dentry's d_iput (a jmp to a
// retpoline thunk on 6.1), so from the guest's memory alone every region of it is refused (the
// indirect jump could land anywhere in it) and no short jump to an island serves it either
// (bench/kernel_coverage --proof lists its instructions: placed as jumps only with the proof).
constexpr const char* kImagePoint = "dentry_unlink_inode";
constexpr const char* kWithoutImage = "tail calls are proven only from the kernel image";

int cmd_jump_image(const Args& a) {
  auto t0 = Clock::now();
  // The symbols are the guest's own kallsyms, read from its memory (not Dom0's /proc/kallsyms,
  // the other scenarios' shortcut); no image yet.
  auto s = open_session(a, SessionOptions{ChannelKind::Guest}, false);
  hv::Hypervisor& hv = s->hypervisor();
  t0 = Clock::now();
  must(s->load_symbols_from_guest(a.dom), "load_symbols_from_guest");
  say("XPE2E-INFO: the guest's kallsyms read from its memory in %.1f s",
      std::chrono::duration<double>(Clock::now() - t0).count());
  const Gva fn = must(s->resolve(a.dom, kImagePoint), std::string("resolve ") + kImagePoint);
  const std::vector<TextRange> before = snapshot(hv, a.dom, {{kImagePoint, fn}});
  t0 = Clock::now();
  must(s->prepare_jump_probes(a.dom), "prepare_jump_probes");
  say("XPE2E-INFO: jump probes prepared (without the image) in %.1f s",
      std::chrono::duration<double>(Clock::now() - t0).count());
  std::uint64_t hits = 0;
  auto count = [&hits](HitContext&) {
    ++hits;
    return 0;
  };

  // Without the image: Jump is refused, and Fastest makes a trap probe; both say why.
  auto refused = s->probe(a.dom, kImagePoint, count, {}, ProbeOptions{ProbeMethod::Jump});
  check("without_image.jump_refused",
        !refused && refused.error().code == Errc::NotSupported &&
            refused.error().what.find(kWithoutImage) != std::string::npos,
        refused ? std::string("registered as a jump without the image") : refused.error().what);
  if (refused) (void)refused->unregister();
  {
    auto trap = s->probe(a.dom, kImagePoint, count, {}, ProbeOptions{ProbeMethod::Fastest});
    auto i = trap ? trap->info() : Result<ProbeInfo>(std::unexpected(trap.error()));
    check("without_image.fastest_is_trap",
          i && i->method == ProbeMethod::Trap && i->not_jump_because.find(kWithoutImage) != std::string::npos,
          i ? fmt("%s: %s", probe_method_name(i->method), i->not_jump_because.c_str()) : i.error().what);
    if (trap) {
      auto r = trap->unregister();
      check("without_image.unregister", r.has_value(), r ? "ok" : r.error().what);
    }
  }

  // The guest's kernel image: the ELF inside its vmlinuz, without a symbol table; it goes with
  // the guest's kallsyms loaded above.
  t0 = Clock::now();
  auto loaded = s->load_symbols(a.dom, a.image);
  if (!check("image.loaded", loaded.has_value(), loaded ? a.image : loaded.error().what)) return 1;
  say("XPE2E-INFO: %s loaded in %.1f s", a.image.c_str(), std::chrono::duration<double>(Clock::now() - t0).count());
  t0 = Clock::now();
  auto p = s->probe(a.dom, kImagePoint, count, {}, ProbeOptions{ProbeMethod::Fastest});
  if (!check("with_image.registered", p.has_value(), p ? "ok" : p.error().what)) return 1;
  const ProbeInfo info = must(p->info(), "info");
  say("XPE2E-INFO: with the image: %s at 0x%" PRIx64 " (%s) in %.1f s (the proof read from the image)",
      probe_method_name(info.method), info.address.value, info.instruction.c_str(),
      std::chrono::duration<double>(Clock::now() - t0).count());
  check("with_image.fastest_is_jump",
        info.method == ProbeMethod::Jump && info.mode == ExecMode::Detour && info.not_jump_because.empty(),
        fmt("%s%s%s", probe_method_name(info.method), info.not_jump_because.empty() ? "" : ": ",
            info.not_jump_because.c_str()));
  std::vector<Probe> probes;
  probes.push_back(std::move(*p));
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("with_image.written", jw.waiting == 0 && jw.written == 1,
        fmt("%ld written, %ld still wait after %.1f s", jw.written, jw.waiting, jw.seconds));
  auto view = must(GuestView::open(hv, a.dom), "GuestView::open");
  std::array<std::byte, 1> op{};
  check("text.jump", view->read(info.address, op).has_value() && op[0] == std::byte{0xe9},
        fmt("e9 at 0x%" PRIx64, info.address.value));

  auto done = run_workload(*s, a.dom, a.timeout_s);
  check("workload.done", done.has_value(), done ? *done : fmt("no data/xpe2e/done within %d s", a.timeout_s));
  auto w = kv(done.value_or(""));
  check("workload.ok", num(w, "ok") == 1, "the guest's own results are unchanged (ok=1)");
  check("with_image.hits", (long)hits >= num(w, "unlink_ok") && num(w, "unlink_ok") > 0,
        fmt("%" PRIu64 " hits, at least one per successful unlink (%ld) expected", hits, num(w, "unlink_ok")));
  auto h = ctl_header(hv, a.dom);
  check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  auto r = probes.front().unregister();
  check("unregister", r.has_value(), r ? "ok" : r.error().what);
  probes.clear();
  const std::string diff = compare(hv, a.dom, before);
  check("text.restored", diff.empty(),
        diff.empty() ? fmt("%s: %zu bytes byte-identical", kImagePoint, kSnapBytes) : diff);
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG jump-image %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
