// Hits: which trap a stop is for, the pre-handlers, boosting, emulation, the post-handlers.
#include "probe/engine_internal.hpp"

namespace xenprobes::probe {

namespace {

x86::CpuState cpu_state(const Regs& r) {
  x86::CpuState s;
  s.gpr = {r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi,
           r.r8,  r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15};
  s.rflags = r.rflags;
  s.fs_base = r.fs_base;
  s.gs_base = r.gs_base;
  return s;
}

}  // namespace

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
      XP_LOG_RATELIMITED(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(), m.error().what.c_str());
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
      XP_LOG_RATELIMITED(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(), loaded.error().what.c_str());
      return false;
    }
    out = x86::loaded_branch_outcome(insn, *loaded);
  }
  if (!out) {
    XP_LOG_RATELIMITED(Error, "%s: cannot emulate: %s", insn.describe().c_str(), out.error().what.c_str());
    return false;
  }
  if (out->push_return) {
    // A kernel stack: freed and reused by the guest, so no writable mapping stays behind.
    Result<void> w = hit_memory(d);
    if (w) w = d.memory->write_u64_transient(Gva{r.rsp - 8}, out->return_addr.value);
    if (!w) {
      XP_LOG_RATELIMITED(Error, "%s: cannot push the return address: %s", insn.describe().c_str(), w.error().what.c_str());
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
        XP_LOG_RATELIMITED(Warn, "probe at %s: pre-handler returned %d without changing rip; running the instruction",
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
        if (auto u = disarm(d, p); !u)
          XP_LOG(Error, "probe at %s: cannot restore the instruction: %s", hex(p.addr.value).c_str(),
                 u.error().what.c_str());
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
    XP_LOG_RATELIMITED(Error, "%s: could not emulate after the slot; the vCPU continues there",
           st.emulate_next->describe().c_str());
  return channel::Verdict::Resume;
}

}  // namespace xenprobes::probe
