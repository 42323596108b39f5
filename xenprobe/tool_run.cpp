// xenprobe: the run: the program checked, the session's loop with its hits, records, intervals and
// signals, and the output at the end.
#include "main_internal.hpp"

namespace xenprobe {

volatile std::sig_atomic_t g_signal = 0;

namespace {

extern "C" void on_signal(int sig) { g_signal = sig; }

}  // namespace

int Tool::run_program() {
  std::string source = o_.program_text;
  std::string file = "-e";
  if (!o_.program_file.empty()) {
    std::ifstream in(o_.program_file);
    if (!in) die("cannot read " + o_.program_file + ": " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    source = ss.str();
    file = o_.program_file;
  }
  load_types();
  // Checked before anything touches Xen. A program that needs the guest kernel's types and
  // got no --btf is checked again below with the guest's own BTF, read from its memory.
  bool guest_types = false;
  try {
    compiled_ = compile(parse(source), types_.get());
    if (async_) plans_ = plan_async(compiled_);
  } catch (const ProgramError& e) {
    if (!e.needs_types || o_.check_only) {
      std::fputs(format_error(e, source, file).c_str(), stderr);
      return 1;
    }
    guest_types = true;
  }
  if (o_.check_only) return 0;
  // From here on ^C and SIGTERM end the run through the same path as exit(): whatever was
  // attached is detached and the maps are printed, even if the signal comes while attaching.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  open_session();
  select_domains();
  if (guest_types) {
    types_ = types_from_guests();
    try {
      compiled_ = compile(parse(source), types_.get());
      if (async_) plans_ = plan_async(compiled_);
    } catch (const ProgramError& e) {
      std::fputs(format_error(e, source, file).c_str(), stderr);
      return 1;
    }
  }
  out_ = std::make_unique<Output>(o_.format == "json" ? OutputFormat::Json : OutputFormat::Text, stdout,
                                  targets_.size() > 1);
  attach();
  begin();
  loop();
  finish();
  return failed_ ? 1 : 0;
}

void Tool::on_hit(Instance& inst, int block, const ProbeSite& site, xenprobes::HitContext& c) {
  if (stopping_ || (o_.hit_limit && hits_ >= o_.hit_limit)) {
    c.stop();
    return;
  }
  ++hits_;
  count_hit(inst);
  inst.run(block, site, &c);
  if (inst.exit_requested() || (o_.hit_limit && hits_ >= o_.hit_limit)) {
    stopping_ = true;
    c.stop();
  }
}

// An async record (--method async): the block runs from it, as from a hit, after the fact.
// Once exit() or -c stopped the run, the records still in the rings are dropped.
void Tool::on_record(Instance& inst, int block, const ProbeSite& site, const xenprobes::AsyncHit& h) {
  if (stopping_ || (o_.hit_limit && hits_ >= o_.hit_limit)) return;
  ++hits_;
  count_hit(inst);
  RecordContext ctx(h, plans_[static_cast<std::size_t>(block)].captures);
  inst.run(block, site, &ctx, static_cast<std::int64_t>(h.time_ns));
  if (inst.exit_requested() || (o_.hit_limit && hits_ >= o_.hit_limit)) {
    stopping_ = true;
    // The losses are those until now: the guests go on hitting until the probes are out,
    // and what they drop after the stop is no loss of this run.
    count_ring_losses();
  }
}

void Tool::count_ring_losses() {
  for (Target& t : targets_) {
    if (t.gone || t.ring_lost_final) continue;
    const std::uint64_t now = ring_lost(t);
    t.ring_lost = now > t.ring_lost_base ? now - t.ring_lost_base : 0;
    t.ring_lost_final = true;
  }
}

// The hits of `t` its async rings had no room for (drops) or that Dom0 never read (missed,
// by the records' sequence numbers), as of now. Reading the stats drains the rings: their
// records' blocks run first.
std::uint64_t Tool::ring_lost(const Target& t) {
  auto st = session_->ring_stats(t.id);
  if (!st) {
    std::fprintf(stderr, "xenprobe: %s: cannot read its async rings: %s\n", t.name.c_str(), st.error().what.c_str());
    return 0;
  }
  return st->drops + st->missed;
}

void Tool::run_blocks(Target& t, ProbeKind kind) {
  static const ProbeSite kBegin{"", "BEGIN"}, kEnd{"", "END"};
  for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b)
    for (const ProbeSpec& s : compiled_.program.blocks[b].specs)
      if (s.kind == kind) t.instance->run(static_cast<int>(b), kind == ProbeKind::Begin ? kBegin : kEnd, nullptr);
}

void Tool::begin() {
  for (Target& t : targets_) {
    run_blocks(t, ProbeKind::Begin);
    if (t.instance->exit_requested()) stopping_ = true;
  }
  const auto now = Clock::now();
  for (Target& t : targets_)
    for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b)
      for (const ProbeSpec& s : compiled_.program.blocks[b].specs)
        if (s.kind == ProbeKind::Interval) {
          interval_sites_.push_back(ProbeSite{"", s.text});
          t.next_interval[b] = now + std::chrono::nanoseconds(s.interval_ns);
        }
  for (const std::string& d : o_.sim_destroy) {
    auto at = d.rfind('@');
    if (at == std::string::npos) die("--sim-destroy " + d + ": write NAME@HITS");
    destroy_.push_back({d.substr(0, at), std::stoull(d.substr(at + 1)), false});
  }
  // The simulated guests were created paused: the probes are in place, let them run.
  for (DomId d : sim_paused_)
    if (auto r = session_->hypervisor().unpause(d); !r) die("cannot start simulated guest: " + r.error().what);
  started_ = Clock::now();
}

std::uint64_t Tool::interval_ns(std::size_t block) const {
  for (const ProbeSpec& s : compiled_.program.blocks[block].specs)
    if (s.kind == ProbeKind::Interval) return s.interval_ns;
  return 0;
}

void Tool::loop() {
  const auto deadline =
      o_.duration > 0
          ? started_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.duration))
          : Clock::time_point::max();
  while (!stopping_ && !g_signal) {
    auto now = Clock::now();
    if (now >= deadline) break;
    // Interval probes, in Dom0.
    auto next = deadline;
    for (Target& t : targets_) {
      if (t.gone) continue;
      for (std::size_t b = 0; b < t.next_interval.size(); ++b) {
        if (t.next_interval[b] == Clock::time_point::max()) continue;
        if (now >= t.next_interval[b]) {
          static const ProbeSite kInterval{"", "interval"};
          t.instance->run(static_cast<int>(b), kInterval, nullptr);
          if (t.instance->exit_requested()) stopping_ = true;
          t.next_interval[b] += std::chrono::nanoseconds(interval_ns(b));
        }
        next = std::min(next, t.next_interval[b]);
      }
    }
    if (stopping_) break;
    int wait_ms = 20;
    if (next != Clock::time_point::max())
      wait_ms = static_cast<int>(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count(), 0, 20));
    auto r = session_->run_once(wait_ms);
    if (!r) {
      std::fprintf(stderr, "xenprobe: the session failed: %s; detaching\n", r.error().what.c_str());
      failed_ = true;
      break;
    }
    check_domains();
    if (std::all_of(targets_.begin(), targets_.end(), [](const Target& t) { return t.gone || t.halted; })) break;
  }
  if (g_signal) std::fprintf(stderr, "xenprobe: %s: detaching\n", g_signal == SIGINT ? "interrupted" : "terminated");
}

void Tool::count_hit(const Instance& inst) {
  for (Target& t : targets_)
    if (t.instance.get() == &inst) ++t.hits;
}

void Tool::check_domains() {
  for (auto& d : destroy_) {
    if (d.done || !host_) continue;
    for (Target& t : targets_)
      if (t.name == d.name && t.hits >= d.hits) {
        d.done = true;
        if (auto r = host_->destroy_domain(t.id); !r)
          std::fprintf(stderr, "xenprobe: --sim-destroy %s: %s\n", d.name.c_str(), r.error().what.c_str());
      }
  }
  for (Target& t : targets_) {
    if (t.gone || t.halted) continue;
    auto info = session_->hypervisor().domain_info(t.id);
    std::string why;
    if (!info) why = info.error().code == xenprobes::Errc::NoSuchDomain ? "it was destroyed" : info.error().what;
    else if (info->dying) why = "it is dying";
    else if (info->crashed) why = "it crashed";
    else if (info->shutdown) why = "it shut down";
    if (!why.empty()) {
      t.gone = true;
      collect_lost(t);
      // Let the session take in the domain's release (its @releaseDomain watch) first: a
      // probe of a domain the session has dropped unregisters with nothing to restore.
      if (auto r = session_->run_once(0); !r) failed_ = true;
      t.probes.clear();
      std::size_t left = std::count_if(targets_.begin(), targets_.end(), [](const Target& x) { return !x.gone; });
      std::fprintf(stderr, "xenprobe: domain %s (%u) is gone (%s); its probes went with it, %s\n", t.name.c_str(),
                   t.id.value, why.c_str(),
                   left ? ("going on with " + std::to_string(left) + " other domain(s)").c_str() : "no domain is left");
      continue;
    }
    if (host_ && o_.sim_iterations && host_->wait_halted(t.id, 0ms)) t.halted = true;
  }
}

void Tool::collect_lost(Target& t) {
  for (const xenprobes::Probe& p : t.probes) {
    auto st = p.stats();
    t.lost += st.unhandled + st.untracked_calls;
  }
}

void Tool::finish() {
  // Async records still in the rings: their blocks run before END (unless exit() or -c ended
  // the run: then on_record drops them), and what the rings lost is counted.
  if (async_) count_ring_losses();
  for (Target& t : targets_) run_blocks(t, ProbeKind::End);
  // Detach first, as bpftrace does: the guests run free while the maps are printed.
  for (Target& t : targets_) {
    if (!t.gone) collect_lost(t);
    for (xenprobes::Probe& p : t.probes)
      if (auto r = p.unregister(); !r)
        std::fprintf(stderr, "xenprobe: %s: cannot remove a probe: %s\n", t.name.c_str(), r.error().what.c_str());
    t.probes.clear();
  }
  if (out_->format() == OutputFormat::Text) out_->flush();
  for (Target& t : targets_) {
    if (out_->format() == OutputFormat::Text && !compiled_.maps.empty()) out_->text(t.name, "\n");
    t.instance->print_all_maps();
    if (t.lost || t.ring_lost) {
      if (out_->format() == OutputFormat::Json)
        out_->record(t.name, "lost_events", "{\"events\": " + std::to_string(t.lost + t.ring_lost) + "}");
      if (out_->format() == OutputFormat::Text && t.lost)
        std::fprintf(stderr, "xenprobe: %s: lost %llu events (hits the guest went through without a handler)\n",
                     t.name.c_str(), static_cast<unsigned long long>(t.lost));
      if (out_->format() == OutputFormat::Text && t.ring_lost)
        std::fprintf(stderr, "xenprobe: %s: Lost %llu events (async hits its rings had no room for)\n", t.name.c_str(),
                     static_cast<unsigned long long>(t.ring_lost));
    }
    for (std::size_t m = 0; m < compiled_.maps.size(); ++m)
      if (auto n = t.instance->updates_dropped(static_cast<int>(m)))
        std::fprintf(stderr, "xenprobe: %s: map %s was full (%zu keys): %llu updates with new keys dropped\n",
                     t.name.c_str(), compiled_.maps[m].name.c_str(), o_.max_map_keys,
                     static_cast<unsigned long long>(n));
    if (t.instance->read_errors())
      std::fprintf(stderr, "xenprobe: %s: %llu guest memory reads failed and gave 0 or \"\"\n", t.name.c_str(),
                   static_cast<unsigned long long>(t.instance->read_errors()));
  }
  out_->flush();
}

}  // namespace xenprobe
