// A guest kernel's image (vmlinux, an ELF64 with its symbol table) as a source of symbols and
// of what the running guest no longer holds: its init code and data, freed after boot, which
// the jump rules' tail-call proof reads (kernel/addresses_taken.hpp, docs/probes.md "Jump
// probes"). Session::load_symbols takes one where it takes a System.map.
//
// Addresses: the image's own, link-time ones; symbols() holds them unslid, like a System.map
// (the session slides the copy it keeps). Hostile input: the file is bounded and checked by
// the ELF reader (common/elf_image.hpp); a symbol that is not a kernel symbol is dropped.
#pragma once

#include <filesystem>
#include <span>
#include <string>

#include "common/elf_image.hpp"
#include "common/result.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::symbols {

// Whether the file starts with ELF's magic (a System.map and kallsyms text never do).
bool is_elf_file(const std::filesystem::path& path);
// Whether the file is an x86 bzImage (a vmlinuz: "HdrS" at 0x202, the boot protocol's setup
// header): not a vmlinux itself, but the ELF compressed inside it.
bool is_bzimage_file(const std::filesystem::path& path);

// Puts `syms` at the link addresses of `img` (an image without a symbol table), so that they
// can go with it (KernelImage::with_symbols). `syms` are the guest's symbols as a session holds
// them: a System.map slid to the running kernel, or the guest's own kallsyms, whose addresses
// are running ones. Their slide goes back to 0, then their _text is moved onto the image's
// kernel text (the lowest executable PT_LOAD in the kernel image window, where x86-64's
// vmlinux.lds puts _text). Returns that move: 0 for a System.map and for the kallsyms of a
// kernel that runs where it was linked (a PV guest), minus the KASLR slide for the kallsyms of
// one that was moved. InvalidArgument when the image has no such segment, or the move is no
// valid slide (symbols of another kernel).
[[nodiscard]] Result<std::int64_t> link_to_image(SymbolTable& syms, const elf::Image& img, const std::string& source);

class KernelImage {
 public:
  // NotFound when the file cannot be opened; InvalidArgument when it is no x86-64 ELF64 image
  // or has no symbol table.
  [[nodiscard]] static Result<KernelImage> load(const std::filesystem::path& path);
  [[nodiscard]] static Result<KernelImage> from_elf(elf::Image img, std::string source);
  // With symbols of its own (a System.map beside an image without a symbol table: a
  // decompressed vmlinuz), at link addresses.
  [[nodiscard]] static KernelImage with_symbols(elf::Image img, SymbolTable syms, std::string source);

  // Its symbols as System.map would list them (nm's letters: T t W w text, D d B b R r data;
  // absolute symbols, section and file symbols, and local labels left out), slide 0.
  const SymbolTable& symbols() const { return syms_; }
  const elf::Image& elf() const { return img_; }
  const std::string& source() const { return source_; }
  // Its loadable bytes at link address `addr` (bss past a segment's file bytes reads as zeros);
  // Fault when [addr, addr + out.size()) is not inside one segment. Segments linked below the
  // kernel image (x86-64's per-CPU segment, linked at 0) are not addressed.
  [[nodiscard]] Result<void> read(Gva addr, std::span<std::byte> out) const;

 private:
  elf::Image img_;
  SymbolTable syms_;
  std::string source_;
};

}  // namespace xenprobes::symbols
