// Short jumps to islands (protocol.h "Short jumps to islands", docs/probes.md): where no
// 5-byte region passes the jump rules, a region of at least 2 bytes starts with `eb rel8` to
// an island, 5 bytes of the function's dead padding holding `jmp rel32` to the detour. Which
// padding (the kernel's rules, kernel/island_padding.hpp), the island put in before the trap
// byte, and given back only after a quiescence that follows the short jump's removal.
#include <chrono>
#include <thread>

#include "kernel/island_padding.hpp"
#include "probe/engine_internal.hpp"

namespace xenprobes::probe {

namespace {
constexpr std::uint64_t kIslandMaxFunction = std::uint64_t{256} * 1024;  // as engine_prepare.cpp
}  // namespace

void Engine::island_context(Domain& d, const std::vector<x86::Insn>& insns, Gva lo, Gva hi, const x86::JumpContext& jc,
                            x86::SiteIndex& padding, x86::SiteIndex& taken) {
  // Islands other probes hold, and those waiting to be given back: one probe's at a time.
  for (const auto& [addr, p] : d.points)
    if (p->jump && p->jump->island)
      taken.add(p->jump->island->value, x86::kIslandLen, "the island of " + hex(addr.value));
  for (const Domain::ReturningIsland& r : d.islands_returning)
    taken.add(r.patch.at().value, x86::kIslandLen, "an island given back after the next quiescence");
  // The function's own dead padding, read from live text (after the kernel's boot-time
  // patching), as far as the kernel leaves it alone.
  const kernel::IslandPaddingRules rules = kernel::island_padding_rules(*d.syms);
  auto pad = x86::dead_padding(x86::JumpFunction::from_insns(insns, lo, hi, jc));
  if (pad && kernel::usable_island_padding(*d.syms, rules, *pad))
    padding.add(pad->first.value, static_cast<std::uint32_t>(pad->second.value - pad->first.value), "dead padding");
  // And the previous function's, right before this one (within reach of its first bytes), as
  // bench/kernel_coverage counts it: decoded with what the kernel's tables say of it (its
  // reserved sites and the entries from outside, none of which may lie in the padding).
  auto prev = d.syms->function_containing(Gva{lo.value - 1});
  if (!prev || prev->start == lo || prev->size == 0 || prev->size > kIslandMaxFunction ||
      prev->start.value + prev->size != lo.value)
    return;
  auto bytes = read_text(d, prev->start, prev->size);
  auto pi = bytes ? x86::decode_function(*bytes, prev->start)
                  : Result<std::vector<x86::Insn>>(std::unexpected(bytes.error()));
  if (!pi) return;
  x86::JumpContext pc;  // no jump tables read: one makes the padding unknown (stricter)
  pc.indirect_thunks = jc.indirect_thunks;
  pc.endbr_marks_indirect_targets = jc.endbr_marks_indirect_targets;
  auto pp = x86::dead_padding(x86::JumpFunction::from_insns(*pi, prev->start, lo, pc));
  if (!pp || !d.tables) return;
  const std::uint64_t a = pp->first.value - 4, b = pp->second.value;  // a site reaching into it
  if (d.tables->exception_entry_in(a, b) || d.tables->jump_label_in(a, b) || d.tables->static_call_in(a, b) ||
      d.tables->smp_lock_in(a, b) || jump_fixups(d).overlapping(pp->first.value, b))
    return;
  if (kernel::usable_island_padding(*d.syms, rules, *pp))
    padding.add(pp->first.value, static_cast<std::uint32_t>(pp->second.value - pp->first.value),
                "dead padding of " + prev->name);
}

Result<void> Engine::arm_island(Domain& d, JumpState& j) {
  if (!j.island || j.island_patch) return {};
  // Disarmed and armed again before it was given back: it still holds our jump to this detour.
  for (auto it = d.islands_returning.begin(); it != d.islands_returning.end(); ++it)
    if (it->patch.at() == *j.island) {
      j.island_patch = std::move(it->patch);
      d.islands_returning.erase(it);
      return {};
    }
  PatchSpec spec;
  spec.at = *j.island;
  spec.bytes.assign(x86::kJmpRel32Len, 0);
  XP_TRY(x86::emit_jmp_rel32(spec.bytes, *j.island, j.detour));
  // Never a byte written without checking what is there: the padding as it was listed.
  spec.expect.assign(j.island_original.begin(), j.island_original.end());
  channel::TrapEntry te;
  te.addr = *j.island;
  te.fallback = channel::TrapEntry::Fallback::Island;
  te.resume_at = j.detour;
  te.len = x86::kIslandLen;
  std::copy(j.island_original.begin(), j.island_original.end(), te.insn);
  spec.trap = te;
  // Not journaled: the guardian restores a text record whatever else is there, and an island
  // given back while a short jump still goes there would send the guest into padding. The
  // guest module gives it back itself, after its regions and a quiescence.
  auto patch = patcher(d).apply(std::move(spec));
  if (!patch) {
    Error e = patch.error();
    if (e.code == Errc::Again)
      e.what = hex(j.island->value) +
               ": refused by rule 'text-changed': the guest rewrote the island's padding since it was decoded (" +
               e.what + "); unregister the probe and register it again";
    return std::unexpected(e);
  }
  patch->commit();
  j.island_patch = std::move(*patch);
  return {};
}

void Engine::return_island(Domain& d, JumpState& j) {
  if (!j.island_patch) return;
  // A task interrupted between the eb and the island resumes at the island: it keeps its
  // jump until a quiescence asked for from now on.
  d.islands_returning.push_back(
      Domain::ReturningIsland{std::move(*j.island_patch), d.quiesce_next, j.detour, j.island_original});
  j.island_patch.reset();
}

void Engine::advance_islands(Domain& d, int wait_ms) {
  if (d.islands_returning.empty()) return;
  auto due = [&](const Domain::ReturningIsland& r) { return d.quiesce_done && r.token <= *d.quiesce_done; };
  auto any_due = [&] { return std::any_of(d.islands_returning.begin(), d.islands_returning.end(), due); };
  advance_quiescence(d);
  for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
       !std::all_of(d.islands_returning.begin(), d.islands_returning.end(), due) &&
       std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    advance_quiescence(d);
  }
  if (!any_due()) return;
  auto hold = Pause::take(*this, d);
  if (!hold) {
    XP_LOG(Warn, "domain %u: islands not given back yet: %s", d.id.value, hold.error().what.c_str());
    return;
  }
  std::vector<std::uint64_t> rips;
  for (unsigned v = 0; v < d.info.vcpus; ++v)
    if (auto r = hv_.get_vcpu_regs(d.id, VcpuId{v})) rips.push_back(r->rip);
    else return;  // not knowing where a vCPU stands, write nothing
  for (auto it = d.islands_returning.begin(); it != d.islands_returning.end();) {
    const std::uint64_t at = it->patch.at().value;
    if (!due(*it) || std::any_of(rips.begin(), rips.end(), [&](std::uint64_t r) { return r >= at && r < at + 5; })) {
      ++it;
      continue;
    }
    auto ours = it->patch.restore();
    if (!ours) {
      XP_LOG_RATELIMITED(Warn, "domain %u: the island at %s not given back yet: %s", d.id.value, hex(at).c_str(),
                         ours.error().what.c_str());
      ++it;
      continue;
    }
    if (!*ours) {
      XP_LOG(Warn,
             "domain %u: the island at %s no longer holds our jump: the guest rewrote it; left as it is (rule "
             "'text-changed')",
             d.id.value, hex(at).c_str());
      ++d.text_changed;
    }
    it->patch.forget();
    it = d.islands_returning.erase(it);
  }
}

}  // namespace xenprobes::probe
