// xenprobes-trace: the C++ API. Puts an entry probe on several kernel functions (by symbol, with
// lambdas as handlers), counts their calls per vCPU for a while, and prints a table with how
// each probed instruction runs (boosted out of line, emulated in Dom0, or trapping after its
// copy because a post-handler is attached). One probe also has a post-handler, which sees the
// registers after the probed instruction ran.
//
//   xenprobes-trace [--domain N] [--system-map FILE] [--seconds S] [--max-hits M]
//                   [function ...]
//
// Stops after S seconds (default 1) or M hits in all (default 20000), whichever comes first.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "example_backend.h"

using namespace xenprobes;

namespace {

constexpr unsigned kMaxVcpus = 8;

struct Traced {
  std::string function;
  Probe probe;
  std::uint64_t per_vcpu[kMaxVcpus] = {};
  std::uint64_t posts = 0;
  std::int64_t rip_step = 0;  // what the post-handler saw: how far the instruction moved rip,
  std::uint64_t rax = 0;      // and rax after it
};

// Points inside the demo guest's sys_getppid (guest/demo.c, built by this project), probed
// only on the simulated Xen: a plain instruction boosted out of line, a conditional jump
// emulated in Dom0, and the RIP-relative load of the return value with a post-handler that
// reads it from RAX. On a real kernel, pass your own `symbol+offset` points instead.
const char* const kDemoGuestPoints[] = {"sys_getppid+0x5", "sys_getppid+0x22", "sys_getppid+0x38"};

bool wants_post(const std::string& f) { return f == "sys_unlink" || f == "sys_getppid+0x38"; }

const char* mode_name(ExecMode m) {
  switch (m) {
    case ExecMode::Boosted: return "boosted";
    case ExecMode::Emulated: return "emulated";
    case ExecMode::Skipped: return "skipped";
    case ExecMode::TrapAfter: return "trap-after";
    case ExecMode::Detour: return "detour";
  }
  return "?";
}

[[noreturn]] void die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "xenprobes-trace: %s: %s (%s)\n", what.c_str(), e.what.c_str(), errc_name(e.code));
  std::exit(1);
}

void usage() {
  std::fprintf(stderr,
               "usage: xenprobes-trace [--domain N] [--system-map FILE] [--seconds S] [--max-hits M] "
               "[function ...]\n");
}

}  // namespace

int main(int argc, char** argv) {
  unsigned domid = 1;
  std::string map_path;
  double seconds = 1.0;
  std::uint64_t max_hits = 20000;
  std::vector<std::string> functions;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--domain" && i + 1 < argc) {
      domid = static_cast<unsigned>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--system-map" && i + 1 < argc) {
      map_path = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::strtod(argv[++i], nullptr);
    } else if (a == "--max-hits" && i + 1 < argc) {
      max_hits = std::strtoull(argv[++i], nullptr, 10);
    } else if (!a.empty() && a[0] != '-') {
      functions.push_back(a);
    } else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const bool defaults = functions.empty();
  if (defaults)
    functions = {"sys_getppid", "sys_read",     "sys_write",     "sys_open",
                 "sys_unlink",  "demo_recurse", "demo_classify", "demo_dispatch"};

  example_choose_backend("xenprobes-trace");

  auto session = Session::open();
  if (!session) die("cannot open a session", session.error());
  Session& s = **session;
  DomId dom{domid};
  if (defaults && s.hypervisor().name() == "sim")
    for (const char* point : kDemoGuestPoints) functions.push_back(point);
  // With the simulated Xen the demo guest's System.map is loaded on the first probe by symbol.
  if (!map_path.empty())
    if (auto r = s.load_symbols(dom, map_path); !r) die("cannot load " + map_path, r.error());

  std::vector<Traced> traced(functions.size());
  std::uint64_t total = 0;
  // Registered in one batch: the guest is paused once, not once per probe.
  if (auto r = s.begin_batch(); !r) die("begin_batch", r.error());
  for (std::size_t i = 0; i < functions.size(); ++i) {
    Traced& t = traced[i];
    t.function = functions[i];
    PreHandler pre = [&t, &total](HitContext& c) {
      ++t.per_vcpu[c.vcpu().value % kMaxVcpus];
      ++total;
      return 0;
    };
    PostHandler post;
    if (wants_post(t.function))  // a post-handler: the instruction has run when it is called
      post = [&t](HitContext& c) {
        ++t.posts;
        t.rip_step = static_cast<std::int64_t>(c.regs().rip - c.address().value);
        t.rax = c.regs().rax;
      };
    auto p = s.probe(dom, std::string_view(t.function), std::move(pre), std::move(post));
    if (!p) {
      (void)s.end_batch();
      die("cannot probe " + t.function, p.error());
    }
    t.probe = std::move(*p);
  }
  if (auto r = s.end_batch(); !r) die("end_batch", r.error());
  std::printf("tracing %zu functions in domain %u (channel %s) for %.1f s or %" PRIu64 " hits\n", traced.size(), domid,
              s.channel_name(DomId{domid}).value_or("?").c_str(), seconds, max_hits);
  std::fflush(stdout);

  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (total < max_hits && std::chrono::steady_clock::now() < end)
    if (auto r = s.run_once(10); !r) die("run_once", r.error());

  unsigned vcpus = 1;
  if (auto info = s.hypervisor().domain_info(dom); info) vcpus = std::min<unsigned>(info->vcpus, kMaxVcpus);
  std::printf("%-18s %-18s %-10s %9s %7s", "function", "address", "mode", "hits", "unhandled");
  for (unsigned v = 0; v < vcpus; ++v) std::printf("   vcpu%u", v);
  std::printf("  instruction\n");
  bool ok = true;
  for (Traced& t : traced) {
    auto info = t.probe.info();
    if (!info) die("info " + t.function, info.error());
    ProbeStats st = t.probe.stats();
    std::printf("%-18s 0x%016" PRIx64 " %-10s %9" PRIu64 " %7" PRIu64, t.function.c_str(), info->address.value,
                mode_name(info->mode), st.hits, st.unhandled);
    for (unsigned v = 0; v < vcpus; ++v) std::printf(" %7" PRIu64, t.per_vcpu[v]);
    // ProbeInfo::instruction starts with the address: show the bytes and mnemonic only.
    const std::string& insn = info->instruction;
    auto colon = insn.find(": ");
    std::printf("  %s\n", colon == std::string::npos ? insn.c_str() : insn.c_str() + colon + 2);
    if (st.hits == 0) ok = false;
  }
  for (const Traced& t : traced)
    if (t.posts)
      std::printf("post-handler on %s ran %" PRIu64 " times: after the probed instruction, rip had moved by %" PRId64
                  " bytes and rax was %" PRIu64 "\n",
                  t.function.c_str(), t.posts, t.rip_step, t.rax);
  traced.clear();  // unregisters every probe: the guest's bytes are restored exactly
  auto info = s.hypervisor().domain_info(dom);
  if (!info || info->crashed) {
    std::printf("the guest crashed\n");
    return 1;
  }
  std::printf("%" PRIu64 " hits; every probe removed, the guest runs on untouched\n", total);
  return ok ? 0 : 1;
}
