// xenprobe, run as users run it: a subprocess on the simulated Xen (--sim), its demo guests
// running a deterministic workload (guest/demo.c), so every count below is exact. The
// expected values come from the workload's definition (the oracle functions here), never
// from a previous run of the tool.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "demo_abi.h"
#include "module_btf_guest.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ToolRun {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

std::string slurp_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The golden cases in `dir`: every NAME.bt with the stderr it must give, NAME.err.
std::vector<std::pair<fs::path, fs::path>> golden_cases(const fs::path& dir) {
  std::vector<std::pair<fs::path, fs::path>> cases;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".bt") continue;
    fs::path want = e.path();
    want.replace_extension(".err");
    cases.emplace_back(e.path(), want);
  }
  return cases;
}

// Runs the tool with `args`; `during(pid, stdout_path)` runs while it does (for signals).
ToolRun run(const std::vector<std::string>& args, const std::string& cwd = {},
            const std::function<void(pid_t, const fs::path&)>& during = {},
            const std::vector<std::pair<std::string, std::string>>& env = {}) {
  static int serial = 0;
  fs::path dir =
      fs::temp_directory_path() / ("xenprobe_test." + std::to_string(getpid()) + "." + std::to_string(serial++));
  fs::create_directories(dir);
  const fs::path out = dir / "out", err = dir / "err";
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    unsetenv("XENPROBES_BACKEND");
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(XENPROBE_BIN));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(XENPROBE_BIN, argv.data());
    _exit(127);
  }
  if (during) during(pid, out);
  int st = 0;
  waitpid(pid, &st, 0);
  ToolRun r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove_all(dir);
  return r;
}

// The schema of xenprobe's NDJSON (docs/xenprobe.md "Output": bpftrace's record types with a
// "domain"), checked on every record every test reads: "" if `r` fits it, else what does not.
std::string schema_violation(const json& r) {
  if (!r.is_object() || r.size() != 3 || !r.contains("type") || !r.contains("domain") || !r.contains("data"))
    return "a record is an object of exactly type, domain and data";
  if (!r["type"].is_string() || !r["domain"].is_string() || r["domain"].get<std::string>().empty())
    return "type and domain are non-empty strings";
  const std::string type = r["type"];
  const json& d = r["data"];
  const auto one_map = [&]() -> const json* {
    if (!d.is_object() || d.size() != 1 || !d.begin().key().starts_with("@")) return nullptr;
    return &d.begin().value();
  };
  if (type == "attached_probes")
    return d.is_object() && d.size() == 1 && d.contains("probes") && d["probes"].is_number_unsigned()
               ? ""
               : "attached_probes: {\"probes\": N}";
  if (type == "lost_events")
    return d.is_object() && d.size() == 1 && d.contains("events") && d["events"].is_number_unsigned()
               ? ""
               : "lost_events: {\"events\": N}";
  if (type == "printf") return d.is_string() ? "" : "printf: a string";
  if (type == "map") {
    const json* m = one_map();
    if (!m) return "map: {\"@name\": value}";
    if (m->is_number_integer() || m->is_string()) return "";  // a map without keys
    if (!m->is_object()) return "map: a value, or an object of keys";
    for (const auto& [k, v] : m->items())
      if (!v.is_number_integer() && !v.is_string()) return "map: key " + k + "'s value is not an integer or string";
    return "";
  }
  if (type == "hist") {
    const json* m = one_map();
    if (!m) return "hist: {\"@name\": buckets}";
    const auto buckets_ok = [](const json& b) {
      if (!b.is_array()) return false;
      for (const json& x : b) {
        if (!x.is_object() || !x.contains("count") || !x["count"].is_number_unsigned()) return false;
        for (const auto& [k, v] : x.items())
          if ((k != "min" && k != "max" && k != "count") || !v.is_number_integer()) return false;
        if (!x.contains("min") && !x.contains("max")) return false;
      }
      return true;
    };
    if (buckets_ok(*m)) return "";
    if (!m->is_object()) return "hist: an array of buckets, or an object of keys";
    for (const auto& [k, v] : m->items())
      if (!buckets_ok(v)) return "hist: key " + k + "'s buckets";
    return "";
  }
  return "unknown record type " + type;
}

std::vector<json> records(const std::string& ndjson) {
  std::vector<json> v;
  std::istringstream in(ndjson);
  std::string line;
  while (std::getline(in, line)) {
    json r = json::parse(line, nullptr, false);
    EXPECT_FALSE(r.is_discarded()) << "not one JSON record: " << line;
    if (r.is_discarded()) continue;
    EXPECT_EQ(schema_violation(r), "") << line;
    v.push_back(std::move(r));
  }
  return v;
}

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

// The data of the map (or hist) record of `map` in `domain`'s final output (the last one).
json map_data(const std::vector<json>& recs, const std::string& map, const std::string& domain = "sim-1") {
  json found;
  for (const json& r : recs)
    if ((r["type"] == "map" || r["type"] == "hist") && r["domain"] == domain && r["data"].contains(map))
      found = r["data"][map];
  return found;
}

// ---- the workload's oracle (guest/demo.c demo_iteration and demo_dispatch) ----

const char* const kPaths[8] = {"/etc/hostname", "/etc/passwd",   "/tmp",          "/nonexistent",
                               "/proc/version", "/tmp/demo.log", "relative/path", "/etc"};

// sys_read's third argument, in call order, for `iters` iterations of vCPU v.
std::vector<std::int64_t> read_counts(std::uint64_t iters, unsigned v) {
  std::vector<std::int64_t> out;
  for (std::uint64_t i = 0; i < iters; ++i) {
    out.push_back(static_cast<std::int64_t>(1 + (i * 13 + v) % 48));  // direct call, buf of 48
    out.push_back(static_cast<std::int64_t>(i % 32));                 // demo_dispatch case 1
  }
  return out;
}

std::vector<json> hist_oracle(const std::vector<std::int64_t>& xs) {
  std::vector<std::uint64_t> b(66, 0);
  for (auto x : xs) {
    int i = x < 0 ? 0 : x == 0 ? 1 : 2 + (63 - __builtin_clzll(static_cast<unsigned long long>(x)));
    ++b[static_cast<std::size_t>(i)];
  }
  std::size_t first = 0, last = b.size();
  while (first < last && !b[first]) ++first;
  while (last > first && !b[last - 1]) --last;
  std::vector<json> v;
  for (std::size_t i = first; i < last; ++i) {
    json o;
    if (i == 0) {
      o["max"] = -1;
    } else if (i <= 2) {
      o["min"] = i - 1;
      o["max"] = i - 1;
    } else {
      o["min"] = 1ll << (i - 2);
      o["max"] = (1ll << (i - 1)) - 1;
    }
    o["count"] = b[i];
    v.push_back(o);
  }
  return v;
}

std::vector<json> lhist_oracle(const std::vector<std::int64_t>& xs, std::int64_t lo, std::int64_t hi,
                               std::int64_t step) {
  const std::size_t n = static_cast<std::size_t>((hi - lo) / step + 2);
  std::vector<std::uint64_t> b(n, 0);
  for (auto x : xs) ++b[x < lo ? 0 : x >= hi ? n - 1 : static_cast<std::size_t>(1 + (x - lo) / step)];
  std::size_t first = 0, last = n;
  while (first < last && !b[first]) ++first;
  while (last > first && !b[last - 1]) --last;
  std::vector<json> v;
  for (std::size_t i = first; i < last; ++i) {
    json o;
    if (i == 0) {
      o["max"] = lo - 1;
    } else if (i == n - 1) {
      o["min"] = hi;
    } else {
      o["min"] = lo + static_cast<std::int64_t>(i - 1) * step;
      o["max"] = lo + static_cast<std::int64_t>(i) * step - 1;
    }
    o["count"] = b[i];
    v.push_back(o);
  }
  return v;
}

const std::vector<std::string> kSim1 = {"--sim", "--sim-vcpus", "1"};

std::string test_btf_path() {
  std::string p = XENPROBE_TEST_BTF;
  return !p.empty() && fs::exists(p) ? p : std::string{};
}

std::vector<std::string> args(std::vector<std::string> base, std::initializer_list<std::string> more) {
  base.insert(base.end(), more);
  return base;
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

// ---- BTF ----

std::string test_btf() {
  std::string p = XENPROBE_TEST_BTF;
  return !p.empty() && fs::exists(p) ? p : std::string{};
}

// Casts, fields, arrays and pointer indexing through BTF against the demo guest's memory.
TEST(XenprobeBtf, FieldsOfTheGuestsOwnStructures) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  constexpr std::uint64_t K = 8;
  const std::string prog = R"(
    kprobe:sys_getppid {
      $files = (struct demo_file *)kaddr("demo_files");
      @path = str($files[3].path);
      @mode = $files[3].mode;
      @size = $files[2].size;
      @first = str($files->path);
      @calls = max(((struct demo_stats *)kaddr("demo_stats"))->calls[0]);
      @iters = max(((struct demo_stats *)kaddr("demo_stats"))->iterations);
    }
  )";
  ToolRun r = run(args(kSim1, {"--sim-iterations", std::to_string(K), "--btf", btf, "-f", "json", "-e", prog}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  EXPECT_EQ(map_data(recs, "@path"), "/etc/passwd");
  EXPECT_EQ(map_data(recs, "@mode"), 2);   // DEMO_F_IMMUTABLE
  EXPECT_EQ(map_data(recs, "@size"), 11);  // "demo-guest\n"
  EXPECT_EQ(map_data(recs, "@first"), "/");
  // The probe sits before the function counts its own call: the n-th call sees n - 1.
  EXPECT_EQ(map_data(recs, "@calls"), 2 * K - 1);
  EXPECT_EQ(map_data(recs, "@iters"), K - 1);
  EXPECT_EQ(r.err.find("reads failed"), std::string::npos) << r.err;
}

TEST(XenprobeBtf, TheIssuesOneLinerChecksAgainstBtf) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r =
      run({"--check", "--btf", btf, "-e",
           "kprobe:vfs_open { @[str(((struct file *)arg1)->f_path.dentry->d_name.name), comm, pid, tid] = count(); "
           "@len = hist(((struct file *)arg1)->f_path.dentry->d_name.len); }"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(XenprobeBtf, TheHostsKernelBtfWhenThereIsOne) {
  // The same path as the test above with a real kernel's BTF (6.2+ keeps the task pointer in
  // pcpu_hot, older ones in current_task: either is found).
  if (!fs::exists("/sys/kernel/btf/vmlinux")) GTEST_SKIP() << "this kernel has no /sys/kernel/btf/vmlinux";
  ToolRun r =
      run({"--check", "--btf", "/sys/kernel/btf/vmlinux", "-e",
           "kprobe:vfs_open { @[str(((struct file *)arg1)->f_path.dentry->d_name.name), comm, pid] = count(); }"});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(XenprobeBtf, CommPidTidRunAndCountUnreadableMemory) {
  // The demo guest has no tasks: its gs base is 0, so the task pointer is unreadable. The run
  // goes on, the keys read as "" and 0, and the tool says how many reads failed.
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r = run(args(kSim1, {"--sim-iterations", "3", "--btf", btf, "-f", "json", "-e",
                               "kprobe:sys_getppid { @[comm, pid, tid] = count(); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(map_data(records(r.out), "@"), json({{",0,0", 6}}));
  EXPECT_NE(r.err.find("sim-1: 18 guest memory reads failed"), std::string::npos) << r.err;
}

TEST(XenprobeBtf, FieldErrorsNameTheFieldsThereAre) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_pth; }"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "-e:1:39: error: struct file has no field 'f_pth'\n"
            "kprobe:f { @ = ((struct file *)arg0)->f_pth; }\n"
            "                                      ^~~~~\n"
            "its fields: f_u, f_path, f_flags\n");
  ToolRun bf = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_flags; }"});
  EXPECT_NE(bf.err.find("'f_flags' is a bitfield, which xenprobe cannot read yet"), std::string::npos) << bf.err;
  ToolRun ns = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct inode *)arg0)->i_mode; }"});
  EXPECT_NE(ns.err.find("no struct inode in BTF file " + btf), std::string::npos) << ns.err;
  // A file that is not BTF at all.
  ToolRun nb = run({"--check", "--btf", XENPROBES_DEMO_GUEST_SYSTEM_MAP, "-e", "BEGIN { }"});
  EXPECT_EQ(nb.status, 1);
  EXPECT_NE(nb.err.find(std::string("xenprobe: cannot read BTF from ") + XENPROBES_DEMO_GUEST_SYSTEM_MAP),
            std::string::npos)
      << nb.err;
}

// ---- a loaded module, end to end: its functions and its BTF read from the guest's memory ----
//
// The guest: tests/module_btf_guest.hpp (the demo guest with a LIVE module "xfs", its functions
// and its split BTF in its memory), given with --sim-image and its System.map with --symbols.

using xenprobes::testing::module_btf_guest;
using ModuleGuest = xenprobes::testing::ModuleBtfGuest;
constexpr std::uint64_t kIno = ModuleGuest::kIno;

ModuleGuest module_guest() { return module_btf_guest(); }

TEST(XenprobeModules, AModulesFunctionsAreListedAndResolvedFromItsMemory) {
  ModuleGuest g = module_guest();
  const std::vector<std::string> base = {"--sim",     "--sim-vcpus",   "1", "--sim-image", g.image,
                                         "--symbols", "sim-1=" + g.map};
  ToolRun l = run(args(base, {"list", "xfs*"}));
  ASSERT_EQ(l.status, 0) << l.err;
  EXPECT_EQ(l.out, "kprobe:xfs_file_read_iter [xfs]\n");  // its data symbol is not a function
  ToolRun q = run(args(base, {"list", "xfs:*"}));
  EXPECT_EQ(q.out, "kprobe:xfs_file_read_iter [xfs]\n") << q.err;
  ToolRun c = run(args(base, {"list", "sys_getppid"}));  // the core kernel's are still there
  EXPECT_EQ(c.out, "kprobe:sys_getppid\n") << c.err;
}

// The module's BTF where a real kernel keeps it once the module's init ran (struct module's
// btf_data NULL, the BTF on the kernel's btf_modules list), and where a guest that keeps
// btf_data has it: the same values either way.
TEST(XenprobeModules, AProgramReadsThroughAModulesStructAndFunctionAddress) {
  for (bool btf_data : {false, true}) {
    SCOPED_TRACE(btf_data ? "through btf_data" : "through btf_modules");
    ModuleGuest g = module_btf_guest({.btf_data = btf_data});
    const std::vector<std::string> base = {"--sim",     "--sim-vcpus",   "1", "--sim-image", g.image,
                                           "--symbols", "sim-1=" + g.map};
    // No --btf: the kernel's BTF and the module's split BTF, both read from the guest.
    ToolRun r =
        run(args(base, {"--sim-iterations", "2", "-f", "json", "-e",
                        "kprobe:sys_getppid { @ino = max(((struct xfs_inode *)kaddr(\"xfs_file_read_iter\"))->i_ino); "
                        "@flags = max(((struct xfs_inode *)kaddr(\"xfs:xfs_file_read_iter\"))->i_flags); "
                        "@calls = count(); }"}),
            {}, {}, {{"XENPROBES_LOG", "debug"}});
    ASSERT_EQ(r.status, 0) << r.err;
    auto recs = records(r.out);
    EXPECT_EQ(map_data(recs, "@ino"), static_cast<std::int64_t>(kIno));
    EXPECT_EQ(map_data(recs, "@flags"), 42);
    EXPECT_EQ(map_data(recs, "@calls"), 4);  // two getppid calls per iteration
    EXPECT_EQ(r.err.find("reads failed"), std::string::npos) << r.err;
    // Where the types came from.
    const std::string from = btf_data ? "guest module xfs: its BTF (100 bytes) from its struct module's btf_data\n"
                                      : "guest module xfs: its BTF (100 bytes) from the kernel's btf_modules list\n";
    EXPECT_NE(r.err.find(from), std::string::npos) << r.err;
  }
  // The demo guest without the module has neither.
  ToolRun none = run(args(kSim1, {"--sim-iterations", "1", "-e", "kprobe:xfs_file_read_iter { }"}));
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("no symbol 'xfs_file_read_iter'"), std::string::npos) << none.err;
}

// Types are read once, when xenprobe starts (as bpftrace reads them when it loads a program):
// a program naming a type of a module that is not loaded then fails before anything is
// attached, saying where the type was looked for, when the modules' types are read and what to
// do; a module whose types could not be used is named with the reason.
TEST(XenprobeModules, ATypeOfAModuleNotLoadedAtTheStartIsAnErrorSayingWhatToDo) {
  const std::string prog = "kprobe:sys_getppid { @ = ((struct xfs_inode *)kaddr(\"sys_getppid\"))->i_ino; }";
  const std::string where =
      "-e:1:27: error: no struct xfs_inode in the BTF of sim-1's kernel (read from its memory)\n" + prog +
      "\n                          ^~~~~~~~~~~~~~~~~~~~\n"
      "a module's types are read with the kernel's when xenprobe starts, from the modules loaded then (as bpftrace "
      "reads them when it loads a program): if the type is a module's, load that module in the guest, then start "
      "xenprobe\n";
  // No module loaded.
  ModuleGuest none = module_btf_guest({.module = false});
  ToolRun n =
      run({"--sim", "--sim-vcpus", "1", "--sim-image", none.image, "--symbols", "sim-1=" + none.map, "-e", prog});
  EXPECT_EQ(n.status, 1);
  EXPECT_TRUE(n.err.ends_with(where)) << n.err;
  EXPECT_EQ(n.out, "");  // nothing attached
  // The module loaded, without BTF: named, with the reason.
  ModuleGuest no_btf = module_btf_guest({.module = true, .module_btf = false});
  ToolRun b =
      run({"--sim", "--sim-vcpus", "1", "--sim-image", no_btf.image, "--symbols", "sim-1=" + no_btf.map, "-e", prog});
  EXPECT_EQ(b.status, 1);
  EXPECT_TRUE(b.err.ends_with(
      where +
      "types left out:\n"
      "  module xfs: it has no BTF: the kernel's btf_modules list has no entry for it (the module was built without "
      "BTF, or the kernel refused its BTF when it loaded it), and its struct module's btf_data is NULL (Linux 5.11 "
      "and later clear it once the module's init ran)\n"))
      << b.err;
  EXPECT_EQ(b.out, "");
  // With the module's BTF, a name neither has: the modules looked at are named.
  ModuleGuest with = module_guest();
  ToolRun w = run({"--sim", "--sim-vcpus", "1", "--sim-image", with.image, "--symbols", "sim-1=" + with.map, "-e",
                   "kprobe:sys_getppid { @ = ((struct xfs_inod *)kaddr(\"sys_getppid\"))->i_ino; }"});
  EXPECT_EQ(w.status, 1);
  EXPECT_NE(w.err.find("error: no struct xfs_inod in the BTF of sim-1's kernel (read from its memory), with the BTF "
                       "of loaded module(s) xfs\n"),
            std::string::npos)
      << w.err;
  // A module's function named with its module, the module not loaded.
  ToolRun f = run({"--sim", "--sim-vcpus", "1", "--sim-image", none.image, "--symbols", "sim-1=" + none.map, "-e",
                   "kprobe:xfs:xfs_file_read_iter { }"});
  EXPECT_EQ(f.status, 1);
  EXPECT_NE(f.err.find("xenprobe: domain sim-1: kprobe:xfs:xfs_file_read_iter: no symbol 'xfs:xfs_file_read_iter'"),
            std::string::npos)
      << f.err;
  EXPECT_TRUE(
      f.err.ends_with("; a module's functions are those of the modules loaded when xenprobe starts: if xfs "
                      "is not loaded, load it in the guest, then start xenprobe\n"))
      << f.err;
  // --btf gives the kernel's types only, and says so.
  const std::string btf = test_btf();
  if (!btf.empty()) {
    ToolRun k = run({"--check", "--btf", btf, "-e", prog});
    EXPECT_EQ(k.status, 1);
    EXPECT_TRUE(
        k.err.ends_with("--btf gives the kernel's types only: without it, xenprobe reads the guest kernel's "
                        "BTF and its loaded modules' from its memory\n"))
        << k.err;
  }
}

}  // namespace

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
