// Part of the kallsyms fuzz target (kallsyms_fuzz.cpp: an input whose first u32 has its top bit
// set comes here, the rest of it as below): a loaded module's kallsyms (core_kallsyms: symtab,
// strtab, typetab) and its BTF as split BTF (kernel/module_symbols.cpp), read from fuzzed guest
// memory, then put into a SymbolTable (symbols/symbol_table_modules.cpp). All of it comes from
// a guest: hostile.
//
// Input: u8 flags (1: unmapped bytes fault, else read as zeros; 2: a wild symtab pointer
// follows as u64; 4: a wild strtab pointer follows as u64), u16 text size, u32 num_symtab,
// then three regions, each u16 length + bytes: the symtab (at kSymtab), the strtab (at
// kStrtab), the typetab (at kTypetab); then u16 length + a base BTF and the rest as a module's
// split BTF over it.
//
// Invariants: read_module_symbols fails only with InvalidArgument or Fault and a printable
// message; when it succeeds every function is named 1..512 printable characters without
// space or ':', lies inside the module's text with a size that ends inside it, the functions
// do not overlap (aliases at one address aside), and the stats add up to num_symtab - 1
// entries; it reads at most the symtab, the typetab and max_strtab bytes of strtab;
// set_module_functions accepts the result, resolve("fz:NAME") gives that name's address (or
// refuses an ambiguity), symbolize names the module. validate_split_btf never crashes and
// read_module_btf refuses a size over its limit.
#pragma once

#include "fuzz/fuzz_common.hpp"
#include "kernel/module_symbols.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::fuzz::module_symbols {

constexpr std::uint64_t kModText = 0xffffffffc0000000ull;
constexpr std::uint64_t kSymtab = 0xffffffffc1000000ull, kStrtab = 0xffffffffc2000000ull,
                        kTypetab = 0xffffffffc3000000ull, kBtf = 0xffffffffc4000000ull;

struct Region {
  std::uint64_t base;
  std::vector<std::uint8_t> bytes;
};

inline int one_input(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t flags = in.u8();
  const std::uint64_t text_size = in.u16() + 1u;
  const std::uint32_t num = in.u32() % 100000;
  const std::uint64_t wild_symtab = flags & 2 ? in.u64() : kSymtab;
  const std::uint64_t wild_strtab = flags & 4 ? in.u64() : kStrtab;
  std::vector<Region> mem;
  for (std::uint64_t base : {kSymtab, kStrtab, kTypetab}) {
    auto b = in.bytes(in.u16());
    mem.push_back(Region{base, std::vector<std::uint8_t>(b.begin(), b.end())});
  }
  auto base_b = in.bytes(in.u16());
  auto split_b = in.bytes(in.left());
  std::vector<std::byte> base(base_b.size()), split(split_b.size());
  if (!base.empty()) std::memcpy(base.data(), base_b.data(), base.size());
  if (!split.empty()) std::memcpy(split.data(), split_b.data(), split.size());
  mem.push_back(Region{
      kBtf, split_b.empty() ? std::vector<std::uint8_t>{} : std::vector<std::uint8_t>(split_b.begin(), split_b.end())});

  std::uint64_t bytes_read = 0;
  kernel::ReadFn read = [&](Gva a, std::span<std::byte> out) -> Result<void> {
    bytes_read += out.size();
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::optional<std::uint8_t> v;
      for (const Region& r : mem)
        if (a.value + i - r.base < r.bytes.size()) v = r.bytes[a.value + i - r.base];
      if (!v && (flags & 1)) return fail(Errc::Fault, "not mapped (fuzz)");
      out[i] = std::byte{v.value_or(0)};
    }
    return {};
  };

  kernel::Module m;
  m.name = "fz";
  m.usable = true;
  m.state = kernel::ModuleState::Live;
  m.text = {kModText, kModText + text_size};
  m.ksym_num = num;
  m.ksym_symtab = wild_symtab;
  m.ksym_strtab = wild_strtab;
  m.ksym_typetab = kTypetab;
  m.btf_data = kBtf;
  m.btf_size = split.size();

  kernel::ModuleSymbolLimits lim;
  lim.max_symbols = 50000;
  lim.max_strtab = 1u << 16;
  lim.chunk_bytes = 4096;
  kernel::ModuleSymbolStats st;
  std::size_t budget = lim.max_total;
  auto r = kernel::read_module_symbols(read, m, st, budget, lim);
  FUZZ_TRACE("symbols: %s", r ? st.describe().c_str() : r.error().what.c_str());
  if (!r) {
    FUZZ_CHECK(r.error().code == Errc::InvalidArgument || r.error().code == Errc::Fault, r.error().what);
    FUZZ_CHECK(!r.error().what.empty() && printable(r.error().what), r.error().what);
  } else {
    FUZZ_CHECK(bytes_read <= std::uint64_t{num} * 25 + lim.max_strtab, "read " + std::to_string(bytes_read));
    FUZZ_CHECK(st.kept == r->size(), st.describe());
    if (num > 0) FUZZ_CHECK(st.kept + st.not_function + st.bad() == num - 1, st.describe());
    for (std::size_t i = 0; i < r->size(); ++i) {
      const symbols::ModuleFunction& f = (*r)[i];
      FUZZ_CHECK(f.module == "fz");
      FUZZ_CHECK(!f.name.empty() && f.name.size() <= symbols::kMaxNameLen, f.name);
      FUZZ_CHECK(std::all_of(f.name.begin(), f.name.end(), [](char c) { return c > ' ' && c < 0x7f && c != ':'; }),
                 f.name);
      FUZZ_CHECK(m.text.contains(f.start) && f.size > 0 && f.size <= m.text.end - f.start, f.name);
      if (i > 0) {
        const symbols::ModuleFunction& p = (*r)[i - 1];
        FUZZ_CHECK(p.start <= f.start, "not sorted");
        FUZZ_CHECK(p.start == f.start || p.start + p.size <= f.start, "overlap: " + p.name + " " + f.name);
      }
    }
    symbols::SymbolTable t;
    auto s = t.set_module_functions(*r);
    FUZZ_CHECK(s.has_value(), s ? std::string() : s.error().what);
    for (const symbols::ModuleFunction& f : *r) {
      auto a = t.resolve("fz:" + f.name);
      if (a) {
        bool same = false;
        for (const auto& g : *r) same = same || (g.name == f.name && g.start == a->value);
        FUZZ_CHECK(same, f.name);
      } else {
        FUZZ_CHECK(a.error().code == Errc::InvalidArgument, a.error().what);
      }
      const std::string sym = t.symbolize(Gva{f.start});
      FUZZ_CHECK(sym.ends_with(" [fz]"), sym);
    }
  }

  // The module's BTF over the base: never crashes; a blob over the limit is refused unread.
  auto v = kernel::validate_split_btf(split, base);
  FUZZ_TRACE("split BTF: %s", v ? ("accepted, " + std::to_string(*v) + " own types").c_str() : v.error().what.c_str());
  if (!v) FUZZ_CHECK(printable(v.error().what), v.error().what);
  const std::uint64_t before = bytes_read;
  auto b = kernel::read_module_btf(read, m, base, 1024);
  if (split.size() > 1024) {
    FUZZ_CHECK(!b && b.error().code == Errc::InvalidArgument && bytes_read == before, "read past the limit");
  } else if (b) {
    FUZZ_CHECK(b->size() == split.size());
  }
  return 0;
}

}  // namespace xenprobes::fuzz::module_symbols
