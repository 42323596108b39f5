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

// What a handler may change (include/xenprobes/xenprobes.hpp, HitContext::regs): the 16
// general registers, rip and the arithmetic flags. The guest channel's module can take back
// no more than that (it keeps the rest of rflags, cs and ss from the hit), so the other
// channels, which could write more (all of rflags, dr6/dr7 through setvcpucontext), are held
// to the same set: a handler behaves the same whichever channel serves the domain.
constexpr std::uint64_t kArithmeticFlags = 0x001 | 0x004 | 0x010 | 0x040 | 0x080 | 0x800;  // CF PF AF ZF SF OF

// `after` with everything outside the writable set put back as it was at the stop; true if
// something had to be put back.
bool keep_writable_only(const Regs& before, Regs& after) {
  Regs kept = before;
  kept.rax = after.rax, kept.rbx = after.rbx, kept.rcx = after.rcx, kept.rdx = after.rdx;
  kept.rsi = after.rsi, kept.rdi = after.rdi, kept.rbp = after.rbp, kept.rsp = after.rsp;
  kept.r8 = after.r8, kept.r9 = after.r9, kept.r10 = after.r10, kept.r11 = after.r11;
  kept.r12 = after.r12, kept.r13 = after.r13, kept.r14 = after.r14, kept.r15 = after.r15;
  kept.rip = after.rip;
  kept.rflags = (before.rflags & ~kArithmeticFlags) | (after.rflags & kArithmeticFlags);
  const bool changed = kept.rflags != after.rflags || kept.cr0 != after.cr0 || kept.cr2 != after.cr2 ||
                       kept.cr3 != after.cr3 || kept.cr4 != after.cr4 || kept.efer != after.efer ||
                       kept.dr6 != after.dr6 || kept.dr7 != after.dr7 || kept.fs_base != after.fs_base ||
                       kept.gs_base != after.gs_base || kept.cs != after.cs || kept.ss != after.ss ||
                       kept.kernel_mode != after.kernel_mode;
  after = kept;
  return changed;
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
  const Regs at_stop = s.regs;
  // Restored, not cleared: a stop may be handled inside another dispatch (an async handler
  // that disarms a probe flushes its pending stops).
  const bool was_dispatching = std::exchange(dispatching_, true);
  hit_stop_ = &s;
  hit_memory_ready_ = false;
  if (d.trampoline && *d.trampoline == s.trap) {
    v = hit_trampoline(d, s);
  } else if (auto p = d.points.find(s.trap); p != d.points.end() && p->second->armed) {
    v = hit_point(d, *p->second, s);
  } else if (auto st = d.slot_traps.find(s.trap); st != d.slot_traps.end()) {
    v = st->second.jump ? hit_jump(d, st->second, s) : hit_slot(d, st->second, s);
  }
  dispatching_ = was_dispatching;
  hit_stop_ = nullptr;
  if (v == channel::Verdict::Resume && keep_writable_only(at_stop, s.regs))
    XP_LOG_RATELIMITED(Warn,
                       "domain %u: a handler changed a register it may not (only the general registers, rip "
                       "and the arithmetic flags are written back); the others were kept as they were",
                       s.domain.value);
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
      XP_LOG_RATELIMITED(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(),
                         m.error().what.c_str());
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
      XP_LOG_RATELIMITED(Error, "%s: cannot read the branch target: %s", insn.describe().c_str(),
                         loaded.error().what.c_str());
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
      XP_LOG_RATELIMITED(Error, "%s: cannot push the return address: %s", insn.describe().c_str(),
                         w.error().what.c_str());
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
      enter_return_probe(d, *reg, ctx, s);
      if (r.rip != p.addr.value) return channel::Verdict::Resume;  // the entry handler sent it elsewhere
      continue;
    }
    if (!reg->pre) continue;
    // One contract (PreHandler in xenprobes.hpp): rip decides. Changed, the vCPU goes there and
    // the probed instruction, the post-handlers and the later pre-handlers are skipped;
    // unchanged, the instruction runs whatever the handler returned.
    const int rc = reg->pre(ctx);
    if (r.rip != p.addr.value) return channel::Verdict::Resume;
    if (rc != 0)
      XP_LOG_RATELIMITED(Warn,
                         "probe at %s: a pre-handler returned %d without changing rip: the instruction runs "
                         "(to skip it, set regs().rip to where the vCPU should go)",
                         hex(p.addr.value).c_str(), rc);
  }
  if (p.jump) return channel::Verdict::Resume;  // rip unchanged: on in the detour
  switch (p.plan) {
    case x86::Plan::Skip:
      r.rip = p.insn.next().value;
      run_post(d, p, s);
      break;
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel:
      if (p.in_place) {
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
        for (Registration* reg : p.regs) reg->stats.unhandled++;
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
  if (st.emulate_next && s.regs.rip == st.resume.value && !emulate(d, *st.emulate_next, st.emulate_plan, s.regs))
    XP_LOG_RATELIMITED(Error, "%s: could not emulate after the slot; the vCPU continues there",
                       st.emulate_next->describe().c_str());
  return channel::Verdict::Resume;
}

}  // namespace xenprobes::probe
