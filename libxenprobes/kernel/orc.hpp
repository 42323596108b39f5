// The guest kernel's ORC unwind tables, read from its memory, and a stack walk over them from
// Dom0: what `kstack` shows (docs/xenprobe.md). x86-64 Linux with CONFIG_UNWINDER_ORC (every
// distribution kernel) keeps, for each code address objtool described, how to find the
// caller's stack pointer, frame pointer and return address there.
//
// The facts this relies on, in our words (Linux 6.1 and 6.12: arch/x86/include/asm/orc_types.h,
// arch/x86/kernel/unwind_orc.c, arch/x86/include/asm/unwind.h, include/asm-generic/vmlinux.lds.h):
//  - Two parallel arrays, bounded by __start_orc_unwind_ip/__stop_orc_unwind_ip and
//    __start_orc_unwind/__stop_orc_unwind: a 32-bit signed offset per entry (the code address
//    is the offset plus the address of the offset itself) and a 6-byte entry per address. The
//    core kernel's arrays are sorted by address when the image is built; a module's are sorted
//    by the kernel when it loads the module (struct module's arch.orc_unwind_ip,
//    arch.orc_unwind, arch.num_orcs). An address is described by the entry of the highest
//    address at or below it (of equal addresses, the last one).
//  - The 6-byte entry: sp_offset (s16), bp_offset (s16), then 16 bits of flags, low bits
//    first: sp_reg (4 bits), bp_reg (4 bits), then by format (the format numbers are ours):
//      v1 (Linux 4.14 to 6.2): type (2 bits: CALL 0, REGS 1, REGS_PARTIAL 2), end (1 bit);
//          an entry with sp_reg UNDEFINED is the end of the stack when `end` is set, else
//          undefined
//      v2 (Linux 6.3):         type (2 bits, as v1), signal (1 bit), end (1 bit)
//      v3 (Linux 6.4 on, so 6.12): type (3 bits: UNDEFINED 0, END_OF_STACK 1, CALL 2, REGS 3,
//          REGS_PARTIAL 4), signal (1 bit)
//    Registers: UNDEFINED 0, PREV_SP 1, DX 2, DI 3, BP 4, SP 5, R10 6, R13 7, BP_INDIRECT 8,
//    SP_INDIRECT 9.
//  - One step: the entry of the frame's address (the address itself for the first frame and
//    after a REGS frame; the byte before it after a call, whose return address may already
//    belong to the next function) gives the caller's stack pointer: SP or BP plus sp_offset;
//    SP_INDIRECT: the word at SP, plus sp_offset; BP_INDIRECT: the word at BP + sp_offset; R10,
//    R13, DI, DX: that register of the last full pt_regs frame. Then CALL: the return address is
//    the word just below that stack pointer; REGS: a whole struct pt_regs starts there (its ip
//    at +128, sp at +152, cs at +136); REGS_PARTIAL: only its iret frame (ip at +0, sp at +24)
//    starts there. The frame pointer: PREV_SP: the word at the new SP + bp_offset; BP: the word
//    at the old BP + bp_offset; UNDEFINED: unchanged (or the full pt_regs' bp). An address
//    with no entry is unwound as a frame-pointer frame (Linux's own fallback for generated
//    code). A pt_regs frame from user mode (cs & 3) ends the stack.
//
// Trust. The tables and every stack word are the guest's. Table sizes must agree and are capped
// (Limits::max_entries); the address array must be sorted, or the table is refused as a whole
// (a lookup on an unsorted array could answer anything); entries whose address lies outside
// the text they describe are dropped and counted, and no address outside it is looked up.
// A walk is bounded (kMaxFrames), reads only 8-byte words at 8-byte aligned kernel-half
// addresses (a pt_regs frame's whole 168 bytes must lie there too), and ends at a stack pointer
// seen before, one that goes down except across a stack switch (a stack pointer taken from
// memory or a register, or a pt_regs frame: at most kMaxStackSwitches of them), a frame address
// outside the text the tables describe, or any read failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::kernel::orc {

enum class Format : std::uint8_t { Auto, V1, V2, V3 };
const char* to_string(Format);

enum class Type : std::uint8_t { Undefined, EndOfStack, Call, Regs, RegsPartial, Unknown };
const char* to_string(Type);

inline constexpr unsigned kRegUndefined = 0, kRegPrevSp = 1, kRegDx = 2, kRegDi = 3, kRegBp = 4, kRegSp = 5,
                          kRegR10 = 6, kRegR13 = 7, kRegBpIndirect = 8, kRegSpIndirect = 9;
inline constexpr std::size_t kEntrySize = 6;

struct Entry {
  std::int16_t sp_offset = 0;
  std::int16_t bp_offset = 0;
  std::uint8_t sp_reg = 0;
  std::uint8_t bp_reg = 0;
  Type type = Type::Undefined;
  bool signal = false;  // v2/v3: the next lookup uses the address itself (v1: any pt_regs frame)
};

// One raw 6-byte entry under a format (Auto is taken as V3).
Entry decode(std::span<const std::byte, kEntrySize> raw, Format f);
// Which format a table of raw entries is in: most described code is a call frame with sp_reg SP,
// whose type bits are 0 in v1/v2 and 2 in v3; of v1 and v2, only v2 sets bit 11 (its end bit, on its
// end-of-stack entries). Auto when nothing decides (no entry with sp_reg SP).
Format detect_format(std::span<const std::byte> orc_raw);

struct Limits {
  std::size_t max_entries = 1u << 22;  // per table (a distribution 6.12 kernel has ~500k)
  std::size_t chunk_bytes = 64u << 10;
};

// One ORC table (the core kernel's or a module's), decoded and checked.
class Table {
 public:
  Table() = default;
  // `ip_raw` is the address array as it lies at guest address `ip_base`, `orc_raw` the entries.
  // `text`: the ranges the table describes (core text and init text; a module's text).
  // InvalidArgument (with why) when the sizes disagree, the count is 0 or over the limit, the
  // format cannot be told, or the addresses are not sorted.
  [[nodiscard]] static Result<Table> parse(std::uint64_t ip_base, std::span<const std::byte> ip_raw,
                                           std::span<const std::byte> orc_raw, std::vector<Range> text,
                                           Format format = Format::Auto, const Limits& limits = {});
  // The entry describing `ip`, or null when `ip` is outside the table's text or below its
  // first entry. O(log n).
  const Entry* find(std::uint64_t ip) const;
  bool covers(std::uint64_t ip) const;
  std::size_t size() const { return ips_.size(); }
  std::size_t dropped() const { return dropped_; }  // entries outside the text
  Format format() const { return format_; }
  std::string summary() const;  // "412031 entries (v3), 2 outside the text dropped"

 private:
  std::vector<std::uint64_t> ips_;  // sorted
  std::vector<Entry> entries_;
  std::vector<Range> text_;
  std::size_t dropped_ = 0;
  Format format_ = Format::Auto;
};

// The core kernel's table from its symbols (__start_orc_unwind_ip ... __stop_orc_unwind, _stext,
// _etext, _sinittext, _einittext). NotFound when the kernel has none (no CONFIG_UNWINDER_ORC).
[[nodiscard]] Result<Table> read_kernel_table(const symbols::SymbolTable& syms, const ReadFn& read,
                                              Format format = Format::Auto, const Limits& limits = {});
// A module's table: `num` entries at `ip_addr` and `orc_addr`, describing `text`.
[[nodiscard]] Result<Table> read_module_table(const ReadFn& read, std::uint64_t ip_addr, std::uint64_t orc_addr,
                                              std::uint64_t num, Range text, Format format, const Limits& limits = {});

// Where a walk starts: a stopped vCPU's registers. Those a pt_regs frame could name (r10, r13,
// rdi, rdx, rbp) serve the first frame like a full pt_regs.
struct StartRegs {
  std::uint64_t rip = 0, rsp = 0, rbp = 0;
  std::uint64_t r10 = 0, r13 = 0, rdi = 0, rdx = 0;
  bool user_mode = false;  // cs & 3: nothing of the kernel's stack to walk
};

enum class Stop : std::uint8_t {
  EndOfStack,  // an end-of-stack entry or a pt_regs frame from user mode: the whole stack
  Depth,       // max_frames reached
  Undefined,   // an undefined entry (entry code whose stack cannot be described)
  NoText,      // an address outside the kernel's and modules' text (after a fallback frame too)
  BadEntry,    // a register or type this walk does not know, or a register it has no value of
  ReadFailed,  // a stack word could not be read
  BadStack,    // a stack address outside the kernel's half, misaligned, or overflowing
  Loop,        // a stack pointer seen before, or going down without a stack switch
};
const char* to_string(Stop);

struct Walk {
  std::vector<std::uint64_t> ips;  // innermost first: the start address, then return addresses
  Stop stop = Stop::EndOfStack;
  bool fallback = false;  // a frame had no entry and was taken as a frame-pointer frame
};

inline constexpr std::size_t kMaxFrames = 127;  // as bpftrace's default stack depth
inline constexpr unsigned kMaxStackSwitches = 8;

// The kernel's table plus its loaded modules' tables.
class Unwinder {
 public:
  explicit Unwinder(Table core) : core_(std::move(core)) {}
  // Replaces the modules' tables (each holds its module's text) and the text of modules with
  // none (unwound by the frame-pointer fallback).
  void set_modules(std::vector<Table> mods, std::vector<Range> untabled = {});
  const Table& core() const { return core_; }
  std::size_t module_tables() const { return mods_.size(); }
  const Entry* find(std::uint64_t ip) const;
  bool is_text(std::uint64_t ip) const;

  // Walks the stack from `start`, at most `max_frames` addresses (1 ... kMaxFrames), reading
  // stack memory through `read` (the stopped vCPU's view).
  Walk walk(const StartRegs& start, const ReadFn& read, std::size_t max_frames = kMaxFrames) const;

 private:
  Table core_;
  std::vector<Table> mods_;  // searched in turn (a guest has ~100 modules)
  std::vector<Range> untabled_;
};

}  // namespace xenprobes::kernel::orc
