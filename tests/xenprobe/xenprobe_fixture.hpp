// Shared by xenprobe's tests (xenprobe_test.cpp, xenprobe_async_test.cpp, xenprobe_cli_test.cpp,
// xenprobe_btf_test.cpp): the tool run as a subprocess, the schema every NDJSON record it
// prints is checked against, and the oracle of the demo guests' deterministic workload
// (guest/demo.c) the exact counts come from.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace xenprobes::testing {

namespace fs = std::filesystem;
using nlohmann::json;

struct ToolRun {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

inline std::string slurp_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The golden cases in `dir`: every NAME.bt with the stderr it must give, NAME.err.
inline std::vector<std::pair<fs::path, fs::path>> golden_cases(const fs::path& dir) {
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
inline ToolRun run(const std::vector<std::string>& args, const std::string& cwd = {},
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
inline std::string schema_violation(const json& r) {
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

inline std::vector<json> records(const std::string& ndjson) {
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

// The data of the map (or hist) record of `map` in `domain`'s final output (the last one).
inline json map_data(const std::vector<json>& recs, const std::string& map, const std::string& domain = "sim-1") {
  json found;
  for (const json& r : recs)
    if ((r["type"] == "map" || r["type"] == "hist") && r["domain"] == domain && r["data"].contains(map))
      found = r["data"][map];
  return found;
}

// ---- the workload's oracle (guest/demo.c demo_iteration and demo_dispatch) ----

inline const char* const kPaths[8] = {"/etc/hostname", "/etc/passwd",   "/tmp",          "/nonexistent",
                                      "/proc/version", "/tmp/demo.log", "relative/path", "/etc"};

// sys_read's third argument, in call order, for `iters` iterations of vCPU v.
inline std::vector<std::int64_t> read_counts(std::uint64_t iters, unsigned v) {
  std::vector<std::int64_t> out;
  for (std::uint64_t i = 0; i < iters; ++i) {
    out.push_back(static_cast<std::int64_t>(1 + (i * 13 + v) % 48));  // direct call, buf of 48
    out.push_back(static_cast<std::int64_t>(i % 32));                 // demo_dispatch case 1
  }
  return out;
}

inline std::vector<json> hist_oracle(const std::vector<std::int64_t>& xs) {
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

inline std::vector<json> lhist_oracle(const std::vector<std::int64_t>& xs, std::int64_t lo, std::int64_t hi,
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

inline const std::vector<std::string> kSim1 = {"--sim", "--sim-vcpus", "1"};

inline std::string test_btf_path() {
  std::string p = XENPROBE_TEST_BTF;
  return !p.empty() && fs::exists(p) ? p : std::string{};
}

inline std::vector<std::string> args(std::vector<std::string> base, std::initializer_list<std::string> more) {
  base.insert(base.end(), more);
  return base;
}

}  // namespace xenprobes::testing
