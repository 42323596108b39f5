// What a loaded module brings besides its text: its function symbols (its kallsyms), read from
// the guest's memory through its struct module (modules.hpp), and its BTF (module_btf.hpp).
//
// Symbols. A LIVE module's `core_kallsyms` (struct mod_kallsyms in include/linux/module.h,
// 6.1 and 6.12: `Elf_Sym *symtab; unsigned int num_symtab; char *strtab; char *typetab;`) holds
// the symbols the module keeps once its init is done: ELF64 symbols (the ELF ABI's Elf64_Sym,
// 24 bytes: st_name u32 at 0, st_info u8 at 4, st_other u8 at 5, st_shndx u16 at 6, st_value
// u64 at 8, st_size u64 at 16) whose st_value the loader has made the running address, names
// at strtab + st_name, and one nm type letter per symbol in typetab (what /proc/kallsyms
// prints). Entry 0 is ELF's null symbol. Only functions are kept: type t/T/w/W.
//
// Trust. All of it is the guest's: num_symtab is capped (a module over the cap is refused as
// a whole), the tables must be readable kernel-half memory, a name must end with its NUL within
// kMaxNameLen bytes of readable strtab and be printable ASCII without spaces, and a function's
// address must lie inside that module's core text (its size is clipped to the text). A symbol
// failing a check is dropped and counted by reason; nothing is trusted because it parsed.

#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kernel/module_btf.hpp"
#include "kernel/modules.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::kernel {

struct ModuleSymbolLimits {
  std::size_t max_symbols = 1u << 17;   // num_symtab of one module
  std::size_t max_total = 1u << 20;     // all modules together
  std::uint64_t max_strtab = 8u << 20;  // bytes of one module's strtab read
  std::size_t chunk_bytes = 64u << 10;  // one guest read
};

// Why symbols were dropped: every one that was not kept and is not a plain non-function.
struct ModuleSymbolStats {
  std::size_t kept = 0;
  std::size_t not_function = 0;          // data, absolute, undefined, the null entry: not for probes
  std::size_t outside_text = 0;          // a function type whose address is outside the module's text
  std::size_t bad_name = 0;              // empty, too long, not printable, or no NUL before unreadable strtab
  std::size_t strtab_out_of_bounds = 0;  // st_name at or past max_strtab, or in unreadable strtab
  std::size_t bad() const { return outside_text + bad_name + strtab_out_of_bounds; }
  std::string describe() const;  // "12 kept, 3 outside its text, ..." (ASCII)
};

// One module's function symbols. Fails (InvalidArgument, with the reason) when the module as
// a whole cannot be read: not usable, no core_kallsyms in the layout, a count over the limit
// (`budget` is what the other modules left of max_total; lowered by what this one uses), a
// table outside the kernel's half or unreadable.
[[nodiscard]] Result<std::vector<symbols::ModuleFunction>> read_module_symbols(const ReadFn& read, const Module& m,
                                                                               ModuleSymbolStats& stats,
                                                                               std::size_t& budget,
                                                                               const ModuleSymbolLimits& limits = {});

// Every usable module's function symbols (a module that cannot be read is logged and left
// out, its reason in `refused`: "name: why").
struct ModuleSymbolsResult {
  std::vector<symbols::ModuleFunction> functions;
  ModuleSymbolStats stats;  // over all modules
  std::size_t modules_read = 0;
  std::vector<std::string> refused;
};
ModuleSymbolsResult read_all_module_symbols(const ReadFn& read, const ModuleTables& mods,
                                            const ModuleSymbolLimits& limits = {});

// Walks the guest's module list with the layout from its BTF `kernel_btf` (the caller read it
// with read_kernel_btf). `core_text` from _stext/_etext of `syms`.
[[nodiscard]] Result<ModuleTables> walk_modules(const symbols::SymbolTable& syms, const ReadFn& read,
                                                std::span<const std::byte> kernel_btf);

// All of it for one guest, from its kernel's symbols: its BTF read (read_kernel_btf), the
// module list walked, then every usable module's functions. Fails (with the reason) when the
// list cannot be walked.
[[nodiscard]] Result<ModuleSymbolsResult> read_guest_module_symbols(const symbols::SymbolTable& syms,
                                                                    const ReadFn& read,
                                                                    const ModuleSymbolLimits& limits = {});
// Every usable module's BTF over the kernel's (module_btf.hpp: the kernel's btf_modules list,
// else its struct module's btf_data); `why` says why a module has none. Fails when the kernel's
// BTF cannot be read or the module list cannot be walked; a btf_modules list that cannot be
// read is no failure (each module without BTF then says why).
struct ModuleBtfBlob {
  std::string module;
  std::vector<std::byte> btf;
  std::string why;
};
[[nodiscard]] Result<std::vector<ModuleBtfBlob>> read_guest_module_btf(const symbols::SymbolTable& syms,
                                                                       const ReadFn& read);

}  // namespace xenprobes::kernel
