// Attaching a program to a domain: the program checked for the domain (its kernel's and its
// loaded modules' types, kept per domain; the async plan), kstack's wiring, the probes placed
// by the program's method (trap, jump and fastest through Session::probe, async through
// Session::probe_async, return probes), a failure retried later; and detaching: the probes
// removed, END run, the detached record.
#include <algorithm>
#include <cstdio>

#include "daemon_internal.hpp"
#include "kstack.hpp"

namespace xenprobesd {

using nlohmann::ordered_json;

namespace {

constexpr std::chrono::seconds kFirstRetryBackoff{2};  // a failed attachment tried again (ProgramState::Failure)
constexpr std::chrono::seconds kMaxRetryBackoff{60};

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// A program's method for its synchronous kprobes (async ones are Session::probe_async's).
xenprobes::ProbeMethod probe_method(Method m) {
  switch (m) {
    case Method::Jump: return xenprobes::ProbeMethod::Jump;
    case Method::Fastest: return xenprobes::ProbeMethod::Fastest;
    default: return xenprobes::ProbeMethod::Trap;
  }
}

}  // namespace

const Daemon::DomainTypes* Daemon::types_for(const DomainKey& key, xenprobes::DomId id, const std::string& name,
                                             std::string* failure) {
  // The module list looked at now (a few reads when it did not change): the types kept are
  // used while no module came or went since they were read. A look that fails keeps the
  // generation known (Session::check_modules).
  auto gen = session_->check_modules(id);
  const std::uint64_t now = gen ? *gen : session_->symbols_generation(id);
  if (auto t = types_.find(key); t != types_.end() && t->second.generation == now) return &t->second;
  auto btf = session_->kernel_btf(id);
  if (!btf) {
    *failure =
        "the program needs the guest kernel's types and its BTF cannot be read from its memory: " + btf.error().what;
    return nullptr;
  }
  // Each live module's BTF; one that cannot be read (or that libbpf refuses) is left out, and
  // a program naming its types fails to check, this note after the checker's error.
  std::vector<xenprobe::ModuleTypes> modules;
  std::vector<std::string> left_out;
  if (auto mb = session_->module_btf(id); !mb) {
    left_out.push_back("every loaded module's: their list cannot be read: " + mb.error().what);
  } else {
    for (xenprobes::ModuleBtf& m : *mb) {
      if (m.why.empty()) modules.push_back(xenprobe::ModuleTypes{std::move(m.module), std::move(m.btf)});
      else left_out.push_back("module " + m.module + ": " + m.why);
    }
  }
  std::vector<std::string> refused;
  DomainTypes d;
  try {
    auto types =
        xenprobe::open_btf_bytes(*btf, "the BTF of " + name + "'s kernel (read from its memory)", modules, &refused);
    types->set_missing_type_hint(
        "a module's types are read from the modules loaded when the program attaches: once the module is "
        "loaded, the next try attaches");
    d.types = std::move(types);
  } catch (const std::exception& e) {
    *failure = e.what();
    return nullptr;
  }
  for (const std::string& r : refused) left_out.push_back("module " + r);
  constexpr std::size_t kShown = 8;  // a guest may have a hundred modules without BTF
  for (std::size_t i = 0; i < left_out.size() && i < kShown; ++i) d.note += "  " + left_out[i] + "\n";
  if (left_out.size() > kShown) d.note += "  and " + std::to_string(left_out.size() - kShown) + " more module(s)\n";
  if (!d.note.empty()) d.note = "types left out:\n" + d.note;
  d.generation = now;
  return &(types_[key] = std::move(d));
}

std::shared_ptr<const xenprobe::Compiled> Daemon::compiled_for(const ProgramConfig& cfg, const DomainKey& key,
                                                               xenprobes::DomId id, const std::string& name,
                                                               std::string* failure, AsyncPlans* plans) {
  if (cfg.compiled) {
    *plans = cfg.plans;
    return cfg.compiled;
  }
  const DomainTypes* t = types_for(key, id, name, failure);
  if (!t) return nullptr;
  xenprobe::Compiled c;
  try {
    c = xenprobe::compile(xenprobe::parse(cfg.source), t->types.get());
  } catch (const xenprobe::ProgramError& e) {
    *failure = "the program does not check against this guest's kernel types:\n" +
               xenprobe::format_error(e, cfg.source, cfg.origin) + t->note;
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

// kstack: the guest kernel's unwind tables and its function names (xenprobe's own wiring,
// docs/xenprobe.md "kstack"); "" when ready, else why not.
std::string Daemon::prepare_kstack(xenprobe::Instance& inst, xenprobes::DomId dom) {
  // The names follow the guest's modules as they come and go (xenprobe::StackNamer).
  auto namer = std::make_shared<xenprobe::StackNamer>(*session_, dom);
  if (auto r = namer->prepare(); !r) return "kstack: " + r.error().what;
  inst.set_stack_source(
      [namer](xenprobes::HitContext& c, unsigned frames, std::string& out) { return namer->stack(c, frames, out); });
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
    if (auto r = session_->load_symbols_from_guest(d.domid); r) symbols_loaded_.insert(a->key);
    else failure = "cannot read the guest kernel's symbols: " + r.error().what;
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
  // Jump and async probes need every kernel function decoded once per domain: done now, with
  // the guest running, not inside the batch. A failure here is the first jump probe's to report.
  if (failure.empty() && cfg.method != Method::Trap)
    static_cast<void>(session_->prepare_jump_probes(d.domid));  // NOLINT(bugprone-unused-return-value)
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
      if (pe.probe)
        if (auto u = pe.probe.unregister(); !u)
          log_.write("error", "WARN",
                     ordered_json{{"domain", name}, {"body", "undoing an attachment: " + u.error().what}});
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
  ordered_json f{{"domain", name},
                 {"domid", d.domid.value},
                 {"program", cfg.name},
                 {"probes", a->probes.size()},
                 {"channel", a->channel},
                 {"skipped", skipped},
                 {"method", method_name(cfg.method)}};
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

}  // namespace xenprobesd
