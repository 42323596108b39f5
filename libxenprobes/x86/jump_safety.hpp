// Jump safety: whether a 5-byte `jmp rel32` to a detour may replace the instructions starting at
// a point of a function (a djprobe / optprobe), instead of a trap byte. The detour runs copies of
// the instructions the jump covers (the region), relocated, then jumps back to the region's end.
//
//   function  start ............ region [start, start + len) ........... end
//                                 e9 <rel32 → detour> [tail of the last copied insn]
//   detour    (saved registers, the handler call) copies of the region's instructions,
//             relocated; jmp rel32 → start + len
//
// One named predicate per rule, each with its reason; the gate (check_jump) runs them in order
// and returns the first refusal. A point whose own region is refused may still be reached by
// a region that starts earlier in the same basic block (the detour then calls the handler
// between the copies, right before the probed instruction): check_jump reports that region.
// A point no region serves stays a trap probe; the verdict says why.
//
// Rules (Linux's optprobes, arch/x86/kernel/kprobes/opt.c, checks the same hazards; where they
// differ the comment in jump_safety.cpp says how):
//   region-in-function   the region starts on an instruction boundary of the function, decoded
//                        from its start
//   fits-in-function     the region (whole instructions, ≥ 5 bytes) ends inside the function
//   whole-instructions   every instruction of the region can run out of line: the instruction
//                        rules (analysis.hpp); RIP-relative operands and relative branches reach
//                        their targets from the detour with rel32; a `call rel32` (always the
//                        region's last instruction) becomes push <original return address>;
//                        jmp <target>, and an indirect call closing the region likewise
//                        (push; jmp <operand>, not through RSP); no loop/jrcxz (rel8 only), no
//                        endbr64 (an indirect-branch landing pad); int3 padding after a ret or
//                        jmp is dead and allowed (is_padding_trap, analysis.hpp)
//   no-branch-into-region  no branch of the function, no jump-table entry and no address the
//                        caller names as entered from outside (exception fixups) targets bytes
//                        1 .. len-1 of the region; an indirect jump whose targets the caller
//                        cannot supply (a jump table it cannot read, a computed goto through a
//                        retpoline thunk) makes every region of the function unsafe
//   no-reserved-address  no address the caller reserves (the kernel's exception table, jump
//                        labels, static calls, lock prefixes, the ftrace site) overlaps the region
//   island-in-reach      (short jumps only) a 2-byte `jmp rel8` at the region's start reaches a
//                        free 5-byte island in dead padding the caller lists (dead_padding()),
//                        which then holds the `jmp rel32` to the detour
//
// Short jumps: where no 5-byte region passes and the caller lists dead padding
// (JumpContext::island_padding), a region of whole instructions of at least 2 bytes may start
// with `eb rel8` to an island:
//
//   function  ... region [start, start + len) ...    ret; int3; nop ... (dead padding)
//                 eb <rel8 → island>                     island: e9 <rel32 → detour>
//
// The region passes the same rules with 2 bytes in place of 5; the detour is the same.
//
// An indirect jump with unknown targets need not taint its function when the caller proves
// that its targets lie outside it (JumpContext::addresses_taken, interior_address_taken()).
//
// Pure code: bytes in, verdict out; the kernel layer supplies the tables.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "x86/insn.hpp"

namespace xenprobes::x86 {

inline constexpr std::uint8_t kJumpPatchLen = 5;           // e9 + rel32
inline constexpr std::uint8_t kShortJumpLen = 2;           // eb + rel8: reaches [start + 2 - 128, start + 2 + 127]
inline constexpr std::uint8_t kIslandLen = kJumpPatchLen;  // an island is one jmp rel32

// Sites by address: [addr, addr + len) with what they are, for O(log n) overlap queries.
class SiteIndex {
 public:
  struct Site {
    std::uint64_t addr = 0;
    std::uint32_t len = 1;
    std::string what;  // "__ex_table entry", "jump label", ...: shown in refusals
  };
  void add(std::uint64_t addr, std::uint32_t len, std::string what);
  // The first site overlapping [lo, hi), or null. The first query after an add() sorts the
  // index: not to be shared between threads until then.
  const Site* overlapping(std::uint64_t lo, std::uint64_t hi) const;
  std::size_t size() const { return sites_.size(); }

 private:
  void sort() const;
  mutable std::vector<Site> sites_;
  mutable bool sorted_ = true;
  std::uint32_t max_len_ = 0;
};

// What the caller knows beyond the function's bytes. Everything is optional; what is missing
// makes the rules stricter, never laxer.
struct JumpContext {
  // Addresses nobody but their owner may overwrite (no-reserved-address).
  const SiteIndex* reserved = nullptr;
  // Addresses entered from outside the function's own branches: exception fixups, known
  // jump-table entries (no-branch-into-region).
  const SiteIndex* entry_points = nullptr;
  // Retpoline thunks (__x86_indirect_thunk_*): a `jmp` into one is an indirect jump.
  const SiteIndex* indirect_thunks = nullptr;
  // The targets of an indirect jump (`i` is the jmp through memory or a register, or the jmp to
  // a thunk), e.g. a jump table's entries read from memory; nullopt when unknown.
  std::function<std::optional<std::vector<Gva>>(const Insn& i)> indirect_targets;
  // The kernel is built for IBT (CONFIG_X86_KERNEL_IBT: -fcf-protection=branch, jump tables
  // off): every target of an indirect jump starts with endbr64, so an indirect jump with
  // unknown targets no longer taints the function (no region may hold an endbr64).
  bool endbr_marks_indirect_targets = false;
  // Where detours run, [detour_area, detour_area + detour_area_size): every relocated
  // displacement must reach its target from both ends. nullopt: no reach is checked (the
  // caller checks when it places the detour).
  std::optional<Gva> detour_area;
  std::uint64_t detour_area_size = 0;
  // Short jumps: the dead padding where an island may go (each site one function's
  // dead_padding(), listed only where the caller's kernel leaves those bytes alone), and the
  // islands other probes hold ([addr, addr + kIslandLen)). Null padding: no short jumps.
  const SiteIndex* island_padding = nullptr;
  const SiteIndex* islands_taken = nullptr;
  // Every code address the caller found materialized outside a branch, anywhere in the kernel
  // (materialized_addresses() of every instruction, and the code addresses its data holds):
  // an indirect jump can only reach an address somebody formed. When set, a function none of
  // whose interior addresses is listed (interior_address_taken()) keeps its regions despite
  // indirect jumps with unknown targets: they can only leave it (tail calls). Null: unknown.
  const SiteIndex* addresses_taken = nullptr;
};

enum class JumpRule : std::uint8_t {
  None,
  RegionInFunction,
  FitsInFunction,
  WholeInstructions,
  NoBranchIntoRegion,
  NoReservedAddress,
  IslandInReach,
};
std::string_view jump_rule_name(JumpRule r);  // "region-in-function", ...

struct JumpRefusal {
  JumpRule rule = JumpRule::None;
  std::string reason;  // "<what> at <address>: <why>"
};

// A function decoded once from its start, with every address its branches (and the caller's
// entry points) reach inside it: the predicates below run against it.
class JumpFunction {
 public:
  // `bytes` is the whole function (its extent from the symbols); EILSEQ if it does not decode
  // from its start to its end.
  [[nodiscard]] static Result<JumpFunction> decode(std::span<const std::uint8_t> bytes, Gva start,
                                                   const JumpContext& ctx);
  // From instructions decode_function() returned for [start, end).
  static JumpFunction from_insns(std::vector<Insn> insns, Gva start, Gva end, const JumpContext& ctx);

  Gva start() const { return start_; }
  Gva end() const { return end_; }
  const std::vector<Insn>& insns() const { return insns_; }
  const JumpContext& context() const { return *ctx_; }

  // Index of the instruction starting at `a`, or npos.
  std::size_t index_of(Gva a) const;
  // The first branch target (or entry point) in (lo, hi), with who reaches it; nullopt if none.
  std::optional<std::string> target_inside(std::uint64_t lo, std::uint64_t hi) const;
  // Why no region of this function can be trusted (an indirect jump with unknown targets).
  const std::optional<std::string>& unknown_targets() const { return unknown_targets_; }
  // It has indirect jumps with unknown targets, and JumpContext::addresses_taken proved that
  // they only leave it (unknown_targets() is then empty).
  bool only_leaving_indirect_jumps() const { return only_leaving_; }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  struct Target {
    std::uint64_t to = 0;
    std::uint64_t from = 0;  // the branch's address (0: an entry point from the context)
  };
  Gva start_{}, end_{};
  std::vector<Insn> insns_;
  std::vector<Target> targets_;  // sorted by `to`
  std::optional<std::string> unknown_targets_;
  bool only_leaving_ = false;
  const JumpContext* ctx_ = nullptr;
};

// The region a jump at `start` would cover: whole instructions from `start` until at least
// kJumpPatchLen bytes. nullopt when `start` is no instruction boundary or the function ends
// first.
struct JumpRegion {
  Gva start{};
  std::uint8_t length = 0;
  std::size_t first = 0;               // index of its first instruction in JumpFunction::insns()
  std::size_t count = 0;               // its instructions
  std::uint8_t patch = kJumpPatchLen;  // the jump written at its start: 5 (rel32) or 2 (rel8)
  Gva end() const { return start + length; }
};

// ---- The predicates: each returns its refusal, or nullopt when the rule holds.
std::optional<JumpRefusal> region_in_function(const JumpFunction& f, Gva start);
std::optional<JumpRefusal> fits_in_function(const JumpFunction& f, Gva start, std::uint8_t patch = kJumpPatchLen);
std::optional<JumpRefusal> whole_instructions(const JumpFunction& f, const JumpRegion& r);
std::optional<JumpRefusal> no_branch_into_region(const JumpFunction& f, const JumpRegion& r);
std::optional<JumpRefusal> no_reserved_address(const JumpFunction& f, const JumpRegion& r);
// A short region's island: the lowest free kIslandLen bytes of the listed padding within rel8
// reach of r.start + kShortJumpLen, outside the region, reachable from the detour area.
std::optional<JumpRefusal> island_in_reach(const JumpFunction& f, const JumpRegion& r, Gva* island);

// All five for a region starting at `start` with a `patch`-byte jump; the first refusal, or
// the region.
[[nodiscard]] std::optional<JumpRefusal> check_region(const JumpFunction& f, Gva start, JumpRegion* out,
                                                      std::uint8_t patch = kJumpPatchLen);

// ---- What the caller lists in the context.

// The function's dead padding, [first, end): the bytes after its last instruction that
// execution never goes past (ret, jmp rel, jmp r/m), when every one of them is an int3 or a nop,
// no branch of the function, entry point or reserved site lies in them, and the function has
// no indirect jump of unknown targets. nullopt when there is none or it is shorter than an
// island. Whether the kernel leaves those bytes alone is the caller's to know (6.2+ rewrites
// the 16 bytes before each function with call padding: they are another symbol, __pfx_*).
std::optional<std::pair<Gva, Gva>> dead_padding(const JumpFunction& f);

// The code addresses `i` forms without branching there: a RIP-relative operand's address, an
// absolute displacement, an immediate (sign-extended imm32 or imm64); not a relative branch's
// target (that is a branch, which the function's targets hold).
std::vector<std::uint64_t> materialized_addresses(const Insn& i);

// Who forms an address inside `f` (after its first byte) per JumpContext::addresses_taken, or
// one of f's own instructions forming f's start (a base for arithmetic on labels); nullopt when
// nobody does, so an indirect jump can only enter f at its start. Needs addresses_taken.
std::optional<std::string> interior_address_taken(const JumpFunction& f);

struct JumpVerdict {
  bool optimizable = false;
  Gva point{};
  JumpRegion region;            // when optimizable
  bool starts_earlier = false;  // region.start < point: the handler is called before the copy of
                                // the probed instruction, after the copies before it
  // Why the point's own region was refused (set when !optimizable, and when starts_earlier).
  JumpRefusal refusal;
  // A short jump (region.patch == kShortJumpLen): the island its rel8 goes to.
  std::optional<Gva> island;
};

// The gate for a probe at `point`: its own region, else the latest earlier start in the same
// basic block whose region covers `point` and passes every rule; then, when the context lists
// island padding, the same with a short jump and an island.
JumpVerdict check_jump(const JumpFunction& f, Gva point);

}  // namespace xenprobes::x86
