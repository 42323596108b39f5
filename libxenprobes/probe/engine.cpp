#include "common/hex.hpp"
#include "probe/engine.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>

#include "common/log.hpp"
#include "mem/paging.hpp"
#include "x86/relocate.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::probe {
namespace {

constexpr std::uint64_t kMaxFunctionBytes = 256 * 1024;  // larger "functions" are symbol gaps
constexpr int kMaxActive = 4096;
constexpr std::size_t kMaxInstanceData = 4096;
// Where calls that lost their instance return to is remembered for this many stack slots.
constexpr std::size_t kReturnedMemory = 4096;


x86::CpuState cpu_state(const Regs& r) {
  x86::CpuState s;
  s.gpr = {r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi,
           r.r8,  r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15};
  s.rflags = r.rflags;
  s.fs_base = r.fs_base;
  s.gs_base = r.gs_base;
  return s;
}

ExecMode exec_mode(x86::Plan p, bool trap_tail) {
  switch (p) {
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel:
      return trap_tail ? ExecMode::TrapAfter : ExecMode::Boosted;
    case x86::Plan::Skip:
      return ExecMode::Skipped;
    default:
      return ExecMode::Emulated;
  }
}

}  // namespace

// ---- pausing -------------------------------------------------------------------------

// Holds one pause of a domain for its lifetime; nested holds pause Xen only once. A failed
// unpause is retried: leaving a guest paused is the one failure a probe must never cause.
class Engine::Pause {
 public:
  static Result<Pause> take(Engine& e, Domain& d) {
    XP_TRY(e.pause(d));
    return Pause(e, d);
  }
  Pause(Pause&& o) noexcept : e_(o.e_), d_(std::exchange(o.d_, nullptr)) {}
  Pause& operator=(Pause&&) = delete;
  ~Pause() {
    if (d_) (void)e_.unpause(*d_);
  }

 private:
  Pause(Engine& e, Domain& d) : e_(e), d_(&d) {}
  Engine& e_;
  Domain* d_;
};

Result<void> Engine::pause(Domain& d) {
  auto first = [&]() -> Result<void> {
    // Journaled before the pause: a process killed right after it leaves the guardian a
    // pause to release (it releases one only while the domain is still paused).
    if (d.journaled) journal_->set_held_pause(d.id, true);
    if (auto p = hv_.pause(d.id); !p) {
      if (d.journaled) journal_->set_held_pause(d.id, false);
      return p;
    }
    // Paused, vCPU 0's page tables cannot go away: walk those, with nothing cached from
    // before (the guest ran).
    if (auto r = refresh_context(d); !r) {
      d.memory->invalidate_translations();
      if (auto u = hv_.unpause(d.id); !u && u.error().code != Errc::NoSuchDomain)
        XP_LOG(Error, "domain %u: could not unpause: %s", d.id.value, u.error().what.c_str());
      else if (d.journaled)
        journal_->set_held_pause(d.id, false);
      return r;
    }
    return {};
  };
  if (batching_ && std::find(batch_paused_.begin(), batch_paused_.end(), &d) == batch_paused_.end()) {
    // The batch's own hold, released by end_batch().
    if (d.pause_depth == 0) XP_TRY(first());
    d.pause_depth++;
    batch_paused_.push_back(&d);
  }
  if (d.pause_depth == 0) XP_TRY(first());
  d.pause_depth++;
  return {};
}

Result<void> Engine::unpause(Domain& d) {
  if (d.pause_depth == 0) return {};
  if (--d.pause_depth > 0) return {};
  Result<void> r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = hv_.unpause(d.id);
    if (r || r.error().code == Errc::NoSuchDomain) {
      if (d.journaled) journal_->set_held_pause(d.id, false);
      return {};
    }
    XP_LOG(Warn, "domain %u: unpause failed (%s), retrying", d.id.value, r.error().what.c_str());
  }
  XP_LOG(Error, "domain %u: could not unpause: %s", d.id.value, r.error().what.c_str());
  return r;
}

Result<void> Engine::begin_batch() {
  if (batching_) return fail(Errc::Busy, "a batch is already open");
  batching_ = true;
  return {};
}

Result<void> Engine::end_batch() {
  if (!batching_) return fail(Errc::InvalidArgument, "no batch is open");
  batching_ = false;
  Result<void> r;
  for (Domain* d : batch_paused_)
    if (auto u = unpause(*d); !u) r = u;
  batch_paused_.clear();
  return r;
}

// ---- handler context ---------------------------------------------------------------

class Engine::Ctx final : public HitContext {
 public:
  Ctx(Engine& e, Domain& d, const channel::Stop& s, Regs& regs, Gva addr)
      : e_(e), d_(d), vcpu_(s.vcpu), regs_(regs), addr_(addr) {}
  DomId domain() const override { return d_.id; }
  VcpuId vcpu() const override { return vcpu_; }
  Gva address() const override { return addr_; }
  Regs& regs() override { return regs_; }
  Result<void> read(Gva va, std::span<std::byte> out) override {
    XP_TRY(e_.hit_memory(d_));
    return d_.memory->read(va, out);
  }
  // Handlers write stacks and data the guest frees and reuses: no writable mapping stays.
  Result<void> write(Gva va, std::span<const std::byte> data) override {
    XP_TRY(e_.hit_memory(d_));
    return d_.memory->write_transient(va, data);
  }
  Result<std::uint64_t> read_u64(Gva va) override {
    XP_TRY(e_.hit_memory(d_));
    return d_.memory->read_u64(va);
  }
  Result<std::string> read_string(Gva va, std::size_t max_len) override {
    XP_TRY(e_.hit_memory(d_));
    return d_.memory->read_string(va, max_len);
  }
  void stop() override { e_.request_stop(); }

 private:
  Engine& e_;
  Domain& d_;
  VcpuId vcpu_;
  Regs& regs_;
  Gva addr_;
};

// ---- construction, domains ----------------------------------------------------------

Engine::Engine(hv::Hypervisor& hv, channel::Channel& ch)
    : hv_(hv), channel_for_([&ch](DomId) -> Result<channel::Channel*> { return &ch; }) {}

Engine::Engine(hv::Hypervisor& hv, ChannelFor channel_for) : hv_(hv), channel_for_(std::move(channel_for)) {}

Engine::~Engine() {
  batching_ = false;
  for (Domain* d : batch_paused_) (void)unpause(*d);
  batch_paused_.clear();
  for (DomId id : domains()) {
    if (auto r = detach(id); !r)
      XP_LOG(Error, "domain %u: detach failed: %s", id.value, r.error().what.c_str());
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
  d.memory->set_context(ctx);
  d.memory->invalidate_translations();
  hit_memory_ready_ = false;  // a handler that registers a probe reads its own vCPU's memory next
  // Kernel text is read and written through page tables that map it. With page-table
  // isolation (HVM/PVH guests on CPUs affected by Meltdown) a vCPU in user mode holds the
  // user page tables, which map almost none of it. Linux allocates the kernel's and the
  // user's top-level tables as an 8 KiB pair, the kernel's first (PGD_ALLOCATION_ORDER with
  // CONFIG_PAGE_TABLE_ISOLATION; the user one is selected by bit 12 of cr3), so the kernel's
  // are the user's with bit 12 clear. PV guests need none of this: Xen reports the kernel's
  // table in cr3 whatever mode the vCPU is in.
  constexpr std::uint64_t kPtiUserBit = 1ull << 12;
  Gva probe = d.syms ? d.syms->resolve("_stext").value_or(d.kernel_text) : d.kernel_text;
  if (d.info.type != hv::GuestType::Pv && probe.value && (ctx.cr3 & kPtiUserBit) && !d.memory->translate(probe)) {
    mem::PagingContext kernel = ctx;
    kernel.cr3 &= ~kPtiUserBit;
    d.memory->set_context(kernel);
    d.memory->invalidate_translations();
    if (!d.memory->translate(probe)) {
      d.memory->set_context(ctx);
      d.memory->invalidate_translations();
      return fail(Errc::Fault, "domain " + std::to_string(d.id.value) + ": the kernel's text at " + hex(probe.value) +
                                   " is mapped neither by vCPU 0's page tables (cr3 " + hex(ctx.cr3) +
                                   ") nor by their kernel half (page-table isolation); retry when it runs in the kernel");
    }
    XP_LOG(Debug, "domain %u: vCPU 0 holds user page tables (PTI): using their kernel half", d.id.value);
  }
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
  hit_memory_ready_ = true;
  return {};
}

Result<void> Engine::attach(DomId id) {
  if (domains_.contains(id)) return {};
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
  d->memory = std::make_unique<mem::GuestMemory>(*d->source, mo);
  XP_TRY(refresh_context(*d));
  d->ch = XP_TRY(channel_for_(id));
  auto rest = [&]() -> Result<void> {
    if (auto mi = read_module_info(hv_, id, check_mapped_via(*d->memory))) {
      d->kernel_text = mi->kernel_text;
      if (mi->has_module_text()) d->module_text = {mi->module_text_start.value, mi->module_text_end.value};
      d->pool = std::make_unique<OeaPool>(XP_TRY(OeaPool::create(mi->areas, OeaPoolOptions{kSlotSize, 0})));
    } else if (!d->ch->can_emulate() || mi.error().code != Errc::NotFound) {
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
  // The kernel's own tables, through vCPU 0's current page tables (the domain may be paused
  // in a batch: pause() took them then).
  if (d->pause_depth == 0) {
    if (auto r = refresh_context(*d); !r) {
      d->syms.reset();
      return r;
    }
  }
  mem::GuestMemory& m = *d->memory;
  d->tables = kernel::KernelTables::read(*d->syms, [&m](Gva a, std::span<std::byte> out) { return m.read(a, out); });
  XP_LOG(Info, "domain %u: guest kernel tables: %s", id.value, d->tables->summary().c_str());
  return {};
}

Result<channel::Channel*> Engine::channel_of(DomId id) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  return d->ch;
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
    if (p->second->point->dom == id)
      p = probes_.erase(p);
    else
      ++p;
  }
  channel::Channel* ch = it->second->ch;
  domains_.erase(it);
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

Result<void> Engine::journal_patch(Domain& d, PatchKind kind, Gva at, std::span<const std::uint8_t> written,
                                   std::span<const std::uint8_t> restore, Gva resume) {
  if (!d.journaled) return {};
  return journal_->add_patch(d.id, kind, at, written, restore, resume);
}

void Engine::unjournal_patch(Domain& d, Gva at) {
  if (d.journaled) journal_->remove_patch(d.id, at);
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
      d->ch->trap_removed(d->id, *d->trampoline);
      unjournal_patch(*d, *d->trampoline);
      (void)d->pool->release(*d->trampoline);
      d->trampoline.reset();
    }
  }
  forget(id);
  return {};
}

// ---- registration ---------------------------------------------------------------------

kernel::RuleContext Engine::rule_context(const Domain& d) const {
  kernel::RuleContext c;
  c.tables = d.tables ? &*d.tables : nullptr;
  c.syms = d.syms ? &*d.syms : nullptr;
  c.module_text = d.module_text;
  c.guest_channel = d.ch && std::string_view(d.ch->name()) == "guest";
  return c;
}

Result<std::vector<std::uint8_t>> Engine::read_text(Domain& d, Gva start, std::uint64_t size) {
  std::vector<std::uint8_t> bytes(size);
  XP_TRY(d.memory->read(start, std::as_writable_bytes(std::span(bytes))));
  // Bytes we patched ourselves read back as the original instruction.
  for (auto& [a, q] : d.points)
    if (q->armed && a.value >= start.value && a.value < start.value + size) bytes[a.value - start.value] = q->original[0];
  return bytes;
}

Result<kernel::EntryPlacement> Engine::place(Domain& d, Gva addr) {
  if (!d.syms) return kernel::EntryPlacement{addr, {}};
  auto fn = d.syms->function_containing(addr);
  if (!fn || fn->start != addr || fn->size == 0 || fn->size > kMaxFunctionBytes) return kernel::EntryPlacement{addr, {}};
  // Only the first instructions matter: read a little, not the whole function.
  if (d.pause_depth == 0) XP_TRY(refresh_context(d));
  auto bytes = XP_TRY(read_text(d, fn->start, std::min<std::uint64_t>(fn->size, 2 * x86::kMaxInsnLen + 8)));
  std::vector<x86::Insn> head;
  std::size_t off = 0;
  while (head.size() < 2 && off < bytes.size()) {
    auto i = x86::decode(std::span(bytes).subspan(off), Gva{fn->start.value + off});
    if (!i) break;
    off += i->length;
    head.push_back(*i);
  }
  auto placed = kernel::place_entry_probe(rule_context(d), head, addr);
  if (!placed.moved_because.empty())
    XP_LOG(Info, "domain %u: a probe asked for at %s goes to %s: %s", d.id.value, fn->name.c_str(),
           d.syms->symbolize(placed.address).c_str(), placed.moved_because.c_str());
  return placed;
}

Result<void> Engine::decode_probe_point(Domain& d, Point& p) {
  const Gva addr = p.addr;
  std::vector<x86::Insn> fn_insns;
  if (!d.syms)
    return fail(Errc::InvalidArgument,
                hex(addr.value) + ": refused by rule 'no-symbols': without the guest kernel's symbols neither the "
                "instruction boundary nor the kernel's own tables can be checked (call load_symbols() with its "
                "System.map or kallsyms first)");
  auto fn = d.syms->function_containing(addr);
  if (!fn || fn->size == 0 || fn->size > kMaxFunctionBytes) {
    // No function to decode from: the address rules say why (data, a gap, not text).
    x86::Insn bare;
    bare.address = addr;
    bare.length = 1;
    auto r = kernel::check_address(rule_context(d), bare, nullptr);
    std::string where = d.syms->symbolize(addr);
    if (where != hex(addr.value)) where += " (" + hex(addr.value) + ")";
    if (r) return fail(r->code, r->message(where));
    return fail(Errc::InvalidArgument, where + ": no function symbol covers it");
  }
  auto bytes = XP_TRY(read_text(d, fn->start, fn->size));
  auto insn = x86::decode_at(bytes, fn->start, addr);
  if (!insn) {
    Error e = insn.error();
    e.what = fn->name + ": " + e.what;
    return std::unexpected(e);
  }
  p.insn = *insn;
  if (auto all = x86::decode_function(bytes, fn->start)) fn_insns = std::move(*all);
  const std::string where = d.syms->symbolize(addr) + " (" + hex(addr.value) + ")";
  if (auto r = kernel::check_address(rule_context(d), p.insn, &*fn)) return fail(r->code, r->message(where));
  // Somebody else's breakpoint on the way from the function's start (an in-guest kprobe, a
  // debugger) hides the instruction it replaced, so the boundary check above may have walked
  // through garbage. An int3 right after ret or jmp is padding (straight-line-speculation
  // hardening puts one after every ret); one in the flow is not ours to reason about.
  for (std::size_t k = 0; k < fn_insns.size() && fn_insns[k].address.value <= addr.value; ++k) {
    const x86::Insn& i = fn_insns[k];
    if (!x86::is_trap_byte(i) || d.points.contains(i.address)) continue;
    bool padding = k > 0 && (fn_insns[k - 1].branch == x86::BranchKind::Ret ||
                             fn_insns[k - 1].branch == x86::BranchKind::Jmp ||
                             fn_insns[k - 1].branch == x86::BranchKind::JmpIndirect || x86::is_trap_byte(fn_insns[k - 1]));
    if (!padding)
      return fail(Errc::Busy, where + ": refused by rule 'foreign-trap': another breakpoint (an in-guest kprobe or "
                                      "debugger) at " + d.syms->symbolize(i.address) +
                                      " hides the instruction it replaced, so the instruction boundaries of " +
                                      fn->name + " cannot be trusted; no channel accepts it until it is gone");
  }
  std::copy(p.insn.bytes.begin(), p.insn.bytes.end(), p.original.begin());
  p.plan = XP_TRY(x86::analyze(p.insn));

  // On a channel that recognises stops by rip == trap + 1, a vCPU must never stand at
  // addr + 1 for any other reason. For a 1-byte instruction that is exactly where it would
  // continue, so the next instruction runs from the slot as well, and addr + 1 must not be a
  // branch target (a vCPU jumping there would look stopped).
  if (!d.ch->stops_found_by_rip() || p.insn.length != 1) return {};
  auto refuse = [&](const std::string& why) {
    return fail(Errc::InvalidArgument, p.insn.describe() + ": a 1-byte instruction " + why +
                                           " (on the debugger channel a vCPU standing right after "
                                           "it cannot be told apart from one stopped on the probe)");
  };
  if (fn_insns.empty()) return refuse("needs the function's symbols to be probed");
  Gva after = p.insn.next();
  auto it = std::find_if(fn_insns.begin(), fn_insns.end(), [&](const x86::Insn& i) { return i.address == after; });
  if (it == fn_insns.end()) return refuse("ends its function");
  for (const auto& i : fn_insns)
    if (i.is_relative_branch() && i.branch_target == after) return refuse("is followed by a branch target");
  // Jump tables: `jmp *table(,%reg,8)` — read the table's entries while they point into the
  // function (a compiler's switch table is bounded by the cmp before the jump).
  const std::uint64_t fn_lo = fn_insns.front().address.value, fn_hi = fn_insns.back().next().value;
  for (const auto& i : fn_insns) {
    if (i.branch != x86::BranchKind::JmpIndirect || !i.mem.present || i.mem.base != x86::Reg::None ||
        i.mem.index == x86::Reg::None || i.mem.scale != 8)
      continue;
    std::uint64_t table = static_cast<std::uint64_t>(i.mem.disp);
    for (unsigned k = 0; k < 1024; ++k) {
      auto e = d.memory->read_u64(Gva{table + 8ull * k});
      if (!e || *e < fn_lo || *e >= fn_hi) break;
      if (*e == after.value) return refuse("is followed by a jump-table target");
    }
  }
  // An emulated 1-byte instruction (ret) never continues at addr + 1 through us: nothing to copy.
  if (p.plan == x86::Plan::EmulateLoaded || p.plan == x86::Plan::EmulateBranch) return {};
  if (d.points.contains(after)) return fail(Errc::Busy, p.insn.describe() + ": the next instruction is probed already");
  auto next_plan = x86::analyze(*it);
  if (!next_plan) return refuse("is followed by an instruction that cannot be probed (" + it->describe() + ")");
  // The next instruction runs out of line too (or is emulated): the address rules hold for it
  // as for the probed one.
  if (auto r = kernel::check_address(rule_context(d), *it, &*fn))
    return fail(r->code, where + ": a 1-byte instruction whose neighbour runs out of line with it on the debugger "
                                 "channel; the neighbour " + r->message(d.syms->symbolize(it->address)));
  p.next = *it;
  p.next_plan = *next_plan;  // a branch (pop; ret) is emulated at a trap after the copy
  if (p.plan == x86::Plan::Skip) p.plan = x86::Plan::Boost;  // a 1-byte nop: copy it with the next
  return {};
}

bool Engine::uses_slot(const Point& p) const {
  return !p.agentless && (p.plan == x86::Plan::Boost || p.plan == x86::Plan::BoostRipRel);
}

bool Engine::needs_trap_tail(const Point& p) const {
  if (next_emulated(p)) return true;
  return std::any_of(p.regs.begin(), p.regs.end(), [](const Registration* r) { return bool(r->post); });
}

bool Engine::any_enabled(const Point& p) const {
  return std::any_of(p.regs.begin(), p.regs.end(), [](const Registration* r) { return r->enabled; });
}

Result<void> Engine::write_slot(Domain& d, Point& p, bool trap_tail, std::array<std::uint8_t, 32>* before) {
  static_assert(kSlotSize == 32);
  Gva slot = XP_TRY(allocate_slot(d));
  if (before) {
    if (auto r = d.memory->read(slot, std::as_writable_bytes(std::span(*before))); !r) {
      (void)d.pool->release(slot);
      return r;
    }
  }
  std::array<std::uint8_t, kSlotSize> code{};
  code.fill(0xcc);  // never executed: pads the slot
  // Layout: [insn][jmp back] or [insn][trap]; with a continuation (p.next, see
  // decode_probe_point): [insn][next][jmp back] or [insn][trap][pad][next][jmp back]; with an
  // emulated next instruction: [insn][trap] (Dom0 emulates it at the trap).
  if (next_emulated(p)) trap_tail = true;
  const bool continuation = p.next && !next_emulated(p);
  Gva resume = p.insn.next();
  auto emitted = x86::emit_slot(code, slot, p.insn, p.insn.next(),
                                trap_tail || continuation ? x86::SlotTail::Trap : x86::SlotTail::JmpBack,
                                d.ch->trap_byte());
  if (emitted && continuation) {
    // Without a trap tail the copy of the next instruction overwrites the trap byte. After a
    // trap it starts one byte later: a vCPU sent there must not stand at trap + 1, which is
    // what a stop on that trap looks like.
    std::size_t at = trap_tail ? *emitted + 1 : p.insn.length;
    resume = slot + at;
    emitted = x86::emit_slot(std::span(code).subspan(at), resume, *p.next, p.next->next(), x86::SlotTail::JmpBack,
                             d.ch->trap_byte());
  }
  if (!emitted) {
    (void)d.pool->release(slot);
    return std::unexpected(emitted.error());
  }
  if (auto w = d.memory->write(slot, std::as_bytes(std::span(code))); !w) {
    (void)d.pool->release(slot);
    return w;
  }
  std::optional<Gva> old = p.slot;
  bool old_tail = p.trap_tail;
  p.slot = slot;
  p.trap_tail = trap_tail;
  if (trap_tail) {
    SlotTrap st{&p, resume, p.insn.next(), std::nullopt, x86::Plan::EmulateBranch};
    channel::TrapEntry te;
    te.addr = slot + p.insn.length;
    te.fallback = channel::TrapEntry::Fallback::ResumeAt;
    te.resume_at = resume;
    if (next_emulated(p)) {
      st.emulate_next = p.next;
      st.emulate_plan = p.next_plan;
      te.fallback = channel::TrapEntry::Fallback::Emulate;
      te.len = p.next->length;
      std::copy(p.next->bytes.begin(), p.next->bytes.end(), te.insn);
    }
    // Known to the channel before any vCPU can reach it: none is sent to the slot yet.
    if (auto r = d.ch->trap_added(d.id, te); !r) {
      (void)d.pool->release(slot);
      return r;
    }
    if (d.journaled) {
      // What the guardian puts there: the jump neutralize_slot_traps() would write.
      std::array<std::uint8_t, 5> jmp{};
      auto n = x86::emit_jmp_rel32(jmp, te.addr, st.original_next);
      std::size_t off = te.addr.value - slot.value;
      Result<void> j = n ? journal_patch(d, PatchKind::SlotTrap, te.addr, std::span(code).subspan(off, 5), jmp,
                                         st.original_next)
                         : Result<void>(std::unexpected(n.error()));
      if (!j) {
        d.ch->trap_removed(d.id, te.addr);
        (void)d.pool->release(slot);
        return j;
      }
    }
    d.slot_traps[te.addr] = st;
  }
  if (old) {  // an armed point switches slots: the old one stays valid until reclaimed
    if (old_tail) d.slot_traps[*old + p.insn.length].point = nullptr;
    release_ran_slot(d, *old);
  }
  return {};
}

Result<void> Engine::refresh_areas(Domain& d) {
  ModuleInfo mi = XP_TRY(read_module_info(hv_, d.id, check_mapped_via(*d.memory)));
  auto added = XP_TRY(added_areas(mi, d.pool->areas()));
  for (const OeaArea& a : added) XP_TRY(d.pool->add_area(a));
  if (!added.empty()) d.growth_requested = false;
  return {};
}

Result<Gva> Engine::allocate_slot(Domain& d) {
  if (d.pool->clean() == 0 && d.pool->dirty() > 0) XP_TRY(reclaim_slots(d));
  auto slot = d.pool->allocate();
  if (!slot && slot.error().code == Errc::NoSpace) {
    // The module may have published an area since we asked (or answer at once).
    if (!d.growth_requested && d.pool->areas().size() < XENPROBES_OEA_MAX_AREAS &&
        request_growth(hv_, d.id, d.pool->areas().back().size))
      d.growth_requested = true;
    if (d.growth_requested && refresh_areas(d)) slot = d.pool->allocate();
    if (!slot && !d.quiesce_wait.empty()) {
      Error e = slot.error();
      e.what += "; " + std::to_string(d.quiesce_wait.size()) +
                " released slots wait for the guest module to confirm quiescence (the guest must run)";
      if (d.growth_requested) e.what += "; asked the guest module for another area too";
      return std::unexpected(e);
    }
    if (!slot && d.growth_requested) {
      Error e = slot.error();
      e.what += "; asked the guest module for another area: retry once it has published it";
      return std::unexpected(e);
    }
  }
  if (slot && d.pool->wants_growth() && !d.growth_requested &&
      request_growth(hv_, d.id, d.pool->areas().back().size))
    d.growth_requested = true;  // ahead of need: the module answers asynchronously
  return slot;
}

channel::TrapEntry Engine::trap_entry(const Point& p) const {
  channel::TrapEntry e;
  e.addr = p.addr;
  e.len = p.insn.length;
  std::copy(p.original.begin(), p.original.begin() + p.insn.length, e.insn);
  switch (p.plan) {
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel:
      if (p.slot) {
        e.fallback = channel::TrapEntry::Fallback::ResumeAt;
        e.resume_at = *p.slot;  // the slot runs the original instruction
      } else {
        e.fallback = channel::TrapEntry::Fallback::Emulate;
      }
      break;
    case x86::Plan::Skip:
      e.fallback = channel::TrapEntry::Fallback::ResumeAt;
      e.resume_at = p.insn.next();
      break;
    case x86::Plan::EmulateBranch:
    case x86::Plan::EmulateLoaded:
      e.fallback = channel::TrapEntry::Fallback::Emulate;
      break;
  }
  return e;
}

Result<void> Engine::arm(Domain& d, Point& p) {
  if (p.armed) return {};
  // Never a trap over bytes we did not decode: the guest may have rewritten the instruction
  // since (a static key flipped while the probe was disabled, a module unloaded and another
  // loaded at the address). Its slot copy would then run the old instruction.
  {
    std::array<std::uint8_t, x86::kMaxInsnLen> now{};
    XP_TRY(d.memory->read(p.addr, std::as_writable_bytes(std::span(now.data(), p.insn.length))));
    if (!std::equal(now.begin(), now.begin() + p.insn.length, p.original.begin()))
      return fail(Errc::Again, hex(p.addr.value) + ": refused by rule 'text-changed': the guest rewrote the instruction "
                               "since it was decoded (" + p.insn.describe() + " now reads " +
                               hex_bytes(std::span(now.data(), p.insn.length)) +
                               "); unregister the probe and register it again to decode it afresh");
  }
  // The channel learns of the trap before the guest can execute it.
  XP_TRY(d.ch->trap_added(d.id, trap_entry(p)));
  std::uint8_t b = d.ch->trap_byte();
  if (auto j = journal_patch(d, PatchKind::Text, p.addr, std::span(&b, 1), std::span(p.original.data(), 1), p.addr);
      !j) {
    if (!p.flush_pending) d.ch->trap_removed(d.id, p.addr);
    return j;
  }
  if (auto w = d.memory->write(p.addr, std::as_bytes(std::span(&b, 1))); !w) {
    if (!p.flush_pending) {
      d.ch->trap_removed(d.id, p.addr);
      unjournal_patch(d, p.addr);
    }
    return w;
  }
  p.armed = true;
  return {};
}

Result<void> Engine::disarm(Domain& d, Point& p) {
  if (!p.armed) return {};
  XP_LOG(Debug, "domain %u: disarm %s", d.id.value, hex(p.addr.value).c_str());
  // Restore only our own byte: if the guest rewrote the site meanwhile, writing the saved
  // byte back would corrupt its new instruction.
  std::uint8_t now = XP_TRY(d.memory->read_u8(p.addr));
  if (now == d.ch->trap_byte()) {
    XP_TRY(d.memory->write(p.addr, std::as_bytes(std::span(p.original.data(), 1))));
  } else {
    XP_LOG(Warn, "domain %u: %s holds %s, not our trap byte: the guest rewrote it; left as it is (rule 'text-changed')",
           d.id.value, hex(p.addr.value).c_str(), hex(now).c_str());
    ++d.text_changed;
  }
  p.armed = false;
  p.flush_pending = true;
  return {};
}

Result<void> Engine::flush(Domain& d) {
  XP_TRY(d.ch->flush(d.id, *this));
  // No vCPU is stopped on a restored byte any more: the channel may forget it.
  for (auto& [addr, p] : d.points) {
    if (p->flush_pending && !p->armed) {
      d.ch->trap_removed(d.id, addr);
      unjournal_patch(d, addr);
    }
    p->flush_pending = false;
  }
  return {};
}

void Engine::neutralize_slot_traps(Domain& d) {
  for (const auto& [trap, st] : d.slot_traps) {
    std::array<std::uint8_t, 5> jmp{};
    auto n = x86::emit_jmp_rel32(jmp, trap, st.original_next);
    Result<void> w = n ? d.memory->write(trap, std::as_bytes(std::span(jmp))) : Result<void>(std::unexpected(n.error()));
    if (!w)
      XP_LOG(Error, "domain %u: cannot turn the slot trap at %s into a jump: %s", d.id.value, hex(trap.value).c_str(),
             w.error().what.c_str());
  }
}

void Engine::release_slot(Domain& d, Point& p) {
  if (!p.slot) return;
  if (p.trap_tail) {
    auto it = d.slot_traps.find(*p.slot + p.insn.length);
    if (it != d.slot_traps.end()) it->second.point = nullptr;
  }
  release_ran_slot(d, *p.slot);
  p.slot.reset();
}

void Engine::release_ran_slot(Domain& d, Gva slot) {
  if (!d.pool->release(slot)) return;
  d.quiesce_wait[slot.value] = d.quiesce_next;
}

void Engine::advance_quiescence(Domain& d) {
  if (d.quiesce_asked) {
    auto done = hv_.xs_read(module_key(d.id, XENPROBES_XS_QUIESCE_DONE));
    // Hostile input: only the exact token we asked for counts.
    if (done && *done == std::to_string(*d.quiesce_asked)) {
      std::erase_if(d.quiesce_wait, [&](const auto& e) { return e.second <= *d.quiesce_asked; });
      d.quiesce_asked.reset();
    }
  }
  if (!d.quiesce_wait.empty() && !d.quiesce_asked) {
    std::uint64_t token = d.quiesce_next;
    if (auto w = hv_.xs_write(module_key(d.id, XENPROBES_XS_QUIESCE_REQUEST), std::to_string(token)); w) {
      d.quiesce_asked = token;
      ++d.quiesce_next;
    } else {
      XP_LOG(Warn, "domain %u: cannot ask the guest module for quiescence: %s", d.id.value, w.error().what.c_str());
    }
  }
}

Result<void> Engine::reclaim_slots(Domain& d) {
  if (!d.pool) return {};
  // With the domain paused: a dirty slot no vCPU is inside can be reused, once the guest
  // module has confirmed that no preempted task is inside either.
  advance_quiescence(d);
  std::vector<std::uint64_t> rips;
  for (const auto& [slot, token] : d.quiesce_wait) rips.push_back(slot);  // not quiesced yet
  for (unsigned v = 0; v < d.info.vcpus; ++v) rips.push_back(XP_TRY(hv_.get_vcpu_regs(d.id, VcpuId{v})).rip);
  for (std::uint64_t rip : d.ch->resumes_in_flight(d.id)) rips.push_back(rip);  // answered, not yet taken
  d.pool->reclaim(rips);
  for (auto it = d.slot_traps.begin(); it != d.slot_traps.end();) {
    auto slot = d.pool->slot_of(it->first);
    if (!it->second.point && (!slot || d.pool->state_of(*slot) != SlotState::Dirty)) {
      d.ch->trap_removed(d.id, it->first);
      unjournal_patch(d, it->first);
      it = d.slot_traps.erase(it);
    } else
      ++it;
  }
  return {};
}

Result<ProbeId> Engine::add(DomId id, Gva addr, PreHandler pre, PostHandler post) {
  if (!pre && !post) return fail(Errc::InvalidArgument, "a probe needs a pre-handler or a post-handler");
  auto reg = std::make_unique<Registration>();
  reg->pre = std::move(pre);
  reg->post = std::move(post);
  return add_registration(id, addr, std::move(reg));
}

Result<ProbeId> Engine::add_ret(DomId id, Gva addr, EntryHandler entry, ReturnHandler on_return, RetProbeOptions o) {
  if (o.maxactive > kMaxActive)
    return fail(Errc::InvalidArgument, "maxactive " + std::to_string(o.maxactive) + " is more than " +
                                           std::to_string(kMaxActive) + " instances");
  if (o.data_size > kMaxInstanceData)
    return fail(Errc::InvalidArgument, "data_size " + std::to_string(o.data_size) + " is more than " +
                                           std::to_string(kMaxInstanceData) + " bytes per call");
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->failed) return fail(Errc::Busy, "domain " + std::to_string(id.value) + ": " + d->failed->what);
  if (d->syms) {
    // Only at a function's first instruction does [rsp] hold the return address.
    auto fn = d->syms->function_containing(addr);
    if (fn && fn->start != addr)
      return fail(Errc::InvalidArgument, hex(addr.value) + " is " + fn->name + "+" + hex(addr.value - fn->start.value) +
                                             ": a return probe goes on a function's first instruction");
  }
  unsigned maxactive = o.maxactive > 0 ? unsigned(o.maxactive) : std::max(10u, 2 * d->info.vcpus);
  auto reg = std::make_unique<Registration>();
  reg->ret = std::make_unique<RetState>();
  reg->ret->entry = std::move(entry);
  reg->ret->on_return = std::move(on_return);
  reg->ret->instances.resize(maxactive);
  for (Instance& in : reg->ret->instances) in.data.resize(o.data_size);
  for (auto it = reg->ret->instances.rbegin(); it != reg->ret->instances.rend(); ++it) reg->ret->free.push_back(&*it);
  reg->stats.maxactive = maxactive;
  std::optional<std::array<std::uint8_t, kSlotSize>> before;  // set if this call makes the trampoline
  if (!d->trampoline) before.emplace();
  XP_TRY(ensure_trampoline(*d, before ? &*before : nullptr));  // before the entry can fire
  auto added = add_registration(id, addr, std::move(reg));
  if (added) {
    std::size_t total = 0;
    for (const auto& [pid, r] : probes_)
      if (r->ret && r->point->dom == id) total += r->ret->instances.size();
    d->live_returns.reserve(total);  // no allocation on the hit path
  }
  if (!added && before) {
    // Transactional: the trampoline this registration made goes too (no other user yet).
    if (auto hold = Pause::take(*this, *d)) {
      d->ch->trap_removed(d->id, *d->trampoline);
      unjournal_patch(*d, *d->trampoline);
      (void)d->memory->write(*d->trampoline, std::as_bytes(std::span(*before)));
      (void)d->pool->release(*d->trampoline);
      d->trampoline.reset();
    }
  }
  return added;
}

Result<ProbeId> Engine::add_registration(DomId id, Gva addr, std::unique_ptr<Registration> reg) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->failed) return fail(Errc::Busy, "domain " + std::to_string(id.value) + ": " + d->failed->what);
  if (d->pool && d->pool->contains(addr))
    return fail(Errc::InvalidArgument, hex(addr.value) + " is inside the out-of-line execution area");
  if (!d->pool && reg->post)
    return fail(Errc::NotSupported,
                "domain " + std::to_string(id.value) + " has no guest module: without its slots the probed "
                "instruction runs in the hypervisor's emulator and no stop follows it, so post-handlers "
                "cannot run (load the xenprobesU module in the guest)");
  reg->id = next_id_;
  reg->requested = addr;
  {
    auto placed = XP_TRY(place(*d, addr));
    addr = placed.address;
    reg->moved_because = std::move(placed.moved_because);
  }

  auto existing = d->points.find(addr);
  if (existing != d->points.end()) {
    // Aggregate: the point is already decoded, slotted and (maybe) armed.
    Point& p = *existing->second;
    bool tail = reg->post && uses_slot(p) && !p.trap_tail;
    bool must_arm = !p.armed;
    if (tail || must_arm) {
      auto hold = XP_TRY(Pause::take(*this, *d));
      if (tail) XP_TRY(write_slot(*d, p, true));
      if (must_arm) XP_TRY(arm(*d, p));
    }
    reg->point = &p;
    p.regs.push_back(reg.get());
    ProbeId rid = next_id_++;
    probes_[rid] = std::move(reg);
    return rid;
  }

  auto point = std::make_unique<Point>();
  point->dom = id;
  point->addr = addr;
  point->agentless = !d->pool;
  // Decoding reads text before the pause: through vCPU 0's page tables now, not through a
  // root left by an earlier hit (whose process may be gone). Checked again under the pause.
  // Already paused (a batch), the context pause() took is still current.
  if (d->pause_depth == 0) XP_TRY(refresh_context(*d));
  XP_TRY(decode_probe_point(*d, *point));
  if (point->agentless && (point->plan == x86::Plan::Boost || point->plan == x86::Plan::BoostRipRel))
    if (auto why = x86::xen_emulator_refusal(point->insn))
      return fail(Errc::NotSupported, point->insn.describe() + ": " + *why +
                                          "; without the guest module's slots the hypervisor must emulate it (load "
                                          "the xenprobesU module in the guest)");
  // A 1-byte point with a continuation copies its neighbour: nobody may probe that one now.
  if (Gva before{addr.value - 1}; d->points.contains(before) && d->points.at(before)->next)
    return fail(Errc::Busy, point->insn.describe() + ": the instruction before it is a probed 1-byte instruction");

  {
    auto hold = XP_TRY(Pause::take(*this, *d));  // with vCPU 0's paging context, fresh
    // The bytes may have changed since we decoded them (the guest patches itself too).
    std::array<std::uint8_t, x86::kMaxInsnLen> now{};
    XP_TRY(d->memory->read(addr, std::as_writable_bytes(std::span(now.data(), point->insn.length))));
    if (!std::equal(now.begin(), now.begin() + point->insn.length, point->original.begin()))
      return fail(Errc::Again, hex(addr.value) + ": the guest changed this instruction while we looked at it; retry");
    bool boost = uses_slot(*point);
    std::array<std::uint8_t, kSlotSize> slot_before{};
    if (boost) {
      // Remember what the slot held, to put it back if arming fails.
      auto r = write_slot(*d, *point, bool(reg->post), &slot_before);
      if (!r) return std::unexpected(r.error());
    }
    if (auto r = arm(*d, *point); !r) {
      if (point->slot) {
        (void)d->memory->write(*point->slot, std::as_bytes(std::span(slot_before)));
        if (d->slot_traps.erase(*point->slot + point->insn.length)) {
          d->ch->trap_removed(id, *point->slot + point->insn.length);
          unjournal_patch(*d, *point->slot + point->insn.length);
        }
        (void)d->pool->release(*point->slot);
        point->slot.reset();
      }
      return std::unexpected(r.error());
    }
  }
  reg->point = point.get();
  point->regs.push_back(reg.get());
  d->points[addr] = std::move(point);
  ProbeId rid = next_id_++;
  probes_[rid] = std::move(reg);
  return rid;
}

Result<void> Engine::set_enabled(ProbeId id, bool on) {
  auto it = probes_.find(id);
  if (it == probes_.end()) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  Registration& r = *it->second;
  if (r.enabled == on) return {};
  Point& p = *r.point;
  Domain* d = domain_of(p);
  if (!d) return fail(Errc::NoSuchDomain, "the probe's domain is gone");
  if (d->failed && on) return fail(Errc::Busy, "domain " + std::to_string(d->id.value) + ": " + d->failed->what);
  bool was = any_enabled(p);
  r.enabled = on;
  bool now = any_enabled(p);
  if (was == now) return {};
  auto hold = Pause::take(*this, *d);
  if (!hold) {
    r.enabled = !on;
    return std::unexpected(hold.error());
  }
  auto res = now ? arm(*d, p) : disarm(*d, p);
  if (!res) {
    r.enabled = !on;
    return res;
  }
  if (!now) XP_TRY(flush(*d));
  return {};
}

Result<void> Engine::remove(ProbeId id) {
  if (!probes_.contains(id)) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  if (dispatching_) {  // from a handler: after the current hit
    if (std::find(deferred_removals_.begin(), deferred_removals_.end(), id) == deferred_removals_.end())
      deferred_removals_.push_back(id);
    probes_[id]->enabled = false;
    return {};
  }
  return remove_now(id);
}

Result<void> Engine::remove_now(ProbeId id) {
  auto it = probes_.find(id);
  if (it == probes_.end()) return {};
  Registration& r = *it->second;
  Point* p = r.point;
  Domain* d = domain_of(*p);
  if (!d) {
    probes_.erase(it);
    return {};
  }
  if (r.ret) {
    // Calls in flight get their return addresses back before the instances go away.
    // The hold lasts until the registration is gone: no new call may be tracked after this.
    auto hold = XP_TRY(Pause::take(*this, *d));
    XP_TRY(flush(*d));  // entries and returns already stopped are handled first
    restore_returns(*d, &r);
    r.enabled = false;
    return remove_registration(*d, it);
  }
  return remove_registration(*d, it);
}

Result<void> Engine::remove_registration(Domain& dom, std::map<ProbeId, std::unique_ptr<Registration>>::iterator it) {
  Registration& r = *it->second;
  Point* p = r.point;
  Domain* d = &dom;
  if (p->regs.size() > 1) {
    std::erase(p->regs, &r);
    bool tail_needed = needs_trap_tail(*p);
    bool enabled = any_enabled(*p);
    if ((p->trap_tail && !tail_needed) || (p->armed && !enabled)) {
      auto hold = XP_TRY(Pause::take(*this, *d));
      if (p->armed && !enabled) {
        XP_TRY(disarm(*d, *p));
        XP_TRY(flush(*d));
      }
      if (p->trap_tail && !tail_needed) XP_TRY(write_slot(*d, *p, false));
      XP_TRY(reclaim_slots(*d));
    }
    probes_.erase(it);
    return {};
  }
  // The last registration: restore the bytes, resume pending stops (found through the
  // disarmed point, then rewound onto the restored instruction), free the slot.
  auto hold = XP_TRY(Pause::take(*this, *d));
  XP_TRY(disarm(*d, *p));
  XP_TRY(flush(*d));
  release_slot(*d, *p);
  d->points.erase(p->addr);
  probes_.erase(it);
  XP_TRY(reclaim_slots(*d));
  return {};
}

Result<void> Engine::after_dispatch() {
  if (deferred_removals_.empty()) return {};
  flush_deferred();
  return {};
}

void Engine::flush_deferred() {
  auto ids = std::move(deferred_removals_);
  deferred_removals_.clear();
  for (ProbeId id : ids)
    if (auto r = remove_now(id); !r) XP_LOG(Error, "probe %" PRIu64 ": deferred removal failed: %s", id, r.error().what.c_str());
}

ProbeStats Engine::stats(ProbeId id) const {
  auto it = probes_.find(id);
  if (it == probes_.end()) return {};
  ProbeStats st = it->second->stats;
  if (const RetState* rs = it->second->ret.get()) st.active = unsigned(rs->instances.size() - rs->free.size());
  return st;
}

Result<ProbeInfo> Engine::info(ProbeId id) const {
  auto it = probes_.find(id);
  if (it == probes_.end()) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  const Point& p = *it->second->point;
  ProbeInfo i;
  i.address = p.addr;
  i.requested = it->second->requested;
  i.moved_because = it->second->moved_because;
  i.instruction = p.insn.describe();
  i.mode = exec_mode(p.plan, p.trap_tail);
  i.slot = p.slot.value_or(Gva{0});
  if (it->second->ret)
    if (auto d = domains_.find(p.dom); d != domains_.end()) i.trampoline = d->second->trampoline.value_or(Gva{0});
  return i;
}

// ---- hits ---------------------------------------------------------------------------

bool Engine::owns_trap(DomId id, Gva addr) const {
  auto it = domains_.find(id);
  if (it == domains_.end()) return false;
  const Domain& d = *it->second;
  auto p = d.points.find(addr);
  if (p != d.points.end() && (p->second->armed || p->second->flush_pending)) return true;
  return d.slot_traps.contains(addr) || (d.trampoline && *d.trampoline == addr);
}

channel::Verdict Engine::on_stop(channel::Stop& s) {
  auto it = domains_.find(s.domain);
  if (it == domains_.end()) return channel::Verdict::NotOurs;
  Domain& d = *it->second;
  channel::Verdict v = channel::Verdict::NotOurs;
  dispatching_ = true;
  hit_stop_ = &s;
  hit_memory_ready_ = false;
  if (d.trampoline && *d.trampoline == s.trap) {
    v = hit_trampoline(d, s);
  } else if (auto p = d.points.find(s.trap); p != d.points.end() && p->second->armed) {
    v = hit_point(d, *p->second, s);
  } else if (auto st = d.slot_traps.find(s.trap); st != d.slot_traps.end()) {
    v = hit_slot(d, st->second, s);
  }
  dispatching_ = false;
  hit_stop_ = nullptr;
  // Removals requested by handlers wait for after_dispatch(): removing now would scan for
  // stops while the channel is still resuming this one.
  return v;
}

bool Engine::emulate(Domain& d, const x86::Insn& insn, x86::Plan plan, Regs& r) {
  x86::CpuState s = cpu_state(r);
  Result<x86::BranchOutcome> out = fail(Errc::InvalidArgument, "");
  if (plan == x86::Plan::EmulateBranch) {
    out = x86::branch_outcome(insn, s);
  } else {
    if (auto m = hit_memory(d); !m) {
      XP_LOG(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(), m.error().what.c_str());
      return false;
    }
    Result<std::uint64_t> loaded = fail(Errc::InvalidArgument, "");
    if (insn.branch == x86::BranchKind::Ret) {
      loaded = d.memory->read_u64(Gva{r.rsp});
    } else if (auto ea = x86::effective_address(insn, s)) {
      loaded = d.memory->read_u64(*ea);
    } else {
      loaded = std::unexpected(ea.error());
    }
    if (!loaded) {
      XP_LOG(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(), loaded.error().what.c_str());
      return false;
    }
    out = x86::loaded_branch_outcome(insn, *loaded);
  }
  if (!out) {
    XP_LOG(Error, "%s: cannot emulate: %s", insn.describe().c_str(), out.error().what.c_str());
    return false;
  }
  if (out->push_return) {
    // A kernel stack: freed and reused by the guest, so no writable mapping stays behind.
    Result<void> w = hit_memory(d);
    if (w) w = d.memory->write_u64_transient(Gva{r.rsp - 8}, out->return_addr.value);
    if (!w) {
      XP_LOG(Error, "%s: cannot push the return address: %s", insn.describe().c_str(), w.error().what.c_str());
      return false;
    }
    r.rsp -= 8;
  }
  r.rsp += out->release_bytes;
  if (out->writes_rcx) r.rcx = out->rcx;
  r.rip = out->next_rip.value;
  return true;
}

void Engine::run_post(Domain& d, Point& p, channel::Stop& s) {
  Ctx ctx(*this, d, s, s.regs, p.addr);
  for (Registration* r : p.regs)
    if (r->enabled && r->post) r->post(ctx);
}

channel::Verdict Engine::hit_point(Domain& d, Point& p, channel::Stop& s) {
  Regs& r = s.regs;
  r.rip = p.addr.value;
  Ctx ctx(*this, d, s, r, p.addr);
  for (Registration* reg : p.regs) {
    if (!reg->enabled) continue;
    reg->stats.hits++;
    if (reg->ret) {
      enter_return_probe(d, *reg, ctx);
      if (r.rip != p.addr.value) return channel::Verdict::Resume;  // the entry handler sent it elsewhere
      continue;
    }
    if (!reg->pre) continue;
    int rc = reg->pre(ctx);
    if (rc != 0 || r.rip != p.addr.value) {
      // The handler sent the vCPU elsewhere: the probed instruction does not run.
      if (r.rip == p.addr.value) {
        XP_LOG(Warn, "probe at %s: pre-handler returned %d without changing rip; running the instruction",
               hex(p.addr.value).c_str(), rc);
        break;
      }
      return channel::Verdict::Resume;
    }
  }
  switch (p.plan) {
    case x86::Plan::Skip:
      r.rip = p.insn.next().value;
      run_post(d, p, s);
      break;
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel:
      if (p.agentless) {
        // No slot: the channel has the hypervisor execute the original bytes in place.
        channel::Stop::Emulate e;
        e.len = p.insn.length;
        std::copy(p.original.begin(), p.original.begin() + p.insn.length, e.bytes.begin());
        s.emulate = e;
        r.rip = p.addr.value;
        break;
      }
      r.rip = p.slot->value;  // a trap tail brings the vCPU back for the post-handlers
      break;
    case x86::Plan::EmulateBranch:
    case x86::Plan::EmulateLoaded:
      if (!emulate(d, p.insn, p.plan, r)) {
        // Give the instruction back to the guest rather than guess: restore it and re-run it.
        for (Registration* reg : p.regs) reg->stats.missed++;
        (void)disarm(d, p);
        r.rip = p.addr.value;
        return channel::Verdict::Resume;
      }
      run_post(d, p, s);
      break;
  }
  return channel::Verdict::Resume;
}

channel::Verdict Engine::hit_slot(Domain& d, const SlotTrap& st, channel::Stop& s) {
  s.regs.rip = st.resume.value;
  if (st.point) run_post(d, *st.point, s);
  if (st.emulate_next && s.regs.rip == st.resume.value &&
      !emulate(d, *st.emulate_next, st.emulate_plan, s.regs))
    XP_LOG(Error, "%s: could not emulate after the slot; the vCPU continues there",
           st.emulate_next->describe().c_str());
  return channel::Verdict::Resume;
}

// ---- return probes ---------------------------------------------------------------------

Result<Gva> Engine::ensure_trampoline(Domain& d, std::array<std::uint8_t, kSlotSize>* before) {
  if (d.trampoline) return *d.trampoline;
  if (!d.pool)
    return fail(Errc::NotSupported, "domain " + std::to_string(d.id.value) +
                                        " has no guest module: return probes need its out-of-line area for "
                                        "the return trampoline (load the xenprobesU module in the guest)");
  auto hold = XP_TRY(Pause::take(*this, d));
  Gva t = XP_TRY(allocate_slot(d));
  if (before) {
    if (auto r = d.memory->read(t, std::as_writable_bytes(std::span(*before))); !r) {
      (void)d.pool->release(t);
      return std::unexpected(r.error());
    }
  }
  channel::TrapEntry te;
  te.addr = t;
  te.fallback = channel::TrapEntry::Fallback::Return;
  if (auto r = d.ch->trap_added(d.id, te); !r) {
    (void)d.pool->release(t);
    return std::unexpected(r.error());
  }
  std::array<std::uint8_t, kSlotSize> code{};
  code.fill(0xcc);  // never executed: the vCPU always leaves from the trap
  code[0] = d.ch->trap_byte();
  if (auto j = journal_patch(d, PatchKind::Trampoline, t, std::span(code.data(), 1), std::span(code.data(), 1), t); !j) {
    d.ch->trap_removed(d.id, t);
    (void)d.pool->release(t);
    return std::unexpected(j.error());
  }
  if (auto w = d.memory->write(t, std::as_bytes(std::span(code))); !w) {
    d.ch->trap_removed(d.id, t);
    unjournal_patch(d, t);
    (void)d.pool->release(t);
    return std::unexpected(w.error());
  }
  d.trampoline = t;
  return t;
}

void Engine::remember_return(Domain& d, std::uint64_t slot, std::uint64_t ret) {
  std::uint64_t seq = ++d.returned_seq;
  d.returned[slot] = Domain::Returned{ret, seq};
  d.returned_order.emplace_back(slot, seq);
  while (d.returned.size() > kReturnedMemory && !d.returned_order.empty()) {
    auto [old, old_seq] = d.returned_order.front();
    d.returned_order.pop_front();
    if (auto it = d.returned.find(old); it != d.returned.end() && it->second.seq == old_seq) d.returned.erase(it);
  }
  if (d.returned_order.size() > 2 * kReturnedMemory) {  // entries superseded since: compact
    std::erase_if(d.returned_order, [&](const auto& e) {
      auto it = d.returned.find(e.first);
      return it == d.returned.end() || it->second.seq != e.second;
    });
  }
}

void Engine::drop_instance(Domain& d, Instance& in, bool remember) {
  if (!in.live) return;
  d.live_returns.erase(in.slot.value);
  d.ch->return_removed(d.id, in.slot);
  if (in.journal != ~0u) {
    journal_->remove_return(in.journal);
    in.journal = ~0u;
  }
  if (remember) remember_return(d, in.slot.value, in.ret);
  in.live = false;
  in.owner->ret->free.push_back(&in);
}

void Engine::enter_return_probe(Domain& d, Registration& reg, Ctx& ctx) {
  RetState& rs = *reg.ret;
  Regs& r = ctx.regs();
  const Gva slot{r.rsp};
  const std::uint64_t tramp = d.trampoline->value;
  Result<std::uint64_t> ret = fail(Errc::InvalidArgument, "");
  if (auto m = hit_memory(d); m)
    ret = d.memory->read_u64(slot);
  else
    ret = std::unexpected(m.error());
  if (!ret) {
    XP_LOG(Warn, "return probe at %s: cannot read the return address at %s: %s", hex(ctx.address().value).c_str(),
           hex(slot.value).c_str(), ret.error().what.c_str());
    reg.stats.missed++;
    return;
  }
  if (*ret == tramp) {
    // A tail call back into the function: its return is the tracked caller's return.
    reg.stats.nmissed++;
    return;
  }
  if (rs.free.empty()) reclaim_instances(d, reg);
  if (rs.free.empty()) {
    reg.stats.nmissed++;
    return;
  }
  Instance& in = *rs.free.back();
  rs.free.pop_back();
  std::fill(in.data.begin(), in.data.end(), std::byte{0});
  if (rs.entry) {
    int rc = rs.entry(ctx, in.data);
    if (rc != 0 || r.rip != ctx.address().value) {
      rs.free.push_back(&in);
      reg.stats.declined++;
      return;
    }
  }
  // A live instance on this slot belongs to a frame that is gone: a new call uses the slot.
  if (Instance* old = d.live_returns.find(slot.value)) {
    old->owner->stats.reclaimed++;
    drop_instance(d, *old, false);
  }
  d.returned.erase(slot.value);
  if (auto a = d.ch->return_added(d.id, slot, Gva{*ret}); !a) {
    XP_LOG(Warn, "return probe at %s: %s", hex(ctx.address().value).c_str(), a.error().what.c_str());
    rs.free.push_back(&in);
    reg.stats.nmissed++;
    return;
  }
  std::uint32_t journaled = ~0u;
  if (d.journaled) {
    // Before the stack changes: the guardian puts the return address back from this.
    auto j = journal_->add_return(d.id, slot, *ret, Gva{tramp});
    if (!j) {
      d.ch->return_removed(d.id, slot);
      rs.free.push_back(&in);
      reg.stats.nmissed++;
      return;
    }
    journaled = *j;
  }
  if (auto w = d.memory->write_u64_transient(slot, tramp); !w) {  // a kernel stack
    XP_LOG(Warn, "return probe at %s: cannot rewrite the return address at %s: %s", hex(ctx.address().value).c_str(),
           hex(slot.value).c_str(), w.error().what.c_str());
    d.ch->return_removed(d.id, slot);
    if (journaled != ~0u) journal_->remove_return(journaled);
    rs.free.push_back(&in);
    reg.stats.missed++;
    return;
  }
  in.journal = journaled;
  in.owner = &reg;
  in.slot = slot;
  in.ret = *ret;
  in.live = true;
  d.live_returns.insert(slot.value, &in);
}

channel::Verdict Engine::hit_trampoline(Domain& d, channel::Stop& s) {
  Regs& r = s.regs;
  // The function's ret popped the trampoline's address from the slot right below rsp.
  const std::uint64_t slot = r.rsp - 8;
  if (Instance* found = d.live_returns.find(slot)) {
    Instance& in = *found;
    Registration& reg = *in.owner;
    r.rip = in.ret;
    if (reg.enabled && reg.ret->on_return) {
      reg.stats.returns++;
      Ctx ctx(*this, d, s, r, reg.point->addr);
      reg.ret->on_return(ctx, in.data);
    }
    drop_instance(d, in, false);
    return channel::Verdict::Resume;
  }
  if (auto it = d.returned.find(slot); it != d.returned.end()) {
    r.rip = it->second.ret;  // its instance is gone (unregistered or reclaimed): no handler
    d.returned.erase(it);
    return channel::Verdict::Resume;
  }
  // Nothing of ours returns from here: the call's instance was reclaimed and its return
  // address forgotten since, or the guest jumped here on its own. The trap byte stays, so
  // answering "not ours" would stop the vCPU here again, forever. As Linux's rethook does
  // (BUG_ON on a return address it cannot find), the task cannot go on: it resumes at
  // address 0, so the guest kernel's own oops names it, once, and the vCPU is free.
  ++d.lost_returns;
  XP_LOG(Error,
         "domain %u vcpu %u: reached the return trampoline with rsp %s, which no call of ours returns to (its "
         "return address is unknown); the task is sent to address 0 so that the guest's oops reports it (lost "
         "returns in this domain: %" PRIu64 ")",
         d.id.value, s.vcpu.value, hex(r.rsp).c_str(), d.lost_returns);
  r.rip = 0;
  return channel::Verdict::Resume;
}

unsigned Engine::reclaim_instances(Domain& d, Registration& reg) {
  unsigned n = 0;
  for (Instance& in : reg.ret->instances) {
    if (!in.live) continue;
    auto v = d.memory->read_u64(in.slot);
    if (v && *v == d.trampoline->value) continue;
    // Gone another way (longjmp-like, a killed task) or, rarely, an interrupt frame now
    // covers a slot whose ret already ran: remembered, so such a return still finds its way.
    reg.stats.reclaimed++;
    drop_instance(d, in, true);
    ++n;
  }
  return n;
}

void Engine::restore_returns(Domain& d, Registration* only) {
  if (!d.trampoline) return;
  const std::uint64_t tramp = d.trampoline->value;
  auto wanted = [&](const Instance& in) { return in.live && (!only || in.owner == only); };
  // A vCPU that already returned to the trampoline but has not trapped yet goes straight on.
  for (unsigned v = 0; v < d.info.vcpus; ++v) {
    auto regs = hv_.get_vcpu_regs(d.id, VcpuId{v});
    if (!regs || regs->rip != tramp) continue;
    Instance* in = d.live_returns.find(regs->rsp - 8);
    if (!in || !wanted(*in)) continue;
    regs->rip = in->ret;
    if (auto w = hv_.set_vcpu_regs(d.id, VcpuId{v}, *regs); !w) {
      XP_LOG(Error, "domain %u vcpu %u: cannot move it off the trampoline: %s", d.id.value, v, w.error().what.c_str());
      continue;  // the instance stays remembered below
    }
    in->owner->stats.missed++;
    drop_instance(d, *in, false);
  }
  std::vector<Instance*> live;
  d.live_returns.for_each([&](std::uint64_t, Instance* in) {
    if (wanted(*in)) live.push_back(in);
  });
  for (Instance* in : live) {
    auto v = d.memory->read_u64(in->slot);
    bool restored = false;
    if (v && *v == tramp) {
      if (auto w = d.memory->write_u64_transient(in->slot, in->ret); w)
        restored = true;
      else
        XP_LOG(Error, "domain %u: cannot restore the return address at %s: %s", d.id.value, hex(in->slot.value).c_str(),
               w.error().what.c_str());
    }
    // Not restored: the trampoline (kept while attached) still knows where it returns.
    drop_instance(d, *in, !restored);
  }
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
