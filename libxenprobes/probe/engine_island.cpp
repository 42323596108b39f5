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

void Engine::island_context(Domain& d, const std::vector<x86::Insn>& insns, Gva lo, Gva hi, const x86::JumpContext& jc,
                            x86::SiteIndex& padding, x86::SiteIndex& taken) {
  // Islands other probes hold, and those waiting to be given back: one probe's at a time.
  for (const auto& [addr, p] : d.points)
    if (p->jump && p->jump->island)
      taken.add(p->jump->island->value, x86::kIslandLen, "the island of " + hex(addr.value));
  for (const Domain::ReturningIsland& r : d.islands_returning)
    taken.add(r.patch.at().value, x86::kIslandLen, "an island given back after the next quiescence");
  // The function's own dead padding and the previous function's, read from live text (after
  // the kernel's boot-time patching), as far as the kernel leaves them alone: the library's
  // selection, which bench/kernel_coverage counts over a whole kernel.
  kernel::IslandPaddingSource src;
  src.syms = &*d.syms;
  src.tables = d.tables ? &*d.tables : nullptr;
  src.entered = &jump_fixups(d);
  src.rules = kernel::island_padding_rules(*d.syms);
  src.read = [&](Gva at, std::uint64_t size) { return read_text(d, at, size); };
  kernel::island_padding_near(src, insns, lo, hi, jc, padding);
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
