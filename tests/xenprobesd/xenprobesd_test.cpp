// xenprobesd's tests: the daemon run as a subprocess on the simulated Xen with several demo
// guests, its NDJSON event log read from its stdout record by record (each wait is a blocking
// read of the next record, bounded by ctest's timeout, never a sleep), its metrics fetched
// from its endpoint and checked with the real `promtool check metrics`, and bad
// configurations checked against golden files.
//
// The demo guest's workload calls sys_getppid twice per iteration and vCPU
// (tests/xenprobe's oracle), so K iterations on one vCPU are 2K hits exactly.

#include "xenprobesd/xenprobesd_fixture.hpp"

namespace xenprobes::testing {
namespace {

// ---- configuration ----

// Every bad configuration in tests/xenprobesd/bad/ is refused by --check-config with exit
// status 1 and exactly the message of its .err file (run from that directory, so the file
// names in the messages are relative).
TEST(xenprobesd, BadConfigsAreRejectedWithFileLineAndReason) {
  const fs::path dir = fs::path(XENPROBESD_TEST_DIR) / "bad";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    const std::string name = e.path().filename().string();
    auto [status, out] =
        shell("cd '" + dir.string() + "' && '" + std::string(XENPROBESD_BIN) + "' --check-config -c " + name);
    EXPECT_EQ(status, 1) << name << ":\n" << out;
    fs::path golden = e.path();
    golden.replace_extension(".err");
    EXPECT_EQ(out, slurp(golden)) << name;
  }
  EXPECT_GE(n, 14);  // every file in bad/ was read
}

TEST(xenprobesd, TheDocumentedExampleConfigIsValid) {
  auto [status, out] = shell("'" + std::string(XENPROBESD_BIN) + "' --check-config -c '" + XENPROBESD_SOURCE_DIR +
                             "/xenprobesd/xenprobesd.toml'");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("valid, 2 program(s)"), std::string::npos) << out;
}

// ---- lifecycle and outputs ----

// Three guests at start; programs choosing them by glob, by domid and name, and by a xenstore
// label. Each runs in exactly the guests it selects, with exact counts, maps exported, and
// metrics promtool finds nothing to say about.
TEST(xenprobesd, AttachesAtStartToTheSelectedGuestsAndCountsExactly) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "all"
source = 'kprobe:sys_getppid { @calls = count(); @by[func] = count(); }'
domains = [{ glob = "sim-*" }]

[[program]]
name = "some"
source = 'kretprobe:sys_getppid { @ret[retval] = count(); }'
domains = [{ domid = 2 }, { name = "sim-3" }]

[[program]]
name = "web"
source = 'kprobe:sys_getppid { @w = count(); }'
domains = [{ xenstore = "vm-data/role", value = "web*" }]
outputs = "events"
)");
  Daemon d(cfg, sim(3, {"--sim-label", "sim-1:vm-data/role=webserver", "--sim-label", "sim-2:vm-data/role=db"}),
           t.path);
  json listening = d.next("metrics_listening");
  ASSERT_FALSE(listening.is_null());
  const int port = listening["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::vector<std::pair<std::string, std::string>> attached;
  for (const json& r : d.all())
    if (r["kind"] == "attached") attached.emplace_back(r["program"], r["domain"]);
  std::sort(attached.begin(), attached.end());
  const std::vector<std::pair<std::string, std::string>> want{{"all", "sim-1"},  {"all", "sim-2"},  {"all", "sim-3"},
                                                              {"some", "sim-2"}, {"some", "sim-3"}, {"web", "sim-1"}};
  EXPECT_EQ(attached, want);

  const std::string m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2", "sim-3"}) {
    EXPECT_EQ(sample(m, hits(dom, "all", "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(
        sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) + "\",program=\"all\",map=\"@calls\",key=\"\"}"),
        2 * K);
    EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) +
                            "\",program=\"all\",map=\"@by\",key=\"sys_getppid\"}"),
              2 * K);
  }
  EXPECT_EQ(sample(m, hits("sim-1", "some", "kretprobe:sys_getppid")), -1);
  for (const char* dom : {"sim-2", "sim-3"}) {
    EXPECT_EQ(sample(m, hits(dom, "some", "kretprobe:sys_getppid")), 2 * K);
    EXPECT_EQ(
        sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) + "\",program=\"some\",map=\"@ret\",key=\"1\"}"),
        2 * K);
  }
  EXPECT_EQ(sample(m, hits("sim-1", "web", "kprobe:sys_getppid")), 2 * K);
  EXPECT_EQ(sample(m, hits("sim-2", "web", "kprobe:sys_getppid")), -1);
  // outputs = "events": counted, but its map is not exported.
  EXPECT_EQ(m.find("program=\"web\",map="), std::string::npos);
  EXPECT_EQ(sample(m, "xenprobesd_probe_missed_total{domain=\"sim-1\",program=\"all\",probe=\"kprobe:sys_getppid\"}"),
            0);
  EXPECT_EQ(sample(m, "xenprobesd_attachment_info{domain=\"sim-2\",program=\"some\",channel=\"guest\"}"), 1);
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  // At the end every attachment detaches, and the daemon says it stopped.
  int detached = 0;
  for (const json& r : d.all()) detached += r["kind"] == "detached";
  EXPECT_EQ(detached, 6);
  EXPECT_EQ(d.all().back()["kind"], "stopped");
}

// A guest created while the daemon runs is attached through @introduceDomain; it is created
// paused (xl create -p) and started after the daemon has looked at it, so its count is exact.
TEST(xenprobesd, AttachesToAGuestThatAppears) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1, {"--sim-create", "late@10"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json a = d.next("attached", "late");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["domid"], 2);
  EXPECT_EQ(a["probes"], 1);
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("late", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A guest that goes inside a handler (its vCPU waiting for Dom0's answer), by `cue`
// ("--sim-destroy" or "--sim-crash" at its 20th hit): its attachment detaches after exactly
// those hits saying `why`, its series leave the metrics, the other guest is served to the end
// with an exact count.
static void expect_gone_mid_probe(const std::string& cue, const std::string& why) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "sim-*" }]
)");
  Daemon d(cfg, sim(2, {cue, "sim-2@20"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json gone = d.next("detached", "sim-2");
  ASSERT_FALSE(gone.is_null());
  EXPECT_EQ(gone["hits"], 20);
  EXPECT_EQ(gone["body"], "the domain is gone (" + why + ")");
  // sim-1 may end its workload before the daemon has seen sim-2 go, or after.
  ASSERT_FALSE(d.seen_or_next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(m.find("sim-2"), std::string::npos) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_NE(d.err().find("domain sim-2 (2) is gone (" + why + ")"), std::string::npos) << d.err();
}

TEST(xenprobesd, AGuestDestroyedMidProbeDetachesAndTheOthersGoOn) {
  expect_gone_mid_probe("--sim-destroy", "it was destroyed");
}

// The guest's kernel panics instead: the domain stays, crashed (xl's on_crash = "preserve").
TEST(xenprobesd, AGuestThatCrashesMidProbeDetachesAndTheOthersGoOn) {
  expect_gone_mid_probe("--sim-crash", "it crashed");
}

// SIGHUP: an unchanged program keeps its probes and counters, a changed one starts again, a
// new one attaches, a removed one detaches. Then a bad configuration is rejected with its
// file, line and reason, and the running one stays.
TEST(xenprobesd, ReloadKeepsUnchangedProgramsAndRejectsABadConfig) {
  TempDir t;
  const std::string keep = R"(
[[program]]
name = "keep"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", daemon_section() + keep + R"(
[[program]]
name = "change"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "drop"
source = 'kretprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::string m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2"}) {
    EXPECT_EQ(sample(m, hits(dom, "keep", "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(sample(m, hits(dom, "change", "kprobe:sys_getppid")), 2 * K) << m;
  }

  t.write("c.toml", daemon_section() + keep + R"(
[[program]]
name = "change"
source = 'kprobe:sys_getppid { @c = count(); @d = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "new"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ name = "sim-2" }]
)");
  d.signal(SIGHUP);
  json loaded = d.next("config_loaded");
  ASSERT_FALSE(loaded.is_null());
  EXPECT_EQ(loaded["kept"], json({"keep"}));
  EXPECT_EQ(loaded["changed"], json({"change"}));
  EXPECT_EQ(loaded["added"], json({"new"}));
  EXPECT_EQ(loaded["removed"], json({"drop"}));
  std::vector<std::string> reasons;
  for (const json& r : d.all())
    if (r["kind"] == "detached")
      reasons.push_back(r["program"].get<std::string>() + ": " + r["body"].get<std::string>());
  std::sort(reasons.begin(), reasons.end());
  EXPECT_EQ(reasons, (std::vector<std::string>{
                         "change: the program changed in a reload", "change: the program changed in a reload",
                         "drop: the program was removed in a reload", "drop: the program was removed in a reload"}));
  m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2"}) {
    EXPECT_EQ(sample(m, hits(dom, "keep", "kprobe:sys_getppid")), 2 * K) << m;  // kept
    EXPECT_EQ(sample(m, hits(dom, "change", "kprobe:sys_getppid")), 0) << m;    // the guests have halted since
    EXPECT_EQ(sample(m, hits(dom, "drop", "kretprobe:sys_getppid")), -1) << m;
  }
  EXPECT_EQ(sample(m, hits("sim-2", "new", "kprobe:sys_getppid")), 0) << m;
  EXPECT_EQ(sample(m, hits("sim-1", "new", "kprobe:sys_getppid")), -1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_config_reloads_total{result=\"accepted\"}"), 1);

  t.write("c.toml",
          daemon_section() + keep + "\n[[program]]\nname = \"x\"\nsource = 'kprobe:sys_getppid { @c = ; }'\n");
  d.signal(SIGHUP);
  json rejected = d.next("config_rejected");
  ASSERT_FALSE(rejected.is_null());
  EXPECT_EQ(rejected["severity"], "ERROR");
  const std::string body = rejected["body"];
  EXPECT_TRUE(body.starts_with(cfg.string() + ":13:37: error: ")) << body;
  EXPECT_NE(body.find("the configuration in use stays in use"), std::string::npos) << body;
  m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "keep", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("sim-2", "new", "kprobe:sys_getppid")), 0) << m;
  EXPECT_EQ(sample(m, "xenprobesd_config_reloads_total{result=\"rejected\"}"), 1);
  EXPECT_EQ(sample(m, "xenprobesd_config_last_reload_successful"), 0);
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// printf records are NDJSON with the documented fields, rate limited per program and domain:
// with a burst of 5 and a refill far slower than the run, exactly 5 records per guest, the
// rest counted as dropped.
TEST(xenprobesd, EventsAreNdjsonRecordsAndRateLimited) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "ev"
source = 'kprobe:sys_getppid { @n++; printf("getppid %d from %s\n", @n, domain); }'
domains = [{ glob = "*" }]
outputs = "events"
event_burst = 5
events_per_second = 0.000001
)");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::map<std::string, std::vector<std::string>> bodies;
  for (const json& r : d.all()) {
    if (r["kind"] != "printf") continue;
    EXPECT_EQ(r["severity"], "INFO");
    EXPECT_EQ(r["program"], "ev");
    EXPECT_EQ(r["probe"], "kprobe:sys_getppid");
    EXPECT_TRUE(r["time"].get<std::string>().ends_with("Z")) << r;
    EXPECT_FALSE(r["time_unix_nano"].get<std::string>().empty());
    bodies[r["domain"]].push_back(r["body"]);
    EXPECT_EQ(r["domid"], r["domain"] == "sim-1" ? 1 : 2);
  }
  for (const char* dom : {"sim-1", "sim-2"}) {
    std::vector<std::string> want;
    for (int i = 1; i <= 5; ++i) want.push_back("getppid " + std::to_string(i) + " from " + dom + "\n");
    EXPECT_EQ(bodies[dom], want);
  }
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_events_total{domain=\"sim-1\",program=\"ev\"}"), 5) << m;
  EXPECT_EQ(sample(m, "xenprobesd_events_dropped_total{domain=\"sim-1\",program=\"ev\"}"), 2 * K - 5) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// logrotate: the file is moved away, SIGUSR1 makes the daemon open a new one; the last records
// go there. The node-exporter textfile is written at exit, whole.
TEST(xenprobesd, EventLogFileReopensOnSigusr1AndTheTextfileIsWritten) {
  TempDir t;
  const fs::path log = t.path / "events.ndjson", prom = t.path / "xenprobesd.prom";
  auto cfg = t.write("c.toml", "[daemon]\nevent_log = \"" + log.string() + "\"\nmetrics_listen = \"\"\n" +
                                   "metrics_textfile = \"" + prom.string() + "\"\n" + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  // With the log in a file, the daemon's stdout stays empty; its sd_notify messages say where
  // it is: READY=1 after the first attach pass, then a STATUS when the guests have finished.
  NotifySocket notify(t.path / "notify");
  Daemon d(cfg, sim(1), t.path, notify.path());
  const std::string said = notify.until("finished its workload");
  EXPECT_NE(said.find("READY=1"), std::string::npos) << said;
  fs::rename(log, t.path / "events.ndjson.1");
  d.signal(SIGUSR1);
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_TRUE(d.all().empty());
  const std::string old = slurp(t.path / "events.ndjson.1"), now = slurp(log);
  EXPECT_NE(old.find("\"kind\":\"attached\""), std::string::npos) << old;
  EXPECT_EQ(old.find("\"kind\":\"stopped\""), std::string::npos) << old;
  EXPECT_NE(now.find("\"kind\":\"stopped\""), std::string::npos) << now;
  const std::string text = slurp(prom);
  EXPECT_EQ(sample(text, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << text;
  expect_promtool_clean(text, t.path);
  EXPECT_FALSE(fs::exists(prom.string() + ".tmp"));
}

// `xenprobesd status` and `xenprobesd reload` through the control socket: the status names
// every attachment with its counts; a bad configuration is refused (exit 1, the file and line
// in the answer) and a good one accepted, saying what it kept and added.
TEST(xenprobesd, StatusAndReloadThroughTheControlSocket) {
  TempDir t;
  const fs::path sock = t.path / "control.sock";
  const std::string head = daemon_section("control_socket = \"" + sock.string() + "\"");
  const std::string p = R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", head + p);
  Daemon d(cfg, sim(2), t.path);
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string bin = XENPROBESD_BIN;
  auto [st, out] = shell("'" + bin + "' status -c '" + cfg.string() + "'");
  EXPECT_EQ(st, 0) << out;
  EXPECT_EQ(out, "config " + cfg.string() +
                     "\nprogram p (both):\n"
                     "  sim-1 (1, guest): 1 probes, 60 hits, 0 missed, 0 events, 0 dropped\n"
                     "  sim-2 (2, guest): 1 probes, 60 hits, 0 missed, 0 events, 0 dropped\n");

  t.write("c.toml", head + p + "\n[[program]]\nname = \"q\"\n");
  std::tie(st, out) = shell("'" + bin + "' reload --socket '" + sock.string() + "'");
  EXPECT_EQ(st, 1) << out;
  EXPECT_TRUE(out.starts_with("rejected: the configuration in use stays in use\n" + cfg.string() + ":11:1: error: "))
      << out;
  EXPECT_FALSE(d.next("config_rejected").is_null());

  t.write("c.toml", head + p + "\n[[program]]\nname = \"q\"\nsource = 'kprobe:sys_getppid { @c = count(); }'\n" +
                        "domains = [{ domid = 2 }]\n");
  std::tie(st, out) = shell("'" + bin + "' reload -c '" + cfg.string() + "'");
  EXPECT_EQ(st, 0) << out;
  EXPECT_EQ(out, "accepted: kept p; changed none; added q; removed none\n");
  json a = d.next("attached", "sim-2");
  EXPECT_EQ(a["program"], "q");
  std::tie(st, out) = shell("'" + bin + "' status --socket '" + sock.string() + "'");
  EXPECT_NE(out.find("program q (both):\n  sim-2 (2, guest): 1 probes, 0 hits"), std::string::npos) << out;
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_FALSE(fs::exists(sock));  // removed at exit
  std::tie(st, out) = shell("'" + bin + "' status --socket '" + sock.string() + "'");
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("cannot reach xenprobesd at " + sock.string()), std::string::npos) << out;
}

// A pair that cannot be attached (here: a function the guest does not have; on a real host, a
// guest still booting, without its module yet) is tried again with a growing wait, 2 s then 4 s;
// the same reason is logged once, not at every try.
TEST(xenprobesd, AFailedAttachmentIsRetriedAndLoggedOnce) {
  TempDir t;
  const fs::path sock = t.path / "control.sock";
  auto cfg = t.write("c.toml", daemon_section("control_socket = \"" + sock.string() + "\"") + R"(
[[program]]
name = "p"
source = 'kprobe:no_such_function { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_NE(f["body"].get<std::string>().find("no_such_function"), std::string::npos) << f;
  const std::string bin = XENPROBESD_BIN;
  std::string out;
  for (int i = 0; i < 100; ++i) {  // the second try comes 2 s after the first
    out = shell("'" + bin + "' status --socket '" + sock.string() + "'").second;
    if (out.find("(2 tries, the next in ") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(out.find("  domain 1: not attached: kprobe:no_such_function: "), std::string::npos) << out;
  EXPECT_NE(out.find("(2 tries, the next in "), std::string::npos) << out;
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_EQ(std::count_if(d.all().begin(), d.all().end(), [](const json& r) { return r["kind"] == "attach_failed"; }),
            1);
}

// A reload that only changes a program's selectors keeps the program: it detaches from the
// domains no longer selected and keeps its counters in the others.
TEST(xenprobesd, ReloadWithNewSelectorsKeepsTheProgramWhereItStillApplies) {
  TempDir t;
  const std::string prog = "\n[[program]]\nname = \"p\"\nsource = 'kprobe:sys_getppid { @c = count(); }'\n";
  auto cfg = t.write("c.toml", daemon_section() + prog + "domains = [{ glob = \"*\" }]\n");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  t.write("c.toml", daemon_section() + prog + "domains = [{ name = \"sim-1\" }]\n");
  d.signal(SIGHUP);
  json loaded = d.next("config_loaded");
  ASSERT_FALSE(loaded.is_null());
  EXPECT_EQ(loaded["kept"], json({"p"}));
  json gone = d.next("detached", "sim-2");
  EXPECT_EQ(gone["body"], "the domain is no longer selected");
  EXPECT_EQ(gone["hits"], 2 * K);
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("sim-2", "p", "kprobe:sys_getppid")), -1) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

}  // namespace
}  // namespace xenprobes::testing
