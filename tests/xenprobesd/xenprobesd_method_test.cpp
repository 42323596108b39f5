// xenprobesd's programs with a method: async records instead of traps, the same counts, types
// planned with the guest's BTF at attach, lost events, refusals, and the method passed to the
// library.

#include "module_btf_guest.hpp"
#include "xenprobesd/xenprobesd_fixture.hpp"

namespace xenprobes::testing {
namespace {

// ---- method ----

// The same program through trap probes in sim-1 and through async records in sim-2 (an async
// probe has its point to itself: the two cannot share a guest). The workload is the same, so
// are the counts and maps; nsecs is the guest's clock at the hit, which stands still on the
// simulated Xen (Dom0's moves). The async guest's lost events are exported (none: its rings
// have room), the trap guest has no such series; the records say each attachment's method.
TEST(xenprobesd, AnAsyncProgramCountsWhatTheTrapOneCounts) {
  TempDir t;
  const std::string prog =
      "source = 'kprobe:sys_getppid { @calls = count(); @by[func, cpu] = count(); @lo = min(nsecs); "
      "@hi = max(nsecs); }'\n";
  auto cfg = t.write("c.toml", daemon_section() + "[[program]]\nname = \"trap\"\n" + prog +
                                   "domains = [{ name = \"sim-1\" }]\n\n[[program]]\nname = \"async\"\n" + prog +
                                   "domains = [{ name = \"sim-2\" }]\nmethod = \"async\"\n");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  int attached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "attached") {
      ++attached;
      EXPECT_EQ(r["method"], r["program"]) << r;
    }
  EXPECT_EQ(attached, 2);
  const std::string m = metrics(port);
  auto value = [&](const std::string& dom, const std::string& p, const std::string& map, const std::string& key) {
    return sample(m, "xenprobesd_map_value{domain=\"" + dom + "\",program=\"" + p + "\",map=\"" + map + "\",key=\"" +
                         key + "\"}");
  };
  for (auto [dom, p] : {std::pair{"sim-1", "trap"}, std::pair{"sim-2", "async"}}) {
    EXPECT_EQ(sample(m, hits(dom, p, "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(value(dom, p, "@calls", ""), 2 * K) << m;
    EXPECT_EQ(value(dom, p, "@by", "sys_getppid,0"), 2 * K) << m;
    EXPECT_GE(value(dom, p, "@lo", ""), 0) << m;
  }
  EXPECT_LT(value("sim-1", "trap", "@lo", ""), value("sim-1", "trap", "@hi", ""));
  EXPECT_EQ(value("sim-2", "async", "@lo", ""), value("sim-2", "async", "@hi", ""));
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-2\"}"), 0) << m;
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-1\"}"), -1) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  int detached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "detached") {
      ++detached;
      EXPECT_EQ(r["hits"], 2 * K) << r;
      EXPECT_EQ(r.contains("lost_events"), r["program"] == "async") << r;
      if (r["program"] == "async") { EXPECT_EQ(r["lost_events"], 0) << r; }
    }
  EXPECT_EQ(detached, 2);
}

// An async program that needs types cannot be planned at load: it is checked and planned with
// the guest's own BTF when it attaches there (the guest of tests/module_btf_guest.hpp, whose
// kernel and xfs module have BTF). One reading a field of a cast argument (a capture at
// arg0 + 8) attaches and counts every call; one reading a field at a kaddr() address checks
// against the types but a record cannot give it: that attachment fails with the planner's
// message, naming the method.
TEST(xenprobesd, AnAsyncProgramNeedingTypesIsPlannedWithTheGuestsBtfAtAttach) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest g = xenprobes::testing::module_btf_guest();
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "field"
source = 'kprobe:sys_getppid { @f[((struct xfs_inode *)arg0)->i_flags >= 0] = count(); @c = count(); }'
domains = [{ name = "sim-1" }]
method = "async"

[[program]]
name = "kaddr"
source = 'kprobe:sys_getppid { @i = max(((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino); }'
domains = [{ name = "sim-1" }]
method = "async"
)");
  Daemon d(cfg, sim(1, {"--sim-image", "sim-1=" + g.image, "--sim-symbols", "sim-1=" + g.map}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "kaddr");
  const std::string b = f["body"];
  EXPECT_TRUE(b.starts_with("the program cannot run with method = \"async\":\n")) << b;
  EXPECT_NE(b.find("error: this read of guest memory cannot come from an async record"), std::string::npos) << b;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "field", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"field\",map=\"@c\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-1\"}"), 0) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
  int attached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "attached") {
      ++attached;
      EXPECT_EQ(r["program"], "field") << r;
      EXPECT_EQ(r["method"], "async") << r;
    }
  EXPECT_EQ(attached, 1);
}

// Async rings too small for the hits between two reads (--sim-ring-order 12: 4 KiB, three
// records of this probe): the guest module drops hits, and they are the domain's lost events,
// in the metrics and in the detached record. Every call the trap program counts in the other
// guest (the same workload) is a record or a lost event in the async one.
TEST(xenprobesd, AsyncHitsTheRingsHadNoRoomForAreLostEvents) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "trap"
source = 'kprobe:sys_read { @n = count(); }'
domains = [{ name = "sim-1" }]

[[program]]
name = "async"
source = 'kprobe:sys_read { @n = count(); @s[str(arg1, 1000)] = count(); }'
domains = [{ name = "sim-2" }]
method = "async"
)");
  Daemon d(cfg, {"--sim", "--sim-guests", "2", "--sim-vcpus", "2", "--sim-iterations", "400", "--sim-ring-order", "12"},
           t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const double calls = sample(m, hits("sim-1", "trap", "kprobe:sys_read"));
  const double records = sample(m, hits("sim-2", "async", "kprobe:sys_read"));
  const double lost = sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-2\"}");
  EXPECT_GT(calls, 0) << m;
  EXPECT_GT(lost, 0) << m;
  EXPECT_EQ(records + lost, calls) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  json gone;
  for (const json& r : d.all())
    if (r["kind"] == "detached" && r["program"] == "async") gone = r;
  ASSERT_FALSE(gone.is_null());
  EXPECT_EQ(gone["lost_events"], lost);
  EXPECT_EQ(gone["hits"], records);
}

// A block an async record cannot serve (a str() of a variable) is refused at load, naming the
// program, the position in the configuration file, and the method to use instead; the same
// program with method = "trap" is accepted.
TEST(xenprobesd, AnAsyncProgramARecordCannotServeIsAConfigError) {
  TempDir t;
  const std::string prog =
      "[[program]]\nname = \"names\"\ndomains = [{ glob = \"*\" }]\n"
      "source = 'kprobe:sys_openat { $p = arg1; @[str($p)] = count(); }'\n";
  auto check = [&](const std::string& method) {
    auto cfg = t.write("c.toml", prog + "method = \"" + method + "\"\n");
    return shell("'" + std::string(XENPROBESD_BIN) + "' --check-config -c '" + cfg.string() + "'");
  };
  auto [status, out] = check("async");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("c.toml:4:44: error: program \"names\": str() of this address cannot come from an async "
                     "record (method = \"async\")"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("use method = \"trap\" (or \"jump\") for this program"), std::string::npos) << out;
  auto [trap_status, trap_out] = check("trap");
  EXPECT_EQ(trap_status, 0) << trap_out;
}

// The method goes to the library: on the debugger channel a jump or an async kprobe cannot be
// placed, and its attachment fails with the library's reason, while the trap program and
// fastest (a trap where a jump cannot be) count as always. (jump and async probe functions of
// their own: a jump or async probe cannot share a trap probe's point.)
TEST(xenprobesd, TheMethodGoesToTheLibrary) {
  TempDir t;
  std::string progs;
  for (auto [m, fn] : {std::pair{"trap", "sys_getppid"}, std::pair{"fastest", "sys_getppid"},
                       std::pair{"jump", "sys_read"}, std::pair{"async", "demo_recurse"}})
    progs += std::string("\n[[program]]\nname = \"") + m + "\"\nmethod = \"" + m + "\"\nsource = 'kprobe:" + fn +
             " { @c = count(); }'\ndomains = [{ glob = \"*\" }]\n";
  auto cfg = t.write("c.toml", daemon_section("channel = \"debugger\"") + progs);
  Daemon d(cfg, sim(1, {"--sim-type", "pvh"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::set<std::string> attached, failed;
  for (const json& r : d.all()) {
    if (r["kind"] == "attached") attached.insert(r["program"].get<std::string>());
    if (r["kind"] == "attach_failed") {
      failed.insert(r["program"].get<std::string>());
      // An async probe is a jump probe whose hit the module records (Session::probe_async).
      const std::string body = r["body"];
      EXPECT_TRUE(body.starts_with(r["program"] == "jump" ? "kprobe:sys_read: " : "kprobe:demo_recurse: ")) << r;
      EXPECT_NE(body.find("cannot be a jump probe: jump probes need the guest channel"), std::string::npos) << r;
    }
  }
  EXPECT_EQ(attached, (std::set<std::string>{"fastest", "trap"}));
  EXPECT_EQ(failed, (std::set<std::string>{"async", "jump"}));
  const std::string m = metrics(port);
  for (const char* p : {"trap", "fastest"}) EXPECT_EQ(sample(m, hits("sim-1", p, "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

}  // namespace
}  // namespace xenprobes::testing
