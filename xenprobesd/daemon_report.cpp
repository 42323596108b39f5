// What the daemon reports: the Prometheus metrics (the endpoint's and the textfile's) and
// `xenprobesd status`.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon_internal.hpp"
#include "metrics.hpp"

namespace xenprobesd {

using xenprobes::DomId;

std::string Daemon::render_metrics() {
  Exposition x;
  x.family("xenprobesd_probe_hits_total", "counter", "Probe hits whose actions ran in Dom0.");
  x.family("xenprobesd_probe_missed_total", "counter",
           "Hits the guest went through without the handler, and return-probe calls left untracked (no free "
           "instance).");
  x.family("xenprobesd_probe_handler_seconds_total", "counter",
           "Time Dom0 spent running the program's actions for the probe's hits.");
  x.family("xenprobesd_events_total", "counter", "Event records the program wrote to the event log.");
  x.family("xenprobesd_events_dropped_total", "counter", "Event records dropped by the program's rate limit.");
  x.family("xenprobesd_guest_read_errors_total", "counter", "Guest memory reads of the program that failed.");
  x.family("xenprobesd_attachment_info", "gauge",
           "1 for each program attached to a domain, with the trap channel serving the domain.");
  x.family("xenprobesd_map_value", "gauge",
           "The programs' map values (count, sum, min, max, avg, integers; hist and lhist: their number of samples).");
  x.family("xenprobesd_map_keys_not_exported", "gauge", "Keys of a map beyond max_map_series, not exported.");
  x.family("xenprobesd_map_updates_dropped_total", "counter",
           "Map updates with a new key dropped because the map held max_map_keys keys.");
  x.family("xenprobesd_async_lost_events_total", "counter",
           "Async hits of the domain whose records reached no handler: no room in its ring, missing by sequence "
           "number, or written wrongly; counted from the daemon's first async probe in the domain.");
  x.family("xenprobesd_config_reloads_total", "counter", "Configuration reloads, by result.");
  x.family("xenprobesd_config_last_reload_successful", "gauge",
           "1 if the last reload was accepted (or none happened).");
  x.family("xenprobesd_event_log_write_failures_total", "counter", "Event records that could not be written.");
  // The async rings first: the records still in them are counted before the counts are read.
  std::vector<std::pair<DomainKey, std::uint64_t>> lost;
  for (const auto& [k, r] : ring_loss_) lost.emplace_back(k, 0);
  for (auto& [k, n] : lost) n = ring_lost(k, DomId{k.domid});
  for (auto& p : programs_) {
    for (auto& [k, a] : p->attached) {
      const Labels dp{{"domain", a->domain}, {"program", p->cfg.name}};
      for (const ProbeEntry& pe : a->probes) {
        Labels l = dp;
        l.emplace_back("probe", pe.site.probe);
        x.add("xenprobesd_probe_hits_total", l, pe.hits);
        x.add("xenprobesd_probe_missed_total", l, missed_of(pe));
        x.add("xenprobesd_probe_handler_seconds_total", l, static_cast<double>(pe.handler_ns) / 1e9);
      }
      x.add("xenprobesd_events_total", dp, a->events);
      x.add("xenprobesd_events_dropped_total", dp, a->dropped);
      x.add("xenprobesd_guest_read_errors_total", dp, a->instance->read_errors());
      Labels info = dp;
      info.emplace_back("channel", a->channel);
      x.add("xenprobesd_attachment_info", info, std::uint64_t{a->exited ? 0u : 1u});
      if (!p->cfg.wants_metrics()) continue;
      for (std::size_t slot = 0; slot < a->compiled->maps.size(); ++slot) {
        const xenprobe::MapDecl& m = a->compiled->maps[slot];
        if (auto n = a->instance->updates_dropped(static_cast<int>(slot))) {
          Labels l = dp;
          l.emplace_back("map", m.name);
          x.add("xenprobesd_map_updates_dropped_total", l, n);
        }
        if (m.kind == xenprobe::MapKind::Str) continue;  // a string has no value to export
        auto snap = a->instance->snapshot(m.name);
        std::size_t n = 0;
        for (const auto& [key, v] : snap) {
          if (n++ >= config_.max_map_series) break;
          Labels l = dp;
          l.emplace_back("map", m.name);
          l.emplace_back("key", key);
          x.add("xenprobesd_map_value", l, static_cast<double>(v));
        }
        if (snap.size() > config_.max_map_series) {
          Labels l = dp;
          l.emplace_back("map", m.name);
          x.add("xenprobesd_map_keys_not_exported", l, std::uint64_t{snap.size() - config_.max_map_series});
        }
      }
    }
  }
  for (const auto& [k, n] : lost)
    if (auto name = names_.find(k); name != names_.end())
      x.add("xenprobesd_async_lost_events_total", {{"domain", name->second}}, n);
  x.add("xenprobesd_config_reloads_total", {{"result", "accepted"}}, reloads_ok_);
  x.add("xenprobesd_config_reloads_total", {{"result", "rejected"}}, reloads_rejected_);
  x.add("xenprobesd_config_last_reload_successful", {}, std::uint64_t{last_reload_ok_ ? 1u : 0u});
  x.add("xenprobesd_event_log_write_failures_total", {}, log_.failed());
  return x.text();
}

std::string Daemon::write_textfile() {
  last_textfile_ = Clock::now();
  if (config_.metrics_textfile.empty()) return {};
  // node-exporter reads *.prom files: write a temporary file beside it, then rename, so that
  // it never reads half a file.
  const std::string tmp = config_.metrics_textfile + ".tmp";
  const std::string text = render_metrics();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      std::string why = std::strerror(errno);
      ::close(fd);
      return "cannot write " + tmp + ": " + why;
    }
    off += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  if (::rename(tmp.c_str(), config_.metrics_textfile.c_str()) != 0)
    return "cannot rename " + tmp + ": " + std::strerror(errno);
  return {};
}

std::string Daemon::status_text() {
  std::string out = "config " + config_.path + "\n";
  for (auto& p : programs_) {
    out += "program " + p->cfg.name + " (" + outputs_name(p->cfg.outputs) +
           (p->cfg.method == Method::Trap ? "" : std::string(", method ") + method_name(p->cfg.method)) + "):";
    if (p->attached.empty() && p->failed.empty()) out += " no domain selected";
    out += "\n";
    for (auto& [k, a] : p->attached) {
      // Async: the records still in the rings are counted first; the domain's lost events.
      const std::string lost =
          a->plans ? ", " + std::to_string(std::max(ring_lost(k, a->id), a->lost_at_attach) - a->lost_at_attach) +
                         " lost events"
                   : "";
      std::uint64_t hits = 0, missed = 0;
      for (const ProbeEntry& pe : a->probes) hits += pe.hits, missed += missed_of(pe);
      out += "  " + a->domain + " (" + std::to_string(a->id.value) + ", " + a->channel +
             "): " + std::to_string(a->probes.size()) + " probes, " + std::to_string(hits) + " hits, " +
             std::to_string(missed) + " missed, " + std::to_string(a->events) + " events, " +
             std::to_string(a->dropped) + " dropped" + lost + (a->exited ? ", exited" : "") + "\n";
    }
    for (auto& [k, f] : p->failed) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(f.retry_at - Clock::now()).count();
      out += "  domain " + std::to_string(k.domid) + ": not attached: " + f.why + " (" + std::to_string(f.tries) +
             (f.tries == 1 ? " try" : " tries") + ", the next in " + std::to_string(std::max<std::int64_t>(left, 0)) +
             " s)\n";
    }
  }
  return out;
}

}  // namespace xenprobesd
