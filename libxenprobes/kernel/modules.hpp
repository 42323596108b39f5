// The guest kernel's loaded modules, read from its memory: the `modules` list of struct
// module, each one's name, state, core text and its own exception table, jump labels, static
// calls, .kprobes.text and .noinstr.text. With them the address rules (address_rules.hpp) treat
// a live module's text like the core kernel's.
//
// Layout. struct module differs between kernel versions and configurations, so nothing about
// it is compiled in: every member offset, width and enum value comes from the guest's own BTF
// (btf.hpp), by name, through libbpf. Two text layouts are recognised from the BTF itself:
// Linux up to 6.3 keeps `core_layout`/`init_layout` (struct module_layout: base, text_size),
// 6.4 and later `mem[]` (struct module_memory: base, size) indexed by enum mod_mem_type's
// MOD_TEXT and MOD_INIT_TEXT.
//
// Trust. The list, every struct module and every table are the guest's: the walk is bounded
// (Limits::max_modules) and stops at a node seen before or whose `prev` does not point back;
// counts are bounded (Limits::max_entries); a module must be LIVE (COMING and GOING modules are
// skipped with the reason), have a valid name and a text range inside the kernel's half that
// overlaps neither the core kernel nor another module, and its tables must be readable, or it
// is kept out of the rules ("usable" false, with why). Entries whose decoded address is outside
// the module's text are dropped and counted (invalid; init_entries for its init text).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::kernel {

// One member of a struct as read from the guest: byte offset from the struct's start and width.
struct Field {
  std::uint32_t offset = 0;
  std::uint32_t size = 0;  // 1, 2, 4 or 8
};

// struct module as the guest's BTF describes it.
struct ModuleLayout {
  std::uint32_t struct_size = 0;
  Field state, list, name;  // list: the struct list_head (next at +0, prev at +8); name: char[]
  bool mem_array = false;   // 6.4+: mem[MOD_TEXT]; else core_layout/init_layout
  Field core_base, core_text_size, init_base, init_text_size;
  Field extable, num_exentries, jump_entries, num_jump_entries, static_call_sites, num_static_call_sites;
  std::optional<Field> kprobes_text_start, kprobes_text_size, noinstr_text_start, noinstr_text_size;
  // CONFIG_KALLSYMS: core_kallsyms (struct mod_kallsyms: symtab, num_symtab, strtab, typetab),
  // each member's place inside struct module; absent when the BTF has no core_kallsyms or its
  // symtab does not point at 24-byte Elf64_Sym (module_symbols.hpp).
  std::optional<Field> ksym_symtab, ksym_num_symtab, ksym_strtab, ksym_typetab;
  // CONFIG_DEBUG_INFO_BTF_MODULES: btf_data, btf_data_size; absent without it.
  std::optional<Field> btf_data, btf_data_size;
  // CONFIG_UNWINDER_ORC: arch.num_orcs, arch.orc_unwind_ip, arch.orc_unwind (struct
  // mod_arch_specific, arch/x86/include/asm/module.h: the module's ORC tables, kernel/orc.hpp).
  std::optional<Field> orc_num, orc_ip, orc_unwind;
  // enum module_state
  std::uint64_t state_live = 0, state_coming = 1, state_going = 2, state_unformed = 3;
  std::string describe() const;  // "struct module 1264 bytes, mem[] layout, …"
};

// NotFound when the BTF has no struct module (or a member the walk needs), Io when libbpf
// rejects the bytes, InvalidArgument when a member has an unusable shape (a bitfield, a width
// that is no integer or pointer, outside the struct).
[[nodiscard]] Result<ModuleLayout> module_layout_from_btf(std::span<const std::byte> btf);

enum class ModuleState { Live, Coming, Going, Unformed, Unknown };
const char* to_string(ModuleState);

struct Module {
  std::string name;  // validated: [A-Za-z0-9_.-], 1..55 bytes; "?" when invalid
  ModuleState state = ModuleState::Unknown;
  std::uint64_t address = 0;                        // its struct module
  std::uint64_t link_next = 0, link_prev = 0;       // its list_head when read
  Range text, init_text;                            // core text [base, base + text size); init text (freed once LIVE)
  std::optional<Range> kprobes_text, noinstr_text;  // clipped to `text`
  std::vector<ExEntry> ex;                          // sorted by insn
  std::vector<Site> jumps, calls;                   // sorted by addr
  TableStatus ex_status, jump_status, sc_status;
  // core_kallsyms and BTF as read from its struct module (0 when the layout has none):
  // hostile values, checked by read_module_symbols / read_module_btf before use.
  std::uint64_t ksym_symtab = 0, ksym_num = 0, ksym_strtab = 0, ksym_typetab = 0;
  std::uint64_t btf_data = 0, btf_size = 0;
  std::uint64_t orc_num = 0, orc_ip = 0, orc_unwind = 0;  // its ORC tables, when the layout has them (hostile)
  bool usable = false;  // live, sane, tables read: its text is kernel text for the rules
  std::string why;      // when !usable: why it is kept out of the rules
};

// What a probe point in a module's text keeps of its module: the module is "still there" only
// while the same struct module holds the same text under the same name.
struct ModuleIdentity {
  std::string name;
  std::uint64_t address = 0;  // its struct module
  Range text;
  static ModuleIdentity of(const struct Module& m);
  bool operator==(const ModuleIdentity&) const = default;  // the same load of the same module
};

class ModuleTables;
// The module `was` (recorded when a point at `addr` was decoded) was unloaded, or another
// module's text now covers `addr`: says which. nullopt while it is still there, and when the
// list could not be walked (then nothing is known).
std::optional<std::string> module_replaced(const ModuleTables& now, std::uint64_t addr, const ModuleIdentity& was);

class ModuleTables {
 public:
  // Walks the guest's module list (`modules` in the symbols) with `layout`; never fails as a
  // whole: status() says when the list could not be walked. `core_text` is the kernel's text
  // (module text overlapping it is refused).
  static ModuleTables read(const symbols::SymbolTable& syms, const ReadFn& read, const ModuleLayout& layout,
                           Range core_text, const Limits& limits = {});
  // No walk possible (no BTF, no struct module in it): status() says why.
  static ModuleTables unavailable(std::string why);

  // "modules": found when the whole list was walked; entries = usable modules, invalid = the
  // others (each says why).
  const TableStatus& status() const { return status_; }
  const std::vector<Module>& modules() const { return modules_; }  // sorted by text start
  // The usable module whose text holds `addr`, or null. O(log n).
  const Module* live_module_at(std::uint64_t addr) const;
  // Any module whose core or init text holds `addr` (usable or not), for messages; or null.
  const Module* module_at(std::uint64_t addr) const;

  // Whether the list may have changed since this walk: its head's next/prev differ (a module
  // loaded: Linux adds new ones at the head) or a usable module's state, links or text differ
  // (one going away, or gone and another in its place). One 16-byte read plus three small
  // reads per usable module; true when anything cannot be read, or when there was no walk.
  bool changed(const symbols::SymbolTable& syms, const ReadFn& read) const;

  // "modules 42 live (3 kept out: foo GOING; ...)" or "modules not read (why)"; ASCII only.
  std::string summary() const;
  // The struct module layout the walk used (meaningful when status().found).
  const ModuleLayout& layout() const { return layout_; }

 private:
  TableStatus status_;
  std::vector<Module> modules_;
  std::vector<std::size_t> live_;  // indexes of usable modules, by text start
  std::uint64_t head_ = 0, head_next_ = 0, head_prev_ = 0;
  ModuleLayout layout_;
  bool walked_ = false;
};

}  // namespace xenprobes::kernel
