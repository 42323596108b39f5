// xpe2e-probe bench (its usage: xpe2e_probe.cpp): the paper's Table 1 side by side, each
// config armed in turn while the guest measures its syscalls' latencies (tools/bench/table1.sh).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

namespace {

// ---- bench: the paper's Table 1 side by side ---------------------------------------------

// What the probes sit on: the four measured syscalls (the guest's kprobe events use the same
// functions, workload_bench.c) and two more that only the tar extraction reaches (Table 2/3).
struct BenchFn {
  const char* role;
  const char* fn;
};
constexpr BenchFn kBenchFns[] = {{"null", "__x64_sys_getppid"}, {"read", "__x64_sys_read"},
                                 {"write", "__x64_sys_write"},  {"open", "__x64_sys_openat"},
                                 {"mkdir", "do_mkdirat"},       {"chmod", "chmod_common"}};
constexpr std::size_t kBenchFnCount = sizeof kBenchFns / sizeof kBenchFns[0];
constexpr std::size_t kBenchKinds = 4;  // the measured ones: the first four
std::uint64_t g_bench_entries[kBenchFnCount], g_bench_returns[kBenchFnCount];
// Where the time between two hits goes (diagnostics): gaps between consecutive handler calls,
// as seen by Dom0, in buckets < 1 ms, < 10 ms, < 100 ms, >= 100 ms.
std::uint64_t g_gap[4];
Clock::time_point g_last_hit;
void bench_gap() {
  auto now = Clock::now();
  if (g_last_hit != Clock::time_point{}) {
    double ms = std::chrono::duration<double, std::milli>(now - g_last_hit).count();
    ++g_gap[ms < 1 ? 0 : ms < 10 ? 1 : ms < 100 ? 2 : 3];
  }
  g_last_hit = now;
}

double dnum(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
}

// This process's CPU time so far (user + system), in seconds.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int cmd_bench(const Args& a) {
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto s = open_session(a, SessionOptions{opt});
  hv::Hypervisor& hv = s->hypervisor();
  std::string channel = must(s->channel_name(a.dom), "channel_name");
  // The tables' channel name (table1.sh): spinning gets its own table.
  const std::string label = channel + (a.spin_us ? "+spin" : "");
  std::vector<std::pair<std::string, Gva>> fns;
  for (const auto& f : kBenchFns) fns.emplace_back(f.fn, must(s->resolve(a.dom, f.fn), std::string("resolve ") + f.fn));
  auto before = snapshot(hv, a.dom, fns);

  auto ready = wait_key(hv, dom_path(a.dom, "data/xpe2e/bench/ready"), a.timeout_s);
  if (!check("bench.ready", ready && *ready == "1", ready ? "guest: " + *ready : "no data/xpe2e/bench/ready"))
    fatal("the guest's benchmark loop did not start");

  std::vector<std::string> configs;
  for (std::istringstream in(a.configs);;) {
    std::string c;
    if (!std::getline(in, c, ',')) break;
    std::string base = c.substr(0, c.find('/'));
    if (base != "native" && base != "kprobe" && base != "kretprobe" && base != "xp" && base != "xrp" &&
        base != "jump" && base != "async")
      fatal("unknown bench config " + c);
    for (std::size_t at = c.find('/'); at != std::string::npos; at = c.find('/', at + 1)) {
      std::string opt = c.substr(at + 1, c.find('/', at + 1) - at - 1);
      if (opt.size() < 2 || opt[0] != 'w' || opt.find_first_not_of("0123456789", 1) != std::string::npos)
        fatal("unknown bench config option '" + opt + "' in " + c + " (/w<run_once timeout in ms>)");
    }
    configs.push_back(c);
  }
  int i = 0;
  for (const std::string& spec : configs) {
    ++i;
    // Diagnostics: "<config>/w<ms>" sets run_once's timeout for this config.
    const std::string config = spec.substr(0, spec.find('/'));
    int wait_ms = a.wait_ms;
    if (auto w = spec.find("/w"); w != std::string::npos) wait_ms = std::atoi(spec.c_str() + w + 2);
    std::fill(std::begin(g_bench_entries), std::end(g_bench_entries), 0);
    std::fill(std::begin(g_bench_returns), std::end(g_bench_returns), 0);
    std::fill(std::begin(g_gap), std::end(g_gap), 0);
    g_last_hit = {};
    std::uint64_t loops = 0, idle_loops = 0, late_loops = 0;
    std::vector<Probe> probes;
    std::vector<Gva> points;
    for (std::size_t k = 0; k < kBenchFnCount; ++k) {
      Gva at = fns[k].second;
      if (config == "xp" || config == "jump") {
        // The cheapest useful XP: a pre-handler that counts (the paper's handlers did as little);
        // "jump": the same as a jump probe (issue 14), no trap per hit.
        probes.push_back(must(s->probe(
                                  a.dom, at,
                                  [k](HitContext&) {
                                    ++g_bench_entries[k];
                                    bench_gap();
                                    return 0;
                                  },
                                  {}, ProbeOptions{config == "jump" ? ProbeMethod::Jump : ProbeMethod::Trap}),
                              std::string(config == "jump" ? "jump probe on " : "XP on ") + fns[k].first));
      } else if (config == "async") {
        // An async jump probe (issue 14): the hit is a record in the vCPU's ring, counted when
        // Dom0 reads it.
        // (No bench_gap(): records arrive in batches, their gaps say nothing.)
        probes.push_back(must(s->probe_async(a.dom, at, [k](const AsyncHit&) { ++g_bench_entries[k]; }),
                              std::string("async probe on ") + fns[k].first));
      } else if (config == "xrp") {
        probes.push_back(must(s->ret_probe(
                                  a.dom, at,
                                  [k](HitContext&, std::span<std::byte>) {
                                    ++g_bench_entries[k];
                                    bench_gap();
                                    return 0;
                                  },
                                  [k](HitContext&, std::span<std::byte>) {
                                    ++g_bench_returns[k];
                                    bench_gap();
                                  }),
                              std::string("XrP on ") + fns[k].first));
      } else {
        continue;
      }
      points.push_back(probes.back().info()->address);  // past the function's ftrace site
    }
    if (config == "jump" || config == "async") {
      // Measured once the jumps are in (the module's quiescence), not through their trap bytes.
      const JumpsWritten jw = wait_for_jumps(*s, probes);
      check("bench.jump.written", jw.waiting == 0, fmt("%ld jumps still wait", jw.waiting));
      std::fill(std::begin(g_bench_entries), std::end(g_bench_entries), 0);  // hits while waiting: not measured
      points.clear();                                                        // no trap bytes to check
    }
    if (!points.empty()) {
      std::string d;
      check("bench." + config + ".armed", first_bytes_are_traps(hv, a.dom, points, trap_byte_of(channel), &d), d);
      for (auto& p : probes)
        if (auto inf = p.info())
          say("XPE2E-INFO: bench %s: probe %" PRIu64 " mode=%s", config.c_str(), p.id(), mode_name(inf->mode));
    }
    auto go = fmt("%s %.3f %d %d", config.c_str(), a.round_s, a.rounds, a.untar);  // the guest needs no suffix
    must(hv.xs_write(dom_path(a.dom, fmt("data/xpe2e/bench/go-%d", i)), go), "write go");
    say("XPE2E-STAGE bench %s: %s (%s)", channel.c_str(), go.c_str(), spec.c_str());
    auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    auto end = t0 + std::chrono::seconds(a.timeout_s);
    // The result key is read only when a run_once call handled nothing for wait_ms (the
    // guest's measurement is over or between phases): a xenstore read between two hits would
    // delay the second and count as probe cost.
    const std::string result_key = dom_path(a.dom, fmt("data/xpe2e/bench/result-%d", i));
    std::optional<std::string> result;
    while (Clock::now() < end && !result) {
      auto l0 = Clock::now();
      auto r = s->run_once(wait_ms);
      if (!r) {
        check("run_once", false, r.error().what);
        break;
      }
      ++loops;
      if (*r == 0) {
        ++idle_loops;
        if (auto v = hv.xs_read(result_key)) result = *v;
      }
      // Handled something only after (about) the whole timeout: its event came late or not at all.
      if (*r > 0 && Clock::now() - l0 >= std::chrono::milliseconds(wait_ms * 9 / 10)) ++late_loops;
    }
    double window = std::chrono::duration<double>(Clock::now() - t0).count();
    // What this config cost Dom0 (this process: handlers, polling, reading rings).
    const double cpu = cpu_seconds() - cpu0;
    say("XPE2E-INFO: bench %s: Dom0 CPU %.2f s (user + system) in a %.1f s window (%.0f %%)", spec.c_str(), cpu, window,
        window > 0 ? 100 * cpu / window : 0.0);
    if (!probes.empty())
      say("XPE2E-INFO: bench %s: %" PRIu64 " run_once calls, %" PRIu64 " handled nothing, %" PRIu64
          " handled hits only at their timeout; gaps between hits <1ms %" PRIu64 ", <10ms %" PRIu64 ", <100ms %" PRIu64
          ", >=100ms %" PRIu64,
          spec.c_str(), loops, idle_loops, late_loops, g_gap[0], g_gap[1], g_gap[2], g_gap[3]);
    if (config == "async") {  // the records still in the rings
      auto rs = s->ring_stats(a.dom);
      check("bench.async.rings", rs && rs->drops == 0 && rs->missed == 0 && rs->resyncs == 0,
            rs ? fmt("records %" PRIu64 ", drops %" PRIu64 ", missed %" PRIu64 ", resyncs %" PRIu64, rs->records,
                     rs->drops, rs->missed, rs->resyncs)
               : rs.error().what);
    }
    std::vector<ProbeStats> stats;
    for (auto& p : probes) stats.push_back(p.stats());
    for (auto& p : probes) {
      auto r = p.unregister();
      if (!r) check("bench." + config + ".unregister", false, r.error().what);
    }
    probes.clear();
    std::string diff = compare(hv, a.dom, before);
    check("bench." + config + ".text_restored", diff.empty(), diff.empty() ? "byte-identical" : diff);
    if (!check("bench." + config + ".result", result.has_value(),
               result ? fmt("%.1f s: %s", window, result->c_str()) : fmt("no result within %d s", a.timeout_s)))
      break;
    auto m = kv(*result);
    check("bench." + config + ".errors", num(m, "errors") == 0 && !m.count("error"),
          "failed calls in the guest: " + m["errors"] + (m.count("error") ? " (" + m["error"] + ")" : ""));
    for (std::size_t k = 0; k < kBenchKinds; ++k) {
      std::string kind = kBenchFns[k].role;
      long calls = num(m, kind + "_calls");
      // Every measured call must have been seen by the config's probes (more is fine: the
      // guest's xenstore and console I/O read and write too).
      long seen = config == "xp" || config == "xrp" || config == "jump" || config == "async" ? (long)g_bench_entries[k]
                  : config == "native"                                                       ? calls
                                                                                             : num(m, "kp_" + kind);
      if (config == "xrp") seen = std::min(seen, (long)g_bench_returns[k]);
      check(fmt("bench.%s.%s.seen", config.c_str(), kind.c_str()), calls > 0 && seen >= calls,
            fmt("%ld calls measured, %ld seen by the probe", calls, seen));
      say("XPE2E-BENCH %s %s %s us=%.3f min=%.3f max=%.3f calls=%ld hits=%ld", label.c_str(), spec.c_str(),
          kind.c_str(), dnum(m, kind + "_us"), dnum(m, kind + "_min"), dnum(m, kind + "_max"), calls,
          config == "native" ? 0 : seen);
    }
    if (a.untar > 0) {
      std::string hits;
      for (std::size_t k = 0; k < kBenchFnCount; ++k) {
        long h = config == "xp" || config == "xrp" || config == "jump" || config == "async" ? (long)g_bench_entries[k]
                 : config == "native"                                                       ? 0
                                      : num(m, std::string("kp_") + kBenchFns[k].role);
        hits += fmt("%s%s:%ld", hits.empty() ? "" : ",", kBenchFns[k].role, h);
      }
      say("XPE2E-BENCH %s %s untar s=%.3f min=%.3f max=%.3f rounds=%ld hits=%s", label.c_str(), spec.c_str(),
          dnum(m, "untar_s"), dnum(m, "untar_min"), dnum(m, "untar_max"), num(m, "untar_rounds"), hits.c_str());
    }
    for (std::size_t k = 0; k < stats.size(); ++k)
      if (stats[k].unhandled)
        say("XPE2E-INFO: bench %s: probe %zu: %" PRIu64 " hits unhandled", config.c_str(), k, stats[k].unhandled);
  }
  must(hv.xs_write(dom_path(a.dom, "data/xpe2e/bench/end"), "1"), "write data/xpe2e/bench/end");
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  must(hvp->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG bench %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace xpe2e::probe
