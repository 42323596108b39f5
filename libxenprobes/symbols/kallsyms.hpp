// Kallsyms from a guest's memory: finds the compressed symbol tables a Linux x86-64 kernel
// carries in its .rodata (scripts/kallsyms.c writes them, kernel/kallsyms.c reads them) and
// decodes them into a SymbolTable, with no System.map and no vmlinux.
//
// The tables (docs/guest-symbols.md has the byte layout and the sources):
//   kallsyms_num_syms      u32 N (then padding to 8)
//   kallsyms_names         N entries: a length (1 byte, or 2 as ULEB128 from 6.1 on) and that
//                          many token numbers; expanded, the first character is the nm type
//   kallsyms_markers       u32 offset into names of every 256th entry
//   kallsyms_token_table   256 NUL-terminated strings
//   kallsyms_token_index   256 u16 offsets of those strings
//   kallsyms_offsets       s32 per symbol, against kallsyms_relative_base (a u64)
//   kallsyms_seqs_of_names (6.2+, backported to Debian's 6.1) the name order: not needed here
// Linux 6.1 puts offsets and relative_base before num_syms; later kernels put them after the
// token index. Both orders are tried, and the one whose addresses come out sorted wins.
//
// Finding them. The token table is found by its signature: every byte value that occurs in a
// symbol name stands for itself, so the digits '0'..'9' are the one-character tokens 0x30..0x39,
// "0\0" "1\0" … "9\0" in a row. Everything else is then found from the token table and checked
// against each other (the token index against the strings, the markers against the names
// walk, the address order), so a random match in memory is rejected, not decoded.
//
// Addresses. A running kernel has relocated kallsyms_relative_base (KASLR), so the table holds
// running addresses, as /proc/kallsyms does: its slide is 0. Read from an image file it holds
// link-time addresses.
//
// Trust. All of it is guest memory: every count is bounded (Limits), every offset and index is
// checked before use, a name longer than Linux's KSYM_NAME_LEN fails the decode, and a failing
// read fails cleanly with the address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::symbols {

// Reads `out.size()` bytes of guest memory at virtual address `addr`.
using MemoryReadFn = std::function<Result<void>(std::uint64_t addr, std::span<std::byte> out)>;

struct KallsymsLimits {
  std::uint32_t max_symbols = 1u << 20;         // Debian's 6.1 has ~94k, 6.12 ~167k
  std::uint64_t max_scan_bytes = 256ull << 20;  // how far past the start the token table may be
  std::size_t chunk_bytes = 64u << 10;          // one guest read while searching
};

// Where the tables are (running or link addresses, as read).
struct KallsymsLocation {
  std::uint64_t token_table = 0;
  std::uint64_t token_index = 0;
  std::uint64_t markers = 0;
  std::uint64_t names = 0;
  std::uint64_t num_syms = 0;
  std::uint64_t offsets = 0;
  std::uint64_t relative_base = 0;
  std::uint32_t count = 0;            // N, the value of kallsyms_num_syms
  bool offsets_after_tokens = false;  // the post-6.1 order
};

// One decoded symbol.
struct KallsymsEntry {
  std::string name;
  char type = '?';
  std::uint64_t address = 0;
};

struct KallsymsResult {
  KallsymsLocation where;
  std::vector<KallsymsEntry> entries;  // in table order (address order)
  bool absolute_percpu = false;        // CONFIG_KALLSYMS_ABSOLUTE_PERCPU was in effect
};

// Searches [start, end) for the tables and decodes them. Unreadable pages are skipped (to the
// next 2 MiB boundary: the kernel image is mapped in whole 2 MiB steps from its start).
// NotFound when no token table is there, Io when one is found but the tables around it do
// not agree (what disagreed is named).
[[nodiscard]] Result<KallsymsResult> find_kallsyms(const MemoryReadFn& read, std::uint64_t start, std::uint64_t end,
                                                   const KallsymsLimits& limits = {});

// Decodes the tables at a known token table (the rest is found from it as above).
[[nodiscard]] Result<KallsymsResult> read_kallsyms_at(const MemoryReadFn& read, std::uint64_t token_table_hint,
                                                      const KallsymsLimits& limits = {});

// The decoded symbols as a SymbolTable (slide 0: the addresses are whatever the table held).
// `source` names it in messages ("domain 3's kallsyms").
[[nodiscard]] Result<SymbolTable> to_symbol_table(const std::vector<KallsymsEntry>& entries, std::string source);

// The slide (running − link) of a file's table, from one symbol whose running address is known
// (the syscall entry point in a vCPU's MSR_LSTAR, or a symbol read from the guest's kallsyms),
// validated and applied as SymbolTable::set_slide does. InvalidArgument if the name is not in
// the table exactly once, or the running address is not in the kernel's half.
[[nodiscard]] Result<std::int64_t> slide_from_symbol(SymbolTable& file_table, std::string_view name,
                                                     std::uint64_t running);

}  // namespace xenprobes::symbols
