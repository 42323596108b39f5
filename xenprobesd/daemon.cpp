// xenprobesd's core (daemon.hpp).
#include "daemon.hpp"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kstack.hpp"
#include "metrics.hpp"
#include "xenprobes/protocol.h"

namespace xenprobesd {

using namespace std::chrono_literals;
using nlohmann::ordered_json;
using xenprobes::DomId;

namespace {

constexpr const char* kIntroToken = "xenprobesd-introduce";
constexpr const char* kReleaseToken = "xenprobesd-release";
constexpr auto kScanEvery = 2s;  // a full look at the domains, besides the xenstore watches
constexpr auto kTextfileEvery = 15s;
constexpr auto kWatchdogEvery = 1s;
constexpr int kLoopWaitMs = 100;  // the longest a signal or a metrics request waits for the loop
constexpr std::chrono::seconds kFirstRetryBackoff{2};  // a failed attachment tried again (ProgramState::Failure)
constexpr std::chrono::seconds kMaxRetryBackoff{60};

std::string domain_name(const xenprobes::hv::DomainInfo& d) {
  return d.name.empty() ? "domain-" + std::to_string(d.domid.value) : d.name;
}

DomainKey key_of(const xenprobes::hv::DomainInfo& d) { return DomainKey{d.domid.value, d.handle}; }

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// A program's method for its synchronous kprobes (async ones are Session::probe_async's).
xenprobes::ProbeMethod probe_method(Method m) {
  switch (m) {
    case Method::Jump:
      return xenprobes::ProbeMethod::Jump;
    case Method::Fastest:
      return xenprobes::ProbeMethod::Fastest;
    default:
      return xenprobes::ProbeMethod::Trap;
  }
}

std::uint64_t missed_of(const ProbeEntry& p) {
  if (!p.probe) return p.missed_at_removal;
  auto st = p.probe.stats();
  return st.unhandled + st.untracked_calls;
}

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

// ---- EventSink ----

class EventSink final : public xenprobe::Output {
 public:
  EventSink(Daemon& d, Attachment& a) : Output(xenprobe::OutputFormat::Json, nullptr, false), d_(d), a_(a) {}
  void text(const std::string&, std::string_view) override {}
  void flush() override {}
  void record(const std::string& domain, const char* type, const std::string& data_json) override {
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
  // Once per map and domain (the runtime says when a map first refuses a key): not rate-limited.
  void warning(const std::string& domain, const std::string& msg) override {
    ordered_json f;
    f["domain"] = domain;
    f["domid"] = a_.id.value;
    f["program"] = a_.program->cfg.name;
    f["body"] = msg;
    d_.log_.write("map_full", "WARN", f);
  }

 private:
  Daemon& d_;
  Attachment& a_;
};

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

Daemon::SimCue Daemon::parse_cue(const std::string& spec, const char* option) {
  auto at = spec.rfind('@');
  if (at == std::string::npos || at == 0 || at + 1 >= spec.size() ||
      !std::all_of(spec.begin() + static_cast<long>(at) + 1, spec.end(), ::isdigit) || spec.size() - at > 19)
    throw std::runtime_error(std::string(option) + " " + spec + ": write NAME@HITS");
  return SimCue{spec.substr(0, at), std::stoull(spec.substr(at + 1)), false};
}

void Daemon::sim_create(const std::string& name) {
  xenprobes::hv::sim::DomainConfig c;
  c.name = name;
  c.vcpus = sim_.vcpus;
  c.iterations = sim_.iterations;
  c.start_paused = true;  // like xl create -p: started once the daemon has had its look at it
  if (sim_.ring_order) c.module_ring_order = sim_.ring_order;
  if (sim_.type == "hvm" || sim_.type == "pvh")
    c.type = xenprobes::hv::GuestType::Hvm;
  else if (sim_.type != "pv")
    throw std::runtime_error("--sim-type: pv, pvh or hvm");
  auto id = host_->create_domain(c);
  if (!id) throw std::runtime_error("cannot create simulated guest " + name + ": " + id.error().what);
  for (const std::string& l : sim_.labels) {
    auto colon = l.find(':'), eq = l.find('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon)
      throw std::runtime_error("--sim-label " + l + ": write NAME:KEY=VALUE");
    if (l.substr(0, colon) != name) continue;
    const std::string path = "/local/domain/" + std::to_string(id->value) + "/" + l.substr(colon + 1, eq - colon - 1);
    if (auto r = watcher_->xs_write(path, l.substr(eq + 1)); !r)
      throw std::runtime_error("--sim-label " + l + ": " + r.error().what);
  }
  sim_paused_.push_back(*id);
  sim_domids_.insert(id->value);
}

std::shared_ptr<const xenprobe::Compiled> Daemon::compiled_for(const ProgramConfig& cfg, const DomainKey& key,
                                                                xenprobes::DomId id, const std::string& name,
                                                                std::string* failure, AsyncPlans* plans) {
  if (cfg.compiled) {
    *plans = cfg.plans;
    return cfg.compiled;
  }
  auto t = types_.find(key);
  if (t == types_.end()) {
    auto btf = session_->kernel_btf(id);
    if (!btf) {
      *failure = "the program needs the guest kernel's types and its BTF cannot be read from its memory: " +
                 btf.error().what;
      return nullptr;
    }
    try {
      t = types_.emplace(key, xenprobe::open_btf_bytes(*btf, "the BTF of " + name + "'s kernel (read from its memory)"))
              .first;
    } catch (const std::exception& e) {
      *failure = e.what();
      return nullptr;
    }
  }
  xenprobe::Compiled c;
  try {
    c = xenprobe::compile(xenprobe::parse(cfg.source), t->second.get());
  } catch (const xenprobe::ProgramError& e) {
    *failure = "the program does not check against this guest's kernel types:\n" +
               xenprobe::format_error(e, cfg.source, cfg.origin);
    return nullptr;
  }
  if (cfg.method == Method::Async) {
    try {
      *plans = std::make_shared<AsyncPlans::element_type>(plan_async_program(c));
    } catch (const xenprobe::ProgramError& e) {
      *failure =
          "the program cannot run with method = \"async\":\n" + xenprobe::format_error(e, cfg.source, cfg.origin);
      return nullptr;
    }
  }
  return std::make_shared<const xenprobe::Compiled>(std::move(c));
}

bool Daemon::matches(const ProgramConfig& p, const xenprobes::hv::DomainInfo& d, const std::string& name) {
  for (const Selector& s : p.domains) {
    switch (s.kind) {
      case Selector::Kind::Name:
        if (s.text == name) return true;
        break;
      case Selector::Kind::Domid:
        if (s.domid == d.domid.value) return true;
        break;
      case Selector::Kind::Glob:
        if (fnmatch(s.text.c_str(), name.c_str(), 0) == 0) return true;
        break;
      case Selector::Kind::Xenstore: {
        // The guest may write this key itself: it is only compared, bounded by xenstored's
        // own limit on a value's size, never parsed.
        auto v = watcher_->xs_read("/local/domain/" + std::to_string(d.domid.value) + "/" + s.text);
        if (v && v->find('\0') == std::string::npos && fnmatch(s.value.c_str(), v->c_str(), 0) == 0) return true;
        break;
      }
    }
  }
  return false;
}

// kstack: the guest kernel's unwind tables and its function names (xenprobe's own wiring,
// docs/xenprobe.md "kstack"); "" when ready, else why not.
std::string Daemon::prepare_kstack(xenprobe::Instance& inst, xenprobes::DomId dom) {
  // The names follow the guest's modules as they come and go (xenprobe::StackNamer).
  auto namer = std::make_shared<xenprobe::StackNamer>(*session_, dom);
  if (auto r = namer->prepare(); !r) return "kstack: " + r.error().what;
  inst.set_stack_source([namer](xenprobes::HitContext& c, unsigned frames, std::string& out) {
    return namer->stack(c, frames, out);
  });
  return {};
}

void Daemon::attach(ProgramState& prog, const xenprobes::hv::DomainInfo& d, const std::string& name) {
  const ProgramConfig& cfg = prog.cfg;
  auto a = std::make_unique<Attachment>();
  a->program = &prog;
  a->key = key_of(d);
  a->id = d.domid;
  a->domain = name;
  std::string failure;
  // A real guest's symbols: its kernel's kallsyms, decoded in its memory once per domain (the
  // simulated Xen's demo guest brings its System.map, which the library loads itself).
  if (!sim_.enabled && !symbols_loaded_.contains(a->key)) {
    if (auto r = session_->load_symbols_from_guest(d.domid); r)
      symbols_loaded_.insert(a->key);
    else
      failure = "cannot read the guest kernel's symbols: " + r.error().what;
  }
  if (failure.empty()) a->compiled = compiled_for(cfg, a->key, d.domid, name, &failure, &a->plans);
  std::vector<std::int64_t> kaddrs;
  if (a->compiled)
    for (const std::string& sym : a->compiled->kaddrs) {
      if (!failure.empty()) break;
      auto addr = session_->resolve(d.domid, sym);
      if (!addr) {
        failure = "kaddr(\"" + sym + "\"): " + addr.error().what;
        break;
      }
      kaddrs.push_back(static_cast<std::int64_t>(addr->value));
    }
  a->sink = std::make_unique<EventSink>(*this, *a);
  if (a->compiled) {  // else failure says why and nothing below runs
    a->instance = std::make_unique<xenprobe::Instance>(*a->compiled, *a->sink, name, std::move(kaddrs),
                                                       xenprobe::Limits{.max_map_keys = config_.max_map_keys});
    a->next_interval.assign(a->compiled->program.blocks.size(), Clock::time_point::max());
    if (a->compiled->uses_kstack && failure.empty()) failure = prepare_kstack(*a->instance, d.domid);
  }
  std::size_t skipped = 0;
  if (failure.empty()) {
    if (auto r = session_->begin_batch(); !r) failure = "cannot begin registering: " + r.error().what;
  }
  if (failure.empty()) {
    Attachment* att = a.get();
    for (std::size_t b = 0; b < a->compiled->program.blocks.size() && failure.empty(); ++b) {
      for (const xenprobe::ProbeSpec& spec : a->compiled->program.blocks[b].specs) {
        if (spec.kind != xenprobe::ProbeKind::Kprobe && spec.kind != xenprobe::ProbeKind::Kretprobe) continue;
        std::vector<std::string> points;
        if (spec.wildcard) {
          auto fs = session_->find_symbols(d.domid, spec.function);
          if (!fs) {
            failure = spec.text + ": " + fs.error().what;
            break;
          }
          for (auto& f : *fs)
            if (f.function) points.push_back(f.name);
          if (points.empty()) {
            failure = spec.text + " matches no function of this guest";
            break;
          }
        } else {
          points.push_back(spec.function);
        }
        for (const std::string& fn : points) {
          const std::string where = spec.offset ? fn + "+0x" + hex(spec.offset) : fn;
          const bool entry = spec.kind == xenprobe::ProbeKind::Kprobe;
          ProbeEntry& pe = att->probes.emplace_back();
          pe.site = xenprobe::ProbeSite{fn, (entry ? "kprobe:" : "kretprobe:") + where};
          pe.block = static_cast<int>(b);
          ProbeEntry* pp = &pe;
          xenprobes::Result<xenprobes::Probe> p;
          if (entry && att->plans) {
            p = session_->probe_async(
                d.domid, std::string_view(where),
                [this, att, pp, alive = att->alive](const xenprobes::AsyncHit& h) {
                  if (*alive) on_record(*att, *pp, h);
                },
                xenprobes::AsyncOptions{(*att->plans)[b].captures});
          } else if (entry) {
            p = session_->probe(
                d.domid, std::string_view(where),
                [this, att, pp, alive = att->alive](xenprobes::HitContext& c) {
                  if (*alive) on_hit(*att, *pp, c);
                  return 0;
                },
                {}, xenprobes::ProbeOptions{probe_method(cfg.method)});
          } else {
            p = session_->ret_probe(
                d.domid, std::string_view(fn), {},
                [this, att, pp, alive = att->alive](xenprobes::HitContext& c, std::span<std::byte>) {
                  if (*alive) on_hit(*att, *pp, c);
                },
                xenprobes::RetProbeOptions{.maxactive = static_cast<int>(cfg.maxactive)});
          }
          if (!p) {
            // pe is the entry pop_back() destroys: read its name first.
            if (!spec.wildcard) failure = pe.site.probe + ": " + p.error().what;
            att->probes.pop_back();
            if (!spec.wildcard) break;
            ++skipped;  // a function of a glob the library refuses (an address rule)
            continue;
          }
          pp->probe = std::move(*p);
        }
        if (!failure.empty()) break;
      }
    }
    if (auto r = session_->end_batch(); !r && failure.empty())
      failure = "cannot register the probes: " + r.error().what;
  }
  if (failure.empty() && a->probes.empty()) failure = "no probe could be placed";
  if (!failure.empty()) {
    for (ProbeEntry& pe : a->probes)
      if (pe.probe) (void)pe.probe.unregister();
    // The same reason again: logged once, tried again later and later.
    ProgramState::Failure& f0 = prog.failed[a->key];
    const bool repeat = f0.tries > 0 && f0.why == failure;
    f0.backoff = repeat ? std::min(f0.backoff * 2, kMaxRetryBackoff) : kFirstRetryBackoff;
    f0.tries = repeat ? f0.tries + 1 : 1;
    f0.retry_at = Clock::now() + f0.backoff;
    f0.why = failure;
    if (repeat) return;
    ordered_json f{{"domain", name}, {"domid", d.domid.value}, {"program", cfg.name}, {"body", failure}};
    log_.write("attach_failed", "ERROR", f);
    std::fprintf(stderr, "xenprobesd: cannot attach program %s to %s (%u): %s (trying again)\n", cfg.name.c_str(),
                 name.c_str(), d.domid.value, failure.c_str());
    return;
  }
  auto ch = session_->channel_name(d.domid);
  a->channel = ch ? *ch : "?";
  a->tokens = cfg.event_burst;
  a->refilled = Clock::now();
  ordered_json f{{"domain", name},        {"domid", d.domid.value}, {"program", cfg.name}, {"probes", a->probes.size()},
                 {"channel", a->channel}, {"skipped", skipped},    {"method", method_name(cfg.method)}};
  log_.write("attached", "INFO", f);
  // BEGIN, then the interval clocks.
  static const xenprobe::ProbeSite kBegin{"", "BEGIN"};
  const auto now = Clock::now();
  for (std::size_t b = 0; b < a->compiled->program.blocks.size(); ++b)
    for (const xenprobe::ProbeSpec& s : a->compiled->program.blocks[b].specs) {
      if (s.kind == xenprobe::ProbeKind::Begin) {
        current_site_ = &kBegin;
        a->instance->run(static_cast<int>(b), kBegin, nullptr);
        current_site_ = nullptr;
      }
      if (s.kind == xenprobe::ProbeKind::Interval) a->next_interval[b] = now + std::chrono::nanoseconds(s.interval_ns);
    }
  if (a->instance->exit_requested()) a->exited = true;
  if (a->plans) {
    // The guest module counts its drops since it loaded: the daemon counts from here. (Reading
    // the rings runs the blocks of the records already there: after BEGIN.)
    if (!ring_loss_.contains(a->key)) ring_loss_[a->key].base = ring_lost(a->key, d.domid);
    a->lost_at_attach = ring_lost(a->key, d.domid);
  }
  names_[a->key] = name;
  prog.failed.erase(a->key);
  prog.attached[a->key] = std::move(a);
}

void Daemon::remove_probes(Attachment& a) {
  for (ProbeEntry& pe : a.probes) {
    if (!pe.probe) continue;
    pe.missed_at_removal = missed_of(pe);
    if (auto r = pe.probe.unregister(); !r) {
      log_.write("error", "ERROR",
                 ordered_json{{"domain", a.domain},
                              {"program", a.program->cfg.name},
                              {"probe", pe.site.probe},
                              {"body", "cannot remove the probe: " + r.error().what}});
      continue;
    }
    pe.probe = xenprobes::Probe{};
  }
}

void Daemon::run_end(Attachment& a) {
  static const xenprobe::ProbeSite kEnd{"", "END"};
  const auto& blocks = a.compiled->program.blocks;
  for (std::size_t b = 0; b < blocks.size(); ++b)
    for (const xenprobe::ProbeSpec& s : blocks[b].specs)
      if (s.kind == xenprobe::ProbeKind::End) {
        current_site_ = &kEnd;
        a.instance->run(static_cast<int>(b), kEnd, nullptr);
        current_site_ = nullptr;
      }
}

void Daemon::detach(Attachment& a, const std::string& why) {
  // Async records still in the rings: their blocks run before the probes go and END runs.
  const std::uint64_t lost = a.plans ? std::max(ring_lost(a.key, a.id), a.lost_at_attach) - a.lost_at_attach : 0;
  remove_probes(a);
  if (!a.exited) run_end(a);
  std::uint64_t hits = 0;
  for (const ProbeEntry& pe : a.probes) hits += pe.hits;
  ordered_json f{{"domain", a.domain}, {"domid", a.id.value}, {"program", a.program->cfg.name}, {"hits", hits}};
  if (a.plans) f["lost_events"] = lost;
  f["body"] = why;
  log_.write("detached", "INFO", f);
}

void Daemon::domain_gone(const DomainKey& key, const std::string& why) {
  // Let the session take in the domain's release first (its own @releaseDomain watch): a
  // probe of a domain the session has dropped unregisters with nothing to restore.
  if (auto r = session_->run_once(0); !r)
    log_.write("error", "ERROR", ordered_json{{"body", "the session: " + r.error().what}});
  symbols_loaded_.erase(key);
  types_.erase(key);
  bool any = false;
  for (auto& p : programs_) {
    p->failed.erase(key);
    auto it = p->attached.find(key);
    if (it == p->attached.end()) continue;
    any = true;
    detach(*it->second, "the domain is gone (" + why + ")");
    p->attached.erase(it);
  }
  if (any) {
    auto n = names_.find(key);
    std::fprintf(stderr, "xenprobesd: domain %s (%u) is gone (%s); its probes went with it\n",
                 n != names_.end() ? n->second.c_str() : "?", key.domid, why.c_str());
  }
  names_.erase(key);
  domain_hits_.erase(key);
  ring_loss_.erase(key);
}

void Daemon::scan(const char* why) {
  (void)why;
  last_scan_ = Clock::now();
  auto doms = session_->hypervisor().list_domains();
  if (!doms) {
    log_.write("error", "ERROR", ordered_json{{"body", "cannot list the domains: " + doms.error().what}});
    return;
  }
  std::map<DomainKey, const xenprobes::hv::DomainInfo*> live;
  std::map<DomainKey, std::string> ending;
  for (const auto& d : *doms) {
    if (d.domid.value == 0) continue;  // Dom0 is never a target
    if (d.dying)
      ending[key_of(d)] = "it is dying";
    else if (d.crashed)
      ending[key_of(d)] = "it crashed";
    else if (d.shutdown)
      ending[key_of(d)] = "it shut down";
    else
      live[key_of(d)] = &d;
  }
  std::set<DomainKey> gone;
  for (auto& p : programs_) {
    for (auto& [k, a] : p->attached)
      if (!live.contains(k)) gone.insert(k);
    for (auto& [k, f] : p->failed)
      if (!live.contains(k)) gone.insert(k);
  }
  for (const DomainKey& k : gone) {
    auto e = ending.find(k);
    domain_gone(k, e != ending.end() ? e->second : "it was destroyed");
  }
  for (auto& [k, d] : live) {
    const std::string name = domain_name(*d);
    for (auto& p : programs_) {
      const bool want = matches(p->cfg, *d, name);
      auto it = p->attached.find(k);
      if (it != p->attached.end()) {
        if (!want) {
          detach(*it->second, "the domain is no longer selected");
          p->attached.erase(it);
        }
      } else if (want) {
        auto f = p->failed.find(k);
        if (f == p->failed.end() || Clock::now() >= f->second.retry_at) attach(*p, *d, name);
      } else {
        p->failed.erase(k);  // no longer selected: nothing to try again
      }
    }
  }
}

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

void Daemon::sim_step() {
  if (!host_) return;
  for (SimCue& cue : creates_)
    if (!cue.done && hits_ >= cue.hits) {
      cue.done = true;
      sim_create(cue.name);
    }
  if (sim_.iterations == 0 || sim_idle_logged_) return;
  if (std::any_of(creates_.begin(), creates_.end(), [](const SimCue& c) { return !c.done; })) return;
  if (!sim_paused_.empty()) return;
  for (std::uint32_t id : sim_domids_) {
    auto info = watcher_->domain_info(DomId{id});
    if (!info || info->crashed || info->dying) continue;  // destroyed, or halted for good
    if (!host_->wait_halted(DomId{id}, 0ms)) return;
  }
  sim_idle_logged_ = true;
  log_.write("sim_idle", "INFO", ordered_json{{"body", "every simulated guest has finished its workload"}});
  notify_("STATUS=every simulated guest has finished its workload");
}

void Daemon::start_paused_guests() {
  for (DomId d : sim_paused_)
    if (auto r = watcher_->unpause(d); !r)
      std::fprintf(stderr, "xenprobesd: cannot start simulated guest %u: %s\n", d.value, r.error().what.c_str());
  sim_paused_.clear();
}

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
  if (watcher_) (void)watcher_->xs_read_watches();  // the watches' first firing: the scan above covered it
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
