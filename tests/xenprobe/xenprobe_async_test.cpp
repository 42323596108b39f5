// xenprobe --method async: records the guest module writes into per-vCPU rings instead of
// traps, on the simulated Xen with the demo guest's deterministic workload (exact counts).

#include <map>
#include <regex>

#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// ---- --method async ----

// Every map and hist record of a run (the final ones), in order.
std::vector<json> final_maps(const std::vector<json>& recs) {
  std::vector<json> v;
  for (const json& r : recs)
    if (r["type"] == "map" || r["type"] == "hist") v.push_back(r);
  return v;
}

std::uint64_t lost_events(const std::vector<json>& recs) {
  std::uint64_t lost = 0;
  for (const json& r : recs)
    if (r["type"] == "lost_events") lost += r["data"]["events"].get<std::uint64_t>();
  return lost;
}

// The same program, through trap probes and through async records: the same maps, in JSON and
// in text, and the strings the workload's oracle says. The kretprobe stays a trap probe.
TEST(XenprobeAsync, StrAndMapsAreTheSameAsWithTrapProbes) {
  constexpr std::uint64_t K = 12;
  const std::string prog = R"(
    kprobe:sys_open { @path[str(arg0)] = count(); @short[str(arg0, 5)] = count(); @tail[str(arg0 + 1)] = count(); }
    kprobe:demo_dispatch /arg0 >= 5 && arg0 != 7/ { @nr[arg0, cpu] = count(); @sum = sum(arg1); }
    kprobe:sys_read { @h = hist(arg2); @f[func, probe] = count(); }
    kretprobe:sys_getppid { @ret[retval] = count(); }
  )";
  std::map<std::string, std::vector<json>> maps;
  std::map<std::string, std::string> text;
  for (const char* method : {"trap", "async"}) {
    const std::vector<std::string> base = {
        "--sim", "--sim-vcpus", "2", "--sim-iterations", std::to_string(K), "--channel", "guest", "--method", method};
    ToolRun r = run(args(base, {"-f", "json", "-e", prog}));
    ASSERT_EQ(r.status, 0) << method << ": " << r.err;
    auto recs = records(r.out);
    EXPECT_EQ(recs.front()["data"]["probes"], 4) << method;
    EXPECT_EQ(lost_events(recs), 0u) << method;
    maps[method] = final_maps(recs);
    ToolRun t = run(args(base, {"-e", prog}));
    ASSERT_EQ(t.status, 0) << method << ": " << t.err;
    text[method] = t.out;
    EXPECT_EQ(t.err.find("ost"), std::string::npos) << method << ": " << t.err;
    std::map<std::string, std::uint64_t> paths;
    for (unsigned v = 0; v < 2; ++v)
      for (std::uint64_t i = 0; i < K; ++i)
        for (const char* p : {kPaths[(i + v) % 8], kPaths[(i * 7 + v + 3) % 8]}) ++paths[p];
    EXPECT_EQ(map_data(recs, "@path"), json(paths)) << method;
  }
  EXPECT_FALSE(maps["async"].empty());
  EXPECT_EQ(maps["trap"], maps["async"]);
  EXPECT_EQ(text["trap"], text["async"]);
}

// A field of a cast argument is one read at argN + constant: a Bytes capture.
TEST(XenprobeAsync, AFieldOfACastArgumentIsCaptured) {
  const std::string btf = test_btf_path();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  const std::string prog =
      "kprobe:sys_open { @len[((struct qstr *)arg0)->len, str(((struct demo_file *)kaddr(\"demo_files\"))->path)] = "
      "count(); }";
  // kaddr() is no register: refused; the field alone is fine.
  ToolRun bad = run({"--check", "--method", "async", "--btf", btf, "-e", prog});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("str() of this address cannot come from an async record"), std::string::npos) << bad.err;
  const std::string ok = "kprobe:sys_open { @len[((struct qstr *)arg0)->len, ((struct qstr *)arg0)->hash] = count(); }";
  std::map<std::string, json> got;
  for (const char* method : {"trap", "async"}) {
    ToolRun r = run({"--sim", "--sim-vcpus", "2", "--sim-iterations", "8", "--channel", "guest", "--method", method,
                     "--btf", btf, "-f", "json", "-e", ok});
    ASSERT_EQ(r.status, 0) << method << ": " << r.err;
    got[method] = map_data(records(r.out), "@len");
    EXPECT_EQ(r.err.find("reads failed"), std::string::npos) << method << ": " << r.err;
  }
  EXPECT_GT(got["trap"].size(), 1u) << got["trap"];
  EXPECT_EQ(got["trap"], got["async"]);
}

// -c and exit() stop at the next record: the records still in the rings are dropped, so the
// counts are exact.
TEST(XenprobeAsync, HitLimitAndExitStopAtTheNextRecord) {
  const std::vector<std::string> base = {
      "--sim", "--sim-vcpus", "2", "--sim-iterations", "50", "--channel", "guest", "--method", "async", "-f", "json"};
  ToolRun c = run(args(base, {"-c", "7", "-e", "kprobe:sys_read { @n = count(); }"}));
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(map_data(records(c.out), "@n"), 7);
  ToolRun e = run(args(base, {"-e", "kprobe:sys_read { @n = count(); if (@n == 3) { exit(); } } END { @end = 1; }"}));
  ASSERT_EQ(e.status, 0) << e.err;
  auto recs = records(e.out);
  EXPECT_EQ(map_data(recs, "@n"), 3);
  EXPECT_EQ(map_data(recs, "@end"), 1);
}

// The records' time is the guest's clock: nsecs in an async block is the record's. The
// simulated guest's clock stands still in xenprobe (--sim runs it on a manual clock), so every
// record has the same time; Dom0's clock moves.
TEST(XenprobeAsync, NsecsIsTheGuestsClockAtTheHit) {
  const std::string prog = "kprobe:sys_read { @lo = min(nsecs); @hi = max(nsecs); }";
  ToolRun a =
      run({"--sim", "--sim-iterations", "20", "--channel", "guest", "--method", "async", "-f", "json", "-e", prog});
  ASSERT_EQ(a.status, 0) << a.err;
  auto recs = records(a.out);
  EXPECT_EQ(map_data(recs, "@lo"), map_data(recs, "@hi"));
  ToolRun t =
      run({"--sim", "--sim-iterations", "20", "--channel", "guest", "--method", "trap", "-f", "json", "-e", prog});
  ASSERT_EQ(t.status, 0) << t.err;
  auto trecs = records(t.out);
  EXPECT_LT(map_data(trecs, "@lo").get<std::int64_t>(), map_data(trecs, "@hi").get<std::int64_t>());
}

// A ring too small for the hits between two reads: the module drops hits, and xenprobe
// reports them as lost events (bpftrace's "Lost N events" / lost_events record). Every call
// is a record or a lost event. How many are lost depends on how fast Dom0 drains in that run
// (on an idle machine about 1 run in 10 loses none): the counts must add up exactly either
// way; nothing here makes a loss certain (a simulated drain that stalls on demand would).
TEST(XenprobeAsync, HitsTheRingsHadNoRoomForAreLostEvents) {
  constexpr std::uint64_t K = 400;
  const std::uint64_t calls = read_counts(K, 0).size() * 2;
  const std::string prog = "kprobe:sys_read { @n = count(); @s[str(arg1, 1000)] = count(); }";
  const std::vector<std::string> base = {"--sim",           "--sim-vcpus",      "2",     "--sim-iterations",
                                         std::to_string(K), "--channel",        "guest", "--method",
                                         "async",           "--sim-ring-order", "12"};
  ToolRun r = run(args(base, {"-f", "json", "-e", prog}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  const std::uint64_t lost = lost_events(recs);  // a 4 KiB ring holds 3 records of this probe
  EXPECT_EQ(map_data(recs, "@n").get<std::uint64_t>() + lost, calls);
  // The text run: whether it loses any depends on how fast Dom0 drains this time. What it
  // says must add up either way: the ring's "Lost N" (and any hits that ran no handler, "lost
  // N") are exactly the calls @n did not count, and a run that lost none says nothing.
  ToolRun t = run(args(base, {"-e", prog}));
  ASSERT_EQ(t.status, 0) << t.err;
  const std::size_t at = t.out.find("@n: ");
  ASSERT_NE(at, std::string::npos) << t.out;
  const std::uint64_t counted = std::stoull(t.out.substr(at + 4));
  std::uint64_t said = 0;
  const std::regex line(
      "xenprobe: sim-1: [Ll]ost ([0-9]+) events \\((async hits its rings had no room for|hits the "
      "guest went through without a handler)\\)");
  for (std::sregex_iterator i(t.err.begin(), t.err.end(), line), e; i != e; ++i) said += std::stoull((*i)[1].str());
  EXPECT_EQ(counted + said, calls) << t.out << t.err;
  ToolRun bad = run(args(kSim1, {"--sim-ring-order", "11", "-e", "BEGIN { }"}));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--sim-ring-order: give 12 ... 24"), std::string::npos) << bad.err;
}

// Where async probes cannot be, the attachment fails before anything runs, saying why; a
// kretprobe is a trap probe whatever the method.
TEST(XenprobeAsync, RefusedOutsideTheGuestChannelAndKretprobesStayTraps) {
  ToolRun bad = run({"--sim", "--sim-iterations", "1", "--channel", "debugger", "--method", "async", "-e",
                     "kprobe:sys_getppid { @c = count(); }"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("xenprobe: domain sim-1: kprobe:sys_getppid: "), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out.find("Attaching"), std::string::npos) << bad.out;
  ToolRun ret = run({"--sim", "--sim-iterations", "3", "--channel", "guest", "--method", "async", "-f", "json", "-e",
                     "kretprobe:sys_getppid { @r[retval] = count(); }"});
  ASSERT_EQ(ret.status, 0) << ret.err;
  EXPECT_EQ(map_data(records(ret.out), "@r"), json({{"1", 12}}));  // 2 calls an iteration, 2 vCPUs
}

// Every value a record cannot give is refused before anything is attached, with its position
// and what to use instead (golden files; --check with the test BTF).
TEST(XenprobeAsync, RefusalsMatchTheirGoldenFiles) {
  const std::string btf = test_btf_path();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  const fs::path dir = fs::path(XENPROBE_TEST_DIR) / "errors-async";
  const auto cases = golden_cases(dir);
  for (const auto& [bt, want] : cases) {
    ToolRun r = run({"--check", "--method", "async", "--btf", btf, bt.filename().string()}, dir.string());
    EXPECT_EQ(r.status, 1) << bt;
    EXPECT_EQ(r.err, slurp(want)) << "for " << bt.filename();
    // The same program is fine with trap probes.
    ToolRun t = run({"--check", "--method", "trap", "--btf", btf, bt.filename().string()}, dir.string());
    EXPECT_EQ(t.status, 0) << bt << ": " << t.err;
  }
  EXPECT_GE(cases.size(), 12u);
}

}  // namespace
}  // namespace xenprobes::testing
