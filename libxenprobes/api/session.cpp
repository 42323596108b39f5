// Session: the C++ API over the engine, a channel and the event loop.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "api/kernel_stack.hpp"
#include "api/session_impl.hpp"
#include "api/session_testing.hpp"
#include "channel/debugger.hpp"
#include "channel/eligibility.hpp"
#include "channel/guest.hpp"
#include "channel/vmevent.hpp"
#include "common/log.hpp"
#include "common/result.hpp"
#include "guardian/journal.hpp"
#include "guardian/spawn.hpp"
#include "hv/sim/sim.hpp"
#include "probe/engine.hpp"
#include "guestmod/module_info.hpp"
#include "kernel/btf.hpp"
#include "kernel/module_symbols.hpp"
#include "kernel/orc.hpp"
#include "symbols/kallsyms.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::open(SessionOptions o) {
  auto hv = XP_TRY(hv::open_hypervisor());
  return open(std::move(hv), std::move(o));
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): the public signature (and ABI) takes it by value.
Result<std::unique_ptr<Session>> Session::open(std::unique_ptr<hv::Hypervisor> hv, SessionOptions o) {
  if (!hv) return fail(Errc::InvalidArgument, "Session::open: no hypervisor");
  const SessionLimits& lim = o.limits;
  for (auto [value, name] : {std::pair{std::uint64_t{lim.domains}, "domains"},
                             {std::uint64_t{lim.points_per_domain}, "points_per_domain"},
                             {std::uint64_t{lim.instances_per_domain}, "instances_per_domain"},
                             {std::uint64_t{lim.mapped_frames_per_domain}, "mapped_frames_per_domain"}})
    if (value == 0)
      return fail(Errc::InvalidArgument,
                  std::string("SessionLimits::") + name + " is 0: every limit must be at least 1");
  auto impl = std::make_unique<Impl>();
  impl->hv = std::move(hv);
  impl->options = o;
  if (o.guardian != GuardianMode::Off) {
    guardian::JournalLimits jl;
    jl.domains = lim.domains;  // every domain the session may probe has its record
    auto j = guardian::Journal::create(jl);
    if (j) impl->journal = std::move(*j);
    else if (o.guardian == GuardianMode::Required) return std::unexpected(j.error());
    else XP_LOG(Warn, "no journal for the guardian: %s", j.error().what.c_str());
  }
  if (o.channel == ChannelKind::Debugger) {
    // Asked for explicitly: refuse now (no GDBSX, VIRQ taken) rather than at the first probe.
    auto ch = channel::DebuggerChannel::open(*impl->hv);
    if (!ch) return std::unexpected(ch.error());
    impl->debugger = std::move(*ch);
  }
  Impl* raw = impl.get();
  impl->engine = std::make_unique<probe::Engine>(*impl->hv, [raw](DomId d) { return raw->choose(d); });
  impl->engine->set_journal(impl->journal.get());
  impl->engine->set_limits(
      probe::Limits{lim.domains, lim.points_per_domain, lim.instances_per_domain, lim.mapped_frames_per_domain});
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl->ports.emplace(*impl->hv);
  if (auto w = impl->hv->xs_watch("@releaseDomain", kReleaseToken); w) impl->watching = true;
  else
    XP_LOG(Warn, "cannot watch @releaseDomain (%s): dead domains are noticed on their next error",
           w.error().what.c_str());
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

hv::Hypervisor& Session::hypervisor() { return *impl_->hv; }
Result<std::string> Session::channel_name(DomId dom) {
  auto ch = XP_TRY(impl_->engine->channel_of(dom));
  return std::string(ch->name());
}

static Result<symbols::KallsymsResult> guest_kallsyms(hv::Hypervisor& hv, DomId dom);

Result<void> Session::load_symbols(DomId dom, const std::string& path) {
  // A vmlinux (ELF) gives its symbol table, and its image to jump probes (tail calls proven).
  // One without a symbol table (a decompressed vmlinuz) goes with the symbols loaded before;
  // one whose section headers or symbol table are broken is refused, saying what is wrong.
  std::shared_ptr<const symbols::KernelImage> image;
  // The library does not decompress kernels (docs/probes.md says why): the ELF inside, please.
  if (!symbols::is_elf_file(path) && symbols::is_bzimage_file(path))
    return fail(Errc::InvalidArgument,
                path +
                    " is a compressed kernel (an x86 bzImage, vmlinuz): give load_symbols() the ELF inside it "
                    "(vmlinux), the payload its boot header locates, decompressed (xz, zstd or gzip)");
  if (symbols::is_elf_file(path)) {
    auto elf = XP_TRY(elf::load(path));
    if (!elf.symtab_error.empty()) return fail(Errc::InvalidArgument, path + ": " + elf.symtab_error);
    if (elf.symtab.empty()) {
      const symbols::SymbolTable* have = impl_->engine->symbols(dom);
      if (!have)
        return fail(Errc::InvalidArgument, path +
                                               " has no symbol table: load the kernel's System.map first, or "
                                               "the guest's own kallsyms (load_symbols_from_guest), then this "
                                               "image");
      symbols::SymbolTable link = *have;
      link.clear_module_functions();
      // A System.map goes back to its link addresses; the guest's kallsyms (its running
      // addresses) too, by its KASLR slide when its kernel was moved.
      const std::int64_t moved = XP_TRY(symbols::link_to_image(link, elf, path));
      if (moved)
        XP_LOG(Info, "domain %u: %s goes with %s moved by %s%llx (the kernel runs KASLR-slid from where it was linked)",
               dom.value, path.c_str(), link.source().c_str(), moved < 0 ? "-0x" : "0x",
               static_cast<unsigned long long>(moved < 0 ? -static_cast<__int128>(moved) : moved));
      return impl_->engine->set_kernel_image(
          dom, std::make_shared<const symbols::KernelImage>(
                   symbols::KernelImage::with_symbols(std::move(elf), std::move(link), path)));
    }
    image = std::make_shared<const symbols::KernelImage>(XP_TRY(symbols::KernelImage::from_elf(std::move(elf), path)));
  }
  auto t = image ? image->symbols() : XP_TRY(symbols::SymbolTable::load(path));
  XP_TRY(impl_->engine->attach(dom));
  if (!impl_->engine->published_kernel_text(dom)) {
    // No guest module to publish the running _text (agentless): the guest's own kallsyms
    // has it, at its running address. A guest without them keeps the file's addresses.
    if (auto k = guest_kallsyms(*impl_->hv, dom)) {
      for (const symbols::KallsymsEntry& e : k->entries)
        if (e.name == "_text") {
          auto slide = symbols::slide_from_symbol(t, "_text", e.address);
          if (!slide)
            return fail(slide.error().code, path + " does not fit domain " + std::to_string(dom.value) +
                                                "'s kernel: " + slide.error().what);
          XP_LOG(Info, "domain %u: KASLR slide 0x%llx from the guest's kallsyms", dom.value,
                 static_cast<unsigned long long>(*slide));
          break;
        }
    } else {
      XP_LOG(Info, "domain %u: no guest module and no kallsyms in its memory (%s): %s taken unslid", dom.value,
             k.error().what.c_str(), path.c_str());
    }
  }
  // The loaded modules' functions join them in the engine, once the slide is known.
  XP_TRY(impl_->engine->set_symbols(dom, std::move(t)));
  if (image) XP_TRY(impl_->engine->set_kernel_image(dom, std::move(image)));
  return {};
}

Result<void> Session::load_symbols_from_guest(DomId dom) {
  XP_TRY(impl_->engine->attach(dom));
  auto found = XP_TRY(guest_kallsyms(*impl_->hv, dom));
  XP_LOG(Info, "domain %u: %zu kallsyms symbols from guest memory (token table at 0x%llx)", dom.value,
         found.entries.size(), static_cast<unsigned long long>(found.where.token_table));
  auto t = XP_TRY(symbols::to_symbol_table(found.entries, "domain " + std::to_string(dom.value) + "'s kallsyms"));
  // The loaded modules' functions join them in the engine, once the slide is known.
  return impl_->engine->set_symbols(dom, std::move(t));
}

// Finds and decodes the guest kernel's kallsyms in its memory.
static Result<symbols::KallsymsResult> guest_kallsyms(hv::Hypervisor& hv, DomId dom) {
  auto view = XP_TRY(GuestView::open(hv, dom));
  auto read = [&view](std::uint64_t a, std::span<std::byte> out) { return view->read(Gva{a}, out); };
  // Where the search starts: a vCPU stopped in the kernel is in its text, and .rodata (the
  // tables) follows the text. With none there (every vCPU in user space), the bottom of the
  // window KASLR places the image in; unmapped 2 MiB steps are skipped.
  std::vector<std::uint64_t> starts;
  hv::DomainInfo info = XP_TRY(hv.domain_info(dom));
  for (unsigned v = 0; v < info.vcpus && starts.empty(); ++v)
    if (auto r = hv.get_vcpu_regs(dom, VcpuId{v});
        r && r->rip >= symbols::kKernelImageStart && r->rip < symbols::kKernelImageEnd)
      starts.push_back(r->rip & ~(symbols::kSlideAlign - 1));
  starts.push_back(symbols::kKernelImageStart);
  Error why{Errc::NotFound, ""};
  for (std::uint64_t start : starts) {
    auto found = symbols::find_kallsyms(read, start, symbols::kKernelImageEnd);
    if (found) return found;
    why = found.error();
  }
  return fail(why.code, "cannot read domain " + std::to_string(dom.value) + "'s kallsyms from its memory: " + why.what +
                            "; give its System.map to load_symbols() instead");
}

Result<std::vector<std::byte>> Session::kernel_btf(DomId dom) {
  XP_TRY(default_symbols(dom));
  if (!impl_->engine->symbols(dom)) XP_TRY(load_symbols_from_guest(dom));
  const symbols::SymbolTable* t = impl_->engine->symbols(dom);
  auto view = XP_TRY(GuestView::open(*impl_->hv, dom));
  return kernel::read_kernel_btf(*t, [&view](Gva a, std::span<std::byte> out) { return view->read(a, out); });
}

Result<std::vector<ModuleBtf>> Session::module_btf(DomId dom) {
  XP_TRY(default_symbols(dom));
  if (!impl_->engine->symbols(dom)) XP_TRY(load_symbols_from_guest(dom));
  auto view = XP_TRY(GuestView::open(*impl_->hv, dom));
  auto blobs = XP_TRY(kernel::read_guest_module_btf(
      *impl_->engine->symbols(dom), [&view](Gva a, std::span<std::byte> out) { return view->read(a, out); }));
  std::vector<ModuleBtf> out;
  for (auto& b : blobs) out.push_back(ModuleBtf{std::move(b.module), std::move(b.btf), std::move(b.why)});
  return out;
}

// The engine's look at the domain's module list (Engine::refresh_modules); the symbols'
// generation after it. A look that fails (vCPU 0 in user space with page-table isolation) keeps
// what was known.
static std::uint64_t modules_now(Session::Impl& impl, DomId dom, std::chrono::milliseconds every) {
  auto gen = impl.engine->refresh_modules(dom, every);
  if (!gen) {
    XP_LOG(Debug, "domain %u: the module list is not checked: %s", dom.value, gen.error().what.c_str());
    return impl.engine->symbols_generation(dom);
  }
  return *gen;
}

Result<std::string> Session::load_unwind_tables(DomId dom) {
  XP_TRY(symbols_for_lookup(dom));
  // The modules' tables are those of the modules live now.
  const std::uint64_t gen = modules_now(*impl_, dom, std::chrono::milliseconds{0});
  return impl_->stacks.load(*impl_->hv, dom, *impl_->engine->symbols(dom), impl_->engine->modules(dom), gen);
}

// How often a hit's stack walk looks at the module list: before any walk when the last look is
// a second old (a module that went must not be unwound through for long), and after a walk that
// ran into an address no table knows when the last look is 100 ms old (a module loaded since).
// A guest whose walks keep missing (BPF programs, ftrace trampolines) costs one look per 100 ms.
inline constexpr std::chrono::milliseconds kStackModulesEvery{1000}, kStackModulesOnMiss{100};

Result<KernelStack> Session::kernel_stack(HitContext& hit, unsigned max_frames) {
  const DomId dom = hit.domain();
  // Without its tables the walk below says why, frame by frame.
  if (!impl_->stacks.tried(dom)) best_effort(load_unwind_tables(dom), "kernel_stack: loading the unwind tables");
  // The modules' unwind tables follow the module list the symbols follow.
  auto sync = [&](std::chrono::milliseconds every) {
    const std::uint64_t gen = modules_now(*impl_, dom, every);
    const symbols::SymbolTable* syms = impl_->engine->symbols(dom);
    if (syms && impl_->stacks.loaded(dom) && impl_->stacks.generation(dom) != gen)
      impl_->stacks.update_modules(*impl_->hv, dom, *syms, impl_->engine->modules(dom), gen);
    return gen;
  };
  const std::uint64_t gen = sync(kStackModulesEvery);
  auto st = impl_->stacks.walk(hit, max_frames);
  if (st && st->stopped == kernel::orc::to_string(kernel::orc::Stop::NoText) && sync(kStackModulesOnMiss) != gen)
    st = impl_->stacks.walk(hit, max_frames);
  return st;
}

std::uint64_t Session::symbols_generation(DomId dom) const { return impl_->engine->symbols_generation(dom); }

Result<std::uint64_t> Session::check_modules(DomId dom) {
  XP_TRY(symbols_for_lookup(dom));
  return modules_now(*impl_, dom, std::chrono::milliseconds{0});
}

Result<void> Session::prepare_jump_probes(DomId dom) {
  XP_TRY(symbols_for_lookup(dom));
  return impl_->engine->prepare_jumps(dom);
}

Result<Probe> Session::probe(DomId dom, Gva address, PreHandler pre, PostHandler post) {
  return probe(dom, address, std::move(pre), std::move(post), ProbeOptions{});
}

Result<Probe> Session::probe(DomId dom, std::string_view symbol, PreHandler pre, PostHandler post) {
  return probe(dom, symbol, std::move(pre), std::move(post), ProbeOptions{});
}

Result<Probe> Session::probe(DomId dom, Gva address, PreHandler pre, PostHandler post, ProbeOptions o) {
  XP_TRY(default_symbols(dom));
  auto id = XP_TRY(impl_->engine->add(dom, address, std::move(pre), std::move(post), o.method));
  return Probe(this, impl_->alive, id);
}

Result<Probe> Session::probe(DomId dom, std::string_view symbol, PreHandler pre, PostHandler post, ProbeOptions o) {
  Gva addr = XP_TRY(resolve(dom, symbol));
  return probe(dom, addr, std::move(pre), std::move(post), o);
}

Result<void> Session::default_symbols(DomId dom) {
  if (!impl_->engine->symbols(dom) && impl_->hv->name() == "sim") {
    // The simulated Xen's demo guest ships its System.map: use it unless told otherwise.
    std::string map = hv::sim::default_guest_dir() + "/System.map";
    if (std::filesystem::exists(map)) XP_TRY(load_symbols(dom, map));
  }
  return {};
}

Result<void> Session::symbols_for_lookup(DomId dom) {
  XP_TRY(default_symbols(dom));
  if (!impl_->engine->symbols(dom) && impl_->hv->name() != "sim") {
    if (auto r = load_symbols_from_guest(dom); !r)
      return fail(Errc::NotFound, "no symbols for domain " + std::to_string(dom.value) + ": " + r.error().what);
  }
  if (!impl_->engine->symbols(dom))
    return fail(Errc::NotFound, "no symbols for domain " + std::to_string(dom.value) +
                                    ": call load_symbols() with the guest kernel's System.map first");
  return {};
}

Result<Gva> Session::resolve(DomId dom, std::string_view symbol) {
  XP_TRY(symbols_for_lookup(dom));
  (void)modules_now(*impl_, dom, std::chrono::milliseconds{0});  // a module that came or went since
  const symbols::SymbolTable* t = impl_->engine->symbols(dom);
  return t->resolve(symbol);
}

Result<std::vector<SymbolInfo>> Session::find_symbols(DomId dom, std::string_view glob) {
  XP_TRY(symbols_for_lookup(dom));
  (void)modules_now(*impl_, dom, std::chrono::milliseconds{0});
  const symbols::SymbolTable* t = impl_->engine->symbols(dom);
  std::vector<SymbolInfo> out;
  for (symbols::Symbol& s : t->matching(glob))
    // A module's function by the name that resolves to it alone: "module:func".
    out.push_back(SymbolInfo{s.module.empty() ? std::move(s.name) : s.module + ":" + s.name, s.address, s.type,
                             s.kind == symbols::SymbolKind::Text, s.size});
  return out;
}

Result<Probe> Session::ret_probe(DomId dom, Gva address, EntryHandler entry, ReturnHandler on_return,
                                 RetProbeOptions o) {
  XP_TRY(default_symbols(dom));
  auto id = XP_TRY(impl_->engine->add_ret(dom, address, std::move(entry), std::move(on_return), o));
  return Probe(this, impl_->alive, id);
}

Result<Probe> Session::ret_probe(DomId dom, std::string_view symbol, EntryHandler entry, ReturnHandler on_return,
                                 RetProbeOptions o) {
  Gva addr = XP_TRY(resolve(dom, symbol));
  return ret_probe(dom, addr, std::move(entry), std::move(on_return), o);
}

Result<Probe> Session::probe_async(DomId dom, Gva address, AsyncHandler handler, AsyncOptions o) {
  XP_TRY(default_symbols(dom));
  auto id = XP_TRY(impl_->engine->add_async(dom, address, std::move(handler), std::move(o.captures)));
  return Probe(this, impl_->alive, id);
}

Result<Probe> Session::probe_async(DomId dom, std::string_view symbol, AsyncHandler handler, AsyncOptions o) {
  Gva addr = XP_TRY(resolve(dom, symbol));
  return probe_async(dom, addr, std::move(handler), std::move(o));
}

Result<RingStats> Session::ring_stats(DomId dom) {
  RingStats s = XP_TRY(impl_->engine->ring_stats(dom));
  // The guest module's own counts are in its control area (the guest channel's): what it
  // refused of our async keys, and the hits it did not notify while Dom0 polled.
  if (impl_->guest)
    if (auto c = impl_->guest->module_counters(dom)) {
      if (s.rings) s.bad_keys = c->async_bad;
      s.notify_skipped = c->notify_skipped;
    }
  return s;
}

Result<void> Session::begin_batch() { return impl_->engine->begin_batch(); }
Result<void> Session::end_batch() { return impl_->engine->end_batch(); }

Result<void> Session::run() {
  impl_->stop = false;
  impl_->engine->clear_stop();
  while (!impl_->stop && !impl_->engine->stop_requested()) XP_TRY(run_once(-1));
  impl_->engine->clear_stop();
  return {};
}

void Session::stop() {
  impl_->stop = true;
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(impl_->wake_fd, &one, sizeof one);
}

Result<void> Session::set_enabled(std::uint64_t id, bool on) { return impl_->engine->set_enabled(id, on); }
Result<void> Session::unregister(std::uint64_t id) { return impl_->engine->remove(id); }
ProbeStats Session::stats(std::uint64_t id) const { return impl_->engine->stats(id); }
Result<ProbeInfo> Session::info(std::uint64_t id) const { return impl_->engine->info(id); }

// ---- test hooks (api/session_testing.hpp) ----

int SessionTesting::journal_fd(Session& s) { return s.impl_->journal ? s.impl_->journal->fd() : -1; }

pid_t SessionTesting::guardian_pid(Session& s) { return s.impl_->guardian ? s.impl_->guardian->pid() : -1; }

int SessionTesting::wait_guardian(Session& s, int ms) {
  return s.impl_->guardian ? s.impl_->guardian->wait_exit(ms) : -1;
}

Result<channel::GuestChannel::ModuleCounters> SessionTesting::module_counters(Session& s, DomId dom) {
  if (!s.impl_->guest) return fail(Errc::InvalidArgument, "the session has no guest channel");
  return s.impl_->guest->module_counters(dom);
}

bool SessionTesting::jumps_prepared(Session& s, DomId dom) { return s.impl_->engine->jumps_prepared(dom); }

void SessionTesting::set_module_clock(Session& s, std::function<std::chrono::steady_clock::time_point()> clock) {
  s.impl_->engine->set_clock(std::move(clock));
}

void SessionTesting::set_spin_clock(Session& s, std::function<std::chrono::steady_clock::time_point()> clock) {
  s.impl_->spin_clock = std::move(clock);
}

std::unique_ptr<hv::Hypervisor> SessionTesting::abandon(std::unique_ptr<Session> s) {
  s->impl_->abandon();
  // The handle goes last, as the process's death would take it (its VIRQ binding and event
  // channels, its ring mappings); the caller keeps it alive if it wants to (the sim's
  // domains do not depend on it).
  std::unique_ptr<hv::Hypervisor> hv = std::move(s->impl_->hv);
  s->impl_->engine.reset();
  s->impl_->guest.reset();
  s->impl_->vmevent.reset();
  s->impl_->vmevent_int3.reset();
  s->impl_->debugger.reset();
  s->impl_->journal.reset();  // unmapped; the caller dup()ed the fd if it wants to read it
  s->impl_->guardian.reset();
  s->impl_->watching = false;
  s.reset();
  return hv;
}

}  // namespace xenprobes
