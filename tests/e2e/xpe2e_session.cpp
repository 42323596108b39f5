// What xpe2e-probe's commands share (declared in xpe2e_probe.hpp): kernel text snapshots, the
// session on a domain whose guest module is ready, the workload window, the trap bytes of armed
// points, the wait for jump probes' jumps, and stall diagnostics.
#include <cinttypes>
#include <fstream>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

std::string hexbytes(const std::vector<std::byte>& b, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < b.size() && i < n; ++i) s += fmt("%02x", static_cast<unsigned>(b[i]));
  return s;
}

// ---- kernel text snapshots ------------------------------------------------------------

std::vector<TextRange> snapshot(hv::Hypervisor& hv, DomId dom, const std::vector<std::pair<std::string, Gva>>& fns) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  std::vector<TextRange> out;
  for (auto& [name, addr] : fns) {
    TextRange r{name, addr, std::vector<std::byte>(kSnapBytes)};
    must(view->read(addr, r.bytes), "read kernel text of " + name);
    out.push_back(std::move(r));
  }
  return out;
}

void save(const std::vector<TextRange>& s, const std::string& file) {
  std::ofstream o(file);
  for (auto& r : s) o << r.name << ' ' << std::hex << r.addr.value << ' ' << hexbytes(r.bytes, kSnapBytes) << '\n';
  if (!o) fatal("cannot write " + file);
}

std::vector<TextRange> load(const std::string& file) {
  std::ifstream in(file);
  std::vector<TextRange> out;
  std::string name, addr, hex;
  while (in >> name >> addr >> hex) {
    TextRange r{name, Gva{std::stoull(addr, nullptr, 16)}, {}};
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
      r.bytes.push_back(static_cast<std::byte>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    out.push_back(std::move(r));
  }
  if (out.empty()) fatal("no snapshot in " + file);
  return out;
}

// Names the first differing range, or "".
std::string compare(hv::Hypervisor& hv, DomId dom, const std::vector<TextRange>& before) {
  auto view = GuestView::open(hv, dom);
  if (!view) return "GuestView::open: " + view.error().what;
  for (auto& r : before) {
    std::vector<std::byte> now(r.bytes.size());
    if (auto rd = (*view)->read(r.addr, now); !rd) return r.name + ": " + rd.error().what;
    for (std::size_t i = 0; i < now.size(); ++i)
      if (now[i] != r.bytes[i])
        return fmt("%s+0x%zx: %02x, was %02x", r.name.c_str(), i, static_cast<unsigned>(now[i]),
                   static_cast<unsigned>(r.bytes[i]));
  }
  return "";
}

// Everything before the probes: the module's keys, the session, the symbols.
std::unique_ptr<Session> open_session(const Args& a, SessionOptions o, bool dom0_kallsyms) {
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto state = wait_key(*hvp, dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  check("module.state", state && *state == XENPROBES_XS_STATE_READY,
        state ? "state=" + *state : "no data/xenprobes/state within 120 s");
  if (!state) fatal("the guest module never published its keys");
  auto rel = hvp->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RELEASE));
  auto ktext = hvp->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_KERNEL_TEXT));
  std::string dom0_rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, dom0_rel);
  check("module.release", rel && *rel == dom0_rel,
        "guest " + (rel ? *rel : std::string("?")) + ", Dom0 " + dom0_rel +
            " (Dom0's kallsyms serve only the same build)");
  say("XPE2E-INFO: module kernel-text=%s; %s", ktext ? ktext->c_str() : "?", describe(ctl_header(*hvp, a.dom)).c_str());
  o.spin_us = a.spin_us;
  if (a.spin_us)
    say("XPE2E-INFO: Dom0 polls the mailboxes for %u us after each hit (SessionOptions::spin_us)", a.spin_us);
  auto s = must(Session::open(std::move(hvp), o), "Session::open");
  if (dom0_kallsyms) must(s->load_symbols(a.dom, "/proc/kallsyms"), "load_symbols(/proc/kallsyms)");
  auto ch = s->channel_name(a.dom);
  check("channel", ch && (a.channel == "auto" ? *ch == "guest" : *ch == a.channel),
        ch ? "serving channel: " + *ch : "channel_name: " + ch.error().what);
  return s;
}

// Handles hits until the workload's data/xpe2e/done appears.
std::optional<std::string> run_workload(Session& s, DomId dom, int seconds) {
  must(s.hypervisor().xs_write(dom_path(dom, "data/xpe2e/go"), "1"), "write data/xpe2e/go");
  auto t0 = Clock::now();
  auto end = t0 + std::chrono::seconds(seconds);
  std::optional<std::string> done;
  while (Clock::now() < end) {
    auto r = s.run_once(100);
    if (!r) {
      check("run_once", false, r.error().what);
      break;
    }
    // Only between hits (as the benchmark does): on Debian 13's Dom0 a xenstore read after
    // every hit made the guest wait on it (docs/e2e.md "Debian 13").
    if (*r > 0) continue;
    if (auto d = s.hypervisor().xs_read(dom_path(dom, "data/xpe2e/done"))) {
      done = *d;
      break;
    }
  }
  // Hits are answered synchronously, but drain what is pending anyway.
  (void)s.run_once(0);
  say("XPE2E-INFO: workload window %.1f s", std::chrono::duration<double>(Clock::now() - t0).count());
  return done;
}

// The trap byte each channel writes: int3 (guest, vmevent agentless), ICEBP (debugger).
// ICEBP for the debugger channel and the vmevent channel's default mode; int3 for the guest channel.
std::uint8_t trap_byte_of(const std::string& channel) { return channel == "guest" ? 0xcc : 0xf1; }

bool first_bytes_are_traps(hv::Hypervisor& hv, DomId dom, const std::vector<Gva>& points, std::uint8_t trap,
                           std::string* detail) {
  auto view = GuestView::open(hv, dom);
  if (!view) {
    *detail = view.error().what;
    return false;
  }
  for (Gva p : points) {
    auto b = (*view)->read_u64(p);
    if (!b || (*b & 0xff) != trap) {
      *detail =
          fmt("%#" PRIx64 " holds %s", p.value, b ? fmt("%02" PRIx64, *b & 0xff).c_str() : b.error().what.c_str());
      return false;
    }
  }
  *detail = fmt("%zu probe points hold the trap byte %02x", points.size(), trap);
  return true;
}

JumpsWritten wait_for_jumps(Session& s, std::vector<Probe>& probes) {
  auto t0 = Clock::now();
  JumpsWritten w;
  for (;;) {
    w = JumpsWritten{};
    for (Probe& p : probes)
      if (auto i = p.info(); !i || i->method == ProbeMethod::Jump) ++(i && !i->jump_pending ? w.written : w.waiting);
    w.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (w.waiting == 0 || w.seconds >= 120) return w;
    (void)s.run_once(100);
  }
}

// The points of ps that hold a trap byte: all but jump probes' (--method fastest), whose
// bytes are the module's redirect, then a jump.
std::vector<Gva> trap_points(ProbeSet& ps) {
  std::vector<Gva> jumps, out;
  for (auto& p : ps.probes)
    if (auto i = p.info(); i && i->method == ProbeMethod::Jump) jumps.push_back(i->address);
  for (Gva g : ps.points)
    if (std::find(jumps.begin(), jumps.end(), g) == jumps.end()) out.push_back(g);
  if (!jumps.empty())
    say("XPE2E-INFO: %zu probe points are jump probes (--method %s)", jumps.size(), g_args.method.c_str());
  return out;
}

// Diagnostics for a guest that stopped making progress under armed probes: the domain's
// state, each vCPU's rip/rsp, the module's counters and every mailbox, as Dom0 sees them now.
void dump_stall(hv::Hypervisor& hv, DomId dom, const char* why) {
  say("XPE2E-INFO: ---- stall diagnostics, domain %u: %s ----", dom.value, why);
  auto info = hv.domain_info(dom);
  if (!info) {
    say("XPE2E-INFO: domain_info: %s", info.error().what.c_str());
    return;
  }
  say("XPE2E-INFO: paused=%d dying=%d shutdown=%d crashed=%d vcpus=%u online=%u", info->paused, info->dying,
      info->shutdown, info->crashed, info->vcpus, info->online_vcpus);
  for (unsigned v = 0; v < info->vcpus; ++v) {
    auto r = hv.get_vcpu_regs(dom, VcpuId{v});
    if (r)
      say("XPE2E-INFO: vcpu %u: rip=%#" PRIx64 " rsp=%#" PRIx64 " rflags=%#" PRIx64 " rax=%#" PRIx64 " cr3=%#" PRIx64
          " kernel_mode=%d",
          v, r->rip, r->rsp, r->rflags, r->rax, r->cr3, r->kernel_mode);
    else say("XPE2E-INFO: vcpu %u: %s", v, r.error().what.c_str());
  }
  auto h = ctl_header(hv, dom);
  say("XPE2E-INFO: module: %s", describe(h).c_str());
  auto addr = hv.xs_read(dom_path(dom, XENPROBES_XS_DIR "/" XENPROBES_XS_CONTROL_ADDR));
  auto view = GuestView::open(hv, dom);
  if (!h || !addr || !view) return;
  Gva ctl{std::stoull(*addr, nullptr, 16)};
  for (std::uint32_t v = 0; v < h->nr_mailboxes && v < 64; ++v) {
    xenprobes_mailbox mb{};
    Gva at{ctl.value + h->mailbox_offset + std::uint64_t{v} * sizeof mb};
    if (auto r = (*view)->read(at, std::as_writable_bytes(std::span(&mb, 1))); !r) {
      say("XPE2E-INFO: mailbox %u: %s", v, r.error().what.c_str());
      continue;
    }
    say("XPE2E-INFO: mailbox %u: state=%u seq=%u answer_seq=%u trap=%#" PRIx64 " regs.rip=%#" PRIx64
        " regs.rsp=%#" PRIx64,
        v, mb.state, mb.seq, mb.answer_seq, mb.trap, mb.regs.rip, mb.regs.rsp);
  }
}

}  // namespace xpe2e::probe
