// The real-kernel sweep's parts (its description, options and xpe2e_sweep_main() are in
// xpe2e_sweep.cpp): the kernel functions it asks for (xpe2e_sweep_areas.cpp) and the Sweep, a
// batch at a time (xpe2e_sweep_run.cpp). Everything here is in xpe2e::sweep.
#pragma once

#include <cstdint>
#include <deque>
#include <ios>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"

namespace xpe2e::sweep {

using namespace xenprobes;

double since(Clock::time_point t);  // seconds

struct Area {
  const char* name;
  std::vector<const char*> functions;
};
extern const std::vector<Area> kAreas;  // xpe2e_sweep_areas.cpp

struct Args {
  DomId dom{0};
  std::string channel = "guest";
  unsigned batch = 1000;             // instructions asked for per batch (the module's trap table: 2048)
  unsigned cap = 5;                  // handler calls before a probe is unregistered
  unsigned per_area = 0;             // 0: every function of the list
  std::uint64_t max_fn_bytes = 256;  // bounds the sweep's time: see docs/e2e.md
  unsigned min_functions = 300;
  int round_limit = 240;  // the guest's limit for one round
  int hot_limit = 60;     // seconds into a round before the batch's probes go
  std::string console;    // the DomU's console log (xenconsoled)
  std::string only;       // comma-separated names: only these functions (to bisect a failure)
};

std::vector<std::string> console_bad(const std::string& path, std::streamoff* offset);

struct Function {
  std::string area, name;
  Gva start;
  std::uint64_t size = 0;
  std::vector<std::uint64_t> insns;  // instruction addresses, decoded from the guest's text
  std::vector<std::byte> text;       // the snapshot of the batch it is probed in
  bool undecodable_tail = false;     // Capstone stopped before the end
};

struct Point {
  std::size_t fn = 0;
  Gva at;
  Probe probe;
  std::uint64_t hits = 0;
  bool capped = false;
  bool counted = false;  // a counted syscall's entry: never capped
};

struct Tally {
  std::map<std::string, std::uint64_t> accepted;  // by mode, "moved" apart
  std::map<std::string, std::uint64_t> refused;   // by rule
  std::map<std::string, std::string> example;     // one refusal message per rule
  std::map<std::string, std::uint64_t> area_insns, area_accepted, area_functions, area_hit;
  std::uint64_t capped = 0, hits = 0, points = 0, hot_dropped = 0;
};

class Sweep {
 public:
  Sweep(const Args& a, Session& s) : a_(a), s_(s), hv_(s.hypervisor()) {}

  int run();

 private:
  bool select_functions();
  void register_counted();
  std::optional<std::string> round(int phase, const std::string& tag, std::deque<Point>* batch, double* hot_at);
  void cap_pending();
  void unregister(std::deque<Point>& pts, const std::string& tag);
  bool after_batch(const std::string& tag, const std::optional<std::string>& res, std::size_t fn_from,
                   std::size_t fn_to);
  void serve(int ms);

  const Args& a_;
  Session& s_;
  hv::Hypervisor& hv_;
  std::vector<Function> fns_;
  std::deque<Point> counted_;
  std::vector<Point*> to_cap_;
  std::map<std::string, std::uint64_t> counted_before_;
  Tally t_;
  std::streamoff console_off_ = 0;
  std::vector<std::string> pending_bad_;  // bad console lines seen while a round ran
  double cap_max_s_ = 0, run_max_s_ = 0;  // the longest cap_pending() (the domain paused) and run_once() with hits
  int phase_ = 0;
  bool dead_ = false;
};

}  // namespace xpe2e::sweep
