// A loaded module's BTF (CONFIG_DEBUG_INFO_BTF_MODULES), read from the guest: split BTF on top of
// the kernel's (its type ids continue the kernel's), from one of two places.
//
// The kernel's btf_modules list (kernel/bpf/btf.c, Linux 5.11 to 6.12 at least):
//   static LIST_HEAD(btf_modules);
//   struct btf_module { struct list_head list; struct module *module; struct btf *btf;
//                       struct bin_attribute *sysfs_attr; int flags; };
//   struct btf { void *data; ...; u32 data_size; ... };
// When a module comes (MODULE_STATE_COMING) the kernel parses its .BTF into a struct btf whose
// `data` is its own copy of the bytes (in kernels that take a distilled base, 6.12 among them:
// relocated onto the kernel's type ids when the module carries one, .BTF.base) and adds an
// entry at the list's head; it takes it out when the module goes. `btf_modules` is a static symbol: in kallsyms with KALLSYMS_ALL, as
// Debian's kernels have it. Both structs are in the kernel's own BTF on Debian's 6.1 and 6.12
// (struct btf_module 48 bytes: list +0, module +16, btf +24; struct btf: data +0, data_size
// +80); their members are taken from there, by name. A BTF without struct btf_module gets the
// shape above (list +0, module +16, btf +24: unchanged since 5.11), said in describe(); every
// entry read with it is checked as below, as any other. struct btf changed since (6.18 has
// `init_private` after `data`), so without it in the BTF the list is not read.
//
// struct module's btf_data/btf_data_size: the module's .BTF section as loaded. Linux 5.11 and
// later set btf_data to NULL in do_init_module() once the module's init ran (.BTF is not an
// allocated section: it goes with the init memory), so a LIVE module on a real kernel has its
// BTF in the list only.
//
// Which one. The list's entry when the module has one (what the kernel parsed and accepted,
// on the kernel's type ids), else btf_data when it is set (a guest that keeps it: the
// simulated Xen's), else the module has no BTF and says why.
//
// Trust. The list and everything it points to are the guest's. The walk is bounded (at most
// max_entries nodes) and stops, keeping the entries read before, at a node outside the
// kernel's half or not 8-byte aligned, one seen before (a loop), one that cannot be read or
// whose `prev` does not point back. An entry is refused, with the reason and the walk going
// on, when its module pointer is no struct module on the module list Dom0 walked (or one that
// already had an entry), its struct btf is outside the kernel's half or unreadable, its `data`
// is outside the kernel's half, `data_size` is shorter than a BTF header or over max_bytes, or
// the bytes at `data` do not start with BTF's magic (0xeB9F) and version 1. The blob itself is
// read only for a usable module, bounded, and kept only if libbpf accepts it as split BTF over
// the kernel's (validate_split_btf).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kernel/modules.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::kernel {

// A module's BTF blob is at most this (it holds only the module's own types).
inline constexpr std::uint64_t kMaxModuleBtfBytes = 16ull << 20;

// struct btf_module and struct btf as the guest's BTF describes them.
struct BtfListLayout {
  std::uint32_t entry_size = 0;                 // bytes of struct btf_module read per entry
  std::uint32_t list = 0, module = 0, btf = 0;  // its list_head, struct module * and struct btf *
  std::uint32_t btf_struct_size = 0;            // bytes of struct btf read per entry
  Field data, data_size;                        // struct btf's data (a pointer) and data_size
  bool assumed = false;                         // struct btf_module is not in the BTF: Linux's shape taken
  std::string describe() const;                 // "struct btf_module 48 bytes (module +16, btf +24), ..."
};

// NotFound when the BTF has no struct btf (or no data/data_size in it), Io when libbpf rejects
// the bytes, InvalidArgument when a member has a shape the reader cannot use.
[[nodiscard]] Result<BtfListLayout> btf_list_layout_from_btf(std::span<const std::byte> kernel_btf);

struct BtfListLimits {
  std::size_t max_entries = 4096;  // list nodes (as Limits::max_modules)
  std::uint64_t max_bytes = kMaxModuleBtfBytes;
};

// An entry that passed every check: the module it names, where its BTF is and how long.
struct BtfListEntry {
  std::uint64_t node = 0;    // its struct btf_module
  std::uint64_t module = 0;  // the struct module it names: one of the list Dom0 walked
  std::uint64_t btf = 0;     // its struct btf
  std::uint64_t data = 0, size = 0;
};

struct BtfModuleList {
  bool read = false;      // the head was found and read
  std::string why;        // !read: why the list is not read; read: why the walk stopped early, "" when it went round
  std::size_t nodes = 0;  // entries walked
  std::vector<BtfListEntry> entries;             // accepted, each naming a different module
  std::map<std::uint64_t, std::string> refused;  // struct module -> why its entry was refused
  std::vector<std::string> stray;                // refused entries naming no module on the list: "the entry at X: why"
  const BtfListEntry* entry_for(std::uint64_t module) const;
};

// Walks `btf_modules` (from the symbols) with `layout`; `modules`: the module list Dom0 walked
// (every struct module on it, usable or not). Never fails as a whole: `read` and `why` say.
BtfModuleList read_btf_module_list(const symbols::SymbolTable& syms, const ReadFn& read, const BtfListLayout& layout,
                                   std::span<const Module> modules, const BtfListLimits& limits = {});

// An accepted entry's BTF: its data_size bytes at its data, accepted by libbpf as split BTF over
// `base` (the kernel's raw BTF). Fault when it cannot be read, Io when libbpf refuses it.
[[nodiscard]] Result<std::vector<std::byte>> read_listed_btf(const ReadFn& read, const BtfListEntry& e,
                                                             std::span<const std::byte> base);

// One module's BTF through its struct module's btf_data, validated as split BTF over `base`.
// NotFound when the module has none (or the layout has no btf_data), InvalidArgument when its
// size is over `max_bytes` or its pointer is outside the kernel's half, Fault when it cannot
// be read, Io when libbpf refuses it.
[[nodiscard]] Result<std::vector<std::byte>> read_module_btf(const ReadFn& read, const Module& m,
                                                             std::span<const std::byte> base,
                                                             std::uint64_t max_bytes = kMaxModuleBtfBytes);
// The check both readers apply, on its own (for the fuzzer): libbpf's btf__new_split over
// btf__new(base). Returns the module's own type count.
[[nodiscard]] Result<std::uint32_t> validate_split_btf(std::span<const std::byte> blob,
                                                       std::span<const std::byte> base);

// One usable module's BTF from what was read: the list's entry, else btf_data, else why not
// (NotFound, naming both places).
[[nodiscard]] Result<std::vector<std::byte>> module_btf_of(const ReadFn& read, const Module& m,
                                                           const BtfModuleList& list, std::span<const std::byte> base);

}  // namespace xenprobes::kernel
