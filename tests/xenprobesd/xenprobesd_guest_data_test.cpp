// xenprobesd and what its programs read in the guests: types from each guest's own BTF and from
// its loaded modules (tests/module_btf_guest.hpp), guest bytes in the metrics and the log, full
// maps, kstack keys; on the simulated Xen with the demo guests' workload (2K hits for K
// iterations).

#include "module_btf_guest.hpp"
#include "xenprobesd/xenprobesd_fixture.hpp"

namespace xenprobes::testing {
namespace {

// A program that needs the guest kernel's types (here comm) is accepted and checked again for
// each guest with that guest's BTF, read from its memory. The demo guest's kernel has none:
// its attachment fails and says so; the program beside it, which needs no types, is served.
TEST(xenprobesd, AProgramNeedingTypesIsCheckedWithEachGuestsOwnBtf) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "by-comm"
source = 'kprobe:sys_getppid { @c[comm] = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "by-comm");
  EXPECT_NE(f["body"].get<std::string>().find(
                "the program needs the guest kernel's types and its BTF cannot be read from its memory: "),
            std::string::npos)
      << f;
  EXPECT_NE(f["body"].get<std::string>().find("__start_BTF"), std::string::npos) << f;
  json a = d.seen_or_next("attached", "sim-1");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["program"], "plain");
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A program that reads through a loaded module's struct is checked with the guest's kernel
// types and its live modules' (tests/module_btf_guest.hpp: the demo guest with a LIVE module
// "xfs" whose split BTF has struct xfs_inode on the kernel's btf_modules list, as a real kernel
// keeps it, given with --sim-image and --sim-symbols) and
// reads the exact values there. The same program in a guest with the same kernel BTF and no
// module, or with the module but no BTF for it, fails to check, naming the type (and the
// module left out, and why); those guests are served by the program beside it.
TEST(xenprobesd, AProgramReadsThroughALoadedModulesTypes) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest with = xenprobes::testing::module_btf_guest();
  const ModuleBtfGuest none = xenprobes::testing::module_btf_guest({.module = false});
  const ModuleBtfGuest no_btf = xenprobes::testing::module_btf_guest({.module = true, .module_btf = false});
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "xfs"
source = '''
kprobe:sys_getppid { printf("ino=%lx flags=%u\n", ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino,
                            ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_flags);
                     @flags = max(((struct xfs_inode *)kaddr("xfs:xfs_file_read_iter"))->i_flags); @calls = count(); }
'''
domains = [{ glob = "*" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  std::vector<std::string> args;
  for (const auto& [name, g] : {std::pair{"sim-1", &with}, std::pair{"sim-2", &none}, std::pair{"sim-3", &no_btf}})
    for (const std::string& a : {std::string("--sim-image"), std::string(name) + "=" + g->image,
                                 std::string("--sim-symbols"), std::string(name) + "=" + g->map})
      args.push_back(a);
  Daemon d(cfg, sim(3, args), t.path);
  const int port = d.next("metrics_listening")["port"];
  const std::string no_type = "error: no struct xfs_inode in the BTF of ";
  json f2 = d.next("attach_failed", "sim-2");
  ASSERT_FALSE(f2.is_null());
  EXPECT_EQ(f2["program"], "xfs");
  const std::string b2 = f2["body"];
  EXPECT_TRUE(b2.starts_with("the program does not check against this guest's kernel types:\n")) << b2;
  EXPECT_NE(b2.find(no_type + "sim-2's kernel (read from its memory)\n"), std::string::npos) << b2;
  EXPECT_EQ(b2.find("types left out"), std::string::npos) << b2;  // no module, none left out
  json f3 = d.seen_or_next("attach_failed", "sim-3");
  ASSERT_FALSE(f3.is_null());
  EXPECT_EQ(f3["program"], "xfs");
  const std::string b3 = f3["body"];
  EXPECT_NE(b3.find(no_type + "sim-3's kernel (read from its memory)\n"), std::string::npos) << b3;
  EXPECT_TRUE(b3.ends_with(
      "types left out:\n  module xfs: it has no BTF: the kernel's btf_modules list has no entry for it (the module "
      "was built without BTF, or the kernel refused its BTF when it loaded it), and its struct module's btf_data is "
      "NULL (Linux 5.11 and later clear it once the module's init ran)\n"))
      << b3;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"xfs\",map=\"@flags\",key=\"\"}"),
            ModuleBtfGuest::kFlags)
      << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"xfs\",map=\"@calls\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_attachment_info{domain=\"sim-2\",program=\"xfs\",channel=\"guest\"}"), -1) << m;
  for (const char* dom : {"sim-1", "sim-2", "sim-3"})
    EXPECT_EQ(sample(m, hits(dom, "plain", "kprobe:sys_getppid")), 2 * K) << dom << "\n" << m;
  EXPECT_EQ(sample(m, "xenprobesd_guest_read_errors_total{domain=\"sim-1\",program=\"xfs\"}"), 0) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
  // Every hit in sim-1 printed the module's struct as it is in the guest's memory.
  char want[64];
  std::snprintf(want, sizeof want, "ino=%llx flags=%u\n", static_cast<unsigned long long>(ModuleBtfGuest::kIno),
                ModuleBtfGuest::kFlags);
  int printed = 0;
  for (const json& r : d.all())
    if (r["kind"] == "printf") {
      EXPECT_EQ(r["domain"], "sim-1") << r;
      EXPECT_EQ(r["body"], want) << r;
      ++printed;
    }
  EXPECT_EQ(printed, 2 * K);
  EXPECT_EQ(std::count_if(d.all().begin(), d.all().end(),
                          [](const json& r) { return r["kind"] == "attached" && r["program"] == "xfs"; }),
            1);
}

// A module loaded while the daemon runs: the guest's "xfs" is laid out in its memory but not on
// its module list nor its BTF on btf_modules, so the program naming struct xfs_inode fails to
// attach; inside the handler of the guest's 5th hit (of the program that needs no types) the
// daemon's --sim-write links both in, as an insmod would, and the attachment's next try (2 s later) reads the types again
// and attaches with no reload: every hit it serves prints the module's struct as it is in the
// guest.
TEST(xenprobesd, AModuleLoadedWhileItRunsBringsItsTypesAtTheNextTry) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest g = xenprobes::testing::module_btf_guest({.linked = false});
  char hex[32];
  std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(ModuleBtfGuest::kHead));
  std::string link = std::string("sim-1@5:") + hex + "=";
  for (std::uint8_t b : ModuleBtfGuest::link_bytes()) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    link += hex;
  }
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "xfs"
source = '''
kprobe:sys_getppid { printf("ino=%lx flags=%u\n", ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino,
                            ((struct xfs_inode *)kaddr("xfs:xfs_file_read_iter"))->i_flags); }
'''
domains = [{ name = "sim-1" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ name = "sim-1" }]
)");
  // The guest runs until the daemon stops: the retry comes seconds after the module is loaded.
  Daemon d(cfg,
           {"--sim", "--sim-guests", "1", "--sim-vcpus", "1", "--sim-iterations", "0", "--sim-image",
            "sim-1=" + g.image, "--sim-symbols", "sim-1=" + g.map, "--sim-write", link},
           t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "xfs");
  const std::string b = f["body"];
  EXPECT_NE(b.find("error: no struct xfs_inode in the BTF of sim-1's kernel (read from its memory)\n"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("a module's types are read from the modules loaded when the program attaches: once the module "
                   "is loaded, the next try attaches\n"),
            std::string::npos)
      << b;
  EXPECT_EQ(b.find("types left out"), std::string::npos) << b;  // no module on the list yet
  // The same attachment, attached at a later try.
  json a;
  do a = d.next("attached", "sim-1");
  while (!a.is_null() && a["program"] != "xfs");
  ASSERT_FALSE(a.is_null()) << d.err();
  char want[64];
  std::snprintf(want, sizeof want, "ino=%llx flags=%u\n", static_cast<unsigned long long>(ModuleBtfGuest::kIno),
                ModuleBtfGuest::kFlags);
  json p = d.next("printf", "sim-1");
  ASSERT_FALSE(p.is_null());
  EXPECT_EQ(p["body"], want) << p;
  EXPECT_EQ(d.stop(), 0) << d.err();
  int printed = 0, failed = 0;
  for (const json& r : d.all()) {
    if (r["kind"] == "printf") {
      EXPECT_EQ(r["body"], want) << r;
      ++printed;
    }
    if (r["kind"] == "attach_failed") ++failed;
  }
  EXPECT_GE(printed, 1);
  EXPECT_EQ(failed, 1);  // one record per reason, not one per try
  EXPECT_EQ(d.err().find("--sim-write"), std::string::npos) << d.err();
}

// Map keys and printf text are guest data. The bytes at sys_getppid are the ftrace nop
// 0f 1f 44 00 00, and at +5 sits the probe's own trap byte while it is armed (0xcc on the
// guest channel, tests/xenprobe): a lone 0xcc is not UTF-8. The metrics carry U+FFFD in its
// place and still pass promtool; the event log's lines still parse.
TEST(xenprobesd, GuestBytesCannotBreakTheMetricsOrTheLog) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "bytes"
source = '''
kprobe:sys_getppid { @bin[str(kaddr("sys_getppid") + 5, 2)] = count(); @ctl[str(kaddr("sys_getppid"), 4)] = count();
                     printf("%s|%s\n", str(kaddr("sys_getppid") + 5, 2), str(kaddr("sys_getppid"), 4)); }
'''
domains = [{ glob = "*" }]
event_burst = 1
events_per_second = 0.000001
)");
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  json p = d.next("printf");
  ASSERT_FALSE(p.is_null());
  EXPECT_EQ(p["body"],
            "\xef\xbf\xbd|\x0f\x1f"
            "D\n");
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"bytes\",map=\"@bin\",key=\"\xef\xbf\xbd\"}"),
            2 * K)
      << m;
  EXPECT_EQ(sample(m,
                   "xenprobesd_map_value{domain=\"sim-1\",program=\"bytes\",map=\"@ctl\",key=\"\x0f\x1f"
                   "D\"}"),
            2 * K)
      << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A guest that makes every key unique cannot grow the daemon's memory: each map holds at most
// max_map_keys keys per domain; updates with new keys are dropped, counted in the metrics and
// logged once per map.
TEST(xenprobesd, AFullMapDropsNewKeysAndSaysSoOnce) {
  TempDir t;
  const std::string prog = R"(
[[program]]
name = "flood"
source = 'kprobe:sys_getppid { @n = count(); @flood[@n] = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", daemon_section("max_map_keys = 10") + prog);
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  json full = d.next("map_full", "sim-1");
  ASSERT_FALSE(full.is_null());
  EXPECT_EQ(full["program"], "flood");
  EXPECT_NE(full["body"].get<std::string>().find("map @flood is full (10 keys)"), std::string::npos) << full;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const std::string l = "{domain=\"sim-1\",program=\"flood\",map=\"@flood\"}";
  EXPECT_EQ(sample(m, "xenprobesd_map_updates_dropped_total" + l), 2 * K - 10) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@n\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@flood\",key=\"10\"}"), 1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@flood\",key=\"11\"}"), -1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_updates_dropped_total{domain=\"sim-1\",program=\"flood\",map=\"@n\"}"), -1) << m;
  expect_promtool_clean(m, t.path);
  int warnings = 0;
  for (const json& r : d.all()) warnings += r["kind"] == "map_full";
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(d.stop(), 0) << d.err();

  TempDir bad;
  auto zero = bad.write("c.toml", daemon_section("max_map_keys = 0") + prog);
  auto [st, out] = shell(std::string(XENPROBESD_BIN) + " --check-config -c " + zero.string());
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("max_map_keys"), std::string::npos) << out;
}

// kstack in a daemon's program: the demo guest's hand-written ORC chain (guest/kstack.S), its
// first two frames as one map key, exported with the newlines escaped.
TEST(xenprobesd, KstackKeysAMapByTheGuestsStack) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section("") + R"(
[[program]]
name = "stacks"
source = 'kprobe:demo_kstack_leaf { @s[kstack(2)] = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const std::string key = "\\n        demo_kstack_leaf+0x0\\n        demo_kstack_middle+0x9\\n";
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"stacks\",map=\"@s\",key=\"" + key + "\"}"), K)
      << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

}  // namespace
}  // namespace xenprobes::testing
