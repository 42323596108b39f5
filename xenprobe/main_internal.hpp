// xenprobe's program (main.cpp has its options): what its parts share. Internal to the tool.
#pragma once

#include <fnmatch.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "async.hpp"
#include "compile.hpp"
#include "elf_symbols.hpp"
#include "kstack.hpp"
#include "lang.hpp"
#include "runtime.hpp"
#include "types.hpp"
#include "xenprobes/doctor.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobe {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using xenprobes::DomId;

// Set by the SIGINT/SIGTERM handler; the run loop ends when it is.
extern volatile std::sig_atomic_t g_signal;

struct Options {
  std::string program_text;
  std::string program_file;
  std::vector<std::string> domains;
  std::string format = "text";
  std::uint64_t hit_limit = 0;
  double duration = 0;
  std::vector<std::string> symbol_files;  // DOM=FILE
  std::string btf;
  std::string channel = "auto";
  std::string method = "trap";
  bool sim = false;
  unsigned sim_guests = 1;
  unsigned sim_vcpus = 2;
  std::uint64_t sim_iterations = 0;
  std::string sim_type = "pv";
  std::string sim_image;                   // "" = the demo guest
  std::vector<std::string> sim_no_module;  // globs of simulated guests without the guest module
  std::vector<std::string> sim_destroy;    // NAME@HITS
  unsigned sim_ring_order = 0;             // 0 = the simulated module's default
  std::string list_pattern = "*";
  bool check_only = false;
  unsigned maxactive = 64;
  std::size_t max_map_keys = xenprobe::kDefaultMaxMapKeys;
};

[[noreturn]] void die(const std::string& msg);

// A domain the user selected, with what xenprobe keeps for it.
struct Target {
  DomId id;
  std::string name;
  std::unique_ptr<Instance> instance;
  std::vector<xenprobes::Probe> probes;
  bool gone = false;
  bool halted = false;  // simulated guest that finished its workload
  std::uint64_t lost = 0;
  std::uint64_t hits = 0;                        // hits and records handled for this domain (--sim-destroy counts them)
  std::uint64_t ring_lost_base = 0;              // --method async: drops + missed before the run
  std::uint64_t ring_lost = 0;                   // and since
  bool ring_lost_final = false;                  // counted when the run stopped
  std::vector<Clock::time_point> next_interval;  // per block (time_point::max() if none)
};

// Where probe names come from: the library's symbols of each domain (a System.map given with
// --symbols, the demo guest's on the simulated Xen, or whatever the library loads by default).
// An interface, so that another source can stand in for it.
class SymbolSource {
 public:
  virtual ~SymbolSource() = default;
  virtual xenprobes::Result<std::vector<xenprobes::SymbolInfo>> functions(DomId, std::string_view glob) = 0;
  virtual xenprobes::Result<xenprobes::Gva> resolve(DomId, std::string_view expr) = 0;
};

class Tool {
 public:
  explicit Tool(Options o)
      : o_(std::move(o)),
        method_(o_.method == "jump"      ? xenprobes::ProbeMethod::Jump
                : o_.method == "fastest" ? xenprobes::ProbeMethod::Fastest
                                         : xenprobes::ProbeMethod::Trap),
        async_(o_.method == "async") {}

  int run_program();
  int run_doctor();
  int run_list();

 private:
  void load_types();
  bool use_sim() const;
  void open_session();
  void select_domains(bool symbols = true);
  std::unique_ptr<TypeSource> types_from_guests();
  void attach();
  void prepare_kstack(Target& t);
  static std::string hex(std::uint64_t v);
  static std::string module_note(const std::string& function);
  static std::string not_found_note(const Target& t, const std::string& function);
  [[noreturn]] void fail_attach(const Target& t, const std::string& what);
  void on_hit(Instance& inst, int block, const ProbeSite& site, xenprobes::HitContext& c);
  void on_record(Instance& inst, int block, const ProbeSite& site, const xenprobes::AsyncHit& h);
  void count_ring_losses();
  std::uint64_t ring_lost(const Target& t);
  void run_blocks(Target& t, ProbeKind kind);
  void begin();
  std::uint64_t interval_ns(std::size_t block) const;
  void loop();
  void count_hit(const Instance& inst);
  void check_domains();
  void collect_lost(Target& t);
  void finish();

  struct Destroy {
    std::string name;
    std::uint64_t hits;
    bool done;
  };

  Options o_;
  xenprobes::ProbeMethod method_;  // --method, for kprobes (kretprobes are trap probes)
  bool async_ = false;             // --method async: kprobes are async probes
  std::vector<AsyncPlan> plans_;   // per block, with async_
  std::unique_ptr<TypeSource> types_;
  Compiled compiled_;
  std::shared_ptr<xenprobes::hv::sim::SimHost> host_;
  std::vector<DomId> sim_paused_;
  std::unique_ptr<xenprobes::Session> session_;
  std::unique_ptr<SymbolSource> symbols_;
  std::unique_ptr<Output> out_;
  std::vector<Target> targets_;
  std::deque<ProbeSite> sites_;  // stable addresses: the handlers point at them
  std::deque<ProbeSite> interval_sites_;
  std::vector<Destroy> destroy_;
  std::uint64_t hits_ = 0;
  bool stopping_ = false;
  bool failed_ = false;  // the session's loop failed: the maps are printed, the exit status says so
  Clock::time_point started_;
};

}  // namespace xenprobe
