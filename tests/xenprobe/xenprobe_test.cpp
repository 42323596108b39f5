// xenprobe, run as users run it: a subprocess on the simulated Xen (--sim), its demo guests
// running a deterministic workload (guest/demo.c), so every count below is exact. The
// expected values come from the workload's definition (the oracle functions here), never
// from a previous run of the tool.

#include <cstdio>
#include <map>

#include "demo_abi.h"

#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// The check itself: what bpftrace's shapes are not is refused.
TEST(XenprobeJson, TheSchemaCheckRefusesWhatIsNotARecordsShape) {
  const auto bad = [](const char* text) { return schema_violation(json::parse(text)); };
  EXPECT_EQ(bad(R"({"type": "map", "domain": "d", "data": {"@m": {"k": 1, "l": "s"}}})"), "");
  EXPECT_EQ(
      bad(R"({"type": "hist", "domain": "d", "data": {"@h": [{"max": -1, "count": 1}, {"min": 0, "max": 0, "count": 2}]}})"),
      "");
  EXPECT_EQ(bad(R"({"type": "hist", "domain": "d", "data": {"@h": {"k": [{"min": 4, "count": 1}]}}})"), "");
  EXPECT_NE(bad(R"({"type": "map", "domain": "d", "data": {"m": 1}})"), "");  // no @
  EXPECT_NE(bad(R"({"type": "map", "domain": "d", "data": {"@m": {"k": [1]}}})"), "");
  EXPECT_NE(bad(R"({"type": "hist", "domain": "d", "data": {"@h": [{"count": 1}]}})"), "");  // no bound
  EXPECT_NE(bad(R"({"type": "hist", "domain": "d", "data": {"@h": [{"min": 1, "max": 2, "count": -1}]}})"), "");
  EXPECT_NE(bad(R"({"type": "attached_probes", "domain": "d", "data": {"probes": "2"}})"), "");
  EXPECT_NE(bad(R"({"type": "lost_events", "domain": "d", "data": {"events": 1, "x": 0}})"), "");
  EXPECT_NE(bad(R"({"type": "printf", "domain": "", "data": "x"})"), "");
  EXPECT_NE(bad(R"({"type": "printf", "domain": "d", "data": "x", "extra": 1})"), "");
  EXPECT_NE(bad(R"({"type": "time", "domain": "d", "data": "x"})"), "");
}

// ---- aggregations ----

TEST(Xenprobe, EveryAggregationHasTheWorkloadsExactValues) {
  constexpr std::uint64_t kIters = 20;
  ToolRun r =
      run(args(kSim1, {"--sim-iterations", std::to_string(kIters), "-f", "json", "-e",
                       "kprobe:sys_read { @count = count(); @sum = sum(arg2); @avg = avg(arg2); "
                       "@min = min(arg2); @max = max(arg2); @hist = hist(arg2); @lhist = lhist(arg2, 0, 48, 8); "
                       "@neg = min(0 - arg2); @h2 = hist(0 - 1); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front()["type"], "attached_probes");
  EXPECT_EQ(recs.front()["data"]["probes"], 1);
  std::vector<std::int64_t> xs = read_counts(kIters, 0);
  std::int64_t sum = 0, mn = xs[0], mx = xs[0];
  for (auto x : xs) sum += x, mn = std::min(mn, x), mx = std::max(mx, x);
  EXPECT_EQ(map_data(recs, "@count"), xs.size());
  EXPECT_EQ(map_data(recs, "@sum"), sum);
  EXPECT_EQ(map_data(recs, "@avg"), sum / static_cast<std::int64_t>(xs.size()));
  EXPECT_EQ(map_data(recs, "@min"), mn);
  EXPECT_EQ(map_data(recs, "@max"), mx);
  EXPECT_EQ(map_data(recs, "@neg"), -mx);
  EXPECT_EQ(map_data(recs, "@hist"), json(hist_oracle(xs)));
  EXPECT_EQ(map_data(recs, "@lhist"), json(lhist_oracle(xs, 0, 48, 8)));
  EXPECT_EQ(map_data(recs, "@h2"), json(hist_oracle(std::vector<std::int64_t>(xs.size(), -1))));
  // Record types: hist for hist/lhist, map for the rest.
  for (const json& rec : recs) {
    if (rec["data"].contains("@hist") || rec["data"].contains("@lhist")) { EXPECT_EQ(rec["type"], "hist"); }
  }
}

// ---- builtins ----

TEST(Xenprobe, EveryBuiltinOnTwoVcpus) {
  constexpr std::uint64_t K = 10;
  const std::string prog = R"(
    BEGIN { @start = nsecs; @dom = domain; }
    kprobe:demo_dispatch /arg0 >= 5 && arg0 != 7/ { @sel = count(); }
    kprobe:demo_dispatch { @nr[arg0] = count(); @vcpu_of[arg0, arg1 - arg2 * 7 - arg0] = count(); }
    kprobe:sys_getppid { @cpu[cpu] = count(); @probe[probe, func] = count(); }
    kretprobe:sys_getppid { @ret[retval] = count(); @rprobe[probe] = count(); }
    kretprobe:demo_recurse { @rec = count(); }
    kprobe:sys_open { @path[str(arg0)] = count(); @short[str(arg0, 5)] = count(); }
    kprobe:sys_unlink { @later = min(nsecs > @start); }
    kprobe:sys_* { @f[func] = count(); }
  )";
  ToolRun r = run({"--sim", "--sim-vcpus", "2", "--sim-iterations", std::to_string(K), "-f", "json", "-e", prog});
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  // 2 demo_dispatch + sys_getppid + kretprobe sys_getppid + demo_recurse + sys_open +
  // sys_unlink + the 5 sys_* functions.
  EXPECT_EQ(recs.front()["data"]["probes"], 12);
  EXPECT_EQ(map_data(recs, "@dom"), "sim-1");
  EXPECT_EQ(map_data(recs, "@sel"), 4 * K * 2);
  json nr, vcpu_of, cpu, path, shortp;
  for (int n = 0; n < 10; ++n) {
    nr[std::to_string(n)] = 2 * K;
    for (int v = 0; v < 2; ++v) vcpu_of[std::to_string(n) + "," + std::to_string(v)] = K;
  }
  EXPECT_EQ(map_data(recs, "@nr"), nr);
  EXPECT_EQ(map_data(recs, "@vcpu_of"), vcpu_of);
  EXPECT_EQ(map_data(recs, "@cpu"), json({{"0", 2 * K}, {"1", 2 * K}}));
  EXPECT_EQ(map_data(recs, "@probe"), json({{"kprobe:sys_getppid,sys_getppid", 4 * K}}));
  EXPECT_EQ(map_data(recs, "@ret"), json({{"1", 4 * K}}));
  EXPECT_EQ(map_data(recs, "@rprobe"), json({{"kretprobe:sys_getppid", 4 * K}}));
  EXPECT_EQ(map_data(recs, "@rec"), (DEMO_RECURSE_DEPTH + 1 + DEMO_DISPATCH_RECURSE_DEPTH + 1) * K * 2);
  std::map<std::string, std::uint64_t> paths, shorts;
  for (unsigned v = 0; v < 2; ++v)
    for (std::uint64_t i = 0; i < K; ++i)
      for (const char* p : {kPaths[(i + v) % 8], kPaths[(i * 7 + v + 3) % 8]}) {
        ++paths[p];
        ++shorts[std::string(p).substr(0, 4)];
      }
  EXPECT_EQ(map_data(recs, "@path"), json(paths));
  EXPECT_EQ(map_data(recs, "@short"), json(shorts));
  EXPECT_EQ(map_data(recs, "@later"), 1);
  json f;
  for (const char* fn : {"sys_getppid", "sys_read", "sys_write", "sys_open", "sys_unlink"}) f[fn] = 2 * K * 2;
  EXPECT_EQ(map_data(recs, "@f"), f);
}

// A return probe tracks --maxactive calls at once: the demo guest's recursion nests 9 deep on
// each of two vCPUs, so with 10 some returns are missed, and lost_events says how many.
TEST(Xenprobe, ReturnsBeyondMaxactiveAreLostEvents) {
  constexpr std::uint64_t K = 10;
  const std::uint64_t calls = (DEMO_RECURSE_DEPTH + 1 + DEMO_DISPATCH_RECURSE_DEPTH + 1) * K * 2;
  ToolRun r = run({"--sim", "--sim-vcpus", "2", "--sim-iterations", std::to_string(K), "--maxactive", "10", "-f",
                   "json", "-e", "kretprobe:demo_recurse { @rec = count(); }"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  std::uint64_t lost = 0;
  for (const json& rec : recs)
    if (rec["type"] == "lost_events") lost = rec["data"]["events"];
  EXPECT_GT(lost, 0u);
  EXPECT_EQ(map_data(recs, "@rec").get<std::uint64_t>() + lost, calls);
}

// A guest can make every key unique (an argument it chooses, a string it writes): a map holds
// at most --max-map-keys keys. A full map drops updates with new keys, counts them, warns once;
// its existing keys go on counting. 2K hits: @n numbers them 1..2K.
TEST(Xenprobe, AFullMapDropsNewKeysCountsThemAndKeepsCounting) {
  constexpr std::uint64_t K = 30;
  ToolRun r = run(args(kSim1, {"--sim-iterations", std::to_string(K), "--max-map-keys", "10", "-f", "json", "-e",
                               "kprobe:sys_getppid { @n = count(); @flood[@n] = count(); @mod[@n % 12] = count(); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  EXPECT_EQ(map_data(recs, "@n").get<std::uint64_t>(), 2 * K);
  json flood = map_data(recs, "@flood");
  ASSERT_EQ(flood.size(), 10u) << flood;
  for (int k = 1; k <= 10; ++k) EXPECT_EQ(flood[std::to_string(k)], 1) << k;
  // @mod: keys 1..10 come first and take the map; 11 and 0 never get in; every n = k mod 12
  // of 1..60 still counts for k in 1..10: five each.
  json mod = map_data(recs, "@mod");
  ASSERT_EQ(mod.size(), 10u) << mod;
  for (int k = 1; k <= 10; ++k) EXPECT_EQ(mod[std::to_string(k)], 5) << k;
  auto occurrences = [&](const std::string& s) {
    std::size_t n = 0;
    for (std::size_t at = r.err.find(s); at != std::string::npos; at = r.err.find(s, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(occurrences("sim-1: map @flood is full (10 keys): updates with new keys are dropped"), 1u) << r.err;
  EXPECT_EQ(occurrences("sim-1: map @mod is full (10 keys)"), 1u) << r.err;
  EXPECT_EQ(occurrences("sim-1: map @flood was full (10 keys): 50 updates with new keys dropped"), 1u) << r.err;
  EXPECT_EQ(occurrences("sim-1: map @mod was full (10 keys): 10 updates with new keys dropped"), 1u) << r.err;
  EXPECT_EQ(occurrences("map @n"), 0u) << r.err;

  ToolRun bad = run(args(kSim1, {"--max-map-keys", "0", "-e", "BEGIN { }"}));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--max-map-keys"), std::string::npos) << bad.err;
}

// The counts do not depend on the channel the hits come through.
TEST(Xenprobe, ExactCountsOnEveryChannel) {
  constexpr std::uint64_t K = 6;
  for (const char* ch : {"guest", "debugger", "vmevent"}) {
    ToolRun r =
        run({"--sim", "--sim-vcpus", "2", "--sim-type", "pvh", "--sim-iterations", std::to_string(K), "--channel", ch,
             "-f", "json", "-e", "kprobe:sys_getppid { @c = count(); } kretprobe:demo_recurse { @r = count(); }"});
    ASSERT_EQ(r.status, 0) << ch << ": " << r.err;
    auto recs = records(r.out);
    EXPECT_EQ(map_data(recs, "@c"), 2 * K * 2) << ch;
    EXPECT_EQ(map_data(recs, "@r"), (DEMO_RECURSE_DEPTH + 1 + DEMO_DISPATCH_RECURSE_DEPTH + 1) * K * 2) << ch;
  }
}

// --method jump: the same counts through jump probes (the guest channel), and a refusal that
// says why where a point cannot be one.
TEST(Xenprobe, JumpProbesCountTheSameAndRefusalsSayWhy) {
  constexpr std::uint64_t K = 6;
  for (const char* method : {"jump", "fastest"}) {
    ToolRun r = run({"--sim", "--sim-vcpus", "2", "--sim-iterations", std::to_string(K), "--channel", "guest",
                     "--method", method, "-f", "json", "-e",
                     "kprobe:sys_getppid { @c = count(); } kretprobe:demo_recurse { @r = count(); }"});
    ASSERT_EQ(r.status, 0) << method << ": " << r.err;
    auto recs = records(r.out);
    EXPECT_EQ(map_data(recs, "@c"), 2 * K * 2) << method;
    EXPECT_EQ(map_data(recs, "@r"), (DEMO_RECURSE_DEPTH + 1 + DEMO_DISPATCH_RECURSE_DEPTH + 1) * K * 2) << method;
  }
  ToolRun bad = run({"--sim", "--sim-iterations", "1", "--channel", "debugger", "--method", "jump", "-e",
                     "kprobe:sys_getppid { @c = count(); }"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("cannot be a jump probe: jump probes need the guest channel"), std::string::npos) << bad.err;
  ToolRun typo = run({"--sim", "--method", "jmp", "-e", "BEGIN { }"});
  EXPECT_NE(typo.status, 0);
  EXPECT_NE(typo.err.find("--method"), std::string::npos) << typo.err;
}

TEST(Xenprobe, PrintfFormatsLikeC) {
  constexpr std::uint64_t K = 6;
  ToolRun r = run(args(
      kSim1,
      {"--sim-iterations", std::to_string(K), "-f", "json", "-e",
       R"(kprobe:demo_dispatch /arg0 == 7/ { printf("%s nr=%d a=%x b=%5d|%-4s|%c%%\n", func, arg0, arg1, arg2, "ab", 65); })"}));
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> got;
  for (const json& rec : records(r.out))
    if (rec["type"] == "printf") got.push_back(rec["data"]);
  std::vector<std::string> want;
  for (std::uint64_t i = 0; i < K; ++i) {
    char b[128];
    std::snprintf(b, sizeof b, "demo_dispatch nr=7 a=%llx b=%5llu|ab  |A%%\n",
                  static_cast<unsigned long long>(i * 7 + 7), static_cast<unsigned long long>(i));
    want.push_back(b);
  }
  EXPECT_EQ(got, want);
}

// Statements: variables, if/else, ternary, string comparison, delete, clear, print, exit, END.
TEST(Xenprobe, ExitDeleteClearPrintAndEnd) {
  const std::string prog = R"(
    kprobe:demo_dispatch {
      $nr = arg0;
      @d[$nr] = count();
      if ($nr == 9) { delete(@d[9]); } else { @notnine++; }
      @kind[$nr < 5 ? "low" : "high"] = count();
    }
    kprobe:sys_open /str(arg0) == "/etc/passwd"/ { @passwd = count(); }
    kprobe:sys_getppid { @n = count(); @tmp = 1; if (@n == 30) { print(@n); clear(@tmp); exit(); } }
    END { @end = 1; }
  )";
  // The workload runs forever: only exit() ends this run.
  ToolRun r = run(args(kSim1, {"-f", "json", "-e", prog}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  // The oracle: walk vCPU 0's calls in order until the 30th sys_getppid entry.
  std::map<std::string, std::uint64_t> d, kind;
  std::uint64_t passwd = 0, getppid = 0, notnine = 0;
  for (std::uint64_t i = 0;; ++i) {
    if (++getppid == 30) break;  // the direct call
    if (std::string(kPaths[i % 8]) == "/etc/passwd") ++passwd;
    bool done = false;
    for (std::uint64_t nr = 0; nr < 10 && !done; ++nr) {
      if (nr != 9) ++d[std::to_string(nr)], ++notnine;  // demo_dispatch's entry, before its call
      ++kind[nr < 5 ? "low" : "high"];
      if (nr == 0) done = ++getppid == 30;
      if (nr == 3 && std::string(kPaths[(i * 7 + 3) % 8]) == "/etc/passwd") ++passwd;
    }
    if (done) break;
  }
  EXPECT_EQ(map_data(recs, "@d"), json(d));
  EXPECT_EQ(map_data(recs, "@kind"), json(kind));
  EXPECT_EQ(map_data(recs, "@passwd"), passwd);
  EXPECT_EQ(map_data(recs, "@notnine"), notnine);
  EXPECT_EQ(map_data(recs, "@n"), 30);
  EXPECT_EQ(map_data(recs, "@end"), 1);
  EXPECT_TRUE(map_data(recs, "@tmp").is_null()) << "clear(@tmp) left it in the output";
  // print(@n) printed it before the final maps, with the same value.
  int n_records = 0;
  for (const json& rec : recs) n_records += rec["type"] == "map" && rec["data"].contains("@n");
  EXPECT_EQ(n_records, 2);
}

// Integer semantics, in BEGIN (no guest involved): C's precedence, wrapping, BPF's division
// by zero, casts, logical operators, the ternary, string comparison.
TEST(Xenprobe, ArithmeticAndCasts) {
  const std::string prog = R"(BEGIN {
    printf("%d %d %d %d %d\n", 1 + 2 * 3, (1 + 2) * 3, 7 / 2, -7 / 2, -7 % 3);
    printf("%d %d %d %d\n", 5 / 0, 5 % 0, 1 << 65, 0x10 >> 4);
    printf("%d %d %d %d\n", (uint8)257, (int8)255, (uint32)-1, (int16)0x18000);
    printf("%d %d %d %d %d\n", 3 > 2 && 2 > 1, 0 || 0, !5, ~0, 1 ? 10 : 20);
    printf("%d %d %s\n", "ab" == "ab", "ab" != "ab", 0 ? "yes" : "no");
    printf("%d\n", 9223372036854775807 + 1 < 0);
    exit();
  })";
  ToolRun r = run(args(kSim1, {"-e", prog}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "Attaching 0 probes to sim-1 (domain 1, channel none)...\n"
            "7 9 3 -3 -1\n"
            "0 5 2 1\n"
            "1 -1 4294967295 -32768\n"
            "1 0 0 -1 10\n"
            "1 0 no\n"
            "1\n");
}

// interval runs in Dom0 on its own schedule; exit() from it ends the run.
TEST(Xenprobe, IntervalProbesRunUntilExit) {
  ToolRun r = run(args(kSim1, {"-f", "json", "-e",
                               "kprobe:sys_getppid { @hits = count(); } "
                               "interval:ms:20 { @ticks = count(); if (@ticks == 3) { print(@ticks); exit(); } }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  EXPECT_EQ(map_data(recs, "@ticks"), 3);
  int printed = 0;
  for (const json& rec : recs) printed += rec["type"] == "map" && rec["data"].contains("@ticks");
  EXPECT_EQ(printed, 2);  // print() at the third tick, then the maps at exit
}

// Symbols from a file (--symbols DOMAIN=FILE) rather than the library's default.
TEST(Xenprobe, SymbolsFromAFile) {
  const fs::path dir = fs::temp_directory_path() / ("xenprobe_test_map." + std::to_string(getpid()));
  fs::create_directories(dir);
  // A System.map that knows one function under another name: probes resolve through it.
  {
    std::ifstream in(XENPROBES_DEMO_GUEST_SYSTEM_MAP);
    std::ofstream out(dir / "System.map");
    for (std::string line; std::getline(in, line);) {
      if (line.ends_with(" sys_getppid")) line.replace(line.size() - 11, 11, "renamed_getppid");
      out << line << "\n";
    }
  }
  ToolRun r = run(args(kSim1, {"--sim-iterations", "4", "--symbols", "sim-1=" + (dir / "System.map").string(), "-e",
                               "kprobe:renamed_getppid { @c[func] = count(); }"}));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("@c[renamed_getppid]: 8\n"), std::string::npos) << r.out;
  ToolRun bad = run(args(kSim1, {"--symbols", "sim-9=" + (dir / "System.map").string(), "-e", "BEGIN { }"}));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--symbols sim-9="), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("sim-9 is not one of the selected domains"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

// A vmlinux as the symbols (its .symtab): the same functions as its System.map, and probes
// resolve through it. The copy has sys_getppid renamed in its string table, so the count can
// only come from the file given; a truncated file is refused saying why.
TEST(Xenprobe, SymbolsFromAVmlinux) {
  const fs::path dir = fs::temp_directory_path() / ("xenprobe_test_vmlinux." + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path vmlinux = fs::path(XENPROBES_DEMO_GUEST_SYSTEM_MAP).parent_path() / "vmlinux";
  const std::string elf = slurp_binary(vmlinux);
  ASSERT_EQ(elf.substr(0, 4), std::string("\177ELF"));
  // A name of the same length keeps every offset of the file.
  std::string renamed = elf;
  const std::string a("\0sys_getppid\0", 13), b("\0sys_getppie\0", 13);
  std::size_t n = 0;
  for (std::size_t at = renamed.find(a); at != std::string::npos; at = renamed.find(a, at + 1), ++n)
    renamed.replace(at, a.size(), b);
  ASSERT_GE(n, 1u);
  std::ofstream(dir / "vmlinux", std::ios::binary) << renamed;
  ToolRun l = run(args(kSim1, {"--symbols", "sim-1=" + vmlinux.string(), "list", "*"}));
  ToolRun m = run(args(kSim1, {"list", "*"}));
  EXPECT_EQ(l.status, 0) << l.err;
  EXPECT_GT(l.out.size(), 100u);
  EXPECT_EQ(l.out, m.out);
  ToolRun r = run(args(kSim1, {"--sim-iterations", "4", "--symbols", "sim-1=" + (dir / "vmlinux").string(), "-e",
                               "kprobe:sys_getppie { @c[func] = count(); }"}));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("@c[sys_getppie]: 8\n"), std::string::npos) << r.out;
  std::ofstream(dir / "short", std::ios::binary) << elf.substr(0, 3000);
  ToolRun bad = run(args(kSim1, {"--symbols", "sim-1=" + (dir / "short").string(), "-e", "BEGIN { }"}));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("not a symbol table xenprobe can read: its section headers are outside the file"),
            std::string::npos)
      << bad.err;
  fs::remove_all(dir);
}

// kprobe:FUNC+OFFSET probes that instruction (sys_getppid+5, past its ftrace nop), and
// XENPROBES_BACKEND=sim is --sim.
TEST(Xenprobe, AnOffsetProbeAndTheSimBackendVariable) {
  ToolRun r = run(args(kSim1, {"--sim-iterations", "3", "-e", "kprobe:sys_getppid+5 { @[func, probe] = count(); }"}));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("@[sys_getppid, kprobe:sys_getppid+0x5]: 6\n"), std::string::npos) << r.out;
  ToolRun e = run({"--sim-vcpus", "1", "--sim-iterations", "3", "-e", "kprobe:sys_getppid { @ = count(); }"}, {}, {},
                  {{"XENPROBES_BACKEND", "sim"}});
  EXPECT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.err.find("SIMULATED Xen"), std::string::npos) << e.err;
  EXPECT_NE(e.out.find("@: 6\n"), std::string::npos) << e.out;
}

// ---- kstack ----

// The demo guest's kstack chain (guest/kstack.S) has a hand-written ORC table: a hit at
// demo_kstack_leaf unwinds through an SP-based, a BP-based and a pt_regs frame to the table's
// end-of-stack entry, on every channel, once per iteration and vCPU.
std::string demo_stack(std::size_t frames) {
  const std::vector<std::pair<const char*, unsigned>> all = {{"demo_kstack_leaf", 0},
                                                             {"demo_kstack_middle", DEMO_KSTACK_MIDDLE_OFF},
                                                             {"demo_kstack_outer", DEMO_KSTACK_OUTER_OFF},
                                                             {"demo_kstack_entry", DEMO_KSTACK_ENTRY_RET_OFF},
                                                             {"demo_kstack_entry", DEMO_KSTACK_ENTRY_IRQ_OFF}};
  std::string s = "\n";
  char off[32];
  for (std::size_t i = 0; i < frames && i < all.size(); ++i) {
    std::snprintf(off, sizeof off, "+0x%x", all[i].second);
    s += std::string("        ") + all[i].first + off + "\n";
  }
  return s;
}

TEST(XenprobeKstack, TheDemoChainsExactFramesOnEveryChannel) {
  constexpr std::uint64_t K = 5;
  for (const char* ch : {"guest", "debugger", "vmevent"}) {
    ToolRun r =
        run({"--sim", "--sim-vcpus", "2", "--sim-type", "pvh", "--sim-iterations", std::to_string(K), "--channel", ch,
             "-f", "json", "-e", "kprobe:demo_kstack_leaf { @[kstack] = count(); @two[kstack(2), cpu] = count(); }"});
    ASSERT_EQ(r.status, 0) << ch << ": " << r.err;
    EXPECT_EQ(r.err.find("failed"), std::string::npos) << ch << ": " << r.err;
    auto recs = records(r.out);
    json all = map_data(recs, "@");
    ASSERT_TRUE(all.is_object()) << r.out;
    EXPECT_EQ(all.size(), 1u) << all.dump();
    EXPECT_EQ(all[demo_stack(5)], 2 * K) << ch << ": " << all.dump();
    json two = map_data(recs, "@two");
    EXPECT_EQ(two.size(), 2u) << two.dump();
    EXPECT_EQ(two[demo_stack(2) + ",0"], K) << two.dump();
    EXPECT_EQ(two[demo_stack(2) + ",1"], K) << two.dump();
  }
}

TEST(XenprobeKstack, TextOneFrameALineAndPrintf) {
  constexpr std::uint64_t K = 3;
  ToolRun r = run(args(kSim1, {"--sim-iterations", std::to_string(K), "-e",
                               "kprobe:demo_kstack_leaf { @[kstack] = count(); } "
                               "kprobe:demo_kstack_middle { printf(\"middle:%s|\\n\", kstack(3)); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("@[" + demo_stack(5) + "]: " + std::to_string(K) + "\n"), std::string::npos) << r.out;
  // At demo_kstack_middle's first instruction the return address is at the stack pointer.
  char off[32];
  std::snprintf(off, sizeof off, "%x", DEMO_KSTACK_OUTER_OFF);
  const std::string middle = std::string("middle:\n        demo_kstack_middle+0x0\n        demo_kstack_outer+0x") +
                             off + "\n        demo_kstack_entry+0x" +
                             [] {
                               char b[16];
                               std::snprintf(b, sizeof b, "%x", DEMO_KSTACK_ENTRY_RET_OFF);
                               return std::string(b);
                             }() +
                             "\n|\n";
  std::size_t n = 0;
  for (std::size_t at = r.out.find(middle); at != std::string::npos; at = r.out.find(middle, at + 1)) ++n;
  EXPECT_EQ(n, K) << r.out;
}

}  // namespace
}  // namespace xenprobes::testing
