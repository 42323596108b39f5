// Address rules: whether a probe may go on an instruction *at this address* of this guest
// kernel, given its own tables (tables.hpp). The instruction rules (x86/analysis.hpp) say
// whether an instruction can run out of line at all; these say whether the kernel lets
// anybody else write a trap over it. Each rule is one named predicate with its one-line
// reason; the gate (check_address) runs them in order and returns the first that refuses.
//
// Channels differ in one respect only: on the guest channel the trap enters the guest's own
// int3 path (exc_int3 → notify_die → the guest module's notifier), so every address on that
// path — and everything kprobes refuses for the same reason (.kprobes.text, noinstr, the
// kprobe blacklist) — would recurse. On the vmevent and debugger channels Xen takes the trap
// before the guest sees it, so those points are safe there; the refusal says so.
//
// Where a table could not be read (TableStatus::found false), its rule refuses every
// instruction of the shapes that table could cover, naming the missing table.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"

namespace xenprobes::kernel {

struct RuleContext {
  const KernelTables* tables = nullptr;  // the guest kernel's tables
  const symbols::SymbolTable* syms = nullptr;
  Range module_text;           // the guest module's own text (empty: unknown)
  bool guest_channel = false;  // the trap enters the guest's own int3 path
  // The channel can have the hypervisor run an instruction at its own address (the vmevent
  // channel: Xen's emulator). Then an instruction whose fault the kernel fixes up by address
  // (the exception table) is run that way instead of out of line, and is not refused.
  bool emulates_in_place = false;
  // The guest module gives slots with exception-table entries of their own (fixup slots,
  // protocol.h): an instruction with a known entry runs there and its fault reaches the
  // original fixup, on every channel.
  bool fixup_slots = false;
  // The kernel functions the guest module's own hit path calls out to, as it publishes them
  // (hook-path/*, protocol.h): addresses, sorted. On the guest channel a probe whose function
  // contains one is refused ('guest-hook-path', naming the entry), besides the names Dom0 knows
  // (on_guest_hook_path). Null: the module publishes none (an older one): the names alone.
  const std::vector<std::uint64_t>* hook_path = nullptr;
  // Why the module's hook-path keys could not be read (malformed, an entry missing): then the
  // guest channel refuses every probe, as it cannot tell the hook's path from other code.
  std::string hook_path_error{};
};

struct Refusal {
  const char* rule = "";  // e.g. "exception-table"
  Errc code = Errc::InvalidArgument;
  std::string reason;               // why the rule exists, one line
  std::string entry;                // what in the guest's tables triggered it
  bool guest_channel_only = false;  // the vmevent and debugger channels accept the point
  // Where the refusal does not hold, when not the guest channel alone: e.g. "the vmevent
  // channel in int3 mode accepts it". Empty: no channel accepts it.
  std::string accepted_by;
  // "<where>: refused by rule '<rule>': <reason> (<entry>); <which channels accept it>"
  std::string message(const std::string& where) const;
};

// The instruction at insn.address, inside `fn` (its containing function from the symbols;
// null when none covers it).
[[nodiscard]] std::optional<Refusal> check_address(const RuleContext&, const x86::Insn& insn,
                                                   const symbols::Function* fn);

// An instruction whose fault the kernel fixes up by the faulting address: its exception-table
// entry, or (the table could not be read) a memory access that may have one.
struct OwnAddress {
  std::string why;               // "__ex_table entry f+0x8 (0x...) -> fixup f+0xa (0x...), type 3"
  std::optional<ExEntry> entry;  // known: it can run in a fixup slot with a copy of it
};
// Nullopt for an instruction that may run anywhere. A channel that emulates_in_place runs such
// an instruction where it is; with fixup slots, one with a known entry whose type
// fixup_slot_refusal() accepts runs in a fixup slot; check_address refuses it otherwise.
[[nodiscard]] std::optional<OwnAddress> needs_own_address(const RuleContext&, const x86::Insn& insn);
// Whether a fault of this EX_TYPE_* may be fixed up from a fixup slot: its handler uses the
// registers and the entry's fixup, not the faulting address itself (Linux 6.1 to 6.12,
// arch/x86/mm/extable.c; the zeropad handler decodes the instruction at the faulting address,
// and ERETU, BPF and unknown types are refused). Null when it may, else why not.
const char* fixup_slot_refusal(unsigned ex_type);

// Rules that need the decoded function (`function`, from its first byte): 'ftrace-site', a
// point asked for on the 5-byte ftrace site itself (a probe asked for at the function's first
// byte goes past it: place_entry_probe).
[[nodiscard]] std::optional<Refusal> check_in_function(const RuleContext&, std::span<const x86::Insn> function,
                                                       const x86::Insn& insn);

// Rule 'foreign-jump': `i`, an instruction on the way from its function's start to a point,
// is a jmp rel32 into no text the guest's tables know (neither the core kernel's nor a live
// module's): what an in-guest optimized kprobe writes over the instructions it takes to its
// detour buffer, leaving the rest of their bytes behind, so that the function's instructions
// cannot be told apart from there on. A call (an ftrace or BPF trampoline's at the function's
// ftrace site) is one whole instruction and leaves the boundaries as they were. Null when `i`
// is no such jump.
[[nodiscard]] std::optional<Refusal> check_foreign_jump(const RuleContext&, const x86::Insn& i,
                                                        const std::string& function);

// The named predicates, for tests (each true when its rule refuses the instruction).
bool in_kernel_text(const RuleContext&, std::uint64_t addr);
bool in_entry_text(const RuleContext&, std::uint64_t addr);
bool in_noinstr_text(const RuleContext&, std::uint64_t addr);
bool in_kprobes_text(const RuleContext&, std::uint64_t addr);
bool on_guest_hook_path(std::string_view function_name);
// The address the guest module published (RuleContext::hook_path) that lies in `fn`
// ([start, start + size), or its first byte when the symbols give no size), if any.
std::optional<std::uint64_t> published_hook_path_entry(const RuleContext&, const symbols::Function& fn);
bool is_static_call_trampoline(std::string_view function_name);

// Where a probe asked for at a function's first byte goes: past an endbr64 (IBT), then past
// the 5-byte ftrace site (a nop5, or a call once ftrace uses it), which belongs to the
// kernel's ftrace, as kprobes arms such points through ftrace rather than with an int3.
// Registers and [rsp] are the same there as at the first byte. `function` is the decoded
// function; returns the address and, when moved, why.
struct EntryPlacement {
  Gva address;
  std::string moved_because;  // empty when not moved
};
EntryPlacement place_entry_probe(const RuleContext&, std::span<const x86::Insn> function, Gva requested);
// True when `i` is the function's ftrace site: the first instruction (after an endbr64),
// a nop5 or a call rel32, and no jump-label or static-call site.
bool is_ftrace_site(const RuleContext&, std::span<const x86::Insn> function, const x86::Insn& i);

}  // namespace xenprobes::kernel
