// The simulated guest module's side of the guest channel (include/xenprobes/protocol.h): the
// control area, the int3 hook and its mailbox wait, the fallbacks when Dom0 does not answer,
// disarming on its own once Dom0 is gone, and quiescence.
//
// What a real module does in its int3 hook (guest-module/) is done here by the domain's
// scheduler thread with the host lock held: the hook runs between two quanta of the trapping
// vCPU, and its wait only takes that vCPU off the run queue (the scheduler keeps running the
// others and looks at the mailbox before every quantum, or at the timeout when nothing else
// runs). Nothing here blocks, so neither the host lock nor the emulation lock is ever held
// while waiting for Dom0.
//
// Everything read from the control area is Dom0-written data (the trap table, the return
// table, the answers): read once, bounded by the layout the module keeps privately (the
// header in the area is Dom0-writable too, so it is never read back for offsets or sizes).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstddef>
#include <cstring>

#include "common/log.hpp"
#include "hv/sim/page_table_builder.hpp"
#include "hv/sim/sim_host_impl.hpp"
#include "xp_logic.h"  // the guest module's own decisions (guest-module/xp_logic.c, xp_fallback.c)

namespace xenprobes::hv::sim {
namespace {

// In the module area, past every OEA reserve area (those are 16 MiB apart from 0xffffffffa0000000,
// see create_domain); mapped writable and NX: Dom0 writes it, nothing executes from it.
constexpr std::uint64_t kControlVa = 0xffffffffc0000000ull;
constexpr std::uint32_t kMailboxOffset = 256;  // after the header, cache-line aligned
// The module's code after its static OEA pool, as module-text publishes it (a real xenprobesU
// is a few dozen KiB of code; nothing of it is mapped here: the sim runs its hook on the host).
constexpr std::uint64_t kModuleCodeSize = 64ull << 10;
// The rflags bits the hook takes from Dom0 (protocol.h): the module's own mask.
constexpr std::uint64_t kFlagsFromDom0 = XP_RFLAGS_FROM_DOM0;
constexpr std::uint8_t kInt3 = 0xcc;
// Compare-and-swaps of a mailbox's state to ABANDONED that may fail before the module stores
// ABANDONED regardless: Dom0 flipping the state without end must not keep the hook looping.
constexpr unsigned kGiveUpTries = 4;

// protocol.h, "The claim bound": how long a hit Dom0 claimed may wait in all.
std::chrono::milliseconds claim_bound(std::uint32_t timeout_ms) {
  const std::uint64_t t = timeout_ms;
  return std::chrono::milliseconds(
      std::max(t, std::min(std::uint64_t{XENPROBES_CLAIM_FACTOR} * t, std::uint64_t{XENPROBES_CLAIM_MAX_MS})));
}

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

std::uint8_t* mailbox(Domain& d, unsigned vcpu) {
  return area(d) + d.module.mailbox_offset + std::size_t{vcpu} * sizeof(xenprobes_mailbox);
}

// Binary search of the Dom0-written trap table, as the module's hook does it. An unsorted
// or garbage table only makes the search miss; it never reads past the module's capacity.
bool lookup(Domain& d, std::uint64_t addr, xenprobes_trap& out) {
  const ModuleState& m = d.module;
  std::uint32_t n =
      shm_load<std::uint32_t>(header_at(d, offsetof(xenprobes_ctl_header, nr_traps)), std::memory_order_acquire);
  n = std::min(n, m.trap_capacity);
  std::uint32_t lo = 0, hi = n;
  while (lo < hi) {
    std::uint32_t mid = lo + (hi - lo) / 2;
    std::memcpy(&out, area(d) + m.trap_offset + std::size_t{mid} * sizeof(xenprobes_trap), sizeof out);
    if (out.addr < addr) lo = mid + 1;
    else if (out.addr > addr) hi = mid;
    else return true;
  }
  return false;
}

// XENPROBES_TRAP_EMULATE, run by the guest module's own code (xp_emulate): the forms it
// decodes (relative jmp/jcc/call/loop/jrcxz, jmp/call through a register, near ret), the
// target it computes, the return address a call pushes, and its refusal of a target outside
// kernel text and the module area. r.rip is the trap address; false (nothing changed) when
// the module could not run the entry either.
bool emulate(Domain& d, const xenprobes_trap& e, VcpuRegs& r) {
  xp_bounds b = module_bounds(d);
  const xp_mem_ops m = module_mem_ops(d);
  xenprobes_regs x = to_protocol(r);
  if (xp_emulate(e.insn, e.len, &x, &b, &m) != XP_EMUL_OK) return false;
  r.rip = x.rip;
  r.rsp = x.rsp;
  r.rcx = x.rcx;
  return true;
}

std::string dir_of(const Domain& d) { return "/local/domain/" + std::to_string(d.id.value) + "/" XENPROBES_XS_DIR "/"; }

}  // namespace

bool module_lookup(Domain& d, std::uint64_t addr, xenprobes_trap& out) { return lookup(d, addr, out); }

std::uint8_t* area(Domain& d) { return d.ram->base + d.module.ctl_gpa; }
std::uint8_t* header_at(Domain& d, std::size_t field) { return area(d) + field; }

// The areas this module published (oea/0, then reserve areas in order).
bool in_oea(const Domain& d, std::uint64_t va) {
  for (unsigned k = 0; k < d.oea_published; ++k) {
    std::uint64_t base = d.layout.oea_addr + k * kOeaStride;
    if (va >= base && va - base < d.cfg.oea_size) return true;
  }
  return false;
}

void publish_counters(Domain& d) {
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, hits)), d.module.hits);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, timeouts)), d.module.timeouts);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, foreign)), d.module.foreign);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, nested)), d.module.nested);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, async_bad)), d.module.async_bad);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, notify_skipped)), d.module.unnotified);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, wait_ns)), d.module.wait_ns);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, wait_max_ns)), d.module.wait_max_ns);
  shm_store<std::uint64_t>(header_at(d, offsetof(xenprobes_ctl_header, over_budget)), d.module.over_budget);
  shm_store<std::uint32_t>(header_at(d, offsetof(xenprobes_ctl_header, ret_refused)),
                           static_cast<std::uint32_t>(d.module.ret_refused));
}

// A wait for Dom0 is over (answered or given up): its time since the hit into the header's sums.
static void end_wait(Domain& d, Vcpu& v, ModuleClock::time_point now) {
  const auto ns =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     now - (v.module_deadline - std::chrono::milliseconds(d.module.timeout_ms)))
                                     .count());
  d.module.wait_ns += ns, d.module.wait_max_ns = std::max(d.module.wait_max_ns, ns);
  xp_budget_charge(&v.module_budget, ns);
  v.module_wait = false;
  --d.module.waiters;
  publish_counters(d);
}

// [va, va + len) inside one of the guest's mappings: where it is in RAM, or null.
std::uint8_t* guest_ptr(Domain& d, std::uint64_t va, std::uint64_t len) {
  for (const Alias& a : d.aliases)
    if (va >= a.va && va - a.va < a.len && len <= a.len - (va - a.va)) return d.ram->base + a.gpa + (va - a.va);
  return nullptr;
}

xp_mem_ops module_mem_ops(Domain& d) {
  xp_mem_ops m{};
  m.read_u64 = [](void* ctx, std::uint64_t va, std::uint64_t* val) {
    const std::uint8_t* p = guest_ptr(*static_cast<Domain*>(ctx), va, 8);
    if (!p) return false;
    std::memcpy(val, p, 8);
    return true;
  };
  m.write_u64 = [](void* ctx, std::uint64_t va, std::uint64_t val) {
    std::uint8_t* p = guest_ptr(*static_cast<Domain*>(ctx), va, 8);
    if (!p) return false;
    std::memcpy(p, &val, 8);
    return true;
  };
  m.ctx = &d;
  return m;
}

xenprobes_regs to_protocol(const VcpuRegs& r) {
  return xenprobes_regs{r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp,    r.r8, r.r9,
                        r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip, r.rflags, r.cs, r.ss};
}

Result<void> SimHostImpl::module_create_control(Domain& d, PageTableBuilder& pt, std::uint64_t gpa) {
  const DomainConfig& c = d.cfg;
  ModuleState& m = d.module;
  if (c.module_trap_capacity == 0) return fail(Errc::InvalidArgument, "sim: module_trap_capacity must be at least 1");
  if (c.module_timeout_ms == 0) return fail(Errc::InvalidArgument, "sim: module_timeout_ms must be at least 1");
  const std::uint64_t traps = align_up(kMailboxOffset + std::uint64_t{c.vcpus} * sizeof(xenprobes_mailbox), 64);
  const std::uint64_t rets = align_up(traps + std::uint64_t{c.module_trap_capacity} * sizeof(xenprobes_trap), 64);
  const std::uint64_t end = rets + std::uint64_t{c.module_ret_capacity} * sizeof(xenprobes_ret);
  const std::uint64_t pages = align_up(end, kPageSize) / kPageSize;
  if (pages > XENPROBES_CTL_MAX_PAGES)
    return fail(Errc::InvalidArgument, "sim: the guest module's tables need " + std::to_string(pages) +
                                           " pages, the control area has at most " +
                                           std::to_string(XENPROBES_CTL_MAX_PAGES));
  if (!d.oea_reserve.empty() && d.oea_reserve.back() + c.oea_size > kControlVa)
    return fail(Errc::InvalidArgument, "sim: too many OEA reserve areas (they would reach the control area)");
  if (gpa % kPageSize || gpa + pages * kPageSize > d.ram->size)
    return fail(Errc::InvalidArgument, "sim: the guest module's control area does not fit in guest RAM");
  XP_TRY(pt.map_4k(kControlVa, gpa, pages * kPageSize,
                   PageTableBuilder::kGlobal | PageTableBuilder::kWrite | PageTableBuilder::kNx));
  d.aliases.push_back({kControlVa, gpa, pages * kPageSize});

  m.ctl_va = kControlVa;
  m.ctl_gpa = gpa;
  m.ctl_pages = static_cast<unsigned>(pages);
  m.mailbox_offset = kMailboxOffset;
  m.trap_offset = static_cast<std::uint32_t>(traps);
  m.trap_capacity = c.module_trap_capacity;
  m.ret_offset = static_cast<std::uint32_t>(rets);
  m.ret_capacity = c.module_ret_capacity;
  m.timeout_ms = c.module_timeout_ms;
  xenprobes_ctl_header h{};
  h.magic = XENPROBES_CTL_MAGIC;
  h.version = XENPROBES_PROTOCOL_VERSION;
  h.nr_mailboxes = c.vcpus;
  h.mailbox_offset = m.mailbox_offset;
  h.trap_capacity = m.trap_capacity;
  h.trap_offset = m.trap_offset;
  h.ret_capacity = m.ret_capacity;
  h.ret_offset = m.ret_offset;
  h.timeout_ms = m.timeout_ms;
  std::memcpy(area(d), &h, sizeof h);  // before the domain exists: nobody else sees it yet
  m.present = true;
  d.layout.control_addr = kControlVa;
  d.layout.control_size = pages * kPageSize;
  return {};
}

void SimHostImpl::module_publish_locked(Domain& d, const std::string& dir) {
  ModuleState& m = d.module;
  if (!m.present) return;
  // module-text (protocol.h): the module's core text, which in a real xenprobesU holds its
  // static OEA pool, here oea/0, followed by its code.
  char text[32];
  std::snprintf(text, sizeof text, "0x%" PRIx64, d.layout.oea_addr);
  store_[dir + XENPROBES_XS_MODULE_TEXT_START] = text;
  std::snprintf(text, sizeof text, "0x%" PRIx64, d.layout.oea_addr + d.layout.oea_size + kModuleCodeSize);
  store_[dir + XENPROBES_XS_MODULE_TEXT_END] = text;
  if (m.jump_entry) {
    std::snprintf(text, sizeof text, "0x%" PRIx64, m.jump_entry);
    store_[dir + XENPROBES_XS_JUMP_ENTRY] = text;
  }
  if (!m.rings.empty()) {
    std::snprintf(text, sizeof text, "0x%" PRIx64, m.rings_va);
    store_[dir + XENPROBES_XS_RINGS_ADDR] = text;
    store_[dir + XENPROBES_XS_RINGS_COUNT] = std::to_string(m.rings.size());
    store_[dir + XENPROBES_XS_RINGS_ORDER] = std::to_string(m.ring_order);
    if (d.cfg.module_cap_auto) {
      std::snprintf(text, sizeof text, "0x%x", XENPROBES_CAP_AUTO);  // what xp_ring.c reads besides USER
      store_[dir + XENPROBES_XS_RINGS_CAP_FLAGS] = text;
    }
  }
  if (m.fixup_count) {
    std::snprintf(text, sizeof text, "0x%" PRIx64, m.fixup_va);
    store_[dir + XENPROBES_XS_FIXUP_SLOTS_ADDR] = text;
    store_[dir + XENPROBES_XS_FIXUP_SLOTS_COUNT] = std::to_string(m.fixup_count);
    std::snprintf(text, sizeof text, "0x%" PRIx64, m.fixup_table_va);
    store_[dir + XENPROBES_XS_FIXUP_SLOTS_TABLE] = text;
  }
  const unsigned features = (d.cfg.module_ret_write ? XENPROBES_FEATURE_RET_WRITE : 0u) |
                            (d.cfg.module_jump_island && m.jump_entry ? XENPROBES_FEATURE_JUMP_ISLAND : 0u);
  if (features) {
    std::snprintf(text, sizeof text, "0x%x", features);
    store_[dir + XENPROBES_XS_FEATURES] = text;
  }
  // hook-path (protocol.h): the guest functions its hit path calls; none until a test says so.
  store_[dir + XENPROBES_XS_HOOK_PATH_COUNT] = "0";
  // EVTCHNOP_alloc_unbound for remote domain 0, as guest_evtchn_alloc_unbound does.
  m.port = d.next_guest_port++;
  d.guest_ports[m.port] = GuestPort{};
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%" PRIx64, m.ctl_va);
  store_[dir + XENPROBES_XS_CONTROL_ADDR] = hex;
  store_[dir + XENPROBES_XS_CONTROL_PAGES] = std::to_string(m.ctl_pages);
  store_[dir + XENPROBES_XS_EVTCHN] = std::to_string(m.port);
}

bool SimHostImpl::module_int3_locked(Domain& d, Vcpu& v, std::uint64_t rip) {
  ModuleState& m = d.module;
  if (!m.present) return false;
  const std::uint64_t addr = rip - 1;
  if (m.jump_entry && addr == m.jump_entry) {  // a detour's call (ModuleState::jump_entry)
    module_jump_locked(d, v);
    return true;
  }
  xenprobes_trap e{};
  const bool found = lookup(d, addr, e);
  if (found && (e.flags == XENPROBES_TRAP_JUMP || e.flags == (XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC))) {
    // a key, never a trap byte: not ours
    ++m.foreign;
    publish_counters(d);
    return false;
  }
  if (found && e.flags == XENPROBES_TRAP_REDIRECT) {
    // A jump being put in place: on to its detour, which makes the hit.
    std::lock_guard emu(emulation_mutex());
    uc_reg_write(v.uc, UC_X86_REG_RIP, &e.fallback);
    return true;
  }
  if (!found) {
    // Dom0 restored the byte (and dropped the entry) between the trap and the lookup: the
    // original instruction is back, run it.
    const std::uint8_t* b = guest_ptr(d, addr, 1);
    if (b && *b != kInt3) {
      std::lock_guard emu(emulation_mutex());
      uc_reg_write(v.uc, UC_X86_REG_RIP, &addr);
      return true;
    }
    ++m.foreign;  // the kernel's own int3: not ours to handle
    publish_counters(d);
    return false;
  }
  VcpuRegs r = read_regs(d, v);
  r.rip = addr;
  if (m.dom0_gone || m.detaching || module_over_budget_locked(d, v)) {  // nobody to ask, or v's budget spent
    module_fallback_locked(d, v, e, r);
    return true;
  }
  if (v.module_hold) {  // SimHost::hold_module_hits: between the lookup and the mailbox
    v.module_held = true, v.module_entry = e, v.module_regs = r;
    return true;
  }
  module_publish_hit_locked(d, v, e, r, 0);
  return true;
}

void SimHostImpl::module_publish_hit_locked(Domain& d, Vcpu& v, const xenprobes_trap& e, const VcpuRegs& r,
                                            std::uint64_t jump_ret) {
  ModuleState& m = d.module;
  // The kernel functions the real module's exchange calls (its clock, the poll), here guest
  // code a test names (SimHost::set_module_hook_calls); a hit in them is nested.
  if (!module_hook_calls_locked(d, v)) return;
  // Step 1 of a hit: regs and trap, then state = HIT (release), then the notification.
  std::uint8_t* mb = mailbox(d, v.id);
  ++v.module_seq;
  shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, seq), v.module_seq);
  const xenprobes_regs x = to_protocol(r);
  std::memcpy(mb + offsetof(xenprobes_mailbox, regs), &x, sizeof x);
  shm_store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, trap), e.addr);
  module_ret_publish_locked(d, mb, r.rsp);
  if (d.cfg.module_spin_us) {
    shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, spinning), 1);
    v.module_spinning = true;
    v.module_spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(d.cfg.module_spin_us);
  }
  shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, state), XENPROBES_MBOX_HIT, std::memory_order_release);
  ++m.hits;
  publish_counters(d);
  // No notification while Dom0 polls (protocol.h "Spinning"): HIT, a barrier, dom0_polling.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (shm_load<std::uint32_t>(header_at(d, offsetof(xenprobes_ctl_header, dom0_polling))) != 0) {
    ++m.unnotified;
    publish_counters(d);  // header.notify_skipped
  } else {
    ++m.notified;
    if (auto gp = d.guest_ports.find(m.port); gp != d.guest_ports.end() && gp->second.peer)
      gp->second.peer->raise_port(gp->second.peer_port);
  }
  // Step 2: only this vCPU waits (SCHEDOP_poll with a timeout, in a real module).
  const auto now = clock_->now();
  v.module_wait = true;
  v.module_deadline = now + std::chrono::milliseconds(m.timeout_ms);
  v.module_claim_deadline = now + claim_bound(m.timeout_ms);
  v.module_entry = e;
  v.module_regs = r;
  v.module_jump_ret = jump_ret;
  ++m.waiters;
}

void SimHostImpl::module_jump_locked(Domain& d, Vcpu& v) {
  ModuleState& m = d.module;
  VcpuRegs r = read_regs(d, v);
  // The detour's call pushed the return address into the detour: the hit resumes there, with
  // the probed instruction's stack pointer (above that return address).
  std::uint64_t ret = 0;
  const std::uint8_t* top = guest_ptr(d, r.rsp, 8);
  if (!top) {  // cannot happen on a stack the call just wrote; nothing sensible to do but stop
    crash(d, "vcpu " + std::to_string(v.id) + ": guest module: the jump entry's stack is not mapped");
    cv_.notify_all();
    return;
  }
  std::memcpy(&ret, top, 8);
  r.rsp += 8;
  const std::uint64_t hit_rsp = r.rsp;
  auto resume = [&] {  // unanswered: on in the detour
    r.rip = ret;
    r.rsp = hit_rsp;
    write_regs(v, r, false);
  };
  xenprobes_trap e{};
  const xp_bounds b = module_bounds(d);
  const bool found = ret >= 5 && lookup(d, xp_jump_call_addr(ret), e);
  const enum xp_jump_lookup kind = xp_jump_lookup(&b, found ? &e : nullptr, ret);
  if (kind == XP_JUMP_FOREIGN) {
    ++m.foreign;  // a call from no detour Dom0 told us of
    publish_counters(d);
    return resume();
  }
  if (kind == XP_JUMP_ASYNC) {  // a record, and on at once: no mailbox, no Dom0
    r.rip = e.fallback;
    module_async_locked(d, v, e, r);
    r.rip = ret;
    r.rsp = hit_rsp;
    return write_regs(v, r, false);
  }
  if (m.dom0_gone || m.detaching || module_over_budget_locked(d, v)) return resume();
  r.rip = e.fallback;  // the probed address
  module_publish_hit_locked(d, v, e, r, ret);
}

void SimHostImpl::module_poll_locked(Domain& d) {
  ModuleState& m = d.module;
  // A paused or dead guest runs no hook: it neither sees answers nor times out until it runs.
  if (!m.present || d.dying || d.crashed || d.pause_count > 0) return;
  if (m.waiters) {
    const auto now = clock_->now();
    for (auto& vp : d.vcpus) {
      Vcpu& v = *vp;
      if (!v.module_wait) continue;
      std::uint8_t* mb = mailbox(d, v.id);
      if (v.module_spinning && std::chrono::steady_clock::now() >= v.module_spin_end) {
        // The spin ran out: spinning = 0, a barrier, the look below; then only a notification.
        shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, spinning), 0);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        v.module_spinning = false;
      }
      const std::uint32_t state =
          shm_load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, state), std::memory_order_acquire);
      const bool answered = state == XENPROBES_MBOX_DONE &&
                            shm_load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, answer_seq)) == v.module_seq;
      // A claimed hit is waited for up to the claim bound; Dom0 gone (declared on another
      // vCPU's timeouts) ends only waits Dom0 has not claimed.
      const bool due = now >= (state == XENPROBES_MBOX_CLAIMED ? v.module_claim_deadline : v.module_deadline);
      if (answered || m.dom0_gone || due) module_give_up_locked(d, v);
      if (d.crashed) return;
    }
  }
  if (m.quiesce_pending && module_quiescent_locked(d)) {
    const std::string dir = dir_of(d);
    store_[dir + XENPROBES_XS_QUIESCE_DONE] = m.quiesce_token;
    m.quiesce_pending = false;
    fire_watches_locked(dir + XENPROBES_XS_QUIESCE_DONE, false);
  }
}

// Ends a wait: with Dom0's answer if it is there (step 3), else ABANDONED and the fallback
// (step 4), unless Dom0 holds a claim on the hit and the claim bound has not passed: then
// the wait goes on. The state moves to ABANDONED by compare-and-swap only, so an answer
// completed or a claim taken at the last moment is honoured rather than overwritten.
void SimHostImpl::module_give_up_locked(Domain& d, Vcpu& v) {
  ModuleState& m = d.module;
  std::uint8_t* mb = mailbox(d, v.id);
  std::atomic_ref<std::uint32_t> state(*reinterpret_cast<std::uint32_t*>(mb + offsetof(xenprobes_mailbox, state)));
  const bool past_bound = clock_->now() >= v.module_claim_deadline;
  std::uint32_t from = XENPROBES_MBOX_HIT;
  bool claim_expired = false;  // Dom0 died or hung in a handler
  for (unsigned tries = 0;; ++tries) {
    std::uint32_t seen = from;
    if (state.compare_exchange_strong(seen, XENPROBES_MBOX_ABANDONED, std::memory_order_acq_rel)) {
      claim_expired = from == XENPROBES_MBOX_CLAIMED;
      break;
    }
    if (seen == XENPROBES_MBOX_DONE &&
        shm_load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, answer_seq)) == v.module_seq) {
      xenprobes_regs x;
      std::memcpy(&x, mb + offsetof(xenprobes_mailbox, regs), sizeof x);
      VcpuRegs r = v.module_regs;  // cs/ss and everything else stay the guest's
      r.rax = x.rax, r.rbx = x.rbx, r.rcx = x.rcx, r.rdx = x.rdx, r.rsi = x.rsi, r.rdi = x.rdi;
      r.rbp = x.rbp, r.rsp = x.rsp, r.r8 = x.r8, r.r9 = x.r9, r.r10 = x.r10, r.r11 = x.r11;
      r.r12 = x.r12, r.r13 = x.r13, r.r14 = x.r14, r.r15 = x.r15, r.rip = x.rip;
      r.rflags = (r.rflags & ~kFlagsFromDom0) | (x.rflags & kFlagsFromDom0);
      bool usable = true;  // the answer taken: its return-slot write too (protocol.h)
      if (v.module_jump_ret) {
        // protocol.h, "Jump probes", by the module's own rules (xp_jump_answer_apply).
        const xp_bounds b = module_bounds(d);
        const xenprobes_regs hit = to_protocol(v.module_regs);
        xenprobes_regs out{};
        if (xp_jump_answer_apply(&b, &hit, &x, v.module_jump_ret, &out) == XP_ANSWER_OK) {
          r.rax = out.rax, r.rbx = out.rbx, r.rcx = out.rcx, r.rdx = out.rdx, r.rsi = out.rsi, r.rdi = out.rdi;
          r.rbp = out.rbp, r.rsp = out.rsp, r.r8 = out.r8, r.r9 = out.r9, r.r10 = out.r10, r.r11 = out.r11;
          r.r12 = out.r12, r.r13 = out.r13, r.r14 = out.r14, r.r15 = out.r15, r.rip = out.rip;
          r.rflags = out.rflags;
        } else {
          r = v.module_regs;  // unusable: resumed as if unanswered, in the detour
          r.rip = v.module_jump_ret;
          ++m.bad_answers;
          usable = false;
        }
        v.module_jump_ret = 0;
      }
      if (usable) module_ret_apply_locked(d, mb, v.module_regs.rsp);
      write_regs(v, r, false);
      shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, spinning), 0);
      v.module_spinning = false;
      state.store(XENPROBES_MBOX_IDLE, std::memory_order_release);
      end_wait(d, v, clock_->now());
      m.consecutive_timeouts = 0;
      return;
    }
    // Dom0 runs the handlers (they may be writing this vCPU's stack): wait on, up to the bound.
    if (seen == XENPROBES_MBOX_CLAIMED && !past_bound) return;
    // Given back (HIT) or claimed past the bound: swap from that, a few times at most.
    if ((seen == XENPROBES_MBOX_HIT || seen == XENPROBES_MBOX_CLAIMED) && tries + 1 < kGiveUpTries) {
      from = seen;
      continue;
    }
    state.store(XENPROBES_MBOX_ABANDONED, std::memory_order_release);  // whatever was there
    break;
  }
  shm_store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, spinning), 0);
  v.module_spinning = false;
  ++m.timeouts;
  end_wait(d, v, clock_->now());
  if (!m.dom0_gone) ++m.consecutive_timeouts;
  XP_LOG(Debug, "sim: domain %u vcpu %u: no answer from Dom0 for the trap at 0x%" PRIx64 "%s (%u in a row)", d.id.value,
         v.id, v.module_regs.rip, claim_expired ? " (its claim outlived the claim bound)" : "", m.consecutive_timeouts);
  module_fallback_locked(d, v, v.module_entry, v.module_regs);
  if (!m.dom0_gone && m.consecutive_timeouts >= XENPROBES_DEAD_AFTER) module_disarm_locked(d);
}

void SimHostImpl::module_fallback_locked(Domain& d, Vcpu& v, const xenprobes_trap& e, VcpuRegs r) {
  ModuleState& m = d.module;
  auto die = [&](const char* why) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "vcpu %u: guest module: %s (trap at 0x%" PRIx64 ")", v.id, why, r.rip);
    crash(d, buf);
    cv_.notify_all();  // wait_halted() and friends look at crashes
  };
  switch (e.flags) {
    case XENPROBES_TRAP_FALLBACK: r.rip = e.fallback; break;
    case XENPROBES_TRAP_EMULATE:
      if (!emulate(d, e, r)) return die("cannot emulate the trap entry's instruction");
      break;
    case XENPROBES_TRAP_JUMP:  // unanswered: on in the detour, as if never hit
      r.rip = v.module_jump_ret;
      v.module_jump_ret = 0;
      break;
    case XENPROBES_TRAP_REDIRECT: r.rip = e.fallback; break;
    case XENPROBES_TRAP_RETURN: {
      // The trampoline's int3: the return just popped the slot, so it is rsp - 8.
      const std::uint64_t slot = r.rsp - 8;
      std::uint8_t* rets = area(d) + m.ret_offset;
      std::uint32_t i = 0;
      for (; i < m.ret_capacity; ++i) {
        std::uint8_t* ent = rets + std::size_t{i} * sizeof(xenprobes_ret);
        if (shm_load<std::uint64_t>(ent + offsetof(xenprobes_ret, slot), std::memory_order_acquire) != slot) continue;
        r.rip = shm_load<std::uint64_t>(ent + offsetof(xenprobes_ret, ret));
        shm_store<std::uint64_t>(ent + offsetof(xenprobes_ret, slot), 0, std::memory_order_release);
        break;
      }
      if (i == m.ret_capacity) return die("a return reached the trampoline without a return-table entry");
      break;
    }
    default: return die("trap entry without exactly one fallback flag");
  }
  write_regs(v, r, false);
}

void SimHostImpl::module_disarm_locked(Domain& d) {
  ModuleState& m = d.module;
  const unsigned restored = module_restore_locked(d);
  m.dom0_gone = true;
  shm_store<std::uint32_t>(header_at(d, offsetof(xenprobes_ctl_header, dom0_gone)), 1, std::memory_order_release);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "xenprobesU: Dom0 did not answer %u hits in a row: restored %u trap bytes, left %u "
                "in modules unloaded since",
                m.consecutive_timeouts, restored, m.gone_left);
  d.console += std::string(buf) + "\n";
  XP_LOG(Warn, "sim: domain %u: %s", d.id.value, buf);
}

bool SimHostImpl::module_quiescent_locked(Domain& d) {
  // synchronize_rcu_tasks(): every vCPU out of the hook and out of every slot.
  for (auto& vp : d.vcpus) {
    if (vp->module_wait || vp->module_held) return false;
    if (vp->halted) continue;
    std::uint64_t rip;
    {
      std::lock_guard emu(emulation_mutex());
      uc_reg_read(vp->uc, UC_X86_REG_RIP, &rip);
    }
    if (in_oea(d, rip)) return false;
  }
  return true;
}

}  // namespace xenprobes::hv::sim
