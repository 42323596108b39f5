// xpe2e-probe: the Dom0 side of the end-to-end scenarios (tools/e2e/run.sh runs it inside a
// real Dom0 under QEMU, linked against the installed libxenprobes).
//
//   xpe2e-probe probe   --domid D [--channel auto|guest|...] [--timeout S]
//       Waits for the guest module, registers XP and XrP probes on real kernel functions,
//       lets the DomU workload run (xenstore data/xpe2e/go), and compares every count with
//       what the workload reports (data/xpe2e/done); unregisters and checks that the kernel
//       text is byte-identical to before.
//   xpe2e-probe jump    --domid D [--timeout S]
//       Jump probes (issue 14) on the guest channel: registered as jumps, the jumps written
//       once the module confirmed quiescence, every call counted, the text restored.
//   xpe2e-probe jump-island --domid D [--timeout S]
//       A short jump to an island (issue 14, protocol.h "Short jumps to islands") on a function
//       of the workload's openat/unlink/close paths: eb rel8 and the island's e9 written, hits
//       counted, the workload's results unchanged, region and island restored.
//   xpe2e-probe kill    --domid D --snapshot FILE [--die-after-hits N]
//                       [--die-in getppid|call|filp|register|unregister]
//       The same probes, then SIGKILLs itself from inside a handler after N hits (a vCPU is
//       waiting for the answer at that moment): getppid's pre-handler (before the XrP entry
//       there), the handler of the call inside __x64_sys_getppid (the XrP on getppid then has
//       that call in flight), or do_filp_open's on the workload's file (the XrP on
//       __x64_sys_openat has that call in flight). Or right after the N-th probe is registered
//       (the workload not started: the scenario starts it), or, once the workload is done,
//       right after the N-th probe is unregistered. The text snapshot goes to FILE first.
//   xpe2e-probe verify-text --domid D --snapshot FILE [--timeout S] [--channel C]
//       Waits until the kernel text equals the snapshot again and checks who restored it: the
//       module's fail-safe (guest channel: dom0_gone, timeouts), or with --channel debugger or
//       vmevent the session's guardian (the domain neither paused nor debugged, the module
//       untouched).
//   xpe2e-probe refuse-debugger --domid D
//       SessionOptions{Debugger} must fail with the CONFIG_GDBSX message and change nothing.
//   xpe2e-probe pair    --domid A --domid2 B [--timeout S] [--destroy-after-hits N]
//       One session probes two domains at once (XP with pre+post and XrP on getppid, XrP on
//       do_unlinkat, counters per domain). Both workloads run; after N (default 20) getppid
//       hits in B it runs `xl destroy B` while it keeps serving hits; B's probes must be
//       dropped (info() fails, unregister() succeeds), A's counts must equal A's calls exactly
//       and A's text come back byte-identical.
//   xpe2e-probe bench   --domid D [--channel C] [--configs native,kprobe,kretprobe,xp,xrp]
//                       [--round S] [--rounds N] [--untar N] [--timeout S]
//       The paper's Table 1 side by side (tools/bench/table1.sh): for each config in turn,
//       arms it (xp, xrp: our probes on the measured syscalls' functions and on do_mkdirat and
//       chmod_common; kprobe, kretprobe: the guest arms its own tracefs kprobe events; native:
//       nothing), lets the guest's loop measure getppid/read/write/open latencies and a small
//       tar extraction (xpe2e-workload bench), disarms, checks the text is restored and every
//       measured call was seen by the probes, and prints "XPE2E-BENCH ..." lines.
//   xpe2e-probe safety  --domid D [--channel guest|vmevent] [--hazards extable,ftrace,statickey,hookpath]
//                       (or --hazards slotunload alone: it unloads the guest module)
//                       [--points P1,P2] [--timeout S]
//       Probe safety (issue 12, docs/e2e.md "Probe safety"): for each hazard class, finds the
//       points in the running guest itself (the kernel's own tables, read here, independently of
//       the library), registers probes there and drives the guest's matching phase
//       (xpe2e-workload safety). Expected: the library refuses points the guest patches or
//       fixes up at run time (`rule '<name>'` in the message) and points on the guest module's
//       own int3 path (guest channel); it moves a probe on a function's ftrace site past it,
//       and that probe still counts every call; the guest's phases all succeed. On the vmevent
//       channel (--hazards hookpath) the hook-path points must register and count instead.
//   xpe2e-probe sweep   --domid D [--batch N] [--cap N] [--console FILE] ...
//       The real-kernel sweep (issue 12): every instruction of a few hundred kernel functions
//       asked for, batch by batch, under the guest's mixed workload (xpe2e_sweep.cpp).
//
// Every check prints one line "XPE2E-CHECK <name> PASS|FAIL <detail>"; the last line is
// "XPE2E-PROG <command> PASS|FAIL <failed checks>". Exit status 0 only when all passed.
#include <capstone/capstone.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_text.hpp"

using namespace xenprobes;
using namespace xpe2e;

namespace {

std::string hexbytes(const std::vector<std::byte>& b, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < b.size() && i < n; ++i) s += fmt("%02x", static_cast<unsigned>(b[i]));
  return s;
}

struct Args {
  std::string cmd;
  DomId dom{0};
  DomId dom2{0};                // pair: the domain destroyed while probed
  unsigned destroy_after = 20;  // pair: B's getppid hits before `xl destroy B`
  std::string channel = "auto";
  int timeout_s = 240;
  std::string snapshot;
  unsigned die_after = 50;
  std::string die_in = "getppid";  // kill: where it SIGKILLs itself (getppid, call, filp, register, unregister)
  bool exercise_attached = false;  // probe: the guest forks/execs while the session is still open
  std::string skip;  // comma-separated: xrp, branch, boosted, openat, openat2, filp, skipped (to bisect a failure)
  std::string configs = "native,kprobe,kretprobe,xp,xrp";  // bench
  double round_s = 1.0;                                    // bench: seconds per measured round
  int rounds = 3;                                          // bench: rounds per syscall
  int untar = 3;                                           // bench: tar extractions per config
  int wait_ms = 100;                                       // bench: run_once's timeout
  unsigned spin_us = 0;  // SessionOptions::spin_us (protocol.h "Spinning"): every command
  // safety: the classes, in order. Without the rules, statickey's BUG() leaves text_mutex
  // held (ftrace would then hang) and hookpath kills the guest: each goes after the others.
  std::string hazards = "extable,ftrace,statickey,hookpath";
  std::string points;  // safety: hookpath points (default all)
  // probe, kill: how the probes without a post-handler go in (trap, or fastest: jump probes
  // where the point allows, issue 14).
  std::string method = "trap";
};

Args g_args;
// The options of the probes that have no post-handler (--method).
ProbeOptions pre_only() { return ProbeOptions{g_args.method == "fastest" ? ProbeMethod::Fastest : ProbeMethod::Trap}; }
bool skipped(const char* what) {
  return ("," + g_args.skip + ",").find(std::string(",") + what + ",") != std::string::npos;
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2)
    fatal(
        "usage: xpe2e-probe "
        "probe|jump|jump-island|async|kill|verify-text|refuse-debugger|pair|bench|safety|sweep|int3-intercept "
        "--domid D ...");
  a.cmd = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--exercise-attached") {
      a.exercise_attached = true;
      continue;
    }
    if (i + 1 >= argc) fatal("option " + k + " needs a value");
    std::string v = argv[++i];
    if (k == "--domid") a.dom = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--domid2") a.dom2 = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--destroy-after-hits") a.destroy_after = static_cast<unsigned>(std::stoul(v));
    else if (k == "--channel") a.channel = v;
    else if (k == "--timeout") a.timeout_s = std::stoi(v);
    else if (k == "--snapshot") a.snapshot = v;
    else if (k == "--skip") a.skip = v;
    else if (k == "--die-after-hits") a.die_after = static_cast<unsigned>(std::stoul(v));
    else if (k == "--die-in") a.die_in = v;
    else if (k == "--configs") a.configs = v;
    else if (k == "--round") a.round_s = std::stod(v);
    else if (k == "--rounds") a.rounds = std::stoi(v);
    else if (k == "--untar") a.untar = std::stoi(v);
    else if (k == "--wait-ms") a.wait_ms = std::stoi(v);
    else if (k == "--spin-us") a.spin_us = static_cast<unsigned>(std::stoul(v));
    else if (k == "--hazards") a.hazards = v;
    else if (k == "--method") a.method = v;
    else if (k == "--points") a.points = v;
    else fatal("unknown option " + k);
  }
  if (!a.dom.value) fatal("--domid is required");
  if (a.method != "trap" && a.method != "fastest") fatal("--method: trap or fastest");
  if (a.die_in != "getppid" && a.die_in != "call" && a.die_in != "filp" && a.die_in != "register" &&
      a.die_in != "unregister")
    fatal("--die-in: getppid, call, filp, register or unregister");
  if (a.cmd == "pair" && (!a.dom2.value || a.dom2 == a.dom)) fatal("pair: --domid2 (another domain) is required");
  return a;
}

// ---- kernel text snapshots ------------------------------------------------------------

constexpr std::size_t kSnapBytes = 512;

struct TextRange {
  std::string name;
  Gva addr;
  std::vector<std::byte> bytes;
};

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

// ---- finding a relative call in a function (capstone, like the library, but independent) ----

struct Insn {
  Gva addr;
  unsigned size = 0;
  std::uint8_t first = 0;
  std::string text;
};

// The function's first instructions, decoded from the running guest's text.
std::vector<Insn> disasm(hv::Hypervisor& hv, DomId dom, const char* name, Gva fn, std::size_t max) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  std::vector<std::byte> b(256);
  must(view->read(fn, b), std::string("read the bytes of ") + name);
  std::vector<Insn> out;
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  cs_insn* insn = nullptr;
  std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), fn.value, max, &insn);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(
        Insn{Gva{insn[i].address}, insn[i].size, insn[i].bytes[0], fmt("%s %s", insn[i].mnemonic, insn[i].op_str)});
    say("XPE2E-INFO: %s+0x%02" PRIx64 ": %s", name, insn[i].address - fn.value, out.back().text.c_str());
    if (insn[i].id == X86_INS_RET || insn[i].id == X86_INS_INT3 || insn[i].id == X86_INS_JMP) break;
  }
  if (n) cs_free(insn, n);
  cs_close(&h);
  return out;
}

// The first nop after the function's first ret within its first 256 bytes (the padding
// before the next function), decoded from the running guest's text; nullopt when none.
std::optional<Gva> padding_nop(hv::Hypervisor& hv, DomId dom, Gva fn) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  std::vector<std::byte> b(256);
  must(view->read(fn, b), "read the bytes after a function's ret");
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  cs_insn* insn = nullptr;
  std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), fn.value, 0, &insn);
  std::optional<Gva> out;
  bool after_ret = false;
  for (std::size_t i = 0; i < n && !out; ++i) {
    if (insn[i].id == X86_INS_RET) after_ret = true;
    else if (after_ret && insn[i].id == X86_INS_NOP) out = Gva{insn[i].address};
  }
  if (n) cs_free(insn, n);
  cs_close(&h);
  return out;
}

// ---- the probe set shared by `probe` and `kill` -----------------------------------------

constexpr const char* kTarget = "/tmp/xpe2e-target";
constexpr std::uint64_t kPtRegsSi = 104;  // offsetof(struct pt_regs, si), x86-64

struct Counters {
  std::uint64_t getppid_pre = 0, getppid_post = 0, branch = 0, boosted = 0;
  std::uint64_t openat_hits = 0, openat2_pre = 0, openat2_post = 0;
  std::uint64_t openat_target = 0, openat_other = 0, openat_read_errors = 0;
  std::uint64_t filp_target = 0, filp_other = 0, filp_read_errors = 0;
  std::uint64_t ret_getppid_entries = 0, ret_getppid_returns = 0;
  std::map<std::uint64_t, std::uint64_t> getppid_rax, unlink_rax;
  std::uint64_t ret_unlink_returns = 0;
  std::uint64_t ret_openat_entries = 0, ret_openat_returns = 0, ret_openat_failed = 0;
  std::uint64_t skipped_hits = 0;
  std::string first_read_error;
  // Post-handlers that saw a rip other than the instruction after the probed one.
  std::uint64_t post_rip_wrong = 0, openat2_post_rip_wrong = 0;
  std::string first_post_rip;
};

struct ProbeSet {
  std::vector<Probe> probes;
  std::vector<std::pair<std::string, Gva>> functions;  // for the text snapshot
  std::vector<Gva> points;                             // every probe address
  Probe *getppid = nullptr, *boosted = nullptr, *branch = nullptr, *openat = nullptr, *openat2 = nullptr,
        *filp = nullptr, *ret_getppid = nullptr, *ret_unlink = nullptr, *ret_openat = nullptr, *skipped = nullptr;
};

// Kept separate from ProbeSet so handlers can capture it by pointer before the set exists.
Counters g_c;
unsigned g_die_after = 0;
std::string g_die_in;

// `where` names the handler calling (or register, unregister); `hits` its count so far.
void maybe_die(const char* where, std::uint64_t hits) {
  if (g_die_after && g_die_in == where && hits == g_die_after) {
    const std::uint64_t getppid = g_c.ret_getppid_entries - g_c.ret_getppid_returns,
                        openat = g_c.ret_openat_entries - g_c.ret_openat_returns;
    const bool in_handler = g_die_in != "register" && g_die_in != "unregister";
    say("XPE2E-KILL: SIGKILL to myself %s %s %u %s%s; XrP calls in flight: %" PRIu64 " (__x64_sys_getppid %" PRIu64
        ", __x64_sys_openat %" PRIu64 ")",
        in_handler ? "inside the" : "right after", where, g_die_after, in_handler ? "handler's hits" : "probes",
        in_handler ? " (a vCPU waits for this answer)" : "", getppid + openat, getppid, openat);
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
  }
}

void register_probes(Session& s, DomId dom, ProbeSet& ps) {
  auto resolve = [&](const char* sym) { return must(s.resolve(dom, sym), std::string("resolve ") + sym); };
  Gva getppid = resolve("__x64_sys_getppid");
  Gva openat = resolve("__x64_sys_openat");
  Gva filp = resolve("do_filp_open");
  Gva unlink = resolve("do_unlinkat");
  ps.functions = {
      {"__x64_sys_getppid", getppid}, {"__x64_sys_openat", openat}, {"do_filp_open", filp}, {"do_unlinkat", unlink}};
  auto keep = [&](Probe p) -> Probe* {
    ps.probes.push_back(std::move(p));
    maybe_die("register", ps.probes.size());  // kill --die-in register
    return &ps.probes.back();
  };
  ps.probes.reserve(16);  // handles are referred to by pointer below: no reallocation
  // Decode before anything is patched (a probe's int3 would stop the decoding).
  auto ins = disasm(s.hypervisor(), dom, "__x64_sys_getppid", getppid, 40);
  auto oi = disasm(s.hypervisor(), dom, "__x64_sys_openat", openat, 4);
  const std::optional<Gva> pad = padding_nop(s.hypervisor(), dom, getppid);

  // XP with a pre- and a post-handler on the syscall's entry. The library places it past
  // the function's ftrace site (docs/probes.md, "Entry placement"); the post-handler must see
  // rip at the instruction after the placed one.
  auto placed = std::make_shared<std::uint64_t>(getppid.value);
  auto post_rip = std::make_shared<std::uint64_t>(0);
  ps.getppid = keep(must(s.probe(
                             dom, getppid,
                             [](HitContext&) {
                               ++g_c.getppid_pre;
                               maybe_die("getppid", g_c.getppid_pre);
                               return 0;
                             },
                             [post_rip](HitContext& c) {
                               ++g_c.getppid_post;
                               if (c.regs().rip != *post_rip && ++g_c.post_rip_wrong == 1)
                                 g_c.first_post_rip = fmt("getppid post-handler rip %#" PRIx64 ", expected %#" PRIx64,
                                                          c.regs().rip, *post_rip);
                             }),
                         "XP on __x64_sys_getppid"));
  *placed = ps.getppid->info()->address.value;
  for (const Insn& i : ins)
    if (i.addr.value == *placed) *post_rip = i.addr.value + i.size;
  check("xp.getppid.next", *post_rip != 0,
        fmt("the instruction after the placed probe: %#" PRIx64 " (0: the placed address is not an instruction "
            "boundary of the test's own decoding)",
            *post_rip));
  check(
      "xp.getppid.placed", *placed != getppid.value && ps.getppid->info()->requested == getppid,
      fmt("asked for at 0x%" PRIx64 ", placed at __x64_sys_getppid+0x%" PRIx64 " (%s): %s", getppid.value,
          *placed - getppid.value, ps.getppid->info()->instruction.c_str(), ps.getppid->info()->moved_because.c_str()));
  ps.points.push_back(Gva{*placed});

  // XP on the function's first relative call (Dom0 emulates it: pushes the return address
  // on the guest's stack) and on the instruction the call returns to (a plain instruction:
  // boosted, pre-handler only). Not on the 1-byte `push rbx` right before the call: channels
  // that find stops by rip == probe + 1 (debugger) refuse a probe after a probed 1-byte
  // instruction.
  // A call right after the placed entry probe when that is a 1-byte instruction (`push rbx`
  // on Debian's 6.1) is the continuation the debugger channel copies with it: the next call.
  std::uint64_t not_before = *placed;
  for (const Insn& i : ins)
    if (i.addr.value == *placed && i.size == 1) not_before = *placed + 2;
  const Insn* call = nullptr;
  const Insn* after_call = nullptr;
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (ins[i].size == 5 && ins[i].first == 0xe8 && ins[i].addr.value >= not_before) {
      call = &ins[i];
      if (i + 1 < ins.size()) after_call = &ins[i + 1];
      break;
    }
  if (!after_call && !skipped("boosted"))
    check("boosted.found", false,
          "no instruction after a call rel32 in __x64_sys_getppid: the boosted probe is missing");
  if (after_call && !skipped("boosted")) {
    ps.boosted = keep(must(s.probe(
                               dom, after_call->addr,
                               [](HitContext&) {
                                 ++g_c.boosted;
                                 return 0;
                               },
                               {}, pre_only()),
                           "XP on the return site of __x64_sys_getppid's first call (" + after_call->text + ")"));
    ps.points.push_back(after_call->addr);
  }
  if (skipped("branch")) {
  } else if (call) {
    ps.branch = keep(must(s.probe(
                              dom, call->addr,
                              [](HitContext&) {
                                ++g_c.branch;
                                maybe_die("call", g_c.branch);
                                return 0;
                              },
                              {}, pre_only()),
                          "XP on the call in __x64_sys_getppid (" + call->text + ")"));
    ps.points.push_back(call->addr);
  } else {
    check("branch.found", false, "no call rel32 in __x64_sys_getppid before its first ret/jmp");
  }

  // XP on openat: the wrapper gets struct pt_regs * in rdi; the user's filename is regs->si.
  if (!skipped("openat")) {
    ps.openat = keep(must(s.probe(dom, openat,
                                  [](HitContext& c) {
                                    ++g_c.openat_hits;
                                    auto p = c.read_u64(Gva{c.regs().rdi + kPtRegsSi});
                                    Result<std::string> name = p ? c.read_string(Gva{*p}, 256)
                                                                 : Result<std::string>(std::unexpected(p.error()));
                                    if (!name) {
                                      ++g_c.openat_read_errors;
                                      if (g_c.first_read_error.empty())
                                        g_c.first_read_error = "openat user filename: " + name.error().what;
                                    } else if (*name == kTarget) {
                                      ++g_c.openat_target;
                                    } else {
                                      ++g_c.openat_other;
                                    }
                                    return 0;
                                  }),  // a trap: openat2's post-handler shares its point
                          "XP on __x64_sys_openat"));
    ps.points.push_back(openat);
  }

  // A pre- and post-handler on a plain instruction: openat's first one past its entry, where
  // the entry probe lands too. Past the ftrace site (nop5) on Debian 12's 6.1, the second
  // instruction; past endbr64 and the ftrace site on Debian 13's 6.12 (IBT), the third.
  std::size_t o2 = 0;
  if (o2 < oi.size() && oi[o2].text.starts_with("endbr64")) ++o2;
  if (o2 < oi.size() && oi[o2].size == 5 && oi[o2].text.starts_with("nop")) ++o2;
  if (!skipped("openat2")) {
    if (o2 > 0 && o2 < oi.size()) {
      const std::uint64_t next = oi[o2].addr.value + oi[o2].size;
      ps.openat2 =
          keep(must(s.probe(
                        dom, oi[o2].addr,
                        [](HitContext&) {
                          ++g_c.openat2_pre;
                          return 0;
                        },
                        [next](HitContext& c) {
                          ++g_c.openat2_post;
                          if (c.regs().rip != next && ++g_c.openat2_post_rip_wrong == 1 && g_c.first_post_rip.empty())
                            g_c.first_post_rip =
                                fmt("openat post-handler rip %#" PRIx64 ", expected %#" PRIx64, c.regs().rip, next);
                        }),
                    "XP with a post-handler on __x64_sys_openat's first instruction past its entry"));
      ps.points.push_back(oi[o2].addr);
    } else {
      check("openat2.found", false,
            "__x64_sys_openat: no instruction past an ftrace site at its entry: the trap-after probe is missing");
    }
  }

  // XP on do_filp_open(dfd, struct filename *, op): the kernel's copy of the name.
  if (!skipped("filp")) {
    ps.filp = keep(must(s.probe(
                            dom, filp,
                            [](HitContext& c) {
                              auto p = c.read_u64(Gva{c.regs().rsi});
                              Result<std::string> name =
                                  p ? c.read_string(Gva{*p}, 256) : Result<std::string>(std::unexpected(p.error()));
                              if (!name) {
                                ++g_c.filp_read_errors;
                                if (g_c.first_read_error.empty())
                                  g_c.first_read_error = "do_filp_open kernel filename: " + name.error().what;
                              } else if (*name == kTarget) {
                                ++g_c.filp_target;
                                maybe_die("filp", g_c.filp_target);
                              } else {
                                ++g_c.filp_other;
                              }
                              return 0;
                            },
                            {}, pre_only()),
                        "XP on do_filp_open"));
    ps.points.push_back(filp);
  }

  // XrP on getppid (coexists with the XP there) and on do_unlinkat.
  if (!skipped("xrp")) {
    ps.ret_getppid = keep(must(s.ret_probe(
                                   dom, getppid,
                                   [](HitContext&, std::span<std::byte>) {
                                     ++g_c.ret_getppid_entries;
                                     return 0;
                                   },
                                   [](HitContext& c, std::span<std::byte>) {
                                     ++g_c.ret_getppid_returns;
                                     ++g_c.getppid_rax[c.regs().rax];
                                   }),
                               "XrP on __x64_sys_getppid"));
    ps.ret_unlink = keep(must(s.ret_probe(dom, unlink, {},
                                          [](HitContext& c, std::span<std::byte>) {
                                            ++g_c.ret_unlink_returns;
                                            ++g_c.unlink_rax[c.regs().rax];
                                          }),
                              "XrP on do_unlinkat"));
    ps.points.push_back(unlink);
    // The outer call of do_filp_open: in flight while that handler runs (kill --die-in filp).
    ps.ret_openat = keep(must(s.ret_probe(
                                  dom, openat,
                                  [](HitContext&, std::span<std::byte>) {
                                    ++g_c.ret_openat_entries;
                                    return 0;
                                  },
                                  [](HitContext& c, std::span<std::byte>) {
                                    ++g_c.ret_openat_returns;
                                    if (static_cast<std::int32_t>(c.regs().rax) < 0) ++g_c.ret_openat_failed;
                                  }),
                              "XrP on __x64_sys_openat"));
  }

  // XP on a nop: the alignment padding after __x64_sys_getppid's ret (the kernel's straight-line
  // code has no executed nop past the ftrace site, which the library moves probes off). Its
  // mode must be skipped, and the guest never runs it: no hit.
  if (!skipped("skipped")) {
    if (const auto& nop = pad) {
      ps.skipped = keep(must(s.probe(dom, *nop,
                                     [](HitContext&) {
                                       ++g_c.skipped_hits;
                                       return 0;
                                     }),
                             fmt("XP on the nop at %#" PRIx64 " after __x64_sys_getppid's ret", nop->value)));
    } else {
      check("skipped.found", false, "no nop after __x64_sys_getppid's ret: the skipped-mode probe is missing");
    }
  }

  // The armed points are where the library placed the probes: one asked for at a function's
  // start sits past its ftrace site.
  ps.points.clear();
  for (Probe* p : {ps.getppid, ps.boosted, ps.branch, ps.openat, ps.openat2, ps.filp, ps.ret_getppid, ps.ret_unlink,
                   ps.ret_openat, ps.skipped}) {
    if (!p) continue;
    auto i = p->info();
    if (!check(fmt("probe.%" PRIu64 ".info", p->id()), i.has_value(), i ? "registered" : i.error().what)) continue;
    say("XPE2E-INFO: probe %" PRIu64 ": %s mode=%s slot=%#" PRIx64 " trampoline=%#" PRIx64 "%s%s", p->id(),
        i->instruction.c_str(), mode_name(i->mode), i->slot.value, i->trampoline.value,
        i->moved_because.empty() ? "" : "; moved: ", i->moved_because.c_str());
    if (std::find(ps.points.begin(), ps.points.end(), i->address) == ps.points.end()) ps.points.push_back(i->address);
  }
  // Each execution mode on real kernel text (docs/probes.md): a post-handler on a copied
  // instruction makes its slot end in a trap (trap-after), and so does any other probe
  // sharing that point.
  auto mode_is = [](const char* name, Probe* p, ExecMode want, const char* why) {
    if (!p) return;
    auto i = p->info();
    // --method fastest: a pre-handler-only probe may be a jump probe instead (its detour).
    if (i && g_args.method == "fastest" && i->method == ProbeMethod::Jump) {
      check(std::string("xp.") + name + ".mode", i->mode == ExecMode::Detour,
            fmt("a jump probe, mode=%s: %s", mode_name(i->mode), i->instruction.c_str()));
      return;
    }
    check(std::string("xp.") + name + ".mode", i && i->mode == want,
          i ? fmt("mode=%s, expected %s (%s): %s", mode_name(i->mode), mode_name(want), why, i->instruction.c_str())
            : i.error().what);
  };
  mode_is("getppid", ps.getppid, ExecMode::TrapAfter, "a post-handler on a copied instruction");
  mode_is("boosted", ps.boosted, ExecMode::Boosted, "a plain instruction, pre-handler only");
  mode_is("call", ps.branch, ExecMode::Emulated, "a call rel32: Dom0 pushes the return address");
  mode_is("openat2", ps.openat2, ExecMode::TrapAfter, "a post-handler on a copied instruction");
  mode_is("skipped", ps.skipped, ExecMode::Skipped, "a nop");
  if (ps.openat && ps.openat2 && ps.openat->info() && ps.openat2->info() &&
      ps.openat->info()->address == ps.openat2->info()->address)
    mode_is("openat", ps.openat, ExecMode::TrapAfter,
            "placed on the first instruction past the entry, with its post-handler");
}

// Everything before the probes: the module's keys, the session, the symbols.
std::unique_ptr<Session> open_session(const Args& a, SessionOptions o) {
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
  must(s->load_symbols(a.dom, "/proc/kallsyms"), "load_symbols(/proc/kallsyms)");
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

// Jump probes' jumps go in once the guest module has confirmed quiescence (the guest runs
// meanwhile): serves the session until none of `probes` waits any more, at most 120 s. Returns
// how many jump probes are written and how many still wait (trap probes count in neither).
struct JumpsWritten {
  long written = 0, waiting = 0;
  double seconds = 0;
};
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

// jump-island: a short jump to an island (protocol.h "Short jumps to islands"). The first
// instruction of kIslandCandidates (functions on the workload's openat, unlink and close paths;
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

int cmd_jump_island(const Args& a) {
  auto s = open_session(a, SessionOptions{ChannelKind::Guest});
  hv::Hypervisor& hv = s->hypervisor();
  auto feat = hv.xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FEATURES));
  const unsigned long bits = feat ? std::strtoul(feat->c_str(), nullptr, 16) : 0;
  check("module.jump_island", (bits & XENPROBES_FEATURE_JUMP_ISLAND) != 0,
        feat ? "features " + *feat : std::string("the module publishes no features"));
  must(s->prepare_jump_probes(a.dom), "prepare_jump_probes");
  auto view = must(GuestView::open(hv, a.dom), "GuestView::open");
  std::uint64_t hits = 0;
  std::optional<Probe> probe;
  std::string fn, why;
  std::uint64_t tried = 0;
  for (const char* name : kIslandCandidates) {
    auto at = s->resolve(a.dom, name);
    if (!at) continue;
    std::vector<std::byte> bytes;
    std::string err;
    if (!read_guest(*view, at->value, 512, &bytes, &err)) continue;
    std::uint64_t end = 0;
    for (const Decoded& d : decode(bytes, at->value, &end)) {
      ++tried;
      auto p = s->probe(
          a.dom, Gva{d.addr},
          [&hits](HitContext&) {
            ++hits;
            return 0;
          },
          {}, ProbeOptions{ProbeMethod::Jump});
      if (!p) continue;
      auto i = p->info();
      if (i && i->address.value == d.addr && i->not_jump_because.rfind("a short jump", 0) == 0) {
        probe = std::move(*p);
        fn = name;
        why = i->not_jump_because;
        break;
      }
      (void)p->unregister();
    }
    if (probe) break;
  }
  if (!check("island.found", probe.has_value(),
             probe ? fn + ": " + why : fmt("no short jump among %" PRIu64 " instructions tried", tried)))
    return 1;
  const ProbeInfo info = must(probe->info(), "info");
  const std::uint64_t island =
      std::strtoull(why.c_str() + std::strlen("a short jump (eb rel8) to an island at "), nullptr, 16);
  say("XPE2E-INFO: %s: a short jump at 0x%" PRIx64 " (%s), island 0x%" PRIx64 ", detour 0x%" PRIx64, fn.c_str(),
      info.address.value, info.instruction.c_str(), island, info.slot.value);
  check("island.method", info.method == ProbeMethod::Jump && info.mode == ExecMode::Detour,
        probe_method_name(info.method));
  std::vector<Probe> probes;
  probes.push_back(std::move(*probe));
  const JumpsWritten jw = wait_for_jumps(*s, probes);
  check("island.written", jw.waiting == 0, fmt("%ld jumps still wait after %.1f s", jw.waiting, jw.seconds));
  std::array<std::byte, 5> isl{};
  std::array<std::byte, 2> eb{};
  const bool read_ok = view->read(Gva{island}, isl).has_value() && view->read(info.address, eb).has_value();
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

// ---- bench: the paper's Table 1 side by side ---------------------------------------------

// What the probes sit on: the four measured syscalls (the guest's kprobe events use the same
// functions, workload.c) and two more that only the tar extraction reaches (Table 2/3).
struct BenchFn {
  const char* role;
  const char* fn;
};
constexpr BenchFn kBenchFns[] = {{"null", "__x64_sys_getppid"}, {"read", "__x64_sys_read"},
                                 {"write", "__x64_sys_write"},  {"open", "__x64_sys_openat"},
                                 {"mkdir", "do_mkdirat"},       {"chmod", "chmod_common"}};
constexpr std::size_t kBenchFnCount = sizeof kBenchFns / sizeof kBenchFns[0];
constexpr std::size_t kBenchKinds = 4;  // the measured ones: the first four
std::uint64_t g_bench_entries[kBenchFnCount], g_bench_returns[kBenchFnCount];
// Where the time between two hits goes (diagnostics): gaps between consecutive handler calls,
// as seen by Dom0, in buckets < 1 ms, < 10 ms, < 100 ms, >= 100 ms.
std::uint64_t g_gap[4];
Clock::time_point g_last_hit;
void bench_gap() {
  auto now = Clock::now();
  if (g_last_hit != Clock::time_point{}) {
    double ms = std::chrono::duration<double, std::milli>(now - g_last_hit).count();
    ++g_gap[ms < 1 ? 0 : ms < 10 ? 1 : ms < 100 ? 2 : 3];
  }
  g_last_hit = now;
}

double dnum(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
}

// This process's CPU time so far (user + system), in seconds.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int cmd_bench(const Args& a) {
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  hv::Hypervisor& hv = s->hypervisor();
  std::string channel = must(s->channel_name(a.dom), "channel_name");
  // The tables' channel name (table1.sh): spinning gets its own table.
  const std::string label = channel + (a.spin_us ? "+spin" : "");
  std::vector<std::pair<std::string, Gva>> fns;
  for (const auto& f : kBenchFns) fns.emplace_back(f.fn, must(s->resolve(a.dom, f.fn), std::string("resolve ") + f.fn));
  auto before = snapshot(hv, a.dom, fns);

  auto ready = wait_key(hv, dom_path(a.dom, "data/xpe2e/bench/ready"), a.timeout_s);
  if (!check("bench.ready", ready && *ready == "1", ready ? "guest: " + *ready : "no data/xpe2e/bench/ready"))
    fatal("the guest's benchmark loop did not start");

  std::vector<std::string> configs;
  for (std::istringstream in(a.configs);;) {
    std::string c;
    if (!std::getline(in, c, ',')) break;
    std::string base = c.substr(0, c.find('/'));
    if (base != "native" && base != "kprobe" && base != "kretprobe" && base != "xp" && base != "xrp" &&
        base != "jump" && base != "async")
      fatal("unknown bench config " + c);
    for (std::size_t at = c.find('/'); at != std::string::npos; at = c.find('/', at + 1)) {
      std::string opt = c.substr(at + 1, c.find('/', at + 1) - at - 1);
      if (opt.size() < 2 || opt[0] != 'w' || opt.find_first_not_of("0123456789", 1) != std::string::npos)
        fatal("unknown bench config option '" + opt + "' in " + c + " (/w<run_once timeout in ms>)");
    }
    configs.push_back(c);
  }
  int i = 0;
  for (const std::string& spec : configs) {
    ++i;
    // Diagnostics: "<config>/w<ms>" sets run_once's timeout for this config.
    const std::string config = spec.substr(0, spec.find('/'));
    int wait_ms = a.wait_ms;
    if (auto w = spec.find("/w"); w != std::string::npos) wait_ms = std::atoi(spec.c_str() + w + 2);
    std::fill(std::begin(g_bench_entries), std::end(g_bench_entries), 0);
    std::fill(std::begin(g_bench_returns), std::end(g_bench_returns), 0);
    std::fill(std::begin(g_gap), std::end(g_gap), 0);
    g_last_hit = {};
    std::uint64_t loops = 0, idle_loops = 0, late_loops = 0;
    std::vector<Probe> probes;
    std::vector<Gva> points;
    for (std::size_t k = 0; k < kBenchFnCount; ++k) {
      Gva at = fns[k].second;
      if (config == "xp" || config == "jump") {
        // The cheapest useful XP: a pre-handler that counts (the paper's handlers did as little);
        // "jump": the same as a jump probe (issue 14), no trap per hit.
        probes.push_back(must(s->probe(
                                  a.dom, at,
                                  [k](HitContext&) {
                                    ++g_bench_entries[k];
                                    bench_gap();
                                    return 0;
                                  },
                                  {}, ProbeOptions{config == "jump" ? ProbeMethod::Jump : ProbeMethod::Trap}),
                              std::string(config == "jump" ? "jump probe on " : "XP on ") + fns[k].first));
      } else if (config == "async") {
        // An async jump probe (issue 14): the hit is a record in the vCPU's ring, counted when
        // Dom0 reads it.
        // (No bench_gap(): records arrive in batches, their gaps say nothing.)
        probes.push_back(must(s->probe_async(a.dom, at, [k](const AsyncHit&) { ++g_bench_entries[k]; }),
                              std::string("async probe on ") + fns[k].first));
      } else if (config == "xrp") {
        probes.push_back(must(s->ret_probe(
                                  a.dom, at,
                                  [k](HitContext&, std::span<std::byte>) {
                                    ++g_bench_entries[k];
                                    bench_gap();
                                    return 0;
                                  },
                                  [k](HitContext&, std::span<std::byte>) {
                                    ++g_bench_returns[k];
                                    bench_gap();
                                  }),
                              std::string("XrP on ") + fns[k].first));
      } else {
        continue;
      }
      points.push_back(probes.back().info()->address);  // past the function's ftrace site
    }
    if (config == "jump" || config == "async") {
      // Measured once the jumps are in (the module's quiescence), not through their trap bytes.
      const JumpsWritten jw = wait_for_jumps(*s, probes);
      check("bench.jump.written", jw.waiting == 0, fmt("%ld jumps still wait", jw.waiting));
      std::fill(std::begin(g_bench_entries), std::end(g_bench_entries), 0);  // hits while waiting: not measured
      points.clear();                                                        // no trap bytes to check
    }
    if (!points.empty()) {
      std::string d;
      check("bench." + config + ".armed", first_bytes_are_traps(hv, a.dom, points, trap_byte_of(channel), &d), d);
      for (auto& p : probes)
        if (auto inf = p.info())
          say("XPE2E-INFO: bench %s: probe %" PRIu64 " mode=%s", config.c_str(), p.id(), mode_name(inf->mode));
    }
    auto go = fmt("%s %.3f %d %d", config.c_str(), a.round_s, a.rounds, a.untar);  // the guest needs no suffix
    must(hv.xs_write(dom_path(a.dom, fmt("data/xpe2e/bench/go-%d", i)), go), "write go");
    say("XPE2E-STAGE bench %s: %s (%s)", channel.c_str(), go.c_str(), spec.c_str());
    auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    auto end = t0 + std::chrono::seconds(a.timeout_s);
    // The result key is read only when a run_once call handled nothing for wait_ms (the
    // guest's measurement is over or between phases): a xenstore read between two hits would
    // delay the second and count as probe cost.
    const std::string result_key = dom_path(a.dom, fmt("data/xpe2e/bench/result-%d", i));
    std::optional<std::string> result;
    while (Clock::now() < end && !result) {
      auto l0 = Clock::now();
      auto r = s->run_once(wait_ms);
      if (!r) {
        check("run_once", false, r.error().what);
        break;
      }
      ++loops;
      if (*r == 0) {
        ++idle_loops;
        if (auto v = hv.xs_read(result_key)) result = *v;
      }
      // Handled something only after (about) the whole timeout: its event came late or not at all.
      if (*r > 0 && Clock::now() - l0 >= std::chrono::milliseconds(wait_ms * 9 / 10)) ++late_loops;
    }
    double window = std::chrono::duration<double>(Clock::now() - t0).count();
    // What this config cost Dom0 (this process: handlers, polling, reading rings).
    const double cpu = cpu_seconds() - cpu0;
    say("XPE2E-INFO: bench %s: Dom0 CPU %.2f s (user + system) in a %.1f s window (%.0f %%)", spec.c_str(), cpu, window,
        window > 0 ? 100 * cpu / window : 0.0);
    if (!probes.empty())
      say("XPE2E-INFO: bench %s: %" PRIu64 " run_once calls, %" PRIu64 " handled nothing, %" PRIu64
          " handled hits only at their timeout; gaps between hits <1ms %" PRIu64 ", <10ms %" PRIu64 ", <100ms %" PRIu64
          ", >=100ms %" PRIu64,
          spec.c_str(), loops, idle_loops, late_loops, g_gap[0], g_gap[1], g_gap[2], g_gap[3]);
    if (config == "async") {  // the records still in the rings
      auto rs = s->ring_stats(a.dom);
      check("bench.async.rings", rs && rs->drops == 0 && rs->missed == 0 && rs->resyncs == 0,
            rs ? fmt("records %" PRIu64 ", drops %" PRIu64 ", missed %" PRIu64 ", resyncs %" PRIu64, rs->records,
                     rs->drops, rs->missed, rs->resyncs)
               : rs.error().what);
    }
    std::vector<ProbeStats> stats;
    for (auto& p : probes) stats.push_back(p.stats());
    for (auto& p : probes) {
      auto r = p.unregister();
      if (!r) check("bench." + config + ".unregister", false, r.error().what);
    }
    probes.clear();
    std::string diff = compare(hv, a.dom, before);
    check("bench." + config + ".text_restored", diff.empty(), diff.empty() ? "byte-identical" : diff);
    if (!check("bench." + config + ".result", result.has_value(),
               result ? fmt("%.1f s: %s", window, result->c_str()) : fmt("no result within %d s", a.timeout_s)))
      break;
    auto m = kv(*result);
    check("bench." + config + ".errors", num(m, "errors") == 0 && !m.count("error"),
          "failed calls in the guest: " + m["errors"] + (m.count("error") ? " (" + m["error"] + ")" : ""));
    for (std::size_t k = 0; k < kBenchKinds; ++k) {
      std::string kind = kBenchFns[k].role;
      long calls = num(m, kind + "_calls");
      // Every measured call must have been seen by the config's probes (more is fine: the
      // guest's xenstore and console I/O read and write too).
      long seen = config == "xp" || config == "xrp" || config == "jump" || config == "async" ? (long)g_bench_entries[k]
                  : config == "native"                                                       ? calls
                                                                                             : num(m, "kp_" + kind);
      if (config == "xrp") seen = std::min(seen, (long)g_bench_returns[k]);
      check(fmt("bench.%s.%s.seen", config.c_str(), kind.c_str()), calls > 0 && seen >= calls,
            fmt("%ld calls measured, %ld seen by the probe", calls, seen));
      say("XPE2E-BENCH %s %s %s us=%.3f min=%.3f max=%.3f calls=%ld hits=%ld", label.c_str(), spec.c_str(),
          kind.c_str(), dnum(m, kind + "_us"), dnum(m, kind + "_min"), dnum(m, kind + "_max"), calls,
          config == "native" ? 0 : seen);
    }
    if (a.untar > 0) {
      std::string hits;
      for (std::size_t k = 0; k < kBenchFnCount; ++k) {
        long h = config == "xp" || config == "xrp" || config == "jump" || config == "async" ? (long)g_bench_entries[k]
                 : config == "native"                                                       ? 0
                                      : num(m, std::string("kp_") + kBenchFns[k].role);
        hits += fmt("%s%s:%ld", hits.empty() ? "" : ",", kBenchFns[k].role, h);
      }
      say("XPE2E-BENCH %s %s untar s=%.3f min=%.3f max=%.3f rounds=%ld hits=%s", label.c_str(), spec.c_str(),
          dnum(m, "untar_s"), dnum(m, "untar_min"), dnum(m, "untar_max"), num(m, "untar_rounds"), hits.c_str());
    }
    for (std::size_t k = 0; k < stats.size(); ++k)
      if (stats[k].unhandled)
        say("XPE2E-INFO: bench %s: probe %zu: %" PRIu64 " hits unhandled", config.c_str(), k, stats[k].unhandled);
  }
  must(hv.xs_write(dom_path(a.dom, "data/xpe2e/bench/end"), "1"), "write data/xpe2e/bench/end");
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG bench %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

// ---- safety: the probe-safety hazard classes (issue 12) ----------------------------------
//
// Each class is found in the running guest from the kernel's own tables, read here through
// GuestView with Dom0's symbols: independent of the library's rules, so a rule that misses a
// point shows up as a probe that got registered (and, in the guest, as the hazard itself).

// Dom0's /proc/kallsyms (a PV guest runs Dom0's kernel build, no KASLR; the PVH guest boots
// with nokaslr), and the kernel's System.map for linker symbols kallsyms might leave out.
struct KSyms {
  struct Sym {
    std::uint64_t addr;
    char type;
    std::string name;
  };
  std::vector<Sym> all;  // sorted by address; the kernel's own symbols only (no [module])
  std::map<std::string, std::vector<std::uint64_t>> by_name;
  std::string source;

  bool load(const std::string& path) {
    std::ifstream in(path);
    if (!in) return false;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string addr, type, name, mod;
      if (!(ls >> addr >> type >> name) || type.size() != 1) continue;
      if (ls >> mod) continue;  // a module's symbol
      std::uint64_t a = std::strtoull(addr.c_str(), nullptr, 16);
      if (!a) continue;
      all.push_back(Sym{a, type[0], name});
    }
    std::stable_sort(all.begin(), all.end(), [](const Sym& x, const Sym& y) { return x.addr < y.addr; });
    for (auto& y : all) by_name[y.name].push_back(y.addr);
    source = path;
    return !all.empty();
  }
  std::optional<std::uint64_t> addr(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second.empty()) return std::nullopt;
    return it->second.front();
  }
  // The extent of the function at `start`: up to the next symbol at a higher address.
  std::uint64_t end_of(std::uint64_t start) const {
    auto it = std::upper_bound(all.begin(), all.end(), start, [](std::uint64_t a, const Sym& y) { return a < y.addr; });
    return it == all.end() ? start : it->addr;
  }
  // "name+0xoff" of an address (the symbol at or below it).
  std::string describe(std::uint64_t a) const {
    auto it = std::upper_bound(all.begin(), all.end(), a, [](std::uint64_t v, const Sym& y) { return v < y.addr; });
    if (it == all.begin()) return fmt("%#" PRIx64, a);
    --it;
    return fmt("%s+0x%" PRIx64, it->name.c_str(), a - it->addr);
  }
};

// A symbol from kallsyms, else from the System.map (whose source is named in the detail).
struct SymSource {
  const KSyms* kallsyms;
  const KSyms* map;  // may be empty
  std::optional<std::uint64_t> addr(const std::string& name, std::string* from = nullptr) const {
    if (auto a = kallsyms->addr(name)) {
      if (from) *from = kallsyms->source;
      return a;
    }
    if (map && !map->all.empty())
      if (auto a = map->addr(name)) {
        if (from) *from = map->source;
        return a;
      }
    return std::nullopt;
  }
};

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

// What a refusal must look like for each rule (the library's design, issue 12): runtime-patched
// sites are Busy, the rest InvalidArgument.
Errc rule_errc(const std::string& rule) {
  return rule == "jump-label" || rule == "static-call" || rule == "static-call-trampoline" || rule == "ftrace-site" ||
                 rule == "smp-lock"
             ? Errc::Busy
             : Errc::InvalidArgument;
}

// Counts per probe point, by address (handlers find their counter through HitContext).
std::map<std::uint64_t, std::uint64_t> g_safety_hits;

PreHandler safety_counter() {
  return [](HitContext& c) {
    ++g_safety_hits[c.address().value];
    return 0;
  };
}

struct Armed {
  std::string what;
  Gva at;
  Probe probe;
};

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

// Phase i of the guest's safety loop: sends it and serves hits until its result. `cap`, when
// given, is called after every run_once (the vmevent control unregisters hot probes there).
std::optional<std::string> safety_phase(Session& s, DomId dom, int i, const std::string& phase, int seconds,
                                        const std::function<void()>& cap = {}) {
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

struct SafetyCtx {
  Session& s;
  DomId dom;
  const KSyms& ks;
  SymSource syms;
  std::string channel;
  int timeout_s;
  int phase = 0;  // the guest's phase counter
  bool dead = false;
  bool unloaded = false;  // a phase unloaded the guest module (slotunload)
};

struct ExFn {
  const char* name;
  std::uint64_t start = 0, end = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sites;  // insn, fixup
};

// The user copies' instructions the guest's exception table covers, and the module's fixup
// slots [*fx_lo, *fx_hi) where their copies must go; false (checks failed under `tag`) when
// either cannot be found.
bool extable_sites(SafetyCtx& x, const std::string& tag, std::vector<ExFn>& fns, std::uint64_t* fx_lo,
                   std::uint64_t* fx_hi) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::uint64_t base = 0;
  std::string why;
  auto t = read_table(hv, x.dom, x.syms, "__start___ex_table", "__stop___ex_table", &base, &why);
  if (!check("safety." + tag + ".table", t && t->size() % 12 == 0 && !t->empty(),
             t ? fmt("%zu entries of 12 bytes", t->size() / 12) : why))
    return false;
  // 6.1's user copies, and 6.12's (rep_movs_alternative, for CPUs without fast rep movsb).
  for (const char* n : {"strncpy_from_user", "copy_user_enhanced_fast_string", "copy_user_generic_string",
                        "copy_user_generic_unrolled", "rep_movs_alternative", "__get_user_8"})
    fns.push_back(ExFn{n, 0, 0, {}});
  for (auto& f : fns)
    if (auto a = x.ks.addr(f.name)) f.start = *a, f.end = x.ks.end_of(*a);
  // {s32 insn, s32 fixup, s32 data}: each offset relative to its own field.
  for (std::size_t off = 0; off + 12 <= t->size(); off += 12) {
    std::uint64_t e = base + off;
    std::uint64_t insn = e + static_cast<std::int64_t>(s32_at(*t, off));
    std::uint64_t fixup = e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4));
    for (auto& f : fns)
      if (f.start && insn >= f.start && insn < f.end) f.sites.emplace_back(insn, fixup);
  }
  std::string found;
  std::size_t total = 0;
  for (auto& f : fns) {
    std::sort(f.sites.begin(), f.sites.end());
    found += fmt("%s%s: %s", found.empty() ? "" : "; ", f.name,
                 !f.start ? "not in this kernel"
                          : fmt("%zu in [%#" PRIx64 ", %#" PRIx64 ")", f.sites.size(), f.start, f.end).c_str());
    for (auto& [i, fx] : f.sites)
      say("XPE2E-INFO: __ex_table: %s (%#" PRIx64 ") -> fixup %s", x.ks.describe(i).c_str(), i,
          x.ks.describe(fx).c_str());
    total += f.sites.size();
  }
  if (!check("safety." + tag + ".sites", total > 0, fmt("%zu covered instructions: ", total) + found)) return false;

  // The module's fixup slots (protocol.h): where every copy must go.
  {
    auto a = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_ADDR));
    auto n = hv.xs_read(dom_path(x.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_COUNT));
    if (!check("safety." + tag + ".fixup_slots", a && n, "the module publishes fixup-slots/addr and /count"))
      return false;
    *fx_lo = std::stoull(*a, nullptr, 16);
    *fx_hi = *fx_lo + std::stoull(*n) * XENPROBES_FIXUP_SLOT_SIZE;
    say("XPE2E-INFO: fixup slots [%#" PRIx64 ", %#" PRIx64 ")", *fx_lo, *fx_hi);
  }
  return true;
}

// 1. Instructions covered by the exception table: their faults are fixed up by the faulting
// address; run in an ordinary slot the fault finds no entry and oopses. The guest module's
// fixup slots have entries of their own: every one of these instructions must register
// (boosted, in a fixup slot), count exactly, and the guest's bad pointers must give it what
// an unprobed kernel gives (EFAULT, a short read) without an oops.
void hazard_extable(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::vector<ExFn> fns;
  std::uint64_t fx_lo = 0, fx_hi = 0;
  if (!extable_sites(x, "extable", fns, &fx_lo, &fx_hi)) return;
  std::vector<Armed> armed;
  std::map<std::string, std::vector<std::size_t>> by_fn;  // indices into armed
  must(x.s.begin_batch(), "begin_batch");
  for (auto& f : fns) {
    if (f.sites.empty()) continue;
    std::size_t in_fixup = 0;
    std::string bad;
    for (auto& [i, fx] : f.sites) {
      auto r = x.s.probe(x.dom, Gva{i}, safety_counter());
      std::string what = x.ks.describe(i);
      if (!r) {
        bad += fmt(" %s: %s %s;", what.c_str(), errc_name(r.error().code), r.error().what.c_str());
        continue;
      }
      auto inf = r->info();
      if (inf && inf->mode == ExecMode::Boosted && inf->slot.value >= fx_lo && inf->slot.value < fx_hi) ++in_fixup;
      else
        bad += fmt(" %s: mode=%s slot=%#" PRIx64 ";", what.c_str(), inf ? mode_name(inf->mode) : "?",
                   inf ? inf->slot.value : 0);
      by_fn[f.name].push_back(armed.size());
      armed.push_back(Armed{what, Gva{i}, std::move(*r)});
    }
    check(fmt("safety.extable.fixup_slot.%s", f.name), in_fixup == f.sites.size(),
          fmt("%zu of %zu registered, boosted, in a fixup slot", in_fixup, f.sites.size()) +
              (bad.empty() ? "" : ";" + bad));
  }
  must(x.s.end_batch(), "end_batch");
  // openat((char *)16) -> EFAULT, a read() cut short at a PROT_NONE page, open() and execve() of
  // paths ending at a page's end, execve() with argv at address 16.
  auto res = safety_phase(x.s, x.dom, ++x.phase, "extable", x.timeout_s);
  // Every hit went through the handler, none around it; the routines the guest's phase must
  // use (a path copy for every open and execve, a get_user per argv pointer) were hit.
  for (auto& [fn, idx] : by_fn) {
    std::uint64_t hits = 0, handler = 0, unhandled = 0;
    for (std::size_t k : idx) {
      auto st = armed[k].probe.stats();
      hits += st.hits;
      unhandled += st.unhandled;
      handler += g_safety_hits[armed[k].at.value];
    }
    const bool must_hit = fn == "strncpy_from_user" || fn == "__get_user_8";
    check("safety.extable.hits." + fn, hits == handler && unhandled == 0 && (!must_hit || hits > 0),
          fmt("handler %" PRIu64 ", ProbeStats.hits %" PRIu64 ", unhandled %" PRIu64 "%s", handler, hits, unhandled,
              must_hit ? " (at least one expected)" : ""));
  }
  unregister_all(armed, "extable");
  x.dead = !phase_checks(hv, x.dom, "extable", res);
}

// 5. The module's slots at unload (stock_pv_slot_unload): the user copies' exception-table
// instructions probed (their copies run in fixup slots) and __x64_sys_getppid (an OEA copy).
// In the guest a pread() sleeps in a userfaultfd fault its copy took in a fixup slot while a
// process keeps calling getppid, and the guest detaches the module: the detach must fail with
// EBUSY and rmmod with it (the slot is the module's text: freed, the reader would return into
// freed memory), and once the fault is resolved and the read has left the slot, both succeed.
// The module is gone afterwards: this hazard comes last.
void hazard_slotunload(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  std::vector<ExFn> fns;
  std::uint64_t fx_lo = 0, fx_hi = 0;
  if (!extable_sites(x, "slotunload", fns, &fx_lo, &fx_hi)) return;
  std::vector<Armed> armed;
  std::size_t sites = 0, in_fixup = 0;
  must(x.s.begin_batch(), "begin_batch");
  for (auto& f : fns)
    for (auto& [i, fx] : f.sites) {
      ++sites;
      auto r = x.s.probe(x.dom, Gva{i}, safety_counter());
      if (!r) continue;
      auto inf = r->info();
      if (inf && inf->mode == ExecMode::Boosted && inf->slot.value >= fx_lo && inf->slot.value < fx_hi) ++in_fixup;
      armed.push_back(Armed{x.ks.describe(i), Gva{i}, std::move(*r)});
    }
  const char* name = "__x64_sys_getppid";
  auto g = x.s.probe(x.dom, std::string_view(name), safety_counter());
  check("safety.slotunload.getppid", g.has_value(), g ? std::string("registered") : g.error().what);
  if (g) {
    auto inf = g->info();
    armed.push_back(Armed{name, inf ? inf->address : Gva{0}, std::move(*g)});
  }
  must(x.s.end_batch(), "end_batch");
  check("safety.slotunload.fixup_slots", sites > 0 && in_fixup == sites,
        fmt("%zu of %zu covered instructions registered, boosted, in a fixup slot", in_fixup, sites));
  // The guest: the reader asleep in its fault, detach (EBUSY) and rmmod (refused), the fault
  // resolved, the read checked, detach and rmmod again (both succeed).
  auto res = safety_phase(x.s, x.dom, ++x.phase, "slotunload", x.timeout_s);
  // Counted by the handlers: once the module went, the library forgot the guest's probes
  // and their ProbeStats with them (run 20261128-042613-2960 read 0 there, handlers 35).
  std::uint64_t hits = 0;
  for (auto& a : armed) hits += g_safety_hits[a.at.value];
  check("safety.slotunload.hits", hits > 0, fmt("%" PRIu64 " handler calls before the module went", hits));
  if (res) {
    auto m = kv(*res);
    auto val = [&m](const char* k) { return m.count(k) ? m[k] : std::string("(none)"); };
    check("safety.slotunload.held",
          val("faulted") == "1" && val("first_detach") == "EBUSY" && val("held_rmmod") != "unloaded",
          "the reader asleep in its fault: detach " + val("first_detach") + ", rmmod " + val("held_rmmod"));
    check("safety.slotunload.read", val("read_ok") == "1", "the reader's pread() returned " + val("read"));
    check("safety.slotunload.unloaded", val("second_detach") == "ok" && val("rmmod") == "unloaded",
          "after the read: detach " + val("second_detach") + ", rmmod " + val("rmmod"));
  }
  // The module withdrew: the library forgot the guest's probes (unregistering says so).
  unregister_all(armed, "slotunload");
  x.unloaded = true;
  x.dead = !phase_checks(hv, x.dom, "slotunload", res);
}

// 2. A tracepoint's static key (jump label) and static call sites in kernel_clone, and the
// static call's trampoline: the kernel rewrites them when the tracepoint is enabled and BUG()s
// on a byte it did not expect (an int3).
void hazard_statickey(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  auto fn = x.ks.addr("kernel_clone");
  auto tp = x.syms.addr("__tracepoint_sched_process_fork");
  auto sck = x.syms.addr("__SCK__tp_func_sched_process_fork");
  auto sct = x.syms.addr("__SCT__tp_func_sched_process_fork");
  if (!check("safety.statickey.symbols", fn && tp && sck && sct,
             fmt("kernel_clone %#" PRIx64 ", __tracepoint_sched_process_fork %#" PRIx64
                 ", __SCK__tp_func_sched_process_fork %#" PRIx64 ", __SCT__tp_func_sched_process_fork %#" PRIx64,
                 fn.value_or(0), tp.value_or(0), sck.value_or(0), sct.value_or(0))))
    return;
  const std::uint64_t fn_end = x.ks.end_of(*fn);
  // struct tracepoint { const char *name; struct static_key key; ... }: the key is at +8.
  const std::uint64_t key = *tp + 8;

  std::vector<std::uint64_t> jump_sites, call_sites;
  std::uint64_t base = 0;
  std::string why;
  // __jump_table: {s32 code, s32 target, s64 key}, each relative to its own field; the key's
  // low 2 bits are flags (the kernel sorted the table at boot, fixing up the offsets).
  if (auto t = read_table(hv, x.dom, x.syms, "__start___jump_table", "__stop___jump_table", &base, &why)) {
    std::size_t n_key = 0;
    for (std::size_t off = 0; off + 16 <= t->size(); off += 16) {
      std::uint64_t e = base + off;
      std::uint64_t k = (e + 8 + static_cast<std::uint64_t>(s64_at(*t, off + 8) & ~std::int64_t{3}));
      if (k != key) continue;
      ++n_key;
      std::uint64_t code = e + static_cast<std::int64_t>(s32_at(*t, off));
      std::uint64_t target = e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4));
      say("XPE2E-INFO: __jump_table: key __tracepoint_sched_process_fork.key: code %s (%#" PRIx64 ") target %s",
          x.ks.describe(code).c_str(), code, x.ks.describe(target).c_str());
      if (code >= *fn && code < fn_end) jump_sites.push_back(code);
    }
    check("safety.statickey.jump_sites", !jump_sites.empty(),
          fmt("%zu of the table's %zu entries for this key, %zu in kernel_clone [%#" PRIx64 ", %#" PRIx64 ")", n_key,
              t->size() / 16, jump_sites.size(), *fn, fn_end));
  } else {
    check("safety.statickey.jump_sites", false, why);
  }
  // .static_call_sites: {s32 addr, s32 key}, relative; the key's low 2 bits are flags.
  if (auto t = read_table(hv, x.dom, x.syms, "__start_static_call_sites", "__stop_static_call_sites", &base, &why)) {
    std::size_t n_key = 0;
    for (std::size_t off = 0; off + 8 <= t->size(); off += 8) {
      std::uint64_t e = base + off;
      std::uint64_t k = (e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4))) & ~std::uint64_t{3};
      if (k != *sck) continue;
      ++n_key;
      std::uint64_t site = e + static_cast<std::int64_t>(s32_at(*t, off));
      say("XPE2E-INFO: .static_call_sites: key __SCK__tp_func_sched_process_fork: site %s (%#" PRIx64 ")",
          x.ks.describe(site).c_str(), site);
      if (site >= *fn && site < fn_end) call_sites.push_back(site);
    }
    check("safety.statickey.call_sites", !call_sites.empty(),
          fmt("%zu of the table's %zu entries for this key, %zu in kernel_clone", n_key, t->size() / 8,
              call_sites.size()));
  } else {
    check("safety.statickey.call_sites", false, why);
  }

  std::vector<Armed> armed;
  must(x.s.begin_batch(), "begin_batch");
  for (auto a : jump_sites)
    expect_refused(fmt("safety.statickey.refused.jump-label.%s", x.ks.describe(a).c_str()),
                   x.s.probe(x.dom, Gva{a}, safety_counter()), "jump-label", x.ks.describe(a), Gva{a}, armed);
  for (auto a : call_sites)
    expect_refused(fmt("safety.statickey.refused.static-call.%s", x.ks.describe(a).c_str()),
                   x.s.probe(x.dom, Gva{a}, safety_counter()), "static-call", x.ks.describe(a), Gva{a}, armed);
  expect_refused("safety.statickey.refused.static-call-trampoline", x.s.probe(x.dom, Gva{*sct}, safety_counter()),
                 "static-call-trampoline", "__SCT__tp_func_sched_process_fork", Gva{*sct}, armed);
  must(x.s.end_batch(), "end_batch");
  // Enable sched_process_fork, fork 5 times, disable it, then toggle sched_process_exec.
  auto res = safety_phase(x.s, x.dom, ++x.phase, "statickey", x.timeout_s);
  unregister_all(armed, "statickey");
  x.dead = !phase_checks(hv, x.dom, "statickey", res);
}

// 3. The ftrace site at a function's entry: ftrace rewrites it (tracers, kprobe events on
// ftrace) and refuses, with a WARN, bytes it did not write. A probe asked for by name or at the
// function's start must be moved past the 5-byte site, and must still see every call.
void hazard_ftrace(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  const char* name = "__x64_sys_getppid";
  auto start = x.ks.addr(name);
  if (!check("safety.ftrace.symbol", start.has_value(), fmt("%s at %#" PRIx64, name, start.value_or(0)))) return;
  auto before = snapshot(hv, x.dom, {{name, Gva{*start}}});
  say("XPE2E-INFO: %s starts with %s (the ftrace site: 0f1f440000 is its NOP5)", name,
      hexbytes(before[0].bytes, 8).c_str());

  std::uint64_t by_name_hits = 0, by_addr_hits = 0;
  auto count_into = [](std::uint64_t* n) -> PreHandler {
    return [n](HitContext&) {
      ++*n;
      return 0;
    };
  };
  std::vector<std::pair<std::string, Result<Probe>>> regs;
  regs.emplace_back("byname", x.s.probe(x.dom, std::string_view(name), count_into(&by_name_hits)));
  const std::string addr_expr = fmt("0x%" PRIx64, *start);
  regs.emplace_back("byaddr", x.s.probe(x.dom, std::string_view(addr_expr), count_into(&by_addr_hits)));
  std::vector<Armed> armed;
  // Debian 13's 6.12 (IBT) has endbr64 before the ftrace site; the probe goes past both.
  const auto& b0 = before[0].bytes;
  const bool endbr = b0.size() >= 4 && b0[0] == std::byte{0xf3} && b0[1] == std::byte{0x0f} &&
                     b0[2] == std::byte{0x1e} && b0[3] == std::byte{0xfa};
  const std::uint64_t past = *start + (endbr ? 4 : 0) + 5;
  for (auto& [tag, r] : regs) {
    std::string asked = tag == "byname" ? std::string(name) : "'" + addr_expr + "'";
    if (!r) {
      check("safety.ftrace." + tag + ".moved", false,
            fmt("%s: refused (%s): ", asked.c_str(), errc_name(r.error().code)) + r.error().what);
      continue;
    }
    auto i = r->info();
    check("safety.ftrace." + tag + ".moved", i && i->address.value == past,
          i ? fmt("%s: ProbeInfo.address %#" PRIx64 " = %s (the function starts at %#" PRIx64
                  "; past its ftrace site: %#" PRIx64 "), %s, mode=%s",
                  asked.c_str(), i->address.value, x.ks.describe(i->address.value).c_str(), *start, past,
                  i->instruction.c_str(), mode_name(i->mode))
            : "info(): " + i.error().what);
    armed.push_back(Armed{asked, i ? i->address : Gva{*start}, std::move(*r)});
  }
  // set_ftrace_filter + the function tracer, 10 getppid, nop; a kprobe event on the function,
  // 10 getppid; the guest reports its count (20).
  auto res = safety_phase(x.s, x.dom, ++x.phase, "ftrace", x.timeout_s);
  std::vector<ProbeStats> st;
  for (auto& a : armed) st.push_back(a.probe.stats());
  unregister_all(armed, "ftrace");
  long calls = res ? num(kv(*res), "getppid") : -1;
  if (regs[0].second)
    check("safety.ftrace.byname.hits", (long)by_name_hits == calls && calls == 20,
          fmt("the probe by name counted %" PRIu64 ", the guest made %ld getppid calls", by_name_hits, calls));
  if (regs[1].second)
    check("safety.ftrace.byaddr.hits", (long)by_addr_hits == calls && calls == 20,
          fmt("the probe by address counted %" PRIu64 ", the guest made %ld getppid calls", by_addr_hits, calls));
  x.dead = !phase_checks(hv, x.dom, "ftrace", res);
  if (!x.dead) {
    std::string diff = compare(hv, x.dom, before);
    check("safety.ftrace.text_restored", diff.empty(),
          diff.empty() ? fmt("%s: %zu bytes byte-identical (the tracer put its NOP5 back)", name, kSnapBytes) : diff);
  }
}

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

int cmd_safety(const Args& a) {
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  hv::Hypervisor& hv = s->hypervisor();
  std::string channel = must(s->channel_name(a.dom), "channel_name");
  KSyms ks, map;
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

}  // namespace

int xpe2e_sweep_main(int argc, char** argv);      // xpe2e_sweep.cpp
int xpe2e_intercept_main(int argc, char** argv);  // xpe2e_intercept.cpp

// xpe2e_icall.cpp, xpe2e_extable_all.cpp
int xpe2e_icall_main(int argc, char** argv);
int xpe2e_extable_all_main(int argc, char** argv);

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 2 && std::strcmp(argv[1], "sweep") == 0) return xpe2e_sweep_main(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "int3-intercept") == 0) return xpe2e_intercept_main(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "kill-icall") == 0) return xpe2e_icall_main(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "safety-extable-all") == 0) return xpe2e_extable_all_main(argc, argv);
  Args a = parse(argc, argv);
  g_args = a;
  if (!a.skip.empty()) say("XPE2E-INFO: skipping probes: %s", a.skip.c_str());
  if (a.cmd == "probe") return cmd_probe(a);
  if (a.cmd == "kill") return cmd_kill(a);
  if (a.cmd == "jump") return cmd_jump(a);
  if (a.cmd == "jump-island") return cmd_jump_island(a);
  if (a.cmd == "async") return cmd_async(a);
  if (a.cmd == "verify-text") return cmd_verify_text(a);
  if (a.cmd == "refuse-debugger") return cmd_refuse_debugger(a);
  if (a.cmd == "pair") return cmd_pair(a);
  if (a.cmd == "bench") return cmd_bench(a);
  if (a.cmd == "safety") return cmd_safety(a);
  fatal("unknown command " + a.cmd);
}
