// The kernel-layer tests' guest with loaded modules (modules_test.cpp, module_btf_test.cpp): a
// FakeKernel whose `modules` list holds struct modules in Debian's 6.1 or 6.12 layout
// (fake_module_btf.hpp), each with its tables, core_kallsyms, btf_data and ORC members as a
// FakeModule says, and the kernel's BTF where __start_BTF/__stop_BTF say.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel/modules.hpp"
#include "unit/kernel/fake_kernel.hpp"
#include "unit/kernel/fake_module_btf.hpp"

namespace xenprobes::testing {

inline constexpr std::uint64_t kModules = kData + 0x2000;           // the `modules` list head
inline constexpr std::uint64_t kMod = 0xffffffffc0000000ull;        // module text area
inline constexpr std::uint64_t kStructs = 0xffffffffc1000000ull;    // struct modules (0x1000 apart)
inline constexpr std::uint64_t kModTables = 0xffffffffc2000000ull;  // their tables (0x1000 apart)

struct FakeModule {
  std::string name{};
  std::uint64_t state = 0;  // MODULE_STATE_LIVE
  std::uint64_t text = 0, text_size = 0x1000, init = 0, init_size = 0;
  std::vector<std::array<std::uint64_t, 3>> ex{};     // insn, fixup, data
  std::vector<std::array<std::uint64_t, 3>> jumps{};  // code, target, key
  std::vector<std::array<std::uint64_t, 2>> calls{};  // addr, key
  std::uint64_t kprobes = 0, kprobes_size = 0;
  std::uint64_t num_ex_override = 0;  // nonzero: the count written instead
  // core_kallsyms: entry 0 (ELF's null symbol) is written before these.
  struct Sym {
    std::string name;
    char type = 't';
    std::uint64_t value = 0, size = 0;
    std::uint16_t shndx = 1;          // 0: SHN_UNDEF
    std::uint32_t name_override = 0;  // nonzero: st_name written instead
  };
  std::vector<Sym> syms{};
  std::uint64_t num_symtab_override = 0;                  // nonzero: num_symtab written instead
  std::uint64_t symtab_override = 0;                      // nonzero: the symtab pointer written instead
  std::vector<std::byte> btf{};                           // its btf_data
  std::uint64_t btf_size_override = 0;                    // nonzero: btf_data_size written instead
  std::uint64_t orc_num = 0, orc_ip = 0, orc_unwind = 0;  // arch's ORC members, as written
};

inline constexpr std::uint64_t kSymtabs =
    0xffffffffc3000000ull;  // symtab +0, strtab +0x8000, typetab +0xc000 (0x10000 apart)
inline constexpr std::uint64_t kBtfs = 0xffffffffc4000000ull;  // module BTF (0x100000 apart)

struct Walk : ::testing::Test {
  FakeKernel k;
  Offsets o = k61;

  // Writes the modules and links them head -> m[0] -> m[1] -> ... -> head; returns the
  // address of each struct module.
  std::vector<std::uint64_t> put(const std::vector<FakeModule>& mods) {
    k.sym(kModules, 'd', "modules");
    std::vector<std::uint64_t> at;
    for (std::size_t i = 0; i < mods.size(); ++i) {
      const FakeModule& m = mods[i];
      const std::uint64_t s = kStructs + 0x1000 * i, tab = kModTables + 0x1000 * i;
      at.push_back(s);
      k.u64(s + o.state, m.state);
      k.put(s + o.name, m.name.data(), m.name.size());
      const std::uint64_t text_size_off = o.mem ? 8 : 12;
      k.u64(s + o.text, m.text);
      k.s32(s + o.text + text_size_off, static_cast<std::int64_t>(m.text_size));
      k.u64(s + o.init_text, m.init);
      k.s32(s + o.init_text + text_size_off, static_cast<std::int64_t>(m.init_size));
      // Tables, relative to each field as in the core kernel's sections.
      k.u64(s + o.extable, tab);
      k.s32(s + o.num_exentries, static_cast<std::int64_t>(m.num_ex_override ? m.num_ex_override : m.ex.size()));
      for (std::size_t j = 0; j < m.ex.size(); ++j) {
        const std::uint64_t e = tab + 12 * j;
        k.s32(e, static_cast<std::int64_t>(m.ex[j][0] - e));
        k.s32(e + 4, static_cast<std::int64_t>(m.ex[j][1] - (e + 4)));
        k.s32(e + 8, static_cast<std::int64_t>(m.ex[j][2]));
      }
      k.u64(s + o.jump, tab + 0x400);
      k.s32(s + o.num_jump, static_cast<std::int64_t>(m.jumps.size()));
      for (std::size_t j = 0; j < m.jumps.size(); ++j) {
        const std::uint64_t e = tab + 0x400 + 16 * j;
        k.s32(e, static_cast<std::int64_t>(m.jumps[j][0] - e));
        k.s32(e + 4, static_cast<std::int64_t>(m.jumps[j][1] - (e + 4)));
        k.s64(e + 8, static_cast<std::int64_t>(m.jumps[j][2] - (e + 8)));
      }
      k.u64(s + o.sc, tab + 0x800);
      k.s32(s + o.num_sc, static_cast<std::int64_t>(m.calls.size()));
      for (std::size_t j = 0; j < m.calls.size(); ++j) {
        const std::uint64_t e = tab + 0x800 + 8 * j;
        k.s32(e, static_cast<std::int64_t>(m.calls[j][0] - e));
        k.s32(e + 4, static_cast<std::int64_t>(m.calls[j][1] - (e + 4)));
      }
      k.u64(s + o.kprobes, m.kprobes);
      k.s32(s + o.kprobes_size, static_cast<std::int64_t>(m.kprobes_size));
      // core_kallsyms: Elf64_Sym entries, the names, one type letter each.
      const std::uint64_t st = kSymtabs + 0x10000 * i, str = st + 0x8000, typ = st + 0xc000;
      const std::uint64_t n = m.syms.empty() ? 0 : m.syms.size() + 1;
      k.u64(s + o.core_kallsyms, m.symtab_override ? m.symtab_override : st);
      k.s32(s + o.core_kallsyms + 8, static_cast<std::int64_t>(m.num_symtab_override ? m.num_symtab_override : n));
      k.u64(s + o.core_kallsyms + 16, str);
      k.u64(s + o.core_kallsyms + 24, typ);
      std::uint32_t name_at = 1;  // strtab[0] is the null symbol's empty name
      k.put(str, "", 1);
      k.put(typ, "U", 1);
      for (std::size_t j = 0; j < m.syms.size(); ++j) {
        const auto& y = m.syms[j];
        const std::uint64_t e = st + 24 * (j + 1);
        const std::uint32_t nm = y.name_override ? y.name_override : name_at;
        k.put(e, &nm, 4);
        k.put(e + 6, &y.shndx, 2);
        k.u64(e + 8, y.value);
        k.u64(e + 16, y.size);
        k.put(str + name_at, y.name.c_str(), y.name.size() + 1);
        name_at += static_cast<std::uint32_t>(y.name.size() + 1);
        k.put(typ + j + 1, &y.type, 1);
      }
      const std::uint64_t bt = kBtfs + 0x100000 * i;
      k.u64(s + o.btf_data, m.btf.empty() ? 0 : bt);
      k.s32(s + o.btf_size, static_cast<std::int64_t>(m.btf_size_override ? m.btf_size_override : m.btf.size()));
      if (!m.btf.empty()) k.put(bt, m.btf.data(), m.btf.size());
      if (o.arch) {
        k.s32(s + o.arch, static_cast<std::int64_t>(m.orc_num));
        k.u64(s + o.arch + 8, m.orc_ip);
        k.u64(s + o.arch + 16, m.orc_unwind);
      }
    }
    // The links: list_head at s + o.list.
    auto node = [&](std::size_t i) { return i == mods.size() ? kModules : at[i] + o.list; };
    std::uint64_t prev = kModules;
    for (std::size_t i = 0; i <= mods.size(); ++i) {
      const std::uint64_t cur = node(i);
      k.u64(prev, cur);      // prev->next
      k.u64(cur + 8, prev);  // cur->prev
      prev = cur;
      if (i == mods.size()) break;
    }
    k.u64(kModules, mods.empty() ? kModules : node(0));
    k.u64(kModules + 8, mods.empty() ? kModules : node(mods.size() - 1));
    return at;
  }
  // The BTF in guest memory, where __start_BTF/__stop_BTF say.
  void put_btf() {
    auto blob = module_btf(o);
    const std::uint64_t at = kRodata + 0x10000;
    k.put(at, blob.data(), blob.size());
    k.sym(at, 'R', "__start_BTF");
    k.sym(at + blob.size(), 'R', "__stop_BTF");
  }
  kernel::ModuleTables walk(kernel::Limits l = {}) {
    auto layout = kernel::module_layout_from_btf(module_btf(o));
    if (!layout) throw std::runtime_error(layout.error().what);
    return kernel::ModuleTables::read(k.symbols(), k.reader(), *layout, {kText, kTextEnd}, l);
  }
};

}  // namespace xenprobes::testing
