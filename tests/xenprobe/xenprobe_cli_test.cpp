// xenprobe's command line on the simulated Xen: its limits (-c, -d, SIGTERM, --help), several
// domains at once, guest strings in the output, the text layout, list, doctor and errors.

#include <signal.h>

#include <chrono>

#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// ---- the tool's limits ----

TEST(Xenprobe, HitLimitStopsAfterExactlyThatManyHits) {
  ToolRun r = run(args(kSim1, {"-c", "25", "-e", "kprobe:demo_recurse { @ = count(); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Attaching 1 probe to sim-1 (domain 1, channel guest)...\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n@: 25\n"), std::string::npos) << r.out;
}

TEST(Xenprobe, DurationEndsARunOnAGuestThatNeverStops) {
  const auto start = std::chrono::steady_clock::now();
  ToolRun r = run(args(kSim1, {"--duration", "1", "-f", "json", "-e", "kprobe:sys_getppid { @c = count(); }"}));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  ASSERT_TRUE(map_data(recs, "@c").is_number()) << r.out;
  EXPECT_GT(map_data(recs, "@c").get<std::int64_t>(), 0);
  EXPECT_GE(took, std::chrono::seconds(1));
}

TEST(Xenprobe, SigtermDetachesAndPrintsTheMaps) {
  const std::string prog = R"(kprobe:sys_getppid { @c = count(); if (@c == 1) { printf("first hit\n"); } })";
  // SIGTERM, and SIGINT (^C) the same way.
  for (const auto& [sig, says] :
       {std::pair{SIGTERM, "terminated: detaching"}, std::pair{SIGINT, "interrupted: detaching"}}) {
    ToolRun r = run(args(kSim1, {"-e", prog}), {}, [sig](pid_t pid, const fs::path& out) {
      // Signal once the tool has handled a hit (it says so), as a user presses ^C after
      // seeing output.
      for (int i = 0; i < 3000 && slurp(out).find("first hit") == std::string::npos; ++i) usleep(10'000);
      kill(pid, sig);
    });
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("@c: "), std::string::npos) << r.out;
  }
}

// --help is the complete reference of the options (docs/xenprobe.md): each one is there.
TEST(Xenprobe, HelpNamesEveryOption) {
  ToolRun h = run({"--help"});
  EXPECT_EQ(h.status, 0) << h.err;
  for (const char* o : {"-d",
                        "-e",
                        "-f",
                        "-c",
                        "--duration",
                        "--symbols",
                        "--btf",
                        "--channel",
                        "--method",
                        "--check",
                        "--maxactive",
                        "--max-map-keys",
                        "--sim",
                        "--sim-guests",
                        "--sim-vcpus",
                        "--sim-iterations",
                        "--sim-type",
                        "--sim-image",
                        "--sim-no-module",
                        "--sim-destroy",
                        "--sim-ring-order",
                        "list",
                        "doctor"})
    EXPECT_NE(h.out.find(o), std::string::npos) << o << "\n" << h.out;
}

// ---- several domains ----

TEST(Xenprobe, SeveralDomainsEachLineSaysWhich) {
  constexpr std::uint64_t K = 10;
  ToolRun r = run({"--sim", "--sim-guests", "3", "--sim-vcpus", "1", "--sim-iterations", std::to_string(K), "-d", "1",
                   "-d", "sim-[3]", "-e", "kprobe:sys_getppid { @c = count(); } kretprobe:sys_read { @r = count(); }"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* dom : {"sim-1", "sim-3"}) {
    const std::string p = std::string("[") + dom + "] ";
    EXPECT_NE(r.out.find(p + "@c: " + std::to_string(2 * K) + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "@r: " + std::to_string(2 * K) + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "Attaching 2 probes to " + dom), std::string::npos) << r.out;
  }
  EXPECT_EQ(r.out.find("sim-2"), std::string::npos) << "sim-2 was not selected:\n" << r.out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    EXPECT_TRUE(line.starts_with("[sim-1] ") || line.starts_with("[sim-3] ")) << "a line without its domain: " << line;
}

TEST(Xenprobe, ADomainDestroyedMidRunLeavesTheOthersRunning) {
  constexpr std::uint64_t K = 30;
  ToolRun r =
      run({"--sim", "--sim-guests", "2", "--sim-vcpus", "1", "--sim-iterations", std::to_string(K), "--sim-destroy",
           "sim-2@20", "-d", "sim-*", "-f", "json", "-e", "kprobe:sys_getppid { @c = count(); }"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(
      r.err.find("domain sim-2 (2) is gone (it was destroyed); its probes went with it, going on with 1 other domain"),
      std::string::npos)
      << r.err;
  auto recs = records(r.out);
  EXPECT_EQ(map_data(recs, "@c", "sim-1"), 2 * K);
  // sim-2's map holds what it saw before it died: its 20 hits (it goes at its own 20th, whatever
  // sim-1 did meanwhile), and maybe the few that one round of the loop handled after them.
  ASSERT_TRUE(map_data(recs, "@c", "sim-2").is_number());
  EXPECT_GE(map_data(recs, "@c", "sim-2").get<std::uint64_t>(), 20u);
  EXPECT_LT(map_data(recs, "@c", "sim-2").get<std::uint64_t>(), 2 * K);
}

// Strings are guest data: control bytes are escaped in text, bytes that are not UTF-8 do not
// break the JSON. The function's first bytes are the ftrace nop 0f 1f 44 00 00; at +5 sits
// the probe's own trap byte while it is armed (0xcc on the guest channel).
TEST(Xenprobe, GuestStringsCannotBreakTheOutput) {
  const std::string prog =
      R"(kprobe:sys_getppid { @ctl = str(kaddr("sys_getppid"), 4); @bin = str(kaddr("sys_getppid") + 5, 2); })";
  ToolRun t = run(args(kSim1, {"--sim-iterations", "1", "-e", prog}));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("@ctl: \\x0f\\x1fD\n"), std::string::npos) << t.out;
  ToolRun j = run(args(kSim1, {"--sim-iterations", "1", "-f", "json", "-e", prog}));
  ASSERT_EQ(j.status, 0) << j.err;
  auto recs = records(j.out);
  EXPECT_EQ(map_data(recs, "@ctl"),
            "\x0f\x1f"
            "D");
  EXPECT_EQ(map_data(recs, "@bin"), "\xef\xbf\xbd");  // U+FFFD in place of the lone 0xcc
}

// ---- text layout ----

// bpftrace's layout of hist and lhist, checked against a golden file whose numbers the
// aggregation test above checks through JSON.
TEST(Xenprobe, TextOutputMatchesTheGoldenFile) {
  ToolRun r =
      run(args(kSim1, {"--sim-iterations", "20", "-e",
                       "kprobe:sys_read { @h = hist(arg2); @l = lhist(arg2, 0, 40, 10); @c[func, arg2 % 3] = count(); "
                       "@s[\"x\"] = \"str\"; }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, slurp(fs::path(XENPROBE_TEST_DIR) / "golden" / "hist.txt"));
}

// ---- list ----

TEST(Xenprobe, ListNamesTheFunctionsMatchingAGlob) {
  // -d takes one value: the pattern after it is the pattern (as in `xenprobe list -d D PATTERN`).
  ToolRun d = run({"list", "--sim", "-d", "sim-1", "kprobe:sys_getppid"});
  EXPECT_EQ(d.status, 0) << d.err;
  EXPECT_EQ(d.out, "kprobe:sys_getppid\n") << d.err;
  // And the program file after -d is the program (not a second domain).
  const fs::path prog = fs::temp_directory_path() / ("xenprobe_test_prog." + std::to_string(getpid()) + ".bt");
  std::ofstream(prog) << "kprobe:sys_getppid { @c = count(); }\n";
  ToolRun f = run({"--sim", "--sim-vcpus", "1", "--sim-iterations", "3", "-d", "sim-1", prog.string()});
  fs::remove(prog);
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_NE(f.out.find("@c: 6"), std::string::npos) << f.out << f.err;
  ToolRun r = run({"list", "--sim", "kprobe:sys_*"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "kprobe:sys_getppid\nkprobe:sys_open\nkprobe:sys_read\nkprobe:sys_unlink\nkprobe:sys_write\n");
  ToolRun data = run({"list", "--sim", "demo_stats"});  // data symbols are not probe targets
  EXPECT_EQ(data.status, 0) << data.err;
  EXPECT_EQ(data.out, "");
}

TEST(Xenprobe, DoctorSaysWhichChannelForEachDomain) {
  ToolRun r = run({"doctor", "--sim", "--sim-guests", "2", "--sim-type", "pvh", "-d", "sim-*"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* dom : {"[sim-1] ", "[sim-2] "}) {
    EXPECT_NE(r.out.find(std::string(dom) + "  auto picks: guest\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string(dom) + "  vmevent: yes"), std::string::npos) << r.out;
  }
}

// ---- errors ----

TEST(Xenprobe, ErrorsMatchTheirGoldenFiles) {
  const fs::path dir = fs::path(XENPROBE_TEST_DIR) / "errors";
  const auto cases = golden_cases(dir);
  for (const auto& [bt, want] : cases) {
    ToolRun r = run({"--check", bt.filename().string()}, dir.string());
    EXPECT_EQ(r.status, 1) << bt;
    EXPECT_EQ(r.err, slurp(want)) << "for " << bt.filename();
  }
  EXPECT_GE(cases.size(), 20u);
}

TEST(Xenprobe, AttachErrorsNameTheFunctionAndWhatToDo) {
  ToolRun r = run(args(kSim1, {"-e", "kprobe:no_such_function { }"}));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("xenprobe: domain sim-1: kprobe:no_such_function: no symbol 'no_such_function'"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.err.ends_with(" (the functions whose names contain it: xenprobe list -d sim-1 '*no_such_function*')\n"))
      << r.err;
  ToolRun w = run(args(kSim1, {"-e", "kprobe:nothing_* { }"}));
  EXPECT_EQ(w.status, 1);
  EXPECT_NE(w.err.find("kprobe:nothing_* matches no function (see: xenprobe list -d sim-1 'nothing_*')"),
            std::string::npos)
      << w.err;
  ToolRun d = run(args(kSim1, {"-d", "web*", "-e", "BEGIN { }"}));
  EXPECT_EQ(d.status, 1);
  EXPECT_NE(d.err.find("-d web*: no such guest (guests: sim-1 (1))"), std::string::npos) << d.err;
  ToolRun two = run({"--sim", "--sim-guests", "2", "-e", "BEGIN { }"});
  EXPECT_NE(two.err.find("there are several guests (sim-1 (1), sim-2 (2)): choose with -d"), std::string::npos)
      << two.err;
}

// Without --btf a program that needs types is checked again with the guest kernel's own BTF,
// read from its memory. The demo guest has none (no __start_BTF): the run stops before anything
// is attached and says where the types could come from instead; --check alone never touches
// the guest and says the same.
TEST(Xenprobe, TypesWithoutBtfComeFromTheGuestOrTheErrorSaysWhatToGive) {
  ToolRun r = run(args(kSim1, {"-e", "kprobe:sys_getppid { @[comm] = count(); }"}));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("xenprobe: domain sim-1: cannot read its kernel's BTF from its memory: "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("__start_BTF"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(give it with --btf FILE: the guest's /sys/kernel/btf/vmlinux)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("attached"), std::string::npos) << r.out;
  ToolRun c = run({"--check", "-e", "kprobe:f { @[comm] = count(); }"});
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find("with --check, give them with --btf FILE"), std::string::npos) << c.err;
}

TEST(Xenprobe, WithoutXenItPointsAtTheSimulation) {
  if (access("/dev/xen/privcmd", F_OK) == 0) GTEST_SKIP() << "this machine is a Xen Dom0";
  ToolRun r = run({"-e", "BEGIN { }"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no Xen here (no /dev/xen/privcmd)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--sim"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace xenprobes::testing
