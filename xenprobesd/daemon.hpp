// xenprobesd's core: one library session serving every domain that a program of the
// configuration selects. Each (program, domain) pair is an Attachment with its own instance of
// the program (its maps), its probes and its counters. The daemon attaches at start and when
// xenstore says a domain was introduced, detaches when a domain is released, dies, crashes or
// shuts down, and reloads its configuration on request (docs/xenprobesd.md).
//
// Threads: everything runs on the thread that calls run(), except Requests::fetch(),
// which the metrics endpoint's threads call; the main loop renders the text for them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config.hpp"
#include "event_log.hpp"
#include "runtime.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobesd {

using Clock = std::chrono::steady_clock;

// What the simulated Xen runs (--sim): the same knobs as xenprobe's, plus guests that appear
// and disappear on cue so that tests see exact counts.
struct SimPlan {
  bool enabled = false;
  unsigned guests = 1;
  unsigned vcpus = 2;
  std::uint64_t iterations = 0;
  std::string type = "pv";
  std::vector<std::string> create;   // NAME@HITS: a guest created (paused, like xl create -p) after HITS hits in all
  std::vector<std::string> destroy;  // NAME@HITS: destroyed inside its HITS-th hit's handler
  std::vector<std::string> crash;    // NAME@HITS: its kernel panics inside its HITS-th hit's handler
  std::vector<std::string> labels;   // NAME:KEY=VALUE written to /local/domain/<id>/KEY at creation
  unsigned ring_order = 0;           // the guest module's async rings: 2^N bytes each (0 = the module's default)
  std::vector<std::string> images;   // NAME=FILE: that guest boots FILE (a static x86-64 ELF), not the demo guest
  std::vector<std::string> symbols;  // NAME=FILE: that guest's System.map (default: the demo guest's)
  // NAME@HITS:ADDR=HEX: bytes written at a guest-virtual address inside its HITS-th hit's handler
  // (what the guest's own kernel would write: the tests link a module into its module list)
  std::vector<std::string> writes;
};

// Questions from other threads (the metrics endpoint's, the control socket's: "metrics",
// "status", "reload"), answered by the main loop, which alone touches the session and the
// instances (they are not thread-safe).
class Requests {
 public:
  // Any thread: asks, waits at most `timeout` for the answer (nullopt: none came in time, or
  // the daemon is stopping).
  std::optional<std::string> ask(const std::string& what, std::chrono::milliseconds timeout);
  // Main loop: answers every question waiting.
  void serve(const std::function<std::string(const std::string&)>& answer);
  void set_waker(std::function<void()> w);
  void shut_down();

 private:
  struct Question {
    std::string what, answer;
    bool done = false;
  };
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Question>> waiting_;
  bool down_ = false;
  std::function<void()> waker_;
};

struct DomainKey {
  std::uint32_t domid = 0;
  xenprobes::hv::DomainHandle handle{};
  auto operator<=>(const DomainKey&) const = default;
};

class Daemon;
struct ProgramState;

struct ProbeEntry {
  xenprobe::ProbeSite site;
  int block = 0;
  xenprobes::Probe probe;
  std::uint64_t hits = 0;
  std::uint64_t handler_ns = 0;
  std::uint64_t missed_at_removal = 0;  // the probe's missed count when it was removed
};

// The records an instance prints (printf, print(@m)) go to the event log, rate limited.
class EventSink;

struct Attachment {
  Attachment() = default;
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;
  // A probe whose removal failed stays with the library (it retries when its handle goes):
  // its handler must not reach this attachment any more.
  ~Attachment();
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  ProgramState* program = nullptr;
  DomainKey key;
  xenprobes::DomId id;
  std::string domain;
  std::string channel;
  std::unique_ptr<EventSink> sink;
  std::unique_ptr<xenprobe::Instance> instance;
  // The program as checked for this domain: the configuration's, or (a program that needs
  // types) checked again with this domain's BTF.
  std::shared_ptr<const xenprobe::Compiled> compiled;
  // method = "async": each block's captures, planned with `compiled`; null for the other methods.
  AsyncPlans plans;
  std::uint64_t lost_at_attach = 0;  // async: the domain's lost events (Daemon::RingLoss) when attached
  std::deque<ProbeEntry> probes;     // stable addresses: the handlers point at them
  std::vector<Clock::time_point> next_interval;
  bool exited = false;  // the program called exit() here: its probes are gone
  std::uint64_t events = 0, dropped = 0;
  double tokens = 0;
  Clock::time_point refilled;
};

struct ProgramState {
  ProgramConfig cfg;
  std::map<DomainKey, std::unique_ptr<Attachment>> attached;
  // A domain it could not attach to: why, and when it is tried again. A guest that boots has no
  // guest module (and no probe-able channel) at first, so a failure is retried after 2 s, the
  // wait doubling up to 60 s while the reason stays the same. A reload tries every one at once.
  struct Failure {
    std::string why;
    Clock::time_point retry_at;
    std::chrono::seconds backoff{0};
    unsigned tries = 0;  // attempts that failed with this reason
  };
  std::map<DomainKey, Failure> failed;
};

class Daemon {
 public:
  Daemon(Config, SimPlan, EventLog&, Requests&);
  ~Daemon();

  // Opens the session, attaches, then serves until `stop` is set. `reload`/`reopen` are
  // set by signal handlers and cleared here. `ready` is called once the first attach pass
  // is done. Returns the exit status.
  int run(const volatile std::sig_atomic_t& stop, volatile std::sig_atomic_t& reload,
          volatile std::sig_atomic_t& reopen, const std::function<void(const std::string&)>& notify);

  std::string render_metrics();
  // What `xenprobesd status` prints.
  std::string status_text();
  // Wakes run()'s loop from any thread.
  void wake();

 private:
  friend class EventSink;

  struct SimCue {
    std::string name;
    std::uint64_t hits = 0;
    bool done = false;
    std::uint64_t address = 0;  // --sim-write: where, and what
    std::vector<std::byte> bytes{};
  };

  void open_session();
  static SimCue parse_cue(const std::string& spec, const char* option);
  static SimCue parse_write_cue(const std::string& spec);
  void sim_create(const std::string& name);
  void sim_step();
  void start_paused_guests();
  void scan(const char* why);
  bool matches(const ProgramConfig&, const xenprobes::hv::DomainInfo&, const std::string& name);
  void attach(ProgramState&, const xenprobes::hv::DomainInfo&, const std::string& name);
  std::string prepare_kstack(xenprobe::Instance&, xenprobes::DomId);
  // The program checked for this domain, or "" in *failure: the configuration's when it needs
  // no types, else compiled with the domain's BTF.
  // With method = "async", *plans gets the program's async plan (planned here when it was
  // checked with the domain's types; a refusal is a failure).
  std::shared_ptr<const xenprobe::Compiled> compiled_for(const ProgramConfig&, const DomainKey&, xenprobes::DomId,
                                                         const std::string& name, std::string* failure,
                                                         AsyncPlans* plans);
  // A domain's types: its kernel's BTF and its live modules', read from its memory when a
  // program first needs them, and again when its module list changed since (docs/xenprobesd.md
  // "Types"). `note`: the modules whose types are left out and why ("" when none).
  struct DomainTypes {
    std::shared_ptr<const xenprobe::TypeSource> types;
    std::uint64_t generation = 0;  // Session::check_modules when they were read
    std::string note;
  };
  // The domain's types, read now if need be; null with *failure saying why.
  const DomainTypes* types_for(const DomainKey&, xenprobes::DomId, const std::string& name, std::string* failure);
  void remove_probes(Attachment&);
  void run_end(Attachment&);
  void detach(Attachment&, const std::string& why);
  void domain_gone(const DomainKey&, const std::string& why);
  void on_hit(Attachment&, ProbeEntry&, xenprobes::HitContext&);
  // An async record (method = "async"): the block runs from it, with the guest's clock as nsecs.
  void on_record(Attachment&, ProbeEntry&, const xenprobes::AsyncHit&);
  // Reads the domain's async rings (their records' blocks run first) and returns its lost
  // events since the daemon's first async attachment there; the last count read when the
  // rings cannot be read (the domain is gone).
  std::uint64_t ring_lost(const DomainKey&, xenprobes::DomId);
  void run_intervals();
  Clock::time_point next_interval() const;
  void finish_exited();
  std::string reload();  // what happened, for the control socket
  std::string apply(Config next);
  std::string write_textfile();

  Config config_;
  SimPlan sim_;
  EventLog& log_;
  Requests& requests_;
  std::shared_ptr<xenprobes::hv::sim::SimHost> host_;
  std::unique_ptr<xenprobes::Session> session_;
  std::unique_ptr<xenprobes::hv::Hypervisor> watcher_;  // its own xenstore connection for the domain watches
  std::vector<std::unique_ptr<ProgramState>> programs_;
  std::map<DomainKey, std::uint64_t> domain_hits_;
  // A domain's async hits that reached no handler (Session::ring_stats: drops + missed +
  // bad_records), counted from `base`, the count when the daemon attached its first async
  // probes there (the guest module counts since it loaded).
  struct RingLoss {
    std::uint64_t base = 0, lost = 0;
  };
  std::map<DomainKey, RingLoss> ring_loss_;
  std::map<DomainKey, std::string> names_;
  std::uint64_t hits_ = 0;
  std::uint64_t reloads_ok_ = 0, reloads_rejected_ = 0;
  bool last_reload_ok_ = true;
  Clock::time_point started_;

  std::vector<SimCue> creates_, destroys_, crashes_, writes_;
  std::vector<xenprobes::DomId> sim_paused_;  // started once the daemon has had its look at them
  std::set<std::uint32_t> sim_domids_;
  std::set<DomainKey> symbols_loaded_;      // domains whose kallsyms the session has read
  std::map<DomainKey, DomainTypes> types_;  // each domain's types (types_for)
  bool sim_idle_logged_ = false;
  const xenprobe::ProbeSite* current_site_ = nullptr;  // the probe whose action is running
  Clock::time_point last_scan_, last_textfile_, last_watchdog_;
  std::function<void(const std::string&)> notify_;  // sd_notify
};

}  // namespace xenprobesd
