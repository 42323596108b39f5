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
//   xpe2e-probe jump-island --domid D [--timeout S] [--functions F1,F2] [--island own|previous]
//       A short jump to an island (issue 14, protocol.h "Short jumps to islands") on a function
//       of the workload's openat/unlink/close paths (or of --functions): eb rel8 and the island's
//       e9 written (with --island, in the function's own padding or the previous function's),
//       hits counted, the workload's results unchanged, region and island restored.
//   xpe2e-probe kill-island --domid D --snapshot FILE [--die-after-hits N] [--timeout S]
//       kill -9 with a short jump to an island armed: the text around the candidates saved to
//       FILE, jump-island's short jump written and read back, then a SIGKILL to itself inside
//       its handler on the N-th hit (the scenario checks the module's restore with verify-text).
//   xpe2e-probe jump-image --domid D --image VMLINUX [--timeout S]
//       The tail-call proof from the guest's kernel image: a point that is refused as a jump
//       without it (Jump refused, Fastest a trap probe, both saying the image would prove it),
//       given the guest's vmlinux (load_symbols, the ELF without symbols going with the guest's
//       kallsyms) becomes a jump, counts the workload's unlinks, and the text comes back.
//   xpe2e-probe jump-module --domid D [--timeout S]
//       Jump probes in a loaded module's text: the DomU (xpe2e.victim=2) loads loop.ko; a jump
//       probe and then an async probe on its lo_ioctl count each round of the DomU's 40
//       LOOP_GET_STATUS64 ioctls exactly, the module's text identical after each; then a jump
//       written there again while the guest runs `rmmod loop`: unregistering writes nothing.
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
// Where the commands are: probe, kill, verify-text and refuse-debugger in
// xpe2e_probe_kill.cpp (their probe set in xpe2e_probe_set.cpp), jump and async in
// xpe2e_jump.cpp, jump-island and kill-island in xpe2e_jump_island.cpp, jump-image in
// xpe2e_jump_image.cpp, pair in xpe2e_pair.cpp, bench in
// xpe2e_bench.cpp, safety in xpe2e_safety.cpp and xpe2e_safety_*.cpp, sweep in
// xpe2e_sweep*.cpp, and those with a main of their own below
// (int3-intercept, kill-icall, safety-extable-all) in theirs. What they share: xpe2e_probe.hpp
// (defined in xpe2e_session.cpp and xpe2e_probe_set.cpp), xpe2e_common.hpp, xpe2e_kallsyms.hpp.
//
// Every check prints one line "XPE2E-CHECK <name> PASS|FAIL <detail>"; the last line is
// "XPE2E-PROG <command> PASS|FAIL <failed checks>". Exit status 0 only when all passed.
#include <cstdio>
#include <cstring>
#include <string>

#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

using namespace xenprobes;
using namespace xpe2e;
using namespace xpe2e::probe;

namespace xpe2e::probe {

Args g_args;

namespace {

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2)
    fatal(
        "usage: xpe2e-probe "
        "probe|jump|jump-island|jump-image|async|kill|kill-island|verify-text|refuse-debugger|pair|bench|safety|sweep|"
        "int3-intercept "
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
    else if (k == "--image") a.image = v;
    else if (k == "--functions") a.functions = v;
    else if (k == "--island") a.island_in = v;
    else fatal("unknown option " + k);
  }
  if (!a.dom.value) fatal("--domid is required");
  if (a.method != "trap" && a.method != "fastest") fatal("--method: trap or fastest");
  if (!a.island_in.empty() && a.island_in != "own" && a.island_in != "previous") fatal("--island: own or previous");
  if (a.die_in != "getppid" && a.die_in != "call" && a.die_in != "filp" && a.die_in != "register" &&
      a.die_in != "unregister" && a.die_in != "island")
    fatal("--die-in: getppid, call, filp, register, unregister or island (kill-island)");
  if (a.cmd == "jump-image" && a.image.empty()) fatal("jump-image: --image (the guest kernel's vmlinux) is required");
  if (a.cmd == "pair" && (!a.dom2.value || a.dom2 == a.dom)) fatal("pair: --domid2 (another domain) is required");
  return a;
}

}  // namespace

}  // namespace xpe2e::probe

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
  if (a.cmd == "async") return cmd_async(a);
  if (a.cmd == "jump-island") return cmd_jump_island(a);
  if (a.cmd == "kill-island") return cmd_kill_island(a);
  if (a.cmd == "jump-image") return cmd_jump_image(a);
  if (a.cmd == "jump-module") return cmd_jump_module(a);
  if (a.cmd == "verify-text") return cmd_verify_text(a);
  if (a.cmd == "refuse-debugger") return cmd_refuse_debugger(a);
  if (a.cmd == "pair") return cmd_pair(a);
  if (a.cmd == "bench") return cmd_bench(a);
  if (a.cmd == "safety") return cmd_safety(a);
  fatal("unknown command " + a.cmd);
}
