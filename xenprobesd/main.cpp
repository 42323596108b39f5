// xenprobesd: runs xenprobe programs in every Xen guest a configuration selects, today's and
// tomorrow's, and feeds Prometheus and log pipelines (docs/xenprobesd.md).
//
//   xenprobesd [-c FILE]                 serve (as a systemd Type=notify service)
//   xenprobesd --check-config [-c FILE]  check the configuration and exit
//   xenprobesd status|reload [-c FILE] [--socket PATH]   ask the running daemon
#include <httplib.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "config.hpp"
#include "control.hpp"
#include "daemon.hpp"
#include "event_log.hpp"

namespace {

volatile std::sig_atomic_t g_stop = 0, g_reload = 0, g_reopen = 0;
extern "C" void on_stop(int) { g_stop = 1; }
extern "C" void on_hup(int) { g_reload = 1; }
extern "C" void on_usr1(int) { g_reopen = 1; }

void handle(int sig, void (*fn)(int)) {
  struct sigaction sa {};
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

constexpr const char* kFooter = R"(
SIGNALS
  SIGHUP   reload the configuration (a bad one is rejected and the running one kept; programs
           whose text did not change keep their probes and counters) and reopen the event log
  SIGUSR1  reopen the event log (logrotate)
  SIGTERM, SIGINT  detach from every guest and stop

SIMULATED XEN
  --sim runs against the library's simulated Xen inside this process: --sim-guests N demo
  guests sim-1..sim-N (created paused, started once the daemon has attached), --sim-iterations
  K iterations of their workload each; --sim-create NAME@HITS creates a guest after HITS hits
  in all, --sim-destroy NAME@HITS destroys one inside the handler of its HITS-th hit
  (--sim-crash NAME@HITS: its kernel panics there, the domain stays, crashed),
  --sim-label NAME:KEY=VALUE writes /local/domain/<id>/KEY for a guest when it is created,
  --sim-ring-order N gives the guest module's async rings 2^N bytes each (12..24),
  --sim-image NAME=FILE boots that guest from FILE (a static x86-64 ELF) instead of the demo
  guest, and --sim-symbols NAME=FILE gives its System.map; --sim-write NAME@HITS:ADDR=HEX
  writes the bytes HEX (in memory order) at the guest-virtual address ADDR inside the handler
  of that guest's HITS-th hit (what its own kernel would write, e.g. loading a module).
)";

}  // namespace

static int run_main(int argc, char** argv) {
  std::string config_path = "/etc/xenprobesd/xenprobesd.toml";
  bool check_only = false;
  xenprobesd::SimPlan sim;
  CLI::App app{"xenprobesd: xenprobe programs in every selected Xen guest, for Prometheus and log pipelines"};
  app.footer(kFooter);
  app.get_formatter()->column_width(34);
  app.add_option("-c,--config", config_path, "the configuration (default /etc/xenprobesd/xenprobesd.toml)");
  app.add_flag("--check-config", check_only, "check the configuration (programs included) and exit");
  app.add_flag("--sim", sim.enabled, "use the simulated Xen");
  app.add_option("--sim-guests", sim.guests, "simulated demo guests at start (default 1)");
  app.add_option("--sim-vcpus", sim.vcpus, "vCPUs of each simulated guest (default 2)");
  app.add_option("--sim-iterations", sim.iterations, "workload iterations of each simulated guest; 0 = forever");
  app.add_option("--sim-type", sim.type, "pv (default), pvh or hvm")->check(CLI::IsMember({"pv", "pvh", "hvm"}));
  app.add_option("--sim-create", sim.create, "NAME@HITS: create a simulated guest after HITS hits in all");
  app.add_option("--sim-destroy", sim.destroy, "NAME@HITS: destroy that guest inside the handler of its HITS-th hit");
  app.add_option("--sim-crash", sim.crash,
                 "NAME@HITS: that guest's kernel panics inside the handler of its HITS-th hit");
  app.add_option("--sim-label", sim.labels, "NAME:KEY=VALUE: a xenstore key of a simulated guest");
  app.add_option("--sim-ring-order", sim.ring_order,
                 "the simulated guest module's async rings hold 2^N bytes each (12 ... 24; default 14)");
  app.add_option("--sim-image", sim.images, "NAME=FILE: that simulated guest boots FILE, not the demo guest");
  app.add_option("--sim-symbols", sim.symbols, "NAME=FILE: that simulated guest's System.map (default: the demo's)");
  app.add_option("--sim-write", sim.writes, "NAME@HITS:ADDR=HEX: bytes written into that guest in its HITS-th hit");
  std::string socket_path;
  auto* status_cmd = app.add_subcommand("status", "print what the running daemon serves: programs, domains, counts");
  auto* reload_cmd = app.add_subcommand(
      "reload", "make the running daemon reload its configuration; exit 1 if it rejects it (and keeps the old one)");
  for (auto* c : {status_cmd, reload_cmd})
    c->fallthrough()->add_option("--socket", socket_path,
                                 "the daemon's control socket (default: control_socket of the configuration)");
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105 for a bad value, ...) would contradict the documented exit status.
    return app.exit(e) == 0 ? 0 : 1;
  }
  if (*status_cmd || *reload_cmd) {
    if (socket_path.empty()) {
      try {
        socket_path = xenprobesd::load_config(config_path).control_socket;
      } catch (const xenprobesd::ConfigError& e) {
        std::fprintf(stderr, "xenprobesd: cannot find the control socket in %s (give --socket PATH):\n%s",
                     config_path.c_str(), e.what());
        return 1;
      }
      if (socket_path.empty()) {
        std::fprintf(stderr, "xenprobesd: %s sets no control_socket: the daemon has none\n", config_path.c_str());
        return 1;
      }
    }
    try {
      const std::string answer = xenprobesd::control_request(socket_path, *status_cmd ? "status" : "reload");
      std::fputs(answer.c_str(), stdout);
      return answer.starts_with("rejected") || answer.starts_with("error") || answer.empty() ? 1 : 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "xenprobesd: %s\n", e.what());
      return 1;
    }
  }

  xenprobesd::Config config;
  try {
    config = xenprobesd::load_config(config_path);
  } catch (const xenprobesd::ConfigError& e) {
    std::fputs(e.what(), stderr);
    return 1;
  }
  if (check_only) {
    std::printf("%s: valid, %zu program(s)\n", config_path.c_str(), config.programs.size());
    return 0;
  }

  handle(SIGTERM, on_stop);
  handle(SIGINT, on_stop);
  handle(SIGHUP, on_hup);
  handle(SIGUSR1, on_usr1);
  signal(SIGPIPE, SIG_IGN);

  xenprobesd::EventLog log;
  if (std::string why = log.open(config.event_log); !why.empty()) {
    std::fprintf(stderr, "xenprobesd: %s\n", why.c_str());
    return 1;
  }
  xenprobesd::Requests requests;
  httplib::Server server;
  std::thread server_thread;
  std::atomic<bool> server_done{false};
  const std::string listen = config.metrics_listen;
  if (!listen.empty()) {
    auto addr = xenprobesd::parse_listen(listen);  // checked with the configuration
    server.Get("/metrics", [&requests](const httplib::Request&, httplib::Response& res) {
      auto text = requests.ask("metrics", std::chrono::seconds(20));
      if (!text) {
        res.status = 503;
        res.set_content("xenprobesd is busy or stopping\n", "text/plain");
        return;
      }
      res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
    });
    int port = addr->port;
    if (port == 0) port = server.bind_to_any_port(addr->host);
    else if (!server.bind_to_port(addr->host, port)) port = -1;
    if (port <= 0) {
      std::fprintf(stderr, "xenprobesd: cannot listen on %s for the metrics endpoint\n", listen.c_str());
      return 1;
    }
    log.write("metrics_listening", "INFO",
              nlohmann::ordered_json{{"host", addr->host}, {"port", port}, {"path", "/metrics"}});
    // The endpoint's threads block the daemon's signals: they go to the main thread, whose
    // wait they interrupt.
    sigset_t all, old;
    sigemptyset(&all);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    server_thread = std::thread([&server, &server_done] {
      server.listen_after_bind();
      server_done = true;
    });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  int status = 1;
  try {
    std::unique_ptr<xenprobesd::ControlServer> control;
    if (!config.control_socket.empty()) {
      // Its thread blocks the daemon's signals too.
      sigset_t all, old;
      sigemptyset(&all);
      for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&all, sig);
      pthread_sigmask(SIG_BLOCK, &all, &old);
      control = std::make_unique<xenprobesd::ControlServer>(config.control_socket, requests);
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    xenprobesd::Daemon daemon(std::move(config), sim, log, requests);
    status = daemon.run(g_stop, g_reload, g_reopen, [](const std::string& msg) { sd_notify(0, msg.c_str()); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xenprobesd: %s\n", e.what());
    requests.shut_down();
    status = 1;
  }
  if (server_thread.joinable()) {
    // httplib's stop() does nothing until the listening thread is running: a stop that comes
    // first (SIGTERM right after start) would leave that thread in accept() for ever. Stop it
    // once it runs, or not at all if it ended by itself (a failed listen).
    while (!server_done) {
      if (server.is_running()) {
        server.stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_thread.join();
  }
  return status;
}

// An exception that escapes (no memory, a library's own) ends the program with its message and
// status 1, not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) { std::fprintf(stderr, "xenprobesd: %s\n", e.what()); } catch (...) {
    std::fprintf(stderr, "xenprobesd: an unknown exception\n");
  }
  return 1;
}
