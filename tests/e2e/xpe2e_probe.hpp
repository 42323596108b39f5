// What xpe2e-probe's commands share (the command list and main() are in xpe2e_probe.cpp): the
// options, kernel text snapshots, the probe set of `probe` and `kill`, the session and the
// workload window, and each command's entry point. Everything here is in xpe2e::probe; a
// file's own helpers stay in its anonymous namespace.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"

namespace xpe2e::probe {

using namespace xenprobes;

struct Args {
  std::string cmd;
  DomId dom{0};
  DomId dom2{0};                // pair: the domain destroyed while probed
  unsigned destroy_after = 20;  // pair: B's getppid hits before `xl destroy B`
  std::string channel = "auto";
  int timeout_s = 240;
  std::string snapshot;
  unsigned die_after = 50;
  std::string die_in = "getppid";  // kill: where it SIGKILLs itself (getppid, call, filp, register, unregister;
                                   // island: kill-island's probe)
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
  std::string image;  // jump-image: the guest kernel's vmlinux (the ELF inside its vmlinuz)
  // jump-island: the functions to look in, comma-separated (default: kIslandCandidates), and
  // where the island must be: "own" (the function's padding), "previous" (before its start), or
  // "" (either).
  std::string functions;
  std::string island_in;
};

extern Args g_args;  // main() sets it (xpe2e_probe.cpp)

// ---- kernel text snapshots (xpe2e_session.cpp) ----------------------------------------

constexpr std::size_t kSnapBytes = 512;

struct TextRange {
  std::string name;
  Gva addr;
  std::vector<std::byte> bytes;
};

std::string hexbytes(const std::vector<std::byte>& b, std::size_t n);
std::vector<TextRange> snapshot(hv::Hypervisor& hv, DomId dom, const std::vector<std::pair<std::string, Gva>>& fns);
void save(const std::vector<TextRange>& s, const std::string& file);
std::vector<TextRange> load(const std::string& file);
std::string compare(hv::Hypervisor& hv, DomId dom, const std::vector<TextRange>& before);

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

extern Counters g_c;
extern unsigned g_die_after;
extern std::string g_die_in;
void maybe_die(const char* where, std::uint64_t hits);
void register_probes(Session& s, DomId dom, ProbeSet& ps);  // xpe2e_probe_set.cpp

// ---- the session, the workload, trap bytes, jumps, stalls (xpe2e_session.cpp) ------------

// Waits for the guest module, opens a session and loads Dom0's /proc/kallsyms as the guest's
// symbols (the same build: checked), unless `dom0_kallsyms` is false (the session then reads the
// guest's own kallsyms when it needs symbols).
std::unique_ptr<Session> open_session(const Args& a, SessionOptions o, bool dom0_kallsyms = true);
std::optional<std::string> run_workload(Session& s, DomId dom, int seconds);
std::uint8_t trap_byte_of(const std::string& channel);
bool first_bytes_are_traps(hv::Hypervisor& hv, DomId dom, const std::vector<Gva>& points, std::uint8_t trap,
                           std::string* detail);
// Jump probes' jumps go in once the guest module has confirmed quiescence (the guest runs
// meanwhile): serves the session until none of `probes` waits any more, at most 120 s. Returns
// how many jump probes are written and how many still wait (trap probes count in neither).
struct JumpsWritten {
  long written = 0, waiting = 0;
  double seconds = 0;
};
JumpsWritten wait_for_jumps(Session& s, std::vector<Probe>& probes);
std::vector<Gva> trap_points(ProbeSet& ps);
void dump_stall(hv::Hypervisor& hv, DomId dom, const char* why);

// ---- the commands ------------------------------------------------------------------------

int cmd_probe(const Args& a);            // xpe2e_probe_kill.cpp
int cmd_kill(const Args& a);             // xpe2e_probe_kill.cpp
int cmd_verify_text(const Args& a);      // xpe2e_probe_kill.cpp
int cmd_refuse_debugger(const Args& a);  // xpe2e_probe_kill.cpp
int cmd_jump(const Args& a);             // xpe2e_jump.cpp
int cmd_async(const Args& a);            // xpe2e_jump.cpp
int cmd_jump_island(const Args& a);      // xpe2e_jump_island.cpp
int cmd_kill_island(const Args& a);      // xpe2e_jump_island.cpp
int cmd_jump_image(const Args& a);       // xpe2e_jump_image.cpp
int cmd_jump_module(const Args& a);      // xpe2e_jump_module.cpp
int cmd_pair(const Args& a);             // xpe2e_pair.cpp
int cmd_bench(const Args& a);            // xpe2e_bench.cpp
int cmd_safety(const Args& a);           // xpe2e_safety.cpp

}  // namespace xpe2e::probe
