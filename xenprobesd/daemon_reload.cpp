// A reload: the configuration read again (a bad one rejected, the one in use kept), what only a
// restart changes left as it is, and the programs compared with the running ones (an unchanged
// program keeps its instances, probes and counters).
#include <algorithm>
#include <cstdio>
#include <tuple>

#include "daemon_internal.hpp"

namespace xenprobesd {

using nlohmann::ordered_json;

std::string Daemon::apply(Config next) {
  std::vector<std::unique_ptr<ProgramState>> programs;
  std::vector<std::string> kept, replaced, added, removed;
  for (ProgramConfig& np : next.programs) {
    auto old =
        std::find_if(programs_.begin(), programs_.end(), [&](const auto& p) { return p && p->cfg.name == np.name; });
    if (old != programs_.end() && (*old)->cfg.source == np.source && (*old)->cfg.maxactive == np.maxactive &&
        (*old)->cfg.method == np.method) {
      // Unchanged: its instances, probes and counters stay; selectors, outputs and rate limits
      // are taken from the new configuration.
      np.compiled = (*old)->cfg.compiled;
      np.plans = (*old)->cfg.plans;
      (*old)->cfg = std::move(np);
      (*old)->failed.clear();
      kept.push_back((*old)->cfg.name);
      programs.push_back(std::move(*old));
      continue;
    }
    (old != programs_.end() ? replaced : added).push_back(np.name);
    auto ps = std::make_unique<ProgramState>();
    ps->cfg = std::move(np);
    programs.push_back(std::move(ps));
  }
  for (auto& p : programs_) {
    if (!p) continue;  // kept
    if (std::find(replaced.begin(), replaced.end(), p->cfg.name) == replaced.end()) removed.push_back(p->cfg.name);
    const bool changed = std::find(replaced.begin(), replaced.end(), p->cfg.name) != replaced.end();
    for (auto& [k, a] : p->attached)
      detach(*a, changed ? "the program changed in a reload" : "the program was removed in a reload");
  }
  programs_ = std::move(programs);
  next.programs.clear();
  config_.programs.clear();
  auto list = [](const std::vector<std::string>& v) {
    ordered_json j = ordered_json::array();
    for (const auto& s : v) j.push_back(s);
    return j;
  };
  log_.write("config_loaded", "INFO",
             ordered_json{{"path", config_.path},
                          {"kept", list(kept)},
                          {"changed", list(replaced)},
                          {"added", list(added)},
                          {"removed", list(removed)}});
  scan("configuration");
  auto names = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  return "accepted: kept " + names(kept) + "; changed " + names(replaced) + "; added " + names(added) + "; removed " +
         names(removed) + "\n";
}

std::string Daemon::reload() {
  Config next;
  try {
    next = load_config(config_.path);
  } catch (const ConfigError& e) {
    ++reloads_rejected_;
    last_reload_ok_ = false;
    log_.write("config_rejected", "ERROR",
               ordered_json{{"path", config_.path},
                            {"body", std::string(e.what()) + "the configuration in use stays in use"}});
    std::fprintf(stderr, "xenprobesd: the new configuration is rejected, the one in use stays:\n%s", e.what());
    return std::string("rejected: the configuration in use stays in use\n") + e.what();
  }
  // What only a restart changes: the session's channel and the endpoint's address.
  for (auto [what, old_v, new_v] : {std::tuple{"channel", &config_.channel, &next.channel},
                                    std::tuple{"metrics_listen", &config_.metrics_listen, &next.metrics_listen},
                                    std::tuple{"control_socket", &config_.control_socket, &next.control_socket}})
    if (*old_v != *new_v)
      log_.write("warning", "WARN",
                 ordered_json{{"body", std::string(what) + " changed from \"" + *old_v + "\" to \"" + *new_v +
                                           "\": it takes effect when the daemon restarts"}});
  next.channel = config_.channel;
  next.metrics_listen = config_.metrics_listen;
  next.control_socket = config_.control_socket;
  if (next.event_log != config_.event_log) {
    if (std::string why = log_.open(next.event_log); !why.empty()) {
      log_.write("warning", "WARN", ordered_json{{"body", why + "; the event log stays " + config_.event_log}});
      next.event_log = config_.event_log;
    }
  }
  ++reloads_ok_;
  last_reload_ok_ = true;
  const std::string path = config_.path;
  std::vector<ProgramConfig> programs = std::move(next.programs);
  config_ = next;
  config_.path = path;
  for (auto& p : programs_)
    for (auto& [k, a] : p->attached)
      if (a->instance) a->instance->set_limits(xenprobe::Limits{.max_map_keys = config_.max_map_keys});
  Config with;
  with.programs = std::move(programs);
  return apply(std::move(with));
}

}  // namespace xenprobesd
