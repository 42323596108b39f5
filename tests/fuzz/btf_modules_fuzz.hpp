// Part of the kallsyms fuzz target (kallsyms_fuzz.cpp: an input whose first u32 has its two top
// bits set comes here, the rest of it as below): the kernel's btf_modules list, where a loaded
// module's BTF lives once its init ran (kernel/module_btf.cpp), walked in fuzzed guest memory,
// each entry matched to a module, and every usable module's BTF taken from it (or from
// btf_data); and struct btf_module / struct btf's layout from a fuzzed kernel BTF. All of it
// comes from a guest: hostile.
//
// Input: u8 flags (1: unmapped bytes fault, else read as zeros; 2: the layout from a fuzzed
// kernel BTF, u16 length + bytes, that follows; 4: the hand-made kernel BTF without struct
// btf_module, so Linux's shape is taken; 8: module 0 keeps a btf_data, u32 offset into the
// memory + u16 size, that follows), u8 entry limit (1..64), u16 byte limit of one module's BTF,
// then the memory at kMem: `btf_modules` is its first 16 bytes. The modules Dom0 knows are
// struct modules at kModA + 0x1000 * i (i < 3, all usable); the kernel's BTF is fake_module_btf.hpp's
// 6.12 one (a module's split BTF is checked over it).
//
// Invariants: the layout from a fuzzed BTF either fails with NotFound, Io or InvalidArgument
// and a printable message, or has every member inside its struct of at most 4 KiB; the walk
// visits at most the entry limit, reads at most 16 bytes of head and, per node, one struct
// btf_module, one struct btf and a 4-byte header; an accepted entry names one of the modules,
// no two the same, with its data in the kernel's half and a size between a BTF header and the
// byte limit; a refused one names one of the modules and none accepted; every message is
// printable; a module's BTF, when read, is exactly its entry's (or btf_data's) size and libbpf
// accepts it as split BTF over the kernel's.
#pragma once

#include <set>

#include "fuzz/fuzz_common.hpp"
#include "kernel/module_btf.hpp"
#include "symbols/symbol_table.hpp"
#include "unit/kernel/fake_module_btf.hpp"

namespace xenprobes::fuzz::btf_modules {

constexpr std::uint64_t kMem = 0xffffffffc7000000ull;   // the memory; btf_modules at its start
constexpr std::uint64_t kModA = 0xffffffffc1000000ull;  // the known struct modules, 0x1000 apart
constexpr std::size_t kModules = 3;

inline int one_input(const std::uint8_t* data, std::size_t size) {
  static const std::vector<std::byte> kernel_btf = testing::module_btf(testing::k612);
  static const std::vector<std::byte> kernel_btf_assumed = testing::module_btf(testing::k612, "struct btf_module");
  static const symbols::SymbolTable syms = [] {
    auto t = symbols::SymbolTable::parse("ffffffffc7000000 d btf_modules\n", "fuzz System.map");
    if (!t) std::abort();
    return std::move(*t);
  }();
  Input in(data, size);
  const std::uint8_t flags = in.u8();
  kernel::BtfListLimits lim;
  lim.max_entries = 1 + in.u8() % 64;
  lim.max_bytes = in.u16();
  std::vector<std::byte> fuzzed_btf;
  if (flags & 2) {
    auto b = in.bytes(in.u16());
    fuzzed_btf.resize(b.size());
    if (!b.empty()) std::memcpy(fuzzed_btf.data(), b.data(), b.size());
  }
  std::uint64_t keep_off = 0, keep_size = 0;
  if (flags & 8) {
    keep_off = in.u32();
    keep_size = in.u16();
  }
  const auto mem_b = in.rest();
  const std::vector<std::uint8_t> mem(mem_b.begin(), mem_b.end());

  std::uint64_t bytes_read = 0;
  kernel::ReadFn read = [&](Gva a, std::span<std::byte> out) -> Result<void> {
    bytes_read += out.size();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::uint64_t at = a.value + i - kMem;
      if (at < mem.size()) {
        out[i] = std::byte{mem[at]};
      } else {
        if (flags & 1) return fail(Errc::Fault, "not mapped (fuzz)");
        out[i] = std::byte{0};
      }
    }
    return {};
  };

  const std::vector<std::byte>& base = flags & 4 ? kernel_btf_assumed : kernel_btf;
  auto layout = kernel::btf_list_layout_from_btf(base);
  FUZZ_CHECK(layout.has_value(), "the hand-made BTF's layout");
  if (flags & 2) {
    auto l = kernel::btf_list_layout_from_btf(fuzzed_btf);
    FUZZ_TRACE("layout from the fuzzed BTF: %s", l ? l->describe().c_str() : l.error().what.c_str());
    if (!l) {
      const Errc c = l.error().code;
      FUZZ_CHECK(c == Errc::NotFound || c == Errc::Io || c == Errc::InvalidArgument, l.error().what);
      FUZZ_CHECK(printable(l.error().what), l.error().what);
    } else {
      FUZZ_CHECK(l->entry_size <= 4096 && l->btf_struct_size <= 4096, l->describe());
      FUZZ_CHECK(l->list + 16 <= l->entry_size && l->module + 8 <= l->entry_size && l->btf + 8 <= l->entry_size,
                 l->describe());
      FUZZ_CHECK(
          l->data.offset + 8 <= l->btf_struct_size && l->data_size.offset + l->data_size.size <= l->btf_struct_size,
          l->describe());
      layout = std::move(l);  // walk with it: its members are where it says
    }
  }

  std::vector<kernel::Module> mods(kModules);
  for (std::size_t i = 0; i < kModules; ++i) {
    mods[i].name = "m" + std::to_string(i);
    mods[i].address = kModA + 0x1000 * i;
    mods[i].usable = true;
    mods[i].state = kernel::ModuleState::Live;
  }
  if (flags & 8) {
    mods[0].btf_data = kMem + keep_off;
    mods[0].btf_size = keep_size;
  }

  auto list = kernel::read_btf_module_list(syms, read, *layout, mods, lim);
  FUZZ_TRACE("list: read %d, %zu nodes, %zu entries, %zu refused, %zu stray; %s", list.read, list.nodes,
             list.entries.size(), list.refused.size(), list.stray.size(), list.why.c_str());
  FUZZ_CHECK(printable(list.why), list.why);
  FUZZ_CHECK(list.nodes <= lim.max_entries, std::to_string(list.nodes));
  FUZZ_CHECK(bytes_read <= 16 + list.nodes * (layout->entry_size + layout->btf_struct_size + 4) +
                               layout->entry_size,  // the node that stopped the walk
             "read " + std::to_string(bytes_read));
  std::set<std::uint64_t> named;
  auto known = [&](std::uint64_t m) {
    return m >= kModA && m < kModA + 0x1000 * kModules && (m - kModA) % 0x1000 == 0;
  };
  for (const kernel::BtfListEntry& e : list.entries) {
    FUZZ_CHECK(known(e.module), hexs(e.module));
    FUZZ_CHECK(named.insert(e.module).second, "two entries for " + hexs(e.module));
    FUZZ_CHECK(e.data >= symbols::kKernelHalfStart && e.data + e.size >= e.data, hexs(e.data));
    FUZZ_CHECK(e.size >= 24 && e.size <= lim.max_bytes, std::to_string(e.size));
    FUZZ_CHECK(list.entry_for(e.module) == &e);
  }
  for (const auto& [m, why] : list.refused) {
    FUZZ_CHECK(known(m) && !named.contains(m), hexs(m));
    FUZZ_CHECK(printable(why), why);
  }
  for (const std::string& s : list.stray) FUZZ_CHECK(printable(s), s);

  for (const kernel::Module& m : mods) {
    const std::uint64_t before = bytes_read;
    auto b = kernel::module_btf_of(read, m, list, kernel_btf);
    FUZZ_TRACE("%s: %s", m.name.c_str(),
               b ? ("BTF, " + std::to_string(b->size()) + " bytes").c_str() : b.error().what.c_str());
    if (!b) {
      FUZZ_CHECK(printable(b.error().what), b.error().what);
      continue;
    }
    // From its entry, or (no entry, or one whose BTF libbpf refused) from btf_data.
    const kernel::BtfListEntry* e = list.entry_for(m.address);
    FUZZ_CHECK((e && b->size() == e->size) || (m.btf_data && b->size() == m.btf_size), m.name);
    const std::uint64_t most = (e ? e->size : 0) + (m.btf_data ? m.btf_size : 0);
    FUZZ_CHECK(bytes_read - before <= most, "read " + std::to_string(bytes_read - before));
    FUZZ_CHECK(kernel::validate_split_btf(*b, kernel_btf).has_value(), m.name);
  }
  return 0;
}

}  // namespace xenprobes::fuzz::btf_modules
