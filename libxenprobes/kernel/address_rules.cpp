#include "kernel/address_rules.hpp"

#include <algorithm>
#include <array>
#include <string_view>

#include "common/hex.hpp"
#include "kernel/modules.hpp"
#include "x86/analysis.hpp"

namespace xenprobes::kernel {
namespace {

using x86::Insn;

// What the guest module's die notifier runs on every kernel int3 before it can tell a nested
// hit from a new one, in Linux 6.1 and 6.12 (arch/x86/kernel/traps.c exc_int3 → do_int3 →
// notify_die → atomic_notifier_call_chain → notifier_call_chain → the module's hook, which
// takes RCU read locks, reads text with copy_from_kernel_nofault, checks pages with
// lookup_address, waits with ktime_get_mono_fast_ns and xen_poll_irq_timeout, and signals
// Dom0 through an event channel). A trap on any of them re-enters the same path before the
// module can refuse it: unbounded recursion, then a BUG in __nmi_enter or a stack overflow.
// Only the guest channel has this path; the module's own text is refused by its published
// range (module-text). The second group is what the functions the module calls (and publishes
// as hook-path/*) call in turn, out of line, that the module cannot name (static, or not
// exported): the irq lookup both event-channel calls make (info_for_irq → irq_get_chip_data →
// irq_get_irq_data → irq_to_desc: a radix tree on 6.1, a maple tree from 6.5 on), the
// event-channel ABI's clear_pending (2-level or FIFO), the clocksource read under
// ktime_get_mono_fast_ns (Xen's or the TSC's), Xen PV's page-table entry reads under
// lookup_address, hardened usercopy under copy_from_user_nofault (guest-module/README.md "The
// hook path"). A name a kernel lacks (inlined there) matches nothing.
constexpr std::array<std::string_view, 63> kGuestHookPath = {
    "exc_int3",
    "do_int3",
    "do_int3_user",
    "poke_int3_handler",
    "irqentry_nmi_enter",
    "irqentry_nmi_exit",
    "kprobe_int3_handler",
    "notify_die",
    "atomic_notifier_call_chain",
    "notifier_call_chain",
    "__rcu_read_lock",
    "__rcu_read_unlock",
    "rcu_read_unlock_special",
    "lookup_address",
    "lookup_address_in_pgd",
    "lookup_address_in_pgd_attr",
    "copy_from_kernel_nofault",
    "copy_from_kernel_nofault_allowed",
    "copy_to_kernel_nofault",
    "ktime_get_mono_fast_ns",
    "xen_poll_irq_timeout",
    "xen_clear_irq_pending",
    "evtchn_from_irq",
    "notify_remote_via_evtchn",
    "irq_work_queue",
    "xen_hypercall_pv",
    "xen_hypercall_hvm",
    "xen_hypercall_intel",
    "xen_hypercall_amd",
    "hypercall_page",
    "xen_vcpu_nr",
    "pvclock_clocksource_read",
    "__pvclock_read_cycles",
    "text_poke",
    "text_poke_bp",
    "text_poke_sync",
    "sync_core",
    "xen_force_evtchn_callback",
    "atomic_notifier_chain_register",
    "entry_untrain_ret",
    "info_for_irq",
    "irq_get_irq_data",
    "irq_to_desc",
    "radix_tree_lookup",
    "__radix_tree_lookup",
    "mtree_load",
    "mtree_lookup_walk",
    "mas_start",
    "evtchn_2l_clear_pending",
    "evtchn_fifo_clear_pending",
    "xen_clocksource_get_cycles",
    "xen_clocksource_read",
    "pvclock_clocksource_read_nowd",
    "read_tsc",
    "xen_pgd_val",
    "xen_p4d_val",
    "xen_pud_val",
    "xen_pmd_val",
    "xen_pte_val",
    "pte_mfn_to_pfn",
    "__check_object_size",
    "is_vmalloc_addr",
    "__virt_addr_valid",
};
// Return and indirect-branch thunks: with retbleed/SRSO/ITS mitigations every `ret` and
// indirect call on the hook path goes through them.
constexpr std::array<std::string_view, 8> kGuestHookPathPrefixes = {
    "__x86_return_thunk", "__x86_indirect_thunk_", "__x86_indirect_call_thunk_", "zen_untrain_ret", "srso_",
    "retbleed_",          "its_return_thunk",      "__x86_indirect_its_thunk_",
};

std::string where_of(const RuleContext& c, std::uint64_t a) {
  std::string s = hex(a);
  if (c.syms) {
    std::string sym = c.syms->symbolize(Gva{a});
    if (sym != s) s = sym + " (" + s + ")";
  }
  return s;
}

Refusal refuse(const char* rule, Errc code, std::string reason, std::string entry, bool guest_only = false) {
  return Refusal{rule, code, std::move(reason), std::move(entry), guest_only, {}};
}

std::string range_of(const std::optional<Range>& r) { return r ? hex(r->start) + "-" + hex(r->end) : "?"; }

// The refusal for an address in neither the core kernel's text nor a live module's: says
// which module it is in and why that one is kept out, or why modules are unknown.
Refusal outside_text(const RuleContext& c, std::uint64_t a) {
  const KernelTables& t = *c.tables;
  const std::string text = "text " + hex(t.core_text().start) + "-" + hex(t.core_text().end);
  const ModuleTables* mods = t.modules();
  if (!mods)
    return refuse("not-kernel-text", Errc::InvalidArgument,
                  "outside the kernel's text [_stext, _etext), and the loaded modules were not read: data, freed "
                  "init code or module text",
                  text);
  if (!mods->status().found)
    return refuse("not-kernel-text", Errc::InvalidArgument,
                  "outside the kernel's text [_stext, _etext), and the loaded modules could not be read, so module "
                  "text cannot be checked",
                  text + "; " + mods->summary());
  if (const Module* m = mods->module_at(a)) {
    if (m->init_text.contains(a) && !m->text.contains(a))
      return refuse("not-kernel-text", Errc::InvalidArgument, "init text of a module: freed once its init has run",
                    "module " + m->name + " init text " + hex(m->init_text.start) + "-" + hex(m->init_text.end));
    return refuse("not-kernel-text", Errc::InvalidArgument, "text of a module that is kept out of the rules: " + m->why,
                  "module " + m->name + " text " + hex(m->text.start) + "-" + hex(m->text.end));
  }
  return refuse("not-kernel-text", Errc::InvalidArgument,
                "outside the kernel's text and every live module's text: data, freed init code or an unloaded "
                "module",
                text + "; " + mods->summary());
}

bool looks_like_patch_site(const Insn& i) {
  // The shapes a jump label or a static call can take: nop2, nop5, jmp rel8/rel32, call rel32.
  return (i.kind == x86::Kind::Nop && (i.length == 2 || i.length == 5)) || i.branch == x86::BranchKind::Jmp ||
         i.branch == x86::BranchKind::Call;
}
bool may_fault_with_fixup(const Insn& i) {
  // Anything that touches memory through an operand, and the rep string instructions.
  return i.mem.present || (!i.has_modrm && (i.prefixes[0] == 0xf3 || i.prefixes[0] == 0xf2));
}

}  // namespace

std::string Refusal::message(const std::string& where) const {
  std::string m = where + ": refused by rule '" + rule + "': " + reason;
  if (!entry.empty()) m += " (" + entry + ")";
  if (guest_channel_only)
    m += "; the vmevent and debugger channels accept it (Xen takes their traps before the guest's own int3 path "
         "runs)";
  else if (!accepted_by.empty()) m += "; " + accepted_by;
  else m += "; no channel accepts it";
  return m;
}

std::optional<OwnAddress> needs_own_address(const RuleContext& c, const Insn& i) {
  if (!c.tables)
    return may_fault_with_fixup(i) ? std::optional<OwnAddress>(OwnAddress{"no kernel tables", {}}) : std::nullopt;
  const KernelTables* t = c.tables;
  // In a live module: its own table (always read, or the module would not count as text).
  const Module* mod = t->core_text().contains(i.address.value) ? nullptr : t->live_module_at(i.address.value);
  const TableStatus& st = mod ? mod->ex_status : t->ex_status();
  if (!st.found)
    return may_fault_with_fixup(i) ? std::optional<OwnAddress>(OwnAddress{"__ex_table: " + st.why, {}}) : std::nullopt;
  if (const ExEntry* e = t->exception_entry(i.address.value))
    return OwnAddress{(mod ? "module " + mod->name + " " : std::string()) + "__ex_table entry " + where_of(c, e->insn) +
                          " -> fixup " + where_of(c, e->fixup) + ", type " + std::to_string(e->type()),
                      *e};
  return std::nullopt;
}

const char* fixup_slot_refusal(unsigned type) {
  switch (type) {
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:  // default, fault, uaccess, copy, clear_fs, fpu_restore
    case 8:
    case 9:
    case 10:
    case 11:
    case 12:
    case 13:  // the MSR accesses
    case 14:
    case 15:
    case 16:
    case 17:
    case 18:
    case 19:  // mce-safe, pop_reg, imm_reg, sgx, ucopy_len
      return nullptr;
    case 20:
      return "its fixup handler (zeropad) decodes the instruction at the faulting address, which in a slot is "
             "the slot's";
    default: return "a fixup type this library does not know to be independent of the faulting address";
  }
}

bool in_kernel_text(const RuleContext& c, std::uint64_t a) {
  return c.tables && (c.tables->core_text().contains(a) || c.tables->live_module_at(a));
}
bool in_entry_text(const RuleContext& c, std::uint64_t a) {
  return c.tables && c.tables->entry_text() && c.tables->entry_text()->contains(a);
}
// (In a module: its own .noinstr.text and .kprobes.text, from its struct module.)
bool in_noinstr_text(const RuleContext& c, std::uint64_t a) {
  if (!c.tables) return false;
  if (const Module* m = c.tables->live_module_at(a)) return m->noinstr_text && m->noinstr_text->contains(a);
  return c.tables->noinstr_text() && c.tables->noinstr_text()->contains(a);
}
bool in_kprobes_text(const RuleContext& c, std::uint64_t a) {
  if (!c.tables) return false;
  if (const Module* m = c.tables->live_module_at(a)) return m->kprobes_text && m->kprobes_text->contains(a);
  return c.tables->kprobes_text() && c.tables->kprobes_text()->contains(a);
}
bool on_guest_hook_path(std::string_view name) {
  if (std::find(kGuestHookPath.begin(), kGuestHookPath.end(), name) != kGuestHookPath.end()) return true;
  return std::any_of(kGuestHookPathPrefixes.begin(), kGuestHookPathPrefixes.end(),
                     [&](std::string_view p) { return name.starts_with(p); });
}
std::optional<std::uint64_t> published_hook_path_entry(const RuleContext& c, const symbols::Function& fn) {
  if (!c.hook_path) return std::nullopt;
  const std::uint64_t start = fn.start.value, size = std::max<std::uint64_t>(fn.size, 1);
  auto it = std::lower_bound(c.hook_path->begin(), c.hook_path->end(), start);
  if (it != c.hook_path->end() && *it - start < size) return *it;
  return std::nullopt;
}
bool is_static_call_trampoline(std::string_view name) { return name.starts_with("__SCT__"); }

bool is_ftrace_site(const RuleContext& c, std::span<const Insn> fn, const Insn& i) {
  if (fn.empty()) return false;
  std::size_t first = x86::is_endbr(fn[0]) && fn.size() > 1 ? 1 : 0;
  if (fn[first].address != i.address || i.length != 5) return false;
  if (!(i.kind == x86::Kind::Nop || i.branch == x86::BranchKind::Call)) return false;
  if (c.tables && (c.tables->jump_label_in(i.address.value, i.next().value) ||
                   c.tables->static_call_in(i.address.value, i.next().value)))
    return false;
  return true;
}

EntryPlacement place_entry_probe(const RuleContext& c, std::span<const Insn> fn, Gva requested) {
  if (fn.empty() || fn[0].address != requested) return {requested, {}};
  std::size_t k = 0;
  std::string why;
  if (x86::is_endbr(fn[0]) && fn.size() > 1) {
    k = 1;
    why = "past the endbr64 (with IBT an int3 over it breaks every indirect call of the function)";
  }
  if (k < fn.size() && k + 1 < fn.size() && is_ftrace_site(c, fn, fn[k])) {
    ++k;
    why += std::string(why.empty() ? "" : ", then ") +
           "past the 5-byte ftrace site (the guest's ftrace, kprobes, BPF and livepatch rewrite it and would "
           "find our trap byte there)";
  }
  return {fn[k].address, why};
}

std::optional<Refusal> check_in_function(const RuleContext& c, std::span<const Insn> function, const Insn& i) {
  if (function.empty() || !is_ftrace_site(c, function, i)) return std::nullopt;
  return refuse("ftrace-site", Errc::Busy,
                "the function's 5-byte ftrace site: the guest's ftrace, kprobes, BPF and livepatch rewrite it "
                "and check its bytes first (ftrace_bug) (ask for the function itself and the probe goes past it)",
                "");
}

std::optional<Refusal> check_foreign_jump(const RuleContext& c, const Insn& i, const std::string& function) {
  const KernelTables* t = c.tables;
  if (i.branch != x86::BranchKind::Jmp || i.length != 5 || i.bytes[0] != 0xe9 || !t) return std::nullopt;
  const std::uint64_t to = i.branch_target.value;
  if (t->core_text().contains(to) || t->live_module_at(to)) return std::nullopt;
  return refuse("foreign-jump", Errc::Busy,
                "a jump out of every text the guest's tables know (an in-guest optimized kprobe's jump to its "
                "detour) replaced instructions there and left the rest of their bytes, so the instruction "
                "boundaries of " +
                    function + " cannot be trusted past it; no channel accepts it until it is gone",
                "jmp at " + hex(i.address.value) + " to " + hex(to));
}

std::optional<Refusal> check_address(const RuleContext& c, const Insn& i, const symbols::Function* fn) {
  const std::uint64_t a = i.address.value, end = i.next().value;
  const KernelTables* t = c.tables;
  if (!t || t->core_text().empty())
    return refuse("not-kernel-text", Errc::InvalidArgument,
                  "the guest kernel's text bounds are unknown, so no address can be checked",
                  "load symbols that list _stext and _etext");
  // Checked before the text bounds, which it lies outside of, for the more useful reason.
  if (!c.module_text.empty() && c.module_text.overlaps(a, end))
    return refuse("module-text", Errc::InvalidArgument,
                  "the guest module's own code: its int3 hook runs it (a trap there recurses on the guest "
                  "channel), whatever the other modules allow",
                  "xenprobes module text " + hex(c.module_text.start) + "-" + hex(c.module_text.end));
  const Module* mod = t->core_text().contains(a) ? nullptr : t->live_module_at(a);
  if (!t->core_text().contains(a) && !mod) return outside_text(c, a);
  if (mod ? !mod->text.contains(end - 1) : !t->core_text().contains(end - 1))
    return refuse("not-kernel-text", Errc::InvalidArgument,
                  "the instruction runs past the end of the text it starts in",
                  mod ? "module " + mod->name + " text " + hex(mod->text.start) + "-" + hex(mod->text.end)
                      : "text " + hex(t->core_text().start) + "-" + hex(t->core_text().end));
  // In a module: its own tables (always read, or the module would not count as text).
  const std::string in_mod = mod ? "module " + mod->name + " " : "";
  const TableStatus& jump_st = mod ? mod->jump_status : t->jump_status();
  const TableStatus& sc_st = mod ? mod->sc_status : t->static_call_status();
  if (!fn)
    return refuse("no-function", Errc::InvalidArgument,
                  "no function symbol covers it, so the instruction boundary cannot be checked (a data "
                  "symbol, padding, or a function the symbols do not list)",
                  "");
  if (fn->name.starts_with("__pfx_"))
    return refuse("function-padding", Errc::InvalidArgument,
                  "the padding before a function (CONFIG_FUNCTION_PADDING): no path of the function runs it, "
                  "and the kernel rewrites it at boot for call-depth tracking or FineIBT",
                  fn->name);
  if (x86::is_endbr(i))
    return refuse("endbr64", Errc::InvalidArgument,
                  "an indirect-branch landing pad: with IBT on, an indirect call or jump that lands on a trap "
                  "byte instead raises #CP in the guest (ask for the function itself and the probe goes past it)",
                  "");
  if (in_entry_text(c, a))
    return refuse("entry-text", Errc::InvalidArgument,
                  "entry code runs on the entry stack, with the user GS or the user page tables (PTI), "
                  "where neither a trap nor the out-of-line slot is mapped or safe",
                  ".entry.text " + hex(t->entry_text()->start) + "-" + hex(t->entry_text()->end));
  if (is_static_call_trampoline(fn->name))
    return refuse("static-call-trampoline", Errc::Busy,
                  "a static-call trampoline: the kernel rewrites it when the call's target changes and "
                  "BUG()s on a byte it did not write",
                  fn->name);
  // Run-time-patched sites: the kernel checks the bytes before rewriting and BUG()s (jump
  // labels, static calls) on a mismatch, with its text locks held.
  if (!jump_st.found) {
    if (looks_like_patch_site(i))
      return refuse("jump-label", Errc::Busy,
                    "the jump-label table could not be read, so a nop or jmp may be a static-key site",
                    "__jump_table: " + jump_st.why);
  } else if (const Site* s = t->jump_label_in(a, end)) {
    return refuse("jump-label", Errc::Busy,
                  "a static-key site: the kernel rewrites it when the key flips and BUG()s on a byte it "
                  "did not write",
                  in_mod + "__jump_table site " + where_of(c, s->addr) + ", key " + where_of(c, s->key));
  }
  if (!sc_st.found) {
    if (looks_like_patch_site(i))
      return refuse("static-call", Errc::Busy,
                    "the static-call table could not be read, so a call, jmp or nop5 may be a static-call site",
                    ".static_call_sites: " + sc_st.why);
  } else if (const Site* s = t->static_call_in(a, end)) {
    return refuse("static-call", Errc::Busy,
                  "a static-call site: the kernel rewrites it when the call's target changes and BUG()s "
                  "on a byte it did not write",
                  in_mod + ".static_call_sites site " + where_of(c, s->addr) + ", key " + where_of(c, s->key));
  }
  if (mod && !t->smp_locks_status().freed) {
    // A module's lock sites are not in struct module but in the kernel's smp_alt_modules list,
    // which is not read; the kernel keeps them only while it may still switch between UP and
    // SMP, exactly when its own .smp_locks is still mapped (else no prefix is rewritten).
    if (i.has_lock() || i.prefixes[1] == 0x3e)
      return refuse("smp-lock", Errc::Busy,
                    "a lock prefix in a module while the kernel may still rewrite lock prefixes (UP <-> SMP), and a "
                    "module's lock sites are not read",
                    in_mod + ".smp_locks: " +
                        (t->smp_locks_status().found ? "the kernel's is still mapped" : t->smp_locks_status().why));
  } else if (mod) {
    // The kernel rewrites no lock prefix any more (its .smp_locks is freed): nothing to refuse.
  } else if (!t->smp_locks_status().found) {
    if (i.has_lock() || i.prefixes[1] == 0x3e)
      return refuse("smp-lock", Errc::Busy,
                    "the SMP lock-site table could not be read, so this prefix may be rewritten at CPU hotplug",
                    ".smp_locks: " + t->smp_locks_status().why);
  } else if (auto l = t->smp_lock_in(a, end); l && (i.bytes[*l - a] == 0xf0 || i.bytes[*l - a] == 0x3e)) {
    // (An entry whose byte is no lock prefix is garbage from a freed table, not a site.)
    return refuse("smp-lock", Errc::Busy,
                  "a lock prefix the kernel rewrites (0x3e <-> 0xf0) when CPUs come and go; restoring our "
                  "copy could leave the operation non-atomic",
                  ".smp_locks " + where_of(c, *l));
  }
  // Run in place (emulates_in_place), a fault has the instruction's own address; in a fixup
  // slot, the slot's entry sends it to the original fixup: accepted.
  if (auto own = needs_own_address(c, i); own && !c.emulates_in_place) {
    const char* type_refusal = own->entry ? fixup_slot_refusal(own->entry->type()) : nullptr;
    if (!(c.fixup_slots && own->entry && !type_refusal)) {
      Refusal r =
          !(mod ? mod->ex_status : t->ex_status()).found
              ? refuse("exception-table", Errc::InvalidArgument,
                       "the exception table could not be read, so this memory access may expect its fault "
                       "to be fixed up at the original address",
                       own->why)
          : type_refusal
              ? refuse("exception-table", Errc::InvalidArgument,
                       std::string("the kernel expects this instruction to fault and ") + type_refusal, own->why)
              : refuse("exception-table", Errc::InvalidArgument,
                       "the kernel expects this instruction to fault (a user copy, a *_safe access) and "
                       "looks its fixup up by the faulting address, which in an ordinary slot is the slot's; "
                       "this guest module gives no fixup slots (load this version's xenprobesU)",
                       own->why);
      r.accepted_by =
          "the vmevent channel in int3 mode (an HVM or PVH guest without the guest module) accepts it: "
          "Xen's emulator runs it at its own address";
      if (own->entry && !type_refusal)
        r.accepted_by += ", and so does every channel when the guest module gives fixup slots";
      return r;
    }
  }
  // The guest's own int3 path (guest channel only).
  if (c.guest_channel) {
    if (!c.hook_path_error.empty())
      return refuse("guest-hook-path", Errc::InvalidArgument,
                    "the guest module's list of the functions its hit path calls could not be read, so that "
                    "path cannot be told from other code",
                    "hook-path: " + c.hook_path_error, true);
    if (auto e = published_hook_path_entry(c, *fn))
      return refuse("guest-hook-path", Errc::InvalidArgument,
                    "the guest module's hit path calls it (it publishes the function): a trap there is hit "
                    "again inside the module's hook, where Dom0 never sees it, or recurses",
                    fn->name + ", published as " + hex(*e) + " in hook-path", true);
    if (on_guest_hook_path(fn->name))
      return refuse("guest-hook-path", Errc::InvalidArgument,
                    "runs on every kernel int3 before the guest module can tell a nested hit: a trap there "
                    "recurses until the kernel panics",
                    fn->name, true);
    if (in_noinstr_text(c, a))
      return refuse("noinstr", Errc::InvalidArgument,
                    "noinstr code runs before RCU and context tracking are set up for a trap handler",
                    in_mod + ".noinstr.text " + range_of(mod ? mod->noinstr_text : t->noinstr_text()), true);
    if (in_kprobes_text(c, a))
      return refuse("kprobes-text", Errc::InvalidArgument,
                    "the kernel's own breakpoint-handling code (.kprobes.text) must not trap",
                    in_mod + ".kprobes.text " + range_of(mod ? mod->kprobes_text : t->kprobes_text()), true);
    if (!t->blacklist_status().found)
      return refuse("kprobe-blacklist", Errc::InvalidArgument,
                    "the kernel's kprobe blacklist could not be read, so the guest's int3 path cannot be told "
                    "from other code",
                    "kprobe_blacklist: " + t->blacklist_status().why, true);
    if (const Range* r = t->blacklisted(a))
      return refuse("kprobe-blacklist", Errc::InvalidArgument,
                    "the kernel marks it NOKPROBE: it runs where a trap into the guest's own handler recurses "
                    "or corrupts state",
                    "kprobe_blacklist " + where_of(c, r->start) + "-" + hex(r->end), true);
  }
  return std::nullopt;
}

}  // namespace xenprobes::kernel
