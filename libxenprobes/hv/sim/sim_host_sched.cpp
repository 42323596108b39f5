// The simulated host's vCPUs at work: the Unicorn hooks, the scheduler, traps (the debugger's,
// vm_event requests, the guest's own int3 hook), one-instruction emulation, code written
// through Dom0's mappings, and the vCPUs' registers (sim_host.cpp says where the rest of the
// host is).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "hv/sim/sim_host_impl.hpp"

namespace xenprobes::hv::sim {
namespace {

constexpr std::uint64_t kTf = 0x100;

thread_local Vcpu* t_current = nullptr;  // the vCPU this scheduler thread is running

}  // namespace

// ---------------------------------------------------------------------------------------
// Unicorn hooks (scheduler thread, host lock NOT held)

void SimHostImpl::hook_intr(uc_engine* uc, std::uint32_t intno, void* ud) {
  auto* v = static_cast<Vcpu*>(ud);
  v->exit_intno = static_cast<int>(intno);
  uc_emu_stop(uc);
}

void SimHostImpl::hook_block(uc_engine* uc, std::uint64_t address, std::uint32_t, void* ud) {
  auto* self = static_cast<SimHostImpl*>(ud);
  // The running vCPU is found through the per-thread pointer the scheduler sets.
  Vcpu* v = t_current;
  if (!v) return;
  if (++v->blocks >= self->opts_.quantum_blocks || v->stop_requested.load(std::memory_order_relaxed)) {
    // The block at `address` has not run: the vCPU resumes there. Unicorn's RIP is not to be
    // trusted here: with a UC_HOOK_CODE hook (DomainConfig::count_executions) Unicorn 2.0.1
    // leaves it at the previous block's last instruction, already executed (a call there
    // would push its return address twice).
    v->quantum_expired = true;
    v->quantum_resume = address;
    uc_emu_stop(uc);
  }
}

void SimHostImpl::hook_code(uc_engine*, std::uint64_t addr, std::uint32_t, void* ud) {
  // Only the domain's scheduler thread runs its engines: no lock needed for the counter.
  // The hook fires again for the same instruction on each repetition of a rep string
  // instruction and when a quantum ends just before it: those are not new executions.
  auto* v = static_cast<Vcpu*>(ud);
  if (addr == v->last_code) return;
  v->last_code = addr;
  auto it = v->executions->find(addr);
  if (it != v->executions->end()) it->second++;
}

void SimHostImpl::hook_out(uc_engine*, std::uint32_t port, int, std::uint32_t value, void* ud) {
  auto* v = static_cast<Vcpu*>(ud);
  if (port == 0xe9) v->console.push_back(static_cast<char>(value & 0xff));
  if (port == 0xf4) v->done_port = true;
}

// ---------------------------------------------------------------------------------------
// Scheduler

bool SimHostImpl::runnable(const Domain& d, const Vcpu& v) const {
  if (d.dying || d.crashed || v.halted || v.vm_pause || v.sync_pause || v.ring_wait || v.module_wait || v.module_held)
    return false;
  return d.pause_count == 0 || v.grace;
}

void SimHostImpl::run_domain(Domain& d) {
  std::unique_lock lk(mu_);
  while (!d.dying) {
    module_poll_locked(d);
    if (d.clock_seen != clock_advances_) {  // advance_clock waits for this
      d.clock_seen = clock_advances_;
      cv_.notify_all();
    }
    Vcpu* next = nullptr;
    for (unsigned k = 0; k < d.vcpus.size(); ++k) {
      Vcpu& c = *d.vcpus[(d.rr_next + k) % d.vcpus.size()];
      if (runnable(d, c)) {
        next = &c;
        break;
      }
    }
    if (!next) {
      if (std::any_of(d.vcpus.begin(), d.vcpus.end(), [](const auto& v) { return v->module_spinning; }))
        cv_.wait_for(lk, std::chrono::microseconds(50));   // spinning: no notification may come
      else if (auto deadline = module_deadline_locked(d))  // a vCPU waits for Dom0, with a timeout
        clock_->wait_until(cv_, lk, *deadline);
      else cv_.wait(lk);
      continue;
    }
    d.rr_next = (next->id + 1) % d.vcpus.size();
    sync_code_writes(d);
    if (next->pending_emulate) {
      emulate_one(d, *next);
      continue;
    }
    next->grace = false;
    next->exit_intno = -1;
    next->quantum_expired = false;
    next->blocks = 0;
    d.running_vcpu = static_cast<int>(next->id);
    std::uint64_t rip;
    {
      std::lock_guard emu(emulation_mutex());
      uc_reg_read(next->uc, UC_X86_REG_RIP, &rip);
    }
    lk.unlock();
    t_current = next;
    uc_err err;
    {
      std::lock_guard emu(emulation_mutex());
      err = uc_emu_start(next->uc, rip, 0, 0, 0);
    }
    t_current = nullptr;
    lk.lock();
    d.running_vcpu = -1;
    next->stop_requested = false;
    handle_exit(d, *next, err);
    if (!next->console.empty()) {
      d.console += next->console;
      if (std::getenv("XENPROBES_SIM_CONSOLE")) std::fputs(next->console.c_str(), stderr);
      next->console.clear();
    }
    cv_.notify_all();
  }
}

void SimHostImpl::handle_exit(Domain& d, Vcpu& v, uc_err err) {
  std::lock_guard emu(emulation_mutex());
  std::uint64_t rip;
  uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
  char buf[160];
  if (err == UC_ERR_INSN_INVALID) {
    std::uint8_t b = 0;
    uc_mem_read(v.uc, rip, &b, 1);
    if (b == 0xf1) {  // ICEBP: a trap-class #DB, RIP after the instruction
      rip += 1;
      uc_reg_write(v.uc, UC_X86_REG_RIP, &rip);
      trap(d, v, TrapKind::Icebp, rip);
      return;
    }
    std::snprintf(buf, sizeof buf, "vcpu %u: invalid opcode (#UD) at 0x%" PRIx64, v.id, rip);
    return crash(d, buf);
  }
  if (err != UC_ERR_OK) {
    std::snprintf(buf, sizeof buf, "vcpu %u: %s at rip 0x%" PRIx64, v.id, uc_strerror(err), rip);
    return crash(d, buf);
  }
  if (v.exit_intno == 3) return trap(d, v, TrapKind::Int3, rip);
  if (v.exit_intno == 1) return trap(d, v, TrapKind::SingleStep, rip);
  if (v.exit_intno >= 0) {
    std::snprintf(buf, sizeof buf, "vcpu %u: exception %d at rip 0x%" PRIx64, v.id, v.exit_intno, rip);
    return crash(d, buf);
  }
  if (v.quantum_expired) {
    uc_reg_write(v.uc, UC_X86_REG_RIP, &v.quantum_resume);  // hook_block: where the vCPU stopped
    return;
  }
  std::uint8_t prev = 0;
  if (uc_mem_read(v.uc, rip - 1, &prev, 1) == UC_ERR_OK && prev == 0xf4) {
    v.halted = true;  // hlt: the vCPU blocks (a PV kernel's hlt becomes SCHEDOP_block)
    return;
  }
}

void SimHostImpl::crash(Domain& d, const std::string& why) {
  if (d.crashed) return;
  d.crashed = true;
  d.crash_reason = why;
  d.console += "sim: domain crashed: " + why + "\n";
  XP_LOG(Warn, "sim: domain %u crashed: %s", d.id.value, why.c_str());
  fire_watches_locked("@releaseDomain", false);
}

void SimHostImpl::trap(Domain& d, Vcpu& v, TrapKind kind, std::uint64_t rip) {
  char buf[160];
  // Every trap here is taken in guest kernel mode (the demo guest has no user mode).
  if (d.debugging) {
    if (!opts_.gdbsx) return;                           // Xen 4.17 without CONFIG_GDBSX: swallowed, vCPU goes on at rip
    if (kind == TrapKind::SingleStep) v.dr6 |= 0x4000;  // DR6.BS
    if (kind == TrapKind::Int3) v.gdbsx_event = 3;
    bool was_running = d.pause_count == 0;
    d.pause_count++;  // domain_pause_by_systemcontroller_nosync
    if (was_running) {
      // nosync: the other vCPUs are only descheduled "soon" — let each run once more.
      for (auto& o : d.vcpus)
        if (o.get() != &v) o->grace = true;
    }
    if (kind != TrapKind::Int3 && v.gdbsx_event == 0) raise_virq_locked(kVirqDebugger);
    return;
  }
  if (d.cfg.type == GuestType::Hvm && d.monitor) {
    VmEventRequest req;
    req.vcpu = v.id;
    req.flags = kVmEventFlagVcpuPaused;
    if (kind == TrapKind::Int3 && d.mon_sw_bp) {
      req.reason = VmEventReason::SoftwareBreakpoint;
      req.type = 6;
      req.insn_length = 1;
      rip -= 1;  // Xen reports (and leaves) RIP at the int3 itself
    } else if (kind != TrapKind::Int3 && d.mon_debug) {
      req.reason = VmEventReason::DebugException;
      if (kind == TrapKind::Icebp) {
        req.type = 5;
        req.insn_length = 1;
        rip -= 1;  // observed on real Xen: RIP = the ICEBP address
      } else {
        req.type = 3;
        req.pending_dbg = 0x4000;
        v.dr6 |= 0x4000;
      }
    } else {
      goto inject;
    }
    uc_reg_write(v.uc, UC_X86_REG_RIP, &rip);
    req.regs = read_regs(d, v);
    req.gfn = guest_gfn_of_va(d, rip);
    v.vm_pause = 1;
    post_request_locked(d, v, req);
    return;
  }
inject:
  // Delivered to the guest. The guest module hooks int3 (the guest channel, sim_module.cpp):
  // its traps and those Dom0 already restored end there.
  if (kind == TrapKind::Int3 && module_int3_locked(d, v, rip)) return;
  // Otherwise the demo kernel has no IDT, so this is the oops a real kernel would take on an
  // int3/#DB it does not own.
  std::snprintf(buf, sizeof buf, "vcpu %u: unhandled %s at 0x%" PRIx64, v.id,
                kind == TrapKind::Int3    ? "#BP (int3)"
                : kind == TrapKind::Icebp ? "#DB (icebp)"
                                          : "#DB (single step)",
                kind == TrapKind::SingleStep ? rip : rip - 1);
  crash(d, buf);
}

std::uint64_t SimHostImpl::guest_gfn_of_va(const Domain& d, std::uint64_t va) const {
  for (const Alias& a : d.aliases)
    if (va >= a.va && va - a.va < a.len) return (a.gpa + (va - a.va)) >> 12;
  return ~0ull;
}

void SimHostImpl::post_request_locked(Domain& d, Vcpu& v, const VmEventRequest& req) {
  if (d.outstanding >= opts_.ring_slots) {
    v.ring_wait = true;
    v.waiting_req = req;
    d.ring_waiters.push_back(v.id);
    return;
  }
  d.outstanding++;
  d.requests.push_back(req);
  if (d.monitor_owner) d.monitor_owner->ring_signal();
}

void SimHostImpl::emulate_one(Domain& d, Vcpu& v) {
  // Xen's emulator runs one instruction at RIP from the supplied bytes instead of memory.
  // Here: put the bytes at RIP, single-step with TF in this engine only (no other vCPU runs:
  // this is the domain's only scheduler thread), then restore memory.
  v.pending_emulate = false;
  std::lock_guard emu(emulation_mutex());
  std::uint64_t rip, rfl;
  uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
  uc_reg_read(v.uc, UC_X86_REG_EFLAGS, &rfl);
  std::array<std::uint8_t, 16> saved{};
  if (uc_mem_read(v.uc, rip, saved.data(), saved.size()) != UC_ERR_OK ||
      uc_mem_write(v.uc, rip, v.emul.data(), v.emul.size()) != UC_ERR_OK) {
    crash(d, "vcpu " + std::to_string(v.id) + ": emulation failed (#UD injected)");
    return;
  }
  uc_ctl_remove_cache(v.uc, rip, rip + 16);
  std::uint64_t stepping = rfl | kTf;
  uc_reg_write(v.uc, UC_X86_REG_EFLAGS, &stepping);
  v.exit_intno = -1;
  v.quantum_expired = false;
  v.blocks = 0;
  t_current = &v;
  uc_err err;
  {
    std::lock_guard emu(emulation_mutex());
    err = uc_emu_start(v.uc, rip, 0, 0, 0);
  }
  t_current = nullptr;
  uc_mem_write(v.uc, rip, saved.data(), saved.size());
  uc_ctl_remove_cache(v.uc, rip, rip + 16);
  uc_reg_read(v.uc, UC_X86_REG_EFLAGS, &stepping);
  stepping = (stepping & ~kTf) | (rfl & kTf);
  uc_reg_write(v.uc, UC_X86_REG_EFLAGS, &stepping);
  if (err != UC_ERR_OK || v.exit_intno != 1) {
    std::uint64_t now;
    uc_reg_read(v.uc, UC_X86_REG_RIP, &now);
    char buf[160];
    std::snprintf(buf, sizeof buf, "vcpu %u: emulation of the instruction at 0x%" PRIx64 " failed (#UD injected)", v.id,
                  rip);
    crash(d, buf);
  }
}

void SimHostImpl::sync_code_writes(Domain& d) {
  std::lock_guard emu(emulation_mutex());
  for (auto it = d.wframes.begin(); it != d.wframes.end();) {
    std::uint8_t* page = d.ram->base + it->first * 4096;
    if (std::memcmp(page, it->second.shadow.data(), 4096) != 0) {
      std::uint64_t gpa = it->first * 4096;
      for (const Alias& a : d.aliases) {
        if (gpa < a.gpa || gpa - a.gpa >= a.len) continue;
        std::uint64_t va = a.va + (gpa - a.gpa);
        for (auto& v : d.vcpus) uc_ctl_remove_cache(v->uc, va, va + 4096);
      }
      std::memcpy(it->second.shadow.data(), page, 4096);
    }
    if (it->second.refs == 0) it = d.wframes.erase(it);
    else ++it;
  }
}

// Waits (mu_ held through lk) until vCPU v is not executing, keeping it from being scheduled.
void SimHostImpl::stop_vcpu_locked(std::unique_lock<std::mutex>& lk, Domain& d, Vcpu& v) {
  v.sync_pause++;
  while (d.running_vcpu == static_cast<int>(v.id)) {
    // Only the vCPU's own thread stops its engine, at the next block (hook_block). Calling
    // uc_emu_stop from this thread while the engine runs corrupted guest state in Unicorn
    // 2.0.1: under a storm of domain pauses with no probe at all, the demo guest's
    // checksums went wrong and a `ret` landed on a smashed stack (the sim pause-storm test).
    v.stop_requested = true;
    cv_.wait_for(lk, std::chrono::milliseconds(1));
  }
}

void SimHostImpl::resume_vcpu_locked(Vcpu& v) {
  v.sync_pause--;
  cv_.notify_all();
}

VcpuRegs SimHostImpl::read_regs(const Domain& d, const Vcpu& v) const {
  static const int ids[] = {UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RCX,   UC_X86_REG_RDX, UC_X86_REG_RSI,
                            UC_X86_REG_RDI, UC_X86_REG_RBP, UC_X86_REG_RSP,   UC_X86_REG_R8,  UC_X86_REG_R9,
                            UC_X86_REG_R10, UC_X86_REG_R11, UC_X86_REG_R12,   UC_X86_REG_R13, UC_X86_REG_R14,
                            UC_X86_REG_R15, UC_X86_REG_RIP, UC_X86_REG_EFLAGS};
  VcpuRegs r;
  std::uint64_t* dst[] = {&r.rax, &r.rbx, &r.rcx, &r.rdx, &r.rsi, &r.rdi, &r.rbp, &r.rsp, &r.r8,
                          &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15, &r.rip, &r.rflags};
  void* ptrs[18];
  for (int i = 0; i < 18; ++i) ptrs[i] = dst[i];
  {
    std::lock_guard emu(emulation_mutex());
    uc_reg_read_batch(v.uc, const_cast<int*>(ids), ptrs, 18);
  }
  r.cr0 = v.cr0;
  r.cr2 = v.cr2;
  r.cr3 = (d.root_gpa >> 12) + d.mfn_base;
  r.cr3 <<= 12;
  if (v.pti_user_half) r.cr3 |= 0x1000;
  r.cr4 = v.cr4;
  r.efer = v.efer;
  r.dr6 = v.dr6;
  r.dr7 = v.dr7;
  r.cs = d.cfg.type == GuestType::Pv ? 0xe033 : 0x10;  // FLAT_KERNEL_CS64 / __KERNEL_CS
  r.ss = d.cfg.type == GuestType::Pv ? 0xe02b : 0x18;
  r.kernel_mode = true;
  return r;
}

void SimHostImpl::write_regs(Vcpu& v, const VcpuRegs& r, bool debugregs) {
  static const int ids[] = {UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RCX,   UC_X86_REG_RDX, UC_X86_REG_RSI,
                            UC_X86_REG_RDI, UC_X86_REG_RBP, UC_X86_REG_RSP,   UC_X86_REG_R8,  UC_X86_REG_R9,
                            UC_X86_REG_R10, UC_X86_REG_R11, UC_X86_REG_R12,   UC_X86_REG_R13, UC_X86_REG_R14,
                            UC_X86_REG_R15, UC_X86_REG_RIP, UC_X86_REG_EFLAGS};
  const std::uint64_t* src[] = {&r.rax, &r.rbx, &r.rcx, &r.rdx, &r.rsi, &r.rdi, &r.rbp, &r.rsp, &r.r8,
                                &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15, &r.rip, &r.rflags};
  void* ptrs[18];
  for (int i = 0; i < 18; ++i) ptrs[i] = const_cast<std::uint64_t*>(src[i]);
  {
    std::lock_guard emu(emulation_mutex());
    uc_reg_write_batch(v.uc, const_cast<int*>(ids), ptrs, 18);
  }
  if (debugregs) {
    v.dr6 = r.dr6;
    v.dr7 = r.dr7;
  }
}

void SimHostImpl::raise_virq_locked(unsigned virq) {
  if (virq < kNrVirqs && virq_binder_[virq]) virq_binder_[virq]->raise_port(virq_port_[virq]);
}

// The guest module's side the scheduler waits on (sim_module.cpp has the rest).

std::optional<ModuleClock::time_point> SimHostImpl::module_deadline_locked(const Domain& d) const {
  if (!d.module.present || !d.module.waiters || d.pause_count > 0) return std::nullopt;
  // Past its timeout a vCPU still waits only on a claim: until the claim bound, or until Dom0
  // answers or gives the hit back, either of which it notifies (waking the scheduler).
  const auto now = clock_->now();
  std::optional<ModuleClock::time_point> first;
  for (const auto& vp : d.vcpus) {
    if (!vp->module_wait) continue;
    const auto t = now < vp->module_deadline ? vp->module_deadline : vp->module_claim_deadline;
    if (!first || t < *first) first = t;
  }
  return first;
}

// The guest module's waiting budget (protocol.h "Waiting budget"), with the module's own logic
// (xp_budget.h): the simulated vCPU runs one task, whose switches vcpu_switched() counts.
bool SimHostImpl::module_over_budget_locked(Domain& d, Vcpu& v) {
  xp_budget_look(&v.module_budget, 1, v.task_switches);
  if (xp_budget_allows(&v.module_budget, d.module.budget_ns)) return false;
  ++d.module.over_budget;
  publish_counters(d);
  return true;
}

Result<void> SimHostImpl::set_module_wait_budget(DomId id, std::chrono::milliseconds budget) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  if (budget.count() < 0) return fail(Errc::InvalidArgument, "sim: a waiting budget cannot be negative");
  d->module.budget_ns =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count());
  return {};
}

Result<void> SimHostImpl::vcpu_switched(DomId id, VcpuId vid) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  ++XP_TRY(vcpu(*d, vid))->task_switches;
  return {};
}

Result<std::uint64_t> SimHostImpl::module_over_budget(DomId id) {
  std::lock_guard lk(mu_);
  return XP_TRY(dom(id))->module.over_budget;
}

void SimHostImpl::module_quiesce_request_locked(Domain& d, const std::string& value) {
  if (!d.module.present) return;
  d.module.quiesce_token = value;
  d.module.quiesce_pending = true;
  cv_.notify_all();  // the scheduler answers once the guest is quiescent
}

}  // namespace xenprobes::hv::sim
