// The helpers xpe2e-probe's commands share (xpe2e_probe.cpp, and its sweep in xpe2e_sweep.cpp):
// the lines the harness reads, the xenstore keys of a domain, the guest module's control area.
//
// tools/e2e reads these programs' output: every check is one line "XPE2E-CHECK <name>
// PASS|FAIL <detail>", a command ends with "XPE2E-PROG <command> PASS|FAIL <failed checks>",
// and an "XPE2E-INFO: " line gets the time since the program started ("[+1.2s] ") after its
// prefix. Where the two files' helpers differed, both ways are kept (Program below): the sweep
// sets its own at its start.
#pragma once

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"

namespace xpe2e {

using Clock = std::chrono::steady_clock;

// What differs between the commands' helpers: xpe2e-probe's values, which its sweep replaces.
struct Program {
  const char* fatal_check = "fatal";        // the check fatal() fails
  const char* fatal_prog = "-";             // the command on fatal()'s XPE2E-PROG line
  std::size_t fmt_buffer = 1024;            // fmt() gives at most fmt_buffer - 1 characters (at most 2048)
  bool describe_magic = true;               // describe() starts with the control area's magic
  std::chrono::milliseconds key_poll{100};  // how often wait_key() reads the key
};
inline Program g_program;

inline const Clock::time_point g_t0 = Clock::now();
inline int g_failed = 0;

// One line; INFO lines carry the time since the program started.
[[gnu::format(printf, 1, 2)]] inline void say(const char* f, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  std::string line = buf;
  if (line.rfind("XPE2E-INFO: ", 0) == 0) {
    char t[32];
    std::snprintf(t, sizeof t, "[+%.1fs] ", std::chrono::duration<double>(Clock::now() - g_t0).count());
    line.insert(12, t);
  }
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char* f, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, std::min(g_program.fmt_buffer, sizeof buf), f, ap);
  va_end(ap);
  return buf;
}

inline bool check(const std::string& name, bool ok, const std::string& detail) {
  if (!ok) ++g_failed;
  say("XPE2E-CHECK %s %s %s", name.c_str(), ok ? "PASS" : "FAIL", detail.c_str());
  return ok;
}

[[noreturn]] inline void fatal(const std::string& what) {
  ++g_failed;
  say("XPE2E-CHECK %s FAIL %s", g_program.fatal_check, what.c_str());
  say("XPE2E-PROG %s FAIL %d", g_program.fatal_prog, g_failed);
  std::exit(1);
}

template <typename T>
T must(xenprobes::Result<T> r, const std::string& what) {
  if (!r) fatal(what + ": " + r.error().what);
  return std::move(*r);
}
inline void must(xenprobes::Result<void> r, const std::string& what) {
  if (!r) fatal(what + ": " + r.error().what);
}

// ---- xenstore ----

inline std::string dom_path(xenprobes::DomId d, const std::string& rel) {
  return "/local/domain/" + std::to_string(d.value) + "/" + rel;
}

inline std::optional<std::string> wait_key(xenprobes::hv::Hypervisor& hv, const std::string& path, int seconds) {
  auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    if (auto v = hv.xs_read(path)) return *v;
    std::this_thread::sleep_for(g_program.key_poll);
  }
  return std::nullopt;
}

// "k=v k=v ..." into a map.
inline std::map<std::string, std::string> kv(const std::string& s) {
  std::map<std::string, std::string> m;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok)
    if (auto eq = tok.find('='); eq != std::string::npos) m[tok.substr(0, eq)] = tok.substr(eq + 1);
  return m;
}
inline long num(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? -1 : std::strtol(it->second.c_str(), nullptr, 10);
}

// ---- the domain, the module's control-area header (protocol.h), read through the guest's page tables ----

inline bool domain_alive(xenprobes::hv::Hypervisor& hv, xenprobes::DomId dom, std::string* state) {
  auto i = hv.domain_info(dom);
  if (!i) {
    *state = i.error().what;
    return false;
  }
  *state = fmt("crashed=%d shutdown=%d dying=%d paused=%d", i->crashed, i->shutdown, i->dying, i->paused);
  return !i->crashed && !i->shutdown && !i->dying;
}

inline std::optional<xenprobes_ctl_header> ctl_header(xenprobes::hv::Hypervisor& hv, xenprobes::DomId dom) {
  auto a = hv.xs_read(dom_path(dom, XENPROBES_XS_DIR "/" XENPROBES_XS_CONTROL_ADDR));
  if (!a) return std::nullopt;
  auto view = xenprobes::GuestView::open(hv, dom);
  if (!view) return std::nullopt;
  xenprobes_ctl_header h{};
  if (!(*view)->read(xenprobes::Gva{std::stoull(*a, nullptr, 16)}, std::as_writable_bytes(std::span(&h, 1))))
    return std::nullopt;
  return h;
}

inline std::string describe(const std::optional<xenprobes_ctl_header>& h) {
  if (!h) return "control area unreadable";
  return (g_program.describe_magic ? fmt("magic=%#x ", h->magic) : std::string()) +
         fmt("nr_traps=%u timeout_ms=%u dom0_gone=%u hits=%" PRIu64 " timeouts=%" PRIu64 " foreign=%" PRIu64
             " wait_ms=%.1f wait_max_ms=%.3f over_budget=%" PRIu64,
             h->nr_traps, h->timeout_ms, h->dom0_gone, h->hits, h->timeouts, h->foreign, h->wait_ns / 1e6,
             h->wait_max_ns / 1e6, h->over_budget);
}

inline const char* mode_name(xenprobes::ExecMode m) {
  switch (m) {
    case xenprobes::ExecMode::Boosted: return "boosted";
    case xenprobes::ExecMode::Emulated: return "emulated";
    case xenprobes::ExecMode::Skipped: return "skipped";
    case xenprobes::ExecMode::TrapAfter: return "trap-after";
    case xenprobes::ExecMode::Detour: return "detour";
  }
  return "?";
}

// The rule a refusal names (`rule '<name>'`), or a short name for the instruction rule's reason
// or the guest channel's refusal, or "other:<errno name>" (the sweep's tally, kill-icall,
// safety-extable-all).
inline std::string rule_of(const xenprobes::Error& e) {
  const std::string& w = e.what;
  if (auto p = w.find("rule '"); p != std::string::npos) {
    auto q = w.find('\'', p + 6);
    if (q != std::string::npos) return w.substr(p + 6, q - p - 6);
  }
  static const std::pair<const char*, const char*> kInsn[] = {
      {"foreign breakpoint", "insn:int3"},
      {"returns to another context", "insn:context-return"},
      {"software interrupt or system call", "insn:software-interrupt"},
      {"hlt parks the vCPU", "insn:hlt"},
      {"deliberate #UD", "insn:ud2"},
      {"swapgs", "insn:swapgs"},
      {"loads SS", "insn:ss-load"},
      {"far jump/call/return", "insn:far-transfer"},
      {"xbegin", "insn:xbegin"},
      {"operand-size prefix on a relative branch", "insn:opsize-branch"},
      {"EIP-relative", "insn:addr32"},
      {"sti: its one-instruction interrupt shadow", "insn:sti"},
      {"a 1-byte instruction", "insn:one-byte-debugger"},
      // The guest channel: what the guest module's fallback could not run once Dom0 is gone.
      {"cannot emulate a memory-indirect branch", "guest:memory-indirect-branch"},
      {"fallback cannot emulate this instruction", "guest:fallback-cannot-emulate"},
  };
  for (auto& [needle, name] : kInsn)
    if (w.find(needle) != std::string::npos) return name;
  return std::string("other:") + xenprobes::errc_name(e.code);
}

}  // namespace xpe2e
