// The code addresses a kernel image forms outside a branch: what JumpContext::addresses_taken
// needs (x86/jump_safety.hpp) to prove that a function's indirect jumps are tail calls. An
// indirect jump can only reach an address somebody formed, and the kernel is built for the
// kernel code model (not PIC): a code address is a RIP-relative or absolute operand of an
// instruction, or a `.quad`/`.long` in data. The image is needed because init code and data,
// which form addresses too, are freed after boot. One implementation for the engine (a vmlinux
// given as a domain's symbols) and bench/kernel_coverage.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernel/tables.hpp"
#include "symbols/kernel_image.hpp"
#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"

namespace xenprobes::kernel {

// Every address inside a function of `core` (after its first byte) that the image forms, with
// who forms it, at the image's link addresses: the operands of every instruction of every
// function of the core and init text (x86::materialized_addresses), every aligned 8-byte word
// and sign-extended aligned 4-byte word of every segment (pointers and tables), and every
// unaligned one in the code without symbols (the alternatives' replacements, after
// __alt_instructions_end and _einittext). Functions are those of image.symbols() whose start
// is a symbol; `decoded` may hold some of them decoded already (the bench's), by start. The
// others are decoded with x86::formed_addresses() (a function that does not decode forms
// nothing) on `threads` threads (0: taken_threads()), in contiguous ranges merged in function
// order: the list, in its order, is the same whatever `threads`. Seconds for a distribution
// kernel.
struct TakenAddress {
  std::uint64_t to = 0;  // the address formed
  std::uint64_t by = 0;  // the instruction, or the data word, that forms it
  bool data = false;     // `by` is a data word
};
std::vector<TakenAddress> addresses_taken(const symbols::KernelImage& image, const Range& core, const Range& init,
                                          std::span<const std::vector<x86::Insn>* const> decoded = {},
                                          unsigned threads = 0);

// How many threads addresses_taken() decodes `functions` functions on by default:
// min(the hardware's threads, kMaxWorkerThreads), and no more than one per
// kMinTakenFunctionsPerThread functions.
inline constexpr std::size_t kMinTakenFunctionsPerThread = 512;
unsigned taken_threads(std::size_t functions);

// As JumpContext::addresses_taken takes them, each with who forms it, moved by `delta`
// (running − link: the guest's KASLR slide).
x86::SiteIndex taken_index(std::span<const TakenAddress> taken, std::int64_t delta = 0);

}  // namespace xenprobes::kernel
