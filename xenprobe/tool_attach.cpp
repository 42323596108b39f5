// xenprobe: attaching the program's probes to each selected domain.
#include "main_internal.hpp"

namespace xenprobe {

void Tool::attach() {
  // Jump and async probes need every kernel function decoded once per domain: done now, with
  // the guest running, not inside the batch (whose first probe may pause the domain). A
  // failure here is the first jump probe's to report.
  if (method_ != xenprobes::ProbeMethod::Trap || async_)
    for (Target& t : targets_)
      if (auto r = session_->prepare_jump_probes(t.id); !r)
        std::fprintf(stderr, "xenprobe: domain %s: preparing jump probes: %s\n", t.name.c_str(),
                     r.error().what.c_str());
  if (auto r = session_->begin_batch(); !r) die("cannot begin registering: " + r.error().what);
  for (Target& t : targets_) {
    std::vector<std::int64_t> kaddrs;
    for (const std::string& sym : compiled_.kaddrs) {
      auto a = symbols_->resolve(t.id, sym);
      if (!a) fail_attach(t, "kaddr(\"" + sym + "\"): " + a.error().what);
      kaddrs.push_back(static_cast<std::int64_t>(a->value));
    }
    t.instance = std::make_unique<Instance>(compiled_, *out_, t.name, std::move(kaddrs),
                                            xenprobe::Limits{.max_map_keys = o_.max_map_keys});
    if (compiled_.uses_kstack) prepare_kstack(t);
    t.next_interval.assign(compiled_.program.blocks.size(), Clock::time_point::max());
    std::size_t skipped = 0;
    std::string first_skip;
    for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b) {
      for (const ProbeSpec& spec : compiled_.program.blocks[b].specs) {
        if (spec.kind != ProbeKind::Kprobe && spec.kind != ProbeKind::Kretprobe) continue;
        std::vector<std::string> points;
        if (spec.wildcard) {
          auto fs = symbols_->functions(t.id, spec.function);
          if (!fs) fail_attach(t, spec.text + ": " + fs.error().what);
          for (auto& f : *fs) points.push_back(f.name);
          if (points.empty())
            fail_attach(t, spec.text + " matches no function (see: xenprobe list -d " + t.name + " '" + spec.function +
                               "')" + module_note(spec.function));
        } else {
          points.push_back(spec.function);
        }
        for (const std::string& fn : points) {
          std::string where = spec.offset ? fn + "+0x" + hex(spec.offset) : fn;
          const std::string kind = spec.kind == ProbeKind::Kprobe ? "kprobe:" : "kretprobe:";
          sites_.push_back(ProbeSite{fn, kind + where});
          const ProbeSite* site = &sites_.back();
          Instance* inst = t.instance.get();
          const int block = static_cast<int>(b);
          xenprobes::Result<xenprobes::Probe> p;
          if (spec.kind == ProbeKind::Kprobe && async_) {
            p = session_->probe_async(
                t.id, std::string_view(where),
                [this, inst, block, site](const xenprobes::AsyncHit& h) { on_record(*inst, block, *site, h); },
                xenprobes::AsyncOptions{plans_[b].captures});
          } else if (spec.kind == ProbeKind::Kprobe) {
            p = session_->probe(
                t.id, std::string_view(where),
                [this, inst, block, site](xenprobes::HitContext& c) {
                  on_hit(*inst, block, *site, c);
                  return 0;
                },
                {}, xenprobes::ProbeOptions{method_});
          } else {
            p = session_->ret_probe(
                t.id, std::string_view(fn), {},
                [this, inst, block, site](xenprobes::HitContext& c, std::span<std::byte>) {
                  on_hit(*inst, block, *site, c);
                },
                xenprobes::RetProbeOptions{.maxactive = static_cast<int>(o_.maxactive)});
          }
          if (!p) {
            if (!spec.wildcard)
              fail_attach(t, site->probe + ": " + p.error().what +
                                 (p.error().code == xenprobes::Errc::NotFound ? not_found_note(t, fn) : ""));
            if (!skipped++) first_skip = site->probe + ": " + p.error().what;
            continue;
          }
          t.probes.push_back(std::move(*p));
        }
      }
    }
    if (skipped)
      std::fprintf(stderr,
                   "xenprobe: %s: %zu function(s) of a wildcard could not be probed and were left out; the first: %s\n",
                   t.name.c_str(), skipped, first_skip.c_str());
  }
  if (auto r = session_->end_batch(); !r) die("cannot register the probes: " + r.error().what);
  if (async_)
    for (Target& t : targets_) t.ring_lost_base = ring_lost(t);  // the module's counts are since it loaded
  for (Target& t : targets_) {
    const std::size_t n = t.probes.size();
    if (out_->format() == OutputFormat::Json) {
      out_->record(t.name, "attached_probes", "{\"probes\": " + std::to_string(n) + "}");
    } else {
      auto ch = n ? session_->channel_name(t.id) : xenprobes::Result<std::string>(std::string("none"));
      out_->text(t.name, "Attaching " + std::to_string(n) + " probe" + (n == 1 ? "" : "s") + " to " + t.name +
                             " (domain " + std::to_string(t.id.value) + ", channel " + (ch ? *ch : "?") + ")...\n");
    }
  }
}

// kstack: the guest kernel's unwind tables and its function names, read before any probe is
// in place; a hit then walks its stack while its vCPU waits.
// The names follow the guest's modules as they come and go (StackNamer).
void Tool::prepare_kstack(Target& t) {
  auto namer = std::make_shared<StackNamer>(*session_, t.id);
  if (auto r = namer->prepare(); !r) fail_attach(t, "kstack: " + r.error().what);
  t.instance->set_stack_source(
      [namer](xenprobes::HitContext& c, unsigned frames, std::string& out) { return namer->stack(c, frames, out); });
}

std::string Tool::hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// After "no such function" for MODULE:FUNC: the module list is the one read at the start.
std::string Tool::module_note(const std::string& function) {
  const auto colon = function.find(':');
  if (colon == std::string::npos) return {};
  return "; a module's functions are those of the modules loaded when xenprobe starts: if " +
         function.substr(0, colon) + " is not loaded, load it in the guest, then start xenprobe";
}

// After "no symbol" for FUNC: where to look for the name (or, for MODULE:FUNC, module_note).
std::string Tool::not_found_note(const Target& t, const std::string& function) {
  if (function.find(':') != std::string::npos) return module_note(function);
  return " (the functions whose names contain it: xenprobe list -d " + t.name + " '*" + function + "*')";
}

[[noreturn]] void Tool::fail_attach(const Target& t, const std::string& what) {
  std::string also;
  if (auto e = session_->end_batch(); !e) also = " (ending the registration batch failed too: " + e.error().what + ")";
  die("domain " + t.name + ": " + what + also);
}

}  // namespace xenprobe
