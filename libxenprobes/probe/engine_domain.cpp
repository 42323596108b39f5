// Domains: attach (module keys, slot pool, channel, journal), symbols and the kernel's tables,
// paging context, detach and forget, and a channel giving a domain up.
#include "probe/engine_internal.hpp"

#include <cinttypes>
#include <random>

#include "mem/paging.hpp"

namespace xenprobes::probe {

Engine::Engine(hv::Hypervisor& hv, channel::Channel& ch)
    : hv_(hv), channel_for_([&ch](DomId) -> Result<channel::Channel*> { return &ch; }) {}

Engine::Engine(hv::Hypervisor& hv, ChannelFor channel_for) : hv_(hv), channel_for_(std::move(channel_for)) {}

Engine::~Engine() {
  batching_ = false;
  for (Domain* d : batch_paused_)
    if (!unpause(*d)) continue;  // logged by unpause()
  batch_paused_.clear();
  for (DomId id : domains()) {
    if (auto r = detach(id); !r) XP_LOG(Error, "domain %u: detach failed: %s", id.value, r.error().what.c_str());
  }
}

std::vector<DomId> Engine::domains() const {
  std::vector<DomId> out;
  for (const auto& [id, d] : domains_) out.push_back(id);
  return out;
}

Result<Engine::Domain*> Engine::domain(DomId id) {
  auto it = domains_.find(id);
  if (it == domains_.end()) return fail(Errc::NoSuchDomain, "domain " + std::to_string(id.value) + " is not attached");
  return it->second.get();
}

Engine::Domain* Engine::domain_of(const Point& p) {
  auto it = domains_.find(p.dom);
  if (it == domains_.end()) return nullptr;
  auto pt = it->second->points.find(p.addr);
  return pt != it->second->points.end() && pt->second.get() == &p ? it->second.get() : nullptr;
}

Result<void> Engine::refresh_context(Domain& d) {
  hv::VcpuRegs r = XP_TRY(hv_.get_vcpu_regs(d.id, VcpuId{0}));
  mem::PagingContext ctx = XP_TRY(mem::paging_context(d.info, r));  // type and width: fixed
  hit_memory_ready_ = false;  // a handler that registers a probe reads its own vCPU's memory next
  // Kernel text is read and written through page tables that map it: with page-table
  // isolation a vCPU in user mode holds tables that map almost none of it.
  Gva probe = d.syms ? d.syms->resolve("_stext").value_or(d.kernel_text) : d.kernel_text;
  auto kernel = mem::use_kernel_page_tables(*d.memory, ctx, d.info.type, probe);
  if (!kernel)
    return fail(Errc::Fault, "domain " + std::to_string(d.id.value) + ": vCPU 0: " + kernel.error().what +
                                 "; retry when it runs in the kernel");
  if (*kernel) XP_LOG(Debug, "domain %u: vCPU 0 holds user page tables (PTI): using their kernel half", d.id.value);
  return {};
}

Result<void> Engine::hit_memory(Domain& d) {
  if (hit_memory_ready_ || !hit_stop_ || hit_stop_->domain != d.id) return {};
  // A channel that reports no cr3 (the guest channel's mailbox: the vCPU is not paused
  // either, it waits in the module) gets it from Xen; its task cannot exit meanwhile.
  hv::VcpuRegs r = hit_stop_->regs;
  if (!r.cr3) r = XP_TRY(hv_.get_vcpu_regs(d.id, hit_stop_->vcpu));
  d.memory->set_context(XP_TRY(mem::paging_context(d.info, r)));
  d.memory->invalidate_translations();
  hit_gs_base_ = r.gs_base;
  hit_memory_ready_ = true;
  return {};
}

Result<void> Engine::attach(DomId id) {
  if (domains_.contains(id)) return {};
  if (domains_.size() >= limits_.domains)
    return fail(Errc::NoSpace, "cannot probe domain " + std::to_string(id.value) + ": this session probes " +
                                   std::to_string(domains_.size()) +
                                   " domains, its limit (SessionLimits::domains; "
                                   "detach one, or open the session with a higher limit)");
  auto d = std::make_unique<Domain>();
  d->id = id;
  hv::DomainInfo info = XP_TRY(hv_.domain_info(id));
  if (info.dying || info.crashed)
    return fail(Errc::NoSuchDomain, "domain " + std::to_string(id.value) + " is dying or crashed");
  d->info = info;
  // Quiescence tokens start at a random point: a quiesce-done left by an earlier session must
  // never match one of ours.
  d->quiesce_next = (std::uint64_t{std::random_device{}()} << 20 ^ std::random_device{}()) + 1;
  d->source = std::make_unique<mem::HypervisorFrameSource>(hv_, id);
  mem::GuestMemoryOptions mo;
  mo.transient_data_writes = info.type == hv::GuestType::Pv;  // see write_transient()
  mo.mapping_cache_frames = limits_.mapped_frames_per_domain;
  d->memory = std::make_unique<mem::GuestMemory>(*d->source, mo);
  XP_TRY(refresh_context(*d));
  d->ch = XP_TRY(channel_for_(id));
  d->traits = d->ch->traits();
  d->table = d->ch->trap_table();
  auto rest = [&]() -> Result<void> {
    if (auto mi = guestmod::read_module_info(hv_, id, guestmod::check_mapped_via(*d->memory))) {
      d->kernel_text = mi->kernel_text;
      if (mi->has_module_text()) d->module_text = {mi->module_text_start.value, mi->module_text_end.value};
      d->pool = std::make_unique<OeaPool>(XP_TRY(OeaPool::create(mi->areas, OeaPoolOptions{kSlotSize, 0})));
      d->fixup = mi->fixup_slots;
      d->jump_entry = mi->jump_entry;
      // Short jumps to islands: only a module that restores islands (features) gets them.
      if (auto f = guestmod::read_features(hv_, id); f && d->jump_entry)
        d->jump_islands = (*f & XENPROBES_FEATURE_JUMP_ISLAND) != 0;
      // The functions the module's hit path calls: malformed, and the guest channel refuses
      // every probe (address_rules.hpp); the other channels do not need them.
      if (auto hp = guestmod::read_hook_path(hv_, id)) {
        d->hook_path = std::move(*hp);
      } else {
        d->hook_path_error = hp.error().what;
        if (d->traits.guest_int3)
          XP_LOG(Warn, "domain %u: every probe is refused on the guest channel: %s", id.value, hp.error().what.c_str());
      }
      // The rings only serve async probes: malformed ones refuse those, nothing else.
      if (auto ri = guestmod::read_rings_info(hv_, id, *mi)) {
        d->rings_info = *ri;
      } else {
        d->rings_refused = ri.error().what;
        XP_LOG(Warn, "domain %u: no async probes: %s", id.value, ri.error().what.c_str());
      }
    } else if (!d->traits.can_emulate || mi.error().code != Errc::NotFound) {
      return std::unexpected(mi.error());
    } else {
      // Agentless: no guest module, so no slots; the hypervisor runs the original instructions.
      XP_LOG(Info, "domain %u: no guest module; probing agentless through the %s channel", id.value, d->ch->name());
    }
    return d->ch->attach(id);
  };
  if (auto r = rest(); !r) {
    // The selector may have attached it already (and journaled it).
    if (d->ch->detach(id) && journal_) journal_->remove_domain(id);
    return r;
  }
  d->journaled = journal_ && journal_->has_domain(id);
  domains_[id] = std::move(d);
  return {};
}

Result<void> Engine::set_symbols(DomId id, symbols::SymbolTable t) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->kernel_text.value) XP_TRY(t.slide_from_text(d->kernel_text));
  d->syms = std::move(t);
  // What jump probes knew of the kernel came from the symbols before (the index per build is
  // kept by the process: reading it again costs a read of the text), and no image is theirs.
  d->jump_index.reset();
  d->image.reset();
  // The kernel's own tables, through vCPU 0's current page tables (the domain may be paused
  // in a batch: pause() took them then).
  if (d->pause_depth == 0) {
    if (auto r = refresh_context(*d); !r) {
      d->syms.reset();
      return r;
    }
  }
  mem::GuestMemory& m = *d->memory;
  const kernel::ReadFn read = [&m](Gva a, std::span<std::byte> out) { return m.read(a, out); };
  d->tables = kernel::KernelTables::read(*d->syms, read);
  // The loaded modules (their text is probed under the same rules, their functions join the
  // symbols): walked now, and again when the list changed (engine_modules.cpp).
  d->generation_ready = false;
  update_modules(*d);
  XP_LOG(Info, "domain %u: guest kernel tables: %s", id.value, d->tables->summary().c_str());
  return {};
}

Result<void> Engine::set_kernel_image(DomId id, std::shared_ptr<const symbols::KernelImage> img) {
  Domain* d = XP_TRY(domain(id));
  d->image = std::move(img);
  d->jump_index.reset();
  return {};
}

Result<channel::Channel*> Engine::channel_of(DomId id) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  return d->ch;
}

std::optional<Gva> Engine::published_kernel_text(DomId id) const {
  auto it = domains_.find(id);
  if (it == domains_.end() || it->second->kernel_text.value == 0) return std::nullopt;
  return it->second->kernel_text;
}

const symbols::SymbolTable* Engine::symbols(DomId id) const {
  auto it = domains_.find(id);
  return it != domains_.end() && it->second->syms ? &*it->second->syms : nullptr;
}

void Engine::forget(DomId id) {
  auto it = domains_.find(id);
  if (it == domains_.end()) return;
  std::erase(batch_paused_, it->second.get());
  for (auto p = probes_.begin(); p != probes_.end();) {
    if (p->second->point->dom == id) p = probes_.erase(p);
    else ++p;
  }
  channel::Channel* ch = it->second->ch;
  domains_.erase(it);
  std::erase_if(returned_records_, [&](const auto& r) { return r.first == id; });
  // A channel that could not let go (vm_event vCPUs still waiting) keeps the domain in the
  // journal: the guardian tears that down should this process die.
  if (auto r = ch->detach(id); r && journal_) journal_->remove_domain(id);
}

void Engine::abandon() {
  batching_ = false;
  batch_paused_.clear();
  probes_.clear();
  domains_.clear();  // no detach, no restore: the guests keep what we left in them
}

Result<void> Engine::detach(DomId id) {
  Domain* d = XP_TRY(domain(id));
  {
    auto hold = Pause::take(*this, *d);
    if (!hold) {
      if (hold.error().code == Errc::NoSuchDomain) {
        forget(id);
        return {};
      }
      return std::unexpected(hold.error());
    }
    for (auto& [addr, p] : d->points)
      if (p->armed) XP_TRY(disarm(*d, *p));
    // Stops that landed before the bytes went back are resumed now (rewound or sent on).
    XP_TRY(flush(*d));
    restore_returns(*d, nullptr);
    neutralize_slot_traps(*d);
    for (auto& [addr, p] : d->points) {
      p->armed = false;
      release_slot(*d, *p);
    }
    if (d->trampoline) {
      d->trampoline_patch.forget();
      if (auto r = d->pool->release(*d->trampoline); !r)
        XP_LOG(Warn, "domain %u: trampoline slot: %s", d->id.value, r.error().what.c_str());
      d->trampoline.reset();
    }
  }
  // The islands of the short jumps just taken out, after a quiescence (bounded, 2 s: a guest
  // that does not run keeps them: 5 bytes of dead padding that nothing reaches any more, jumping
  // into the guest module's area).
  advance_islands(*d, 2000);
  if (!d->islands_returning.empty())
    XP_LOG(Warn,
           "domain %u: %zu islands not given back (the guest module confirmed no quiescence within 2 s): left in "
           "dead padding, which nothing reaches",
           d->id.value, d->islands_returning.size());
  forget(id);
  return {};
}

void Engine::on_channel_failure(DomId id, const Error& e) {
  auto it = domains_.find(id);
  if (it == domains_.end()) return;
  Domain& d = *it->second;
  d.failed = e;
  auto hold = Pause::take(*this, d);
  if (!hold) XP_LOG(Error, "domain %u: cannot pause it to disarm: %s", id.value, hold.error().what.c_str());
  restore_returns(d, nullptr);
  for (auto& [addr, p] : d.points) {
    if (auto r = disarm(d, *p); !r)
      XP_LOG(Error, "domain %u: cannot restore %s: %s", id.value, hex(addr.value).c_str(), r.error().what.c_str());
    for (Registration* reg : p->regs) reg->enabled = false;
  }
  neutralize_slot_traps(d);  // nobody will answer a slot's trap any more
  XP_LOG(Error, "domain %u: every probe disarmed: %s", id.value, e.what.c_str());
}

}  // namespace xenprobes::probe
