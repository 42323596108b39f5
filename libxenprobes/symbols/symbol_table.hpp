// SymbolTable: kernel symbols from a System.map (`nm -n` output) or /proc/kallsyms text, with
// the KASLR slide of the running guest applied.
//
// Addresses. The file lists link-time addresses (kallsyms lists running ones; its slide is 0).
// Every address this class takes or returns is a *running* address: running = link + slide().
//
// Trust. The file and the running _text value (sent by the guest module through xenstore) are
// hostile input: lines are bounded, anything unparseable is skipped and counted, and a slide is
// only accepted if it is 2 MiB aligned and keeps every symbol in the canonical upper half.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::symbols {

inline constexpr std::size_t kMaxLineLen = 1024;              // longer lines are counted as malformed
inline constexpr std::size_t kMaxNameLen = 512;               // Linux KSYM_NAME_LEN (6.1+)
inline constexpr std::uint64_t kMaxFileBytes = 256ull << 20;  // a distro kallsyms is ~20 MiB
// Linux aligns the x86-64 kernel to CONFIG_PHYSICAL_ALIGN (2 MiB by default), so every KASLR
// slide is a multiple of it.
inline constexpr std::uint64_t kSlideAlign = 2ull << 20;
// Lowest canonical upper-half address with 4-level paging (also canonical with 5-level); the
// kernel image always lives above it.
inline constexpr std::uint64_t kKernelHalfStart = 0xffff800000000000ull;
// x86-64 maps the kernel image at __START_KERNEL_map and KASLR keeps it within
// KERNEL_IMAGE_SIZE (1 GiB) of it: a running _text outside is a lie.
inline constexpr std::uint64_t kKernelImageStart = 0xffffffff80000000ull;
inline constexpr std::uint64_t kKernelImageEnd = 0xffffffffc0000000ull;

enum class SymbolKind { Text, Data };

// One symbol, at its running address.
struct Symbol {
  std::string name;
  Gva address;
  char type = '?';  // nm type letter: T t W w (text), D d B b R r G g S s V v (data)
  SymbolKind kind = SymbolKind::Text;
  std::uint64_t size = 0;  // to the next symbol (see function_containing); 0 = unknown
  std::string module{};    // a loaded module's function: its module ("" for the core kernel)
};

// A loaded module's function, as read from the guest (kernel/module_symbols.hpp): a running
// address (modules are not slid with the kernel image) and a size inside the module's text.
struct ModuleFunction {
  std::string module;  // [A-Za-z0-9_.-]
  std::string name;    // printable ASCII, no spaces, no ':'
  std::uint64_t start = 0;
  std::uint64_t size = 0;  // > 0
  char type = 't';         // t T w W
};

// The largest function the library decodes: a larger "function" is a gap between symbols
// (data, or the end of a section), not code.
inline constexpr std::uint64_t kMaxFunctionBytes = std::uint64_t{256} * 1024;

// A function and its extent [start, start + size), at running addresses.
struct Function {
  std::string name;
  Gva start;
  std::uint64_t size = 0;
};

// What load/parse saw. Lines that were skipped are counted, never silently dropped.
struct LoadStats {
  std::size_t lines = 0;                 // non-empty lines
  std::size_t text = 0;                  // kept as functions
  std::size_t data = 0;                  // kept as data
  std::size_t other_types = 0;           // well-formed but not kept (A a N U ? i …)
  std::size_t module_symbols = 0;        // kallsyms "\t[module]" lines: not kept (not slid with the kernel)
  std::size_t malformed = 0;             // too long, bad address, bad type, bad name, extra columns
  std::size_t first_malformed_line = 0;  // 1-based, 0 if none
};

class SymbolTable {
 public:
  SymbolTable() = default;

  // Reads a System.map or /proc/kallsyms copy. NotFound if the file is absent, InvalidArgument if
  // it is too large or holds no symbol, Permission if every address is 0 (kptr_restrict).
  [[nodiscard]] static Result<SymbolTable> load(const std::filesystem::path& path);
  // Same, from text in memory; `source` names it in messages.
  [[nodiscard]] static Result<SymbolTable> parse(std::string_view text, std::string source);

  // Every symbol with this exact name (duplicates such as same-named static functions are
  // kept, in address order). NotFound if none.
  [[nodiscard]] Result<std::vector<Symbol>> lookup(std::string_view name) const;

  // Every symbol whose name matches the shell glob `pattern` (fnmatch(3): `*`, `?`, `[...]`),
  // in name order, then address order. Empty if none.
  std::vector<Symbol> matching(std::string_view pattern) const;

  // "name", "name+off" or "0xaddr[+off]" (off: 0x-hex or decimal) → running address.
  //   unknown name             → NotFound "no symbol 'x' in <file>"
  //   name at several addresses → InvalidArgument listing them (pass one as "0x…" instead)
  //   bad syntax               → InvalidArgument
  //   off ≥ the symbol's size  → Range naming the size (off > 0 with unknown size → Range too)
  [[nodiscard]] Result<Gva> resolve(std::string_view expr) const;

  // The text symbol whose extent holds `addr`. Extent = up to the next symbol (of any kind) at a
  // higher address, so the last function of .text ends at _etext; the symbol(s) at the highest
  // address have unknown size. NotFound if `addr` is below every symbol, in data, at/after an
  // end marker (_etext, _einittext), or in a symbol of unknown size. Aliases at one address:
  // a function beats a marker, global beats local, no leading '_' beats '_', then file order.
  [[nodiscard]] Result<Function> function_containing(Gva addr) const;

  // "name+0xoff" (text or data) for messages; "0x<addr>" when nothing covers the address.
  std::string symbolize(Gva addr) const;

  // Sets the KASLR slide (running − link). Either sign. InvalidArgument unless a multiple of
  // 2 MiB that keeps every symbol in the canonical upper half without wrapping.
  [[nodiscard]] Result<void> set_slide(std::int64_t slide);
  // slide = running_text − the file's _text (or _stext), validated as above, and applied.
  // `running_text` is hostile: it must itself be a canonical upper-half address, and inside the
  // x86-64 kernel image window [kKernelImageStart, kKernelImageEnd) if the file's _text is.
  [[nodiscard]] Result<std::int64_t> slide_from_text(Gva running_text);
  std::int64_t slide() const { return slide_; }

  // Loaded modules' functions (kernel/module_symbols.hpp), replacing any added before. Their
  // addresses are running ones and are never slid. How names resolve with them:
  //   "func"        the core kernel's symbol when it has one (as Linux's kallsyms_lookup_name);
  //                 else the one module function of that name; in several modules: refused
  //                 (InvalidArgument naming them, "write module:func")
  //   "module:func" that module's function only (Linux's module_kallsyms_lookup_name syntax)
  // lookup(), matching() (a pattern with ':' matches "module:func", else the bare name),
  // function_containing() and symbolize() ("func+0x10 [module]", as /proc/kallsyms names
  // them) answer for them too. InvalidArgument when one overlaps another or is malformed.
  [[nodiscard]] Result<void> set_module_functions(std::vector<ModuleFunction> fns);
  // Drops the module functions: only the core kernel's symbols answer from then on.
  void clear_module_functions() noexcept {
    mods_.clear();
    mods_by_name_.clear();
  }
  std::size_t module_function_count() const { return mods_.size(); }

  const LoadStats& stats() const { return stats_; }
  const std::string& source() const { return source_; }
  std::size_t size() const { return syms_.size(); }

 private:
  struct Entry {
    std::string name;
    std::uint64_t link = 0;  // link-time address
    std::uint64_t size = 0;  // 0 = unknown
    char type = '?';
    SymbolKind kind = SymbolKind::Text;
    bool end_marker = false;  // _etext / _einittext: ends a range, starts no function
  };

  void index();
  Symbol to_symbol(const Entry& e) const;
  std::uint64_t running(std::uint64_t link) const;
  // Index of the preferred symbol covering link address `link`, or npos.
  std::size_t covering(std::uint64_t link) const;
  bool is_link_in_table(std::uint64_t running_addr, std::uint64_t* link) const;
  Result<std::uint64_t> check_offset(const Entry& e, std::uint64_t off) const;

  std::string source_;
  std::vector<Entry> syms_;                  // sorted by link address, file order among equals
  std::vector<std::uint32_t> by_name_;       // indices into syms_, sorted by name then address
  std::vector<ModuleFunction> mods_;         // sorted by start, not overlapping
  std::vector<std::uint32_t> mods_by_name_;  // indices into mods_, by name, module, start
  // Module functions named `name` ("func" or "module:func"), by address.
  std::vector<Symbol> module_lookup(std::string_view name) const;
  const ModuleFunction* module_function_at(std::uint64_t addr) const;
  Result<Gva> resolve_module(std::string_view target, std::uint64_t off, bool has_off) const;
  LoadStats stats_;
  std::int64_t slide_ = 0;
};

}  // namespace xenprobes::symbols
