// Running the programs' actions: a hit's, an async record's (the domain's rings read, their
// lost events counted), the intervals', a program that called exit(); and where their records
// go (EventSink: the event log, rate limited per program and domain).
#include <algorithm>
#include <cstdio>

#include "daemon_internal.hpp"

namespace xenprobesd {

using nlohmann::ordered_json;

// ---- EventSink ----

void EventSink::record(const std::string& domain, const char* type, const std::string& data_json) {
  const ProgramConfig& cfg = a_.program->cfg;
  if (!cfg.wants_events()) return;
  // A token bucket per (program, domain): a guest that floods costs its own records only.
  const auto now = Clock::now();
  a_.tokens = std::min(cfg.event_burst,
                       a_.tokens + std::chrono::duration<double>(now - a_.refilled).count() * cfg.events_per_second);
  a_.refilled = now;
  if (a_.tokens < 1) {
    ++a_.dropped;
    return;
  }
  a_.tokens -= 1;
  ++a_.events;
  ordered_json f;
  f["domain"] = domain;
  f["domid"] = a_.id.value;
  f["program"] = cfg.name;
  if (d_.current_site_) f["probe"] = d_.current_site_->probe;
  // The runtime wrote the data with every byte that is not UTF-8 replaced: it parses.
  f["body"] = ordered_json::parse(data_json, nullptr, false);
  d_.log_.write(type, "INFO", f);
}

void EventSink::warning(const std::string& domain, const std::string& msg) {
  ordered_json f;
  f["domain"] = domain;
  f["domid"] = a_.id.value;
  f["program"] = a_.program->cfg.name;
  f["body"] = msg;
  d_.log_.write("map_full", "WARN", f);
}

// ---- the actions ----

void Daemon::on_hit(Attachment& a, ProbeEntry& pe, xenprobes::HitContext& c) {
  if (a.exited) return;
  const auto t0 = Clock::now();
  current_site_ = &pe.site;
  a.instance->run(pe.block, pe.site, &c);
  current_site_ = nullptr;
  pe.handler_ns +=
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  ++pe.hits;
  ++hits_;
  const std::uint64_t n = ++domain_hits_[a.key];
  if (a.instance->exit_requested()) a.exited = true;  // its probes are removed after this dispatch
  // --sim-destroy: the guest dies while this vCPU waits for the handler's answer.
  for (SimCue& cue : destroys_)
    if (!cue.done && cue.name == a.domain && n >= cue.hits) {
      cue.done = true;
      if (auto r = host_->destroy_domain(a.id); !r)
        std::fprintf(stderr, "xenprobesd: --sim-destroy %s: %s\n", cue.name.c_str(), r.error().what.c_str());
    }
  // --sim-write: bytes written into the guest's memory there, through the hit vCPU's page tables.
  for (SimCue& cue : writes_)
    if (!cue.done && cue.name == a.domain && n >= cue.hits) {
      cue.done = true;
      if (auto r = c.write(xenprobes::Gva{cue.address}, cue.bytes); !r)
        std::fprintf(stderr, "xenprobesd: --sim-write %s: %s\n", cue.name.c_str(), r.error().what.c_str());
    }
  // --sim-crash: the guest's kernel panics there instead (the domain stays, crashed).
  for (SimCue& cue : crashes_)
    if (!cue.done && cue.name == a.domain && n >= cue.hits) {
      cue.done = true;
      if (auto r = host_->crash_domain(a.id, "--sim-crash"); !r)
        std::fprintf(stderr, "xenprobesd: --sim-crash %s: %s\n", cue.name.c_str(), r.error().what.c_str());
    }
}

void Daemon::on_record(Attachment& a, ProbeEntry& pe, const xenprobes::AsyncHit& h) {
  if (a.exited) return;  // records of a probe on its way out
  const auto t0 = Clock::now();
  xenprobe::RecordContext ctx(h, (*a.plans)[static_cast<std::size_t>(pe.block)].captures);
  current_site_ = &pe.site;
  a.instance->run(pe.block, pe.site, &ctx, static_cast<std::int64_t>(h.time_ns));
  current_site_ = nullptr;
  pe.handler_ns +=
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  ++pe.hits;
  ++hits_;
  ++domain_hits_[a.key];
  if (a.instance->exit_requested()) a.exited = true;
}

std::uint64_t Daemon::ring_lost(const DomainKey& key, xenprobes::DomId id) {
  RingLoss& r = ring_loss_[key];
  if (auto st = session_->ring_stats(id); st) {
    const std::uint64_t total = st->drops + st->missed + st->bad_records;
    r.lost = total > r.base ? total - r.base : 0;
  }
  return r.lost;
}

void Daemon::run_intervals() {
  const auto now = Clock::now();
  for (auto& p : programs_)
    for (auto& [k, a] : p->attached) {
      if (a->exited) continue;
      const auto& blocks = a->compiled->program.blocks;
      for (std::size_t b = 0; b < a->next_interval.size(); ++b) {
        if (now < a->next_interval[b]) continue;
        static const xenprobe::ProbeSite kInterval{"", "interval"};
        current_site_ = &kInterval;
        a->instance->run(static_cast<int>(b), kInterval, nullptr);
        current_site_ = nullptr;
        std::uint64_t ns = 0;
        for (const auto& s : blocks[b].specs)
          if (s.kind == xenprobe::ProbeKind::Interval) ns = s.interval_ns;
        a->next_interval[b] += std::chrono::nanoseconds(ns);
        if (a->next_interval[b] < now)
          a->next_interval[b] = now + std::chrono::nanoseconds(ns);  // no burst after a stall
      }
      if (a->instance->exit_requested()) a->exited = true;
    }
}

Clock::time_point Daemon::next_interval() const {
  auto next = Clock::time_point::max();
  for (auto& p : programs_)
    for (auto& [k, a] : p->attached)
      if (!a->exited)
        for (auto t : a->next_interval) next = std::min(next, t);
  return next;
}

void Daemon::finish_exited() {
  for (auto& p : programs_)
    for (auto& [k, a] : p->attached) {
      if (!a->exited ||
          std::none_of(a->probes.begin(), a->probes.end(), [](const ProbeEntry& e) { return bool(e.probe); }))
        continue;
      remove_probes(*a);
      run_end(*a);
      log_.write("exited", "INFO",
                 ordered_json{{"domain", a->domain},
                              {"domid", a->id.value},
                              {"program", p->cfg.name},
                              {"body", "the program called exit(): its probes in this domain are removed"}});
    }
}

}  // namespace xenprobesd
