// Every instruction of the analysed functions decided (coverage.hpp), as the engine decides it:
//   - probe-able on the vmevent channel with the guest module's slots (entry placement, the
//     address rules, the foreign-trap rule, the instruction rules: Engine::decode_probe_point),
//   - boostable (plans boost and boost-riprel),
//   - jump-optimizable today (x86::check_jump's 5-byte region, and the engine's own limits),
//   - and with the engine's two rules, each alone and both: tail calls proven from the image,
//     and short jumps to islands in the padding the engine itself lists
//     (kernel::island_padding_near: the function's own and the previous function's).
#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>

#include "common/hex.hpp"
#include "coverage.hpp"
#include "x86/analysis.hpp"
#include "x86/detour.hpp"

namespace xenprobes::coverage {

namespace {

constexpr std::size_t kEngineSlotSize = 32;  // probe/engine.hpp kSlotSize: one detour
// Where the detours would run for the size check: the modules' area of x86-64 Linux (its
// MODULES_VADDR), where the guest module's slots are.
constexpr std::uint64_t kModuleArea = 0xffffffffa0000000ull;

// Which instruction rule refuses `i` (analysis.hpp's predicates, in the gate's order).
std::string insn_rule(const x86::Insn& i) {
  using P = bool (*)(const x86::Insn&);
  static const std::pair<const char*, P> kRules[] = {
      {"trap byte (int3 padding or a foreign breakpoint)", x86::is_trap_byte},
      {"context return (iret/sysret/sysexit)", x86::is_context_return},
      {"software interrupt / syscall", x86::is_software_interrupt},
      {"hlt", x86::is_halt},
      {"ud2/ud1 (BUG/WARN)", x86::is_deliberate_ud},
      {"swapgs", x86::is_gs_swap},
      {"loads SS", x86::is_ss_load},
      {"far transfer", x86::is_far_transfer},
      {"xbegin", x86::is_transaction_begin},
      {"66 + relative branch", x86::is_opsize_relative_branch},
      {"addr32 RIP-relative", x86::is_addr32_rip_relative},
      {"sti", x86::is_interrupt_enable},
  };
  for (const auto& [name, p] : kRules)
    if (p(i)) return name;
  return "other";
}

// A short key for a jump refusal: the rule, and what in the reason tripped it.
std::string jump_key(const x86::JumpRefusal& r) {
  std::string k(x86::jump_rule_name(r.rule));
  struct Word {
    const char* in;
    const char* key;
  };
  if (r.rule == x86::JumpRule::None) return r.reason;  // the engine's own limits
  static const Word kWords[] = {
      {"foreign breakpoint", "int3 in the region"},
      {"deliberate #UD", "ud2 in the region"},
      {"landing pad", "endbr64 in the region"},
      {"rel8 form", "loop/jrcxz"},
      {"indirect call", "indirect call in the region"},
      {"out of rel32 reach", "rel32 reach from the detour"},
      {"push imm32", "call's return address"},
      {"returns to another context", "iret/sysret in the region"},
      {"software interrupt", "int/syscall in the region"},
      {"hlt parks", "hlt in the region"},
      {"swapgs", "swapgs in the region"},
      {"sti:", "sti in the region"},
      {"indirect jump", "indirect jump with unknown targets in the function"},
      {"__ex_table fixup", "exception fixup inside the region"},
      {"target of the jump label", "jump-label target inside the region"},
      {"(its cold part,", "branch from its cold part into the region"},
      {"(another function,", "branch from another function (not its cold part) into the region"},
      {"the branch", "branch into bytes 1..len-1"},
      {"__ex_table entry", "exception-table instruction"},
      {"jump label", "jump-label site"},
      {"static call", "static-call site"},
      {"lock prefix", "SMP lock prefix"},
      {"ftrace site", "ftrace site"},
      {"cross the function's end", "crosses the function's end"},
      {"not an instruction boundary", "not an instruction boundary"},
  };
  for (const Word& w : kWords)
    if (r.reason.find(w.in) != std::string::npos) return k + ": " + w.key;
  return k + ": other";
}

// What the engine would still refuse of a region the rules accept: longer than the 15 bytes the
// guest module restores, or a detour larger than a slot (probe/engine_jump.cpp, plan_jump).
std::optional<std::string> engine_refuses(const x86::JumpFunction& f, const x86::JumpVerdict& v) {
  if (v.region.length > x86::kMaxInsnLen) return "engine: region longer than 15 bytes";
  std::array<std::uint8_t, x86::kMaxDetourSize> scratch{};
  auto l = x86::emit_detour(scratch, Gva{kModuleArea}, f, v.region, v.point, Gva{kModuleArea + 0x100000});
  if (l && l->size > kEngineSlotSize) return "engine: detour larger than a slot";
  return std::nullopt;
}

// check_jump, and what the engine would still refuse of the region it accepts.
x86::JumpVerdict placed(const x86::JumpFunction& f, Gva at) {
  x86::JumpVerdict w = x86::check_jump(f, at);
  if (auto no = w.optimizable ? engine_refuses(f, w) : std::nullopt) {
    w.optimizable = false;
    w.refusal = x86::JumpRefusal{x86::JumpRule::None, *no};
  }
  return w;
}

// A point beyond today's jumps, in one context (`f`, its island padding `pad`): placed, and how,
// or still a trap, and why.
template <class Where>
void tally(Placed& p, const x86::JumpFunction& f, const x86::SiteIndex& pad, const x86::JumpVerdict& w,
           const Where& where) {
  if (w.optimizable) {
    ++p.added;
    if (w.island) {
      ++p.island;
      p.island_earlier += w.starts_earlier;
      (w.island->value >= f.start().value && w.island->value < f.end().value ? p.island_own : p.island_prev)++;
      p.island_why.add(jump_key(w.refusal), where);
    }
    return;
  }
  p.refused.add(jump_key(w.refusal), [&] { return where() + ": " + w.refusal.reason; });
  // What its own short region lacks: the rules' first refusal, or an island.
  if (auto no = x86::check_region(f, w.point, nullptr, x86::kShortJumpLen))
    p.short_refused.add("the short region: " + jump_key(*no), [&] { return where() + ": " + no->reason; });
  else if (pad.size() == 0)
    p.short_refused.add("the short region passes; no usable dead padding in the function or the one before", where);
  else p.short_refused.add("the short region passes; the listed dead padding is out of rel8 reach", where);
}

void note(PaddingListed& p, const kernel::IslandPaddingListed& l, const std::string& fn) {
  p.own += l.own;
  p.previous += l.previous.has_value();
  p.trimmed += l.own_cut.trimmed;
  if (l.own_cut.dropped && p.dropped++ == 0) p.dropped_example = fn + ": " + *l.own_cut.dropped;
}

}  // namespace

Tally count(Kernel& k, const Options& o) {
  Tally t;
  for (const Decoded& d : k.decoded) {
    k.current = &d;
    const auto& insns = d.insns;
    const Gva lo = d.fn->start, hi = d.fn->start + d.fn->size;
    const x86::JumpFunction jf = x86::JumpFunction::from_insns(insns, lo, hi, k.jc);
    const x86::JumpFunction jf_proof = x86::JumpFunction::from_insns(insns, lo, hi, k.jc_proof);
    if (jf.unknown_targets()) ++t.fn_with_unknown;
    t.fn_relaxed += jf_proof.only_leaving_indirect_jumps();
    if (jf_proof.unknown_targets())
      t.still_unknown.push_back(d.fn->name + ": " + x86::interior_address_taken(jf_proof).value_or("?"));
    // The padding the engine lists for an island of this function, in each context.
    x86::SiteIndex pad, pad_proof;
    note(t.pad, kernel::island_padding_near(k.islands, insns, lo, hi, k.jc, pad), d.fn->name);
    note(t.pad_proof, kernel::island_padding_near(k.islands, insns, lo, hi, k.jc_proof, pad_proof), d.fn->name);
    x86::JumpContext jc_islands = k.jc, jc_both = k.jc_proof;
    jc_islands.island_padding = &pad;
    jc_both.island_padding = &pad_proof;
    std::optional<x86::JumpFunction> jf_islands, jf_both;  // made when needed
    // The engine's foreign-trap rule: an int3 in the flow (not padding, x86::is_padding_trap)
    // hides the instruction it replaced, and refuses every point after it.
    std::size_t first_foreign = insns.size();
    for (std::size_t j = 0; j < insns.size(); ++j) {
      if (x86::is_trap_byte(insns[j]) && !x86::is_padding_trap(insns, j)) {
        first_foreign = j;
        break;
      }
    }
    for (std::size_t j = 0; j < insns.size(); ++j) {
      const x86::Insn& i = insns[j];
      ++t.total;
      auto where = [&] { return d.fn->name + "+" + hex(i.address.value - lo.value) + " " + i.describe(); };
      if (j == 0 && x86::is_endbr(i) && insns.size() > 1) {
        t.refused.add("entry: endbr64 (an entry probe moves past it)", where);
        continue;
      }
      if (j < 2 && kernel::is_ftrace_site(k.rc, insns, i)) {
        t.refused.add("entry: the ftrace site (an entry probe moves past it)", where);
        continue;
      }
      if (auto r = kernel::check_address(k.rc, i, d.fn)) {
        t.refused.add(std::string("address rule: ") + r->rule, where);
        continue;
      }
      if (j > first_foreign) {
        t.refused.add("foreign-trap (an int3 earlier in the flow)", where);
        continue;
      }
      auto plan = x86::analyze(i);
      if (!plan) {
        t.refused.add("instruction rule: " + insn_rule(i), where);
        continue;
      }
      ++t.probeable;
      t.plans.add(std::string(x86::plan_name(*plan)), where);
      if (*plan == x86::Plan::Boost || *plan == x86::Plan::BoostRipRel) ++t.boostable;
      if (!x86::xen_emulator_refusal(i)) ++t.agentless;
      const x86::JumpVerdict v = x86::check_jump(jf, i.address);
      const auto engine_no = v.optimizable ? engine_refuses(jf, v) : std::nullopt;
      if (v.optimizable && !engine_no) {
        ++t.jump_ok;
        if (v.starts_earlier) {
          ++t.jump_earlier;
          t.jump_earlier_why.add(jump_key(v.refusal), where);
        } else {
          ++t.jump_own;
        }
        continue;
      }
      if (engine_no) t.jump_refused.add(*engine_no, where);
      else t.jump_refused.add(jump_key(v.refusal), [&] { return where() + ": " + v.refusal.reason; });
      // What the engine's two rules add, each alone and both together.
      const x86::JumpVerdict wp = placed(jf_proof, i.address);
      t.proof += wp.optimizable;
      if (!jf_islands) jf_islands.emplace(x86::JumpFunction::from_insns(insns, lo, hi, jc_islands));
      const x86::JumpVerdict wi = placed(*jf_islands, i.address);
      if (o.list_proof && wp.optimizable && !wi.optimizable)
        std::printf("PROOF %s+%s %s%s\n", d.fn->name.c_str(), hex(i.address.value - lo.value).c_str(),
                    i.describe().c_str(), wp.starts_earlier ? " (a region starting earlier)" : "");
      if (o.list_islands && wi.optimizable && wi.island)
        std::printf("ISLAND %s+%s island %s %s\n", d.fn->name.c_str(), hex(i.address.value - lo.value).c_str(),
                    k.syms.symbolize(*wi.island).c_str(), i.describe().c_str());
      tally(t.islands, *jf_islands, pad, wi, where);
      if (!jf_both) jf_both.emplace(x86::JumpFunction::from_insns(insns, lo, hi, jc_both));
      tally(t.both, *jf_both, pad_proof, placed(*jf_both, i.address), where);
    }
  }
  return t;
}

}  // namespace xenprobes::coverage
