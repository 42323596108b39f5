// xenprobesd's core (daemon.hpp): the questions from other threads, the session, the main
// loop. The rest of the Daemon, by responsibility: daemon_domains.cpp (which domains, and a
// domain's end), daemon_attach.cpp (attaching a program to a domain: its probes by method,
// and detaching), daemon_actions.cpp (running the programs' actions, their records),
// daemon_reload.cpp (a new configuration), daemon_report.cpp (metrics, the textfile, status),
// daemon_sim.cpp (the simulated Xen's guests and cues).
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "daemon_internal.hpp"
#include "xenprobes/protocol.h"

namespace xenprobesd {

using namespace std::chrono_literals;
using nlohmann::ordered_json;

namespace {

constexpr const char* kIntroToken = "xenprobesd-introduce";
constexpr const char* kReleaseToken = "xenprobesd-release";
constexpr auto kScanEvery = 2s;  // a full look at the domains, besides the xenstore watches
constexpr auto kTextfileEvery = 15s;
constexpr auto kWatchdogEvery = 1s;
constexpr int kLoopWaitMs = 100;  // the longest a signal or a metrics request waits for the loop

}  // namespace

// ---- Requests ----

std::optional<std::string> Requests::ask(const std::string& what, std::chrono::milliseconds timeout) {
  auto q = std::make_shared<Question>();
  q->what = what;
  std::unique_lock lk(m_);
  if (down_) return std::nullopt;
  waiting_.push_back(q);
  if (waker_) waker_();
  cv_.wait_for(lk, timeout, [&] { return q->done || down_; });
  if (!q->done) return std::nullopt;
  return q->answer;
}

void Requests::serve(const std::function<std::string(const std::string&)>& answer) {
  std::deque<std::shared_ptr<Question>> qs;
  {
    std::lock_guard lk(m_);
    qs.swap(waiting_);
  }
  if (qs.empty()) return;
  for (auto& q : qs) q->answer = answer(q->what);  // unlocked: a reload takes its time
  std::lock_guard lk(m_);
  for (auto& q : qs) q->done = true;
  cv_.notify_all();
}

void Requests::set_waker(std::function<void()> w) {
  std::lock_guard lk(m_);
  waker_ = std::move(w);
}

void Requests::shut_down() {
  std::lock_guard lk(m_);
  down_ = true;
  waker_ = nullptr;
  cv_.notify_all();
}

// ---- Daemon ----

Attachment::~Attachment() { *alive = false; }

Daemon::Daemon(Config c, SimPlan sim, EventLog& log, Requests& requests)
    : config_(std::move(c)), sim_(std::move(sim)), log_(log), requests_(requests) {}

Daemon::~Daemon() { requests_.set_waker(nullptr); }

void Daemon::wake() {
  if (session_) session_->stop();  // only wakes run_once(): the loop never calls run()
}

void Daemon::open_session() {
  auto channel = xenprobes::parse_channel_kind(config_.channel);
  if (!channel) throw std::runtime_error("channel: " + channel.error().what);
  xenprobes::SessionOptions so{*channel};
  if (sim_.enabled) {
    if (sim_.guests > 64) throw std::runtime_error("--sim-guests: give 0 ... 64 guests");
    if (sim_.vcpus < 1 || sim_.vcpus > 8) throw std::runtime_error("--sim-vcpus: give 1 ... 8 vCPUs");
    if (sim_.ring_order && (sim_.ring_order < XENPROBES_RING_MIN_ORDER || sim_.ring_order > XENPROBES_RING_MAX_ORDER))
      throw std::runtime_error("--sim-ring-order: give " + std::to_string(XENPROBES_RING_MIN_ORDER) + " ... " +
                               std::to_string(XENPROBES_RING_MAX_ORDER));
    xenprobes::hv::sim::SimOptions opts;
    opts.manual_clock = true;  // a hit never times out because this machine is busy: counts are exact
    host_ = xenprobes::hv::sim::SimHost::create(opts);
    auto s = xenprobes::Session::open(host_->open(), so);
    if (!s) throw std::runtime_error("cannot open a session on the simulated Xen: " + s.error().what);
    session_ = std::move(*s);
    watcher_ = host_->open();
    for (unsigned i = 1; i <= sim_.guests; ++i) sim_create("sim-" + std::to_string(i));
    for (const std::string& c : sim_.create) creates_.push_back(parse_cue(c, "--sim-create"));
    for (const std::string& c : sim_.destroy) destroys_.push_back(parse_cue(c, "--sim-destroy"));
    for (const std::string& c : sim_.crash) crashes_.push_back(parse_cue(c, "--sim-crash"));
    for (const std::string& c : sim_.writes) writes_.push_back(parse_write_cue(c));
    std::fprintf(stderr, "xenprobesd: the SIMULATED Xen (--sim): %u demo guest(s) at start\n", sim_.guests);
  } else {
    if (access("/dev/xen/privcmd", F_OK) != 0 && access("/proc/xen/privcmd", F_OK) != 0)
      throw std::runtime_error(
          "no Xen here (no /dev/xen/privcmd): run xenprobesd in a Xen Dom0, or try it on the "
          "simulated Xen with --sim");
    auto s = xenprobes::Session::open(so);
    if (!s) throw std::runtime_error("cannot open a session: " + s.error().what);
    session_ = std::move(*s);
    auto w = xenprobes::hv::open_hypervisor("xen");
    if (!w)
      throw std::runtime_error("cannot open a second connection to Xen for the domain watches: " + w.error().what);
    watcher_ = std::move(*w);
  }
  for (const char* path : {"@introduceDomain", "@releaseDomain"})
    if (auto r = watcher_->xs_watch(path, path[1] == 'i' ? kIntroToken : kReleaseToken); !r)
      throw std::runtime_error(std::string("cannot watch ") + path + ": " + r.error().what);
  requests_.set_waker([this] { wake(); });
}

int Daemon::run(const volatile std::sig_atomic_t& stop, volatile std::sig_atomic_t& reload_flag,
                volatile std::sig_atomic_t& reopen_flag, const std::function<void(const std::string&)>& notify) {
  notify_ = notify;
  open_session();
  for (ProgramConfig& pc : config_.programs) {
    auto ps = std::make_unique<ProgramState>();
    ps->cfg = std::move(pc);
    programs_.push_back(std::move(ps));
  }
  config_.programs.clear();
  log_.write("started", "INFO", ordered_json{{"path", config_.path}, {"programs", programs_.size()}});
  scan("start");
  // The watches' first firing: the scan above covered it. Were they unreadable, the loop says so.
  if (watcher_)
    if (auto w = watcher_->xs_read_watches(); !w)
      log_.write("error", "WARN", ordered_json{{"body", "xenstore watches: " + w.error().what}});
  start_paused_guests();
  notify("READY=1\nSTATUS=serving");
  int status = 0;
  unsigned failures = 0;
  while (!stop) {
    if (reopen_flag) {
      reopen_flag = 0;
      if (std::string why = log_.reopen(); !why.empty()) std::fprintf(stderr, "xenprobesd: %s\n", why.c_str());
    }
    if (reload_flag) {
      reload_flag = 0;
      notify("RELOADING=1");
      if (std::string why = log_.reopen(); !why.empty()) std::fprintf(stderr, "xenprobesd: %s\n", why.c_str());
      (void)reload();
      notify("READY=1");
    }
    run_intervals();
    finish_exited();
    auto next = next_interval();
    int wait = kLoopWaitMs;
    if (next != Clock::time_point::max())
      wait = static_cast<int>(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count(), 0, kLoopWaitMs));
    auto r = session_->run_once(wait);
    if (!r) {
      // A channel failed: say so, look at the domains (a dead one is dropped), go on. A
      // session that keeps failing is broken: stop, and let the service manager restart.
      log_.write("error", "ERROR", ordered_json{{"body", "the session: " + r.error().what}});
      scan("session error");
      if (++failures >= 100) {
        std::fprintf(stderr, "xenprobesd: the session keeps failing (%s); stopping\n", r.error().what.c_str());
        status = 1;
        break;
      }
    } else {
      failures = 0;
    }
    finish_exited();
    sim_step();
    bool introduced = false, changed = false;
    if (auto ev = watcher_->xs_read_watches(); ev && !ev->empty()) {
      changed = true;
      for (const auto& e : *ev) introduced |= e.token == kIntroToken;
    }
    if (changed || Clock::now() - last_scan_ >= kScanEvery) scan(changed ? "xenstore watch" : "periodic");
    if (introduced) start_paused_guests();
    requests_.serve([this](const std::string& what) -> std::string {
      if (what == "metrics") return render_metrics();
      if (what == "status") return status_text();
      if (what == "reload") {
        notify_("RELOADING=1");
        std::string r = reload();
        notify_("READY=1");
        return r;
      }
      return "error: unknown request \"" + what + "\" (status, reload)\n";
    });
    if (!config_.metrics_textfile.empty() && Clock::now() - last_textfile_ >= kTextfileEvery)
      if (std::string why = write_textfile(); !why.empty()) std::fprintf(stderr, "xenprobesd: %s\n", why.c_str());
    if (Clock::now() - last_watchdog_ >= kWatchdogEvery) {
      last_watchdog_ = Clock::now();
      notify("WATCHDOG=1");
    }
  }
  notify("STOPPING=1");
  if (reopen_flag) (void)log_.reopen();  // a SIGUSR1 that came with the SIGTERM: the last records go to the new file
  requests_.shut_down();
  for (auto& p : programs_)
    for (auto& [k, a] : p->attached) detach(*a, "the daemon is stopping");
  if (std::string why = write_textfile(); !why.empty()) std::fprintf(stderr, "xenprobesd: %s\n", why.c_str());
  log_.write("stopped", "INFO", ordered_json{{"hits", hits_}});
  programs_.clear();
  session_.reset();
  return status;
}

}  // namespace xenprobesd
