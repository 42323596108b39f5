// xenprobes-demo: the main job. Opens the hypervisor (the simulated Xen when this machine is
// not a Xen Dom0), lists the domains, and watches one guest kernel from Dom0: its published
// module keys, its kernel text through its own page tables, and — for the demo guest — the
// per-vCPU call counters its workload keeps in guest memory, while pausing and resuming it.
//
//   xenprobes-demo [--domain N] [--system-map FILE] [--seconds S]
//
// Probes themselves arrive with the XP/XrP API; this program shows the foundation they run on.
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/sim.hpp"
#include "example_backend.h"

using namespace xenprobes;

namespace {

// The demo guest's per-vCPU statistics (guest/demo_abi.h): calls[8], iterations, checksum, done.
constexpr unsigned kDemoFuncs = 8;
constexpr std::size_t kDemoStatsSize = 8 * kDemoFuncs + 24;
const char* kDemoFuncNames[kDemoFuncs] = {"getppid", "read",    "write",    "open",
                                          "unlink",  "recurse", "classify", "dispatch"};

std::map<std::string, std::uint64_t> load_system_map(const std::string& path) {
  std::map<std::string, std::uint64_t> syms;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string addr, type, name;
    if (ls >> addr >> type >> name) syms[name] = std::strtoull(addr.c_str(), nullptr, 16);
  }
  return syms;
}

[[noreturn]] void die(const char* what, const Error& e) {
  std::fprintf(stderr, "xenprobes-demo: %s: %s (%s)\n", what, e.what.c_str(), errc_name(e.code));
  std::exit(1);
}

void usage() {
  std::fprintf(stderr,
               "usage: xenprobes-demo [--domain N] [--system-map FILE] [--seconds S]\n"
               "  XENPROBES_BACKEND=xen|sim selects the hypervisor (default: xen, or sim when\n"
               "  this machine is not a Xen Dom0).\n");
}

}  // namespace

int main(int argc, char** argv) {
  unsigned domid = 1;
  std::string map_path;
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--domain" && i + 1 < argc) {
      domid = static_cast<unsigned>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--system-map" && i + 1 < argc) {
      map_path = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::strtod(argv[++i], nullptr);
    } else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }

  example_choose_backend("xenprobes-demo");

  auto hvr = hv::open_hypervisor();
  if (!hvr) die("cannot open the hypervisor", hvr.error());
  hv::Hypervisor& hv = **hvr;
  auto version = hv.version();
  auto caps = hv.capabilities();
  std::printf("hypervisor: %s, Xen %s, gdbsx %s\n", hv.name().c_str(), version ? version->c_str() : "?",
              caps && caps->gdbsx ? "present" : "absent");

  auto doms = hv.list_domains();
  if (!doms) die("cannot list domains", doms.error());
  std::printf("%-6s %-12s %-4s %-6s %s\n", "domid", "name", "type", "vcpus", "state");
  for (const auto& d : *doms)
    std::printf("%-6u %-12s %-4s %-6u %s\n", d.domid.value, d.name.c_str(), d.type == hv::GuestType::Pv ? "pv" : "hvm",
                d.vcpus,
                d.crashed  ? "crashed"
                : d.paused ? "paused"
                           : "running");

  DomId dom{domid};
  auto info = hv.domain_info(dom);
  if (!info) die("cannot find the domain", info.error());

  // What the guest module published (hostile input: shown, not trusted).
  std::string dir = "/local/domain/" + std::to_string(domid) + "/" XENPROBES_XS_DIR "/";
  auto ver = hv.xs_read(dir + XENPROBES_XS_VERSION);
  auto text = hv.xs_read(dir + XENPROBES_XS_KERNEL_TEXT);
  auto oea = hv.xs_read(dir + "oea/0/addr");
  std::printf("guest module: %s (protocol %s), kernel text %s, OEA %s\n", ver ? "present" : "absent",
              ver ? ver->c_str() : "-", text ? text->c_str() : "-", oea ? oea->c_str() : "-");

  if (map_path.empty() && hv.name() == "sim") map_path = hv::sim::default_guest_dir() + "/System.map";
  auto syms = load_system_map(map_path);
  if (syms.empty()) {
    std::printf("no symbols (pass --system-map FILE to look inside the kernel)\n");
    return 0;
  }
  std::printf("symbols: %zu from %s\n", syms.size(), map_path.c_str());

  auto view = GuestView::open(hv, dom);
  if (!view) die("cannot open guest memory", view.error());
  for (const char* fn : {"sys_getppid", "sys_open", "sys_unlink"}) {
    auto it = syms.find(fn);
    if (it == syms.end()) continue;
    auto pa = (*view)->translate(Gva{it->second});
    std::uint8_t code[8] = {};
    auto rd = (*view)->read(Gva{it->second}, std::as_writable_bytes(std::span(code)));
    if (!pa || !rd) {
      std::printf("  %-12s 0x%016" PRIx64 " -> %s\n", fn, it->second, (pa ? rd.error() : pa.error()).what.c_str());
      continue;
    }
    std::printf("  %-12s 0x%016" PRIx64 " -> %s 0x%09" PRIx64 ": %02x %02x %02x %02x %02x %02x %02x %02x\n", fn,
                it->second, info->type == hv::GuestType::Pv ? "machine" : "guest-phys", pa->value, code[0], code[1],
                code[2], code[3], code[4], code[5], code[6], code[7]);
  }

  auto stats = syms.find("demo_stats");
  if (stats == syms.end()) return 0;
  auto sample = [&](const char* label) -> bool {
    std::printf("%s\n", label);
    for (unsigned v = 0; v < info->vcpus; ++v) {
      std::uint64_t s[kDemoFuncs + 3];
      auto r = (*view)->read(Gva{stats->second + v * kDemoStatsSize}, std::as_writable_bytes(std::span(s)));
      if (!r) {
        std::printf("  vcpu %u: %s\n", v, r.error().what.c_str());
        return false;
      }
      std::printf("  vcpu %u: %8" PRIu64 " iterations |", v, s[kDemoFuncs]);
      for (unsigned f = 0; f < kDemoFuncs; ++f) std::printf(" %s %" PRIu64, kDemoFuncNames[f], s[f]);
      std::printf("\n");
    }
    return true;
  };
  auto sleep = [&](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
  if (!sample("demo workload counters (read from guest memory):")) return 1;
  sleep(seconds / 2);
  if (!sample("... a moment later:")) return 1;
  if (auto r = hv.pause(dom); !r) die("pause", r.error());
  if (!sample("paused (xc_domain_pause): the counters stand still")) return 1;
  sleep(seconds / 2);
  if (!sample("... still paused:")) return 1;
  if (auto r = hv.unpause(dom); !r) die("unpause", r.error());
  sleep(seconds / 2);
  if (!sample("unpaused: running again")) return 1;
  auto after = hv.domain_info(dom);
  if (after && after->crashed) {
    std::printf("the guest crashed\n");
    return 1;
  }
  std::printf("done: the guest kept running, untouched\n");
  return 0;
}
