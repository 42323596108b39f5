// xenprobe against a guest with nothing of ours in it and no file in Dom0 (issue 15's
// agentless case), on the simulated Xen: the demo guest booted from an image that carries
// kallsyms of its own and a BTF blob (tests/kallsyms_image.hpp), without the guest module
// (--sim-no-module), probed through vm_event. Its symbols come from its memory; the names in
// its kallsyms differ from the demo guest's System.map in one function, so a count under that
// name can only come from the guest's memory.

#include "demo_abi.h"
#include "kallsyms_image.hpp"

#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// The demo guest's vmlinux with kallsyms in which sys_getppid is called sys_getppie (same
// length: nothing else moves), removed when the test ends.
struct AgentlessImage {
  std::string path;
  AgentlessImage() {
    std::vector<Sym> syms = symbols_of_map(XENPROBES_DEMO_GUEST_SYSTEM_MAP);
    for (Sym& s : syms)
      if (s.name == "sys_getppid") s.name = "sys_getppie";
    std::size_t btf_at = 0;
    const std::vector<std::uint8_t> seg = kallsyms_segment(syms, &btf_at);
    path = image_with_segment((fs::path(XENPROBES_DEMO_GUEST_SYSTEM_MAP).parent_path() / "vmlinux").string(), seg);
  }
  ~AgentlessImage() { fs::remove(path); }
};

std::vector<std::string> agentless(const AgentlessImage& img) {
  return {"--sim", "--sim-type", "pvh", "--sim-no-module", "sim-1", "--sim-image", img.path};
}

constexpr std::uint64_t kRecurseCalls = DEMO_RECURSE_DEPTH + 1 + DEMO_DISPATCH_RECURSE_DEPTH + 1;

// Without the module the library picks vm_event; symbols (kallsyms) and the BTF come from the
// guest's memory; every count is the workload's.
TEST(XenprobeAgentless, SymbolsAndTypesFromTheGuestsMemoryThroughVmEvent) {
  AgentlessImage img;
  constexpr std::uint64_t K = 5;
  ToolRun r = run(args(agentless(img), {"--sim-vcpus", "2", "--sim-iterations", std::to_string(K), "-e",
                                        "kprobe:sys_getppie { @c[func] = count(); } "
                                        "kprobe:demo_recurse { @r = count(); } "
                                        "kprobe:demo_dispatch /arg0 == 3/ { @d = count(); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Attaching 3 probes to sim-1 (domain 1, channel vmevent)...\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("@c[sys_getppie]: " + std::to_string(2 * K * 2) + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("@r: " + std::to_string(kRecurseCalls * K * 2) + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("@d: " + std::to_string(K * 2) + "\n"), std::string::npos) << r.out;

  // A return probe needs the module (its trampoline lives in the module's out-of-line area):
  // refused before anything runs, saying so.
  ToolRun ret = run(args(agentless(img), {"--sim-iterations", "1", "-e", "kretprobe:demo_recurse { @r = count(); }"}));
  EXPECT_EQ(ret.status, 1);
  EXPECT_NE(ret.err.find("kretprobe:demo_recurse: domain 1 has no guest module: return probes need its out-of-line "
                         "area for the return trampoline"),
            std::string::npos)
      << ret.err;
  EXPECT_EQ(ret.out.find("@r"), std::string::npos) << ret.out;

  // The name the demo guest's System.map has is not the guest's.
  ToolRun old = run(args(agentless(img), {"--sim-iterations", "1", "-e", "kprobe:sys_getppid { }"}));
  EXPECT_EQ(old.status, 1);
  EXPECT_NE(old.err.find("no symbol 'sys_getppid'"), std::string::npos) << old.err;

  ToolRun l = run(args(agentless(img), {"list", "sys_getpp*"}));
  EXPECT_EQ(l.status, 0) << l.err;
  EXPECT_EQ(l.out, "kprobe:sys_getppie\n");

  // Its BTF is read from its memory too (a blob with one type, "int"): the error names where
  // the types were looked for.
  ToolRun t = run(args(agentless(img), {"-e", "kprobe:sys_getppie { @ = ((struct file *)arg0)->f_path; }"}));
  EXPECT_EQ(t.status, 1);
  EXPECT_NE(t.err.find("error: no struct file in the BTF of sim-1's kernel (read from its memory)"), std::string::npos)
      << t.err;
  EXPECT_EQ(t.out, "");
}

// The library picks each domain's channel: a guest with the module gets the guest channel, one
// without it vm_event, in one run; each counts exactly.
TEST(XenprobeAgentless, EachDomainGetsItsOwnChannel) {
  constexpr std::uint64_t K = 4;
  ToolRun r = run({"--sim", "--sim-guests", "2", "--sim-vcpus", "1", "--sim-type", "pvh", "--sim-no-module", "2",
                   "--sim-iterations", std::to_string(K), "-d", "sim-*", "-e", "kprobe:sys_getppid { @c = count(); }"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("[sim-1] Attaching 1 probe to sim-1 (domain 1, channel guest)...\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[sim-2] Attaching 1 probe to sim-2 (domain 2, channel vmevent)...\n"), std::string::npos)
      << r.out;
  for (const char* dom : {"[sim-1] @c: ", "[sim-2] @c: "})
    EXPECT_NE(r.out.find(dom + std::to_string(2 * K) + "\n"), std::string::npos) << dom << "\n" << r.out;
}

// A System.map of a kernel that KASLR moved (linked 2 MiB below where the guest runs), given
// with --symbols to a guest without the module, which publishes no _text: the library slides it
// by the guest's own kallsyms, and the probes count exactly.
TEST(XenprobeAgentless, ASystemMapIsSlidByTheGuestsKallsyms) {
  AgentlessImage img;
  const fs::path map = fs::path(img.path + ".map");
  {
    std::ofstream out(map);
    for (const Sym& s : symbols_of_map(XENPROBES_DEMO_GUEST_SYSTEM_MAP)) {
      char line[600];
      std::snprintf(line, sizeof line, "%016llx %c %s\n", static_cast<unsigned long long>(s.addr - 0x200000), s.type,
                    s.name.c_str());
      out << line;
    }
  }
  constexpr std::uint64_t K = 4;
  ToolRun r = run(args(agentless(img),
                       {"--sim-vcpus", "1", "--sim-iterations", std::to_string(K), "--symbols", "sim-1=" + map.string(),
                        "-e", "kprobe:sys_getppid { @c = count(); } kprobe:sys_read { @r = count(); }"}),
                  {}, {}, {{"XENPROBES_LOG", "info"}});
  fs::remove(map);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("domain 1: KASLR slide 0x200000 from the guest's kallsyms"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("channel vmevent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("@c: " + std::to_string(2 * K) + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("@r: " + std::to_string(2 * K) + "\n"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace xenprobes::testing
