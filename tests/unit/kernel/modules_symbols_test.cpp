// A guest's loaded modules beyond the walk (the fake guest: unit/kernel/module_walk.hpp): their
// functions read from core_kallsyms (kernel/module_symbols.cpp), their BTF read bounded and
// checked as split BTF, the layout taken from the kernel's BTF, and a module's own ORC table.
#include <bpf/btf.h>
#include <gtest/gtest.h>

#include <map>

#include "kernel/address_rules.hpp"
#include "kernel/btf.hpp"
#include "kernel/module_symbols.hpp"
#include "kernel/modules.hpp"
#include "kernel/orc.hpp"
#include "unit/kernel/fake_kernel.hpp"
#include "unit/kernel/fake_module_btf.hpp"
#include "unit/kernel/module_walk.hpp"

namespace xenprobes::testing {
namespace {

using kernel::Module;
using kernel::ModuleLayout;
using kernel::ModuleTables;

// ---- loaded modules' symbols (kernel/module_symbols.cpp) and their BTF

using kernel::ModuleSymbolStats;
using symbols::ModuleFunction;

TEST_F(Walk, ModuleFunctionsAreReadFromCoreKallsymsInBothLayouts) {
  for (const Offsets* v : {&k61, &k612}) {
    o = *v;
    k = FakeKernel{};
    SCOPED_TRACE(o.mem ? "6.12 layout" : "6.1 layout");
    put({{.name = "xfs",
          .text = kMod,
          .text_size = 0x3000,
          .syms =
              {{.name = "xfs_file_read_iter", .type = 't', .value = kMod + 0x100, .size = 0x80},
               {.name = "xfs_init_fs_context", .type = 'T', .value = kMod + 0x200},          // no size: to the next
               {.name = "xfs_stats", .type = 'd', .value = kMod + 0x10},                     // data: not a function
               {.name = "printk", .type = 'U', .value = 0, .shndx = 0},                      // undefined
               {.name = "xfs_last", .type = 't', .value = kMod + 0x2f00, .size = 0x1000}}},  // cut at the text's end
         {.name = "ext4",
          .text = kMod + 0x10000,
          .syms = {{.name = "ext4_read", .value = kMod + 0x10040, .size = 0x40}}}});
    auto t = walk();
    ASSERT_TRUE(t.status().found) << t.status().why;
    auto r = kernel::read_all_module_symbols(k.reader(), t);
    EXPECT_EQ(r.modules_read, 2u);
    EXPECT_TRUE(r.refused.empty());
    EXPECT_EQ(r.stats.kept, 4u);
    EXPECT_EQ(r.stats.not_function, 2u);
    EXPECT_EQ(r.stats.bad(), 0u);
    ASSERT_EQ(r.functions.size(), 4u);
    std::map<std::string, ModuleFunction> by;
    for (const auto& f : r.functions) by[f.name] = f;
    EXPECT_EQ(by["xfs_file_read_iter"].module, "xfs");
    EXPECT_EQ(by["xfs_file_read_iter"].start, kMod + 0x100);
    EXPECT_EQ(by["xfs_file_read_iter"].size, 0x80u);
    EXPECT_EQ(by["xfs_init_fs_context"].size, 0x2f00u - 0x200u);
    EXPECT_EQ(by["xfs_init_fs_context"].type, 'T');
    EXPECT_EQ(by["xfs_last"].size, 0x100u);
    EXPECT_EQ(by["ext4_read"].module, "ext4");

    // Into a symbol table: resolve, list, symbolize, function_containing.
    auto syms = k.symbols();
    ASSERT_TRUE(syms.set_module_functions(r.functions));
    auto a = syms.resolve("xfs_file_read_iter");
    ASSERT_TRUE(a) << a.error().what;
    EXPECT_EQ(a->value, kMod + 0x100);
    EXPECT_EQ(syms.resolve("xfs:xfs_file_read_iter+0x10")->value, kMod + 0x110);
    auto past = syms.resolve("xfs_file_read_iter+0x80");
    ASSERT_FALSE(past);
    EXPECT_EQ(past.error().code, Errc::Range);
    EXPECT_FALSE(syms.resolve("ext4:xfs_file_read_iter"));
    EXPECT_FALSE(syms.resolve("xfs_stats"));  // data is not read
    EXPECT_EQ(syms.symbolize(Gva{kMod + 0x110}), "xfs_file_read_iter+0x10 [xfs]");
    auto fn = syms.function_containing(Gva{kMod + 0x10050});
    ASSERT_TRUE(fn) << fn.error().what;
    EXPECT_EQ(fn->name, "ext4_read [ext4]");
    EXPECT_EQ(fn->size, 0x40u);
    auto m = syms.matching("*_read*");
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].name, "ext4_read");
    EXPECT_EQ(m[0].module, "ext4");
    EXPECT_EQ(m[1].name, "xfs_file_read_iter");
    EXPECT_EQ(syms.matching("xfs:*").size(), 3u);
    EXPECT_EQ(syms.matching("_stext").size(), 1u);  // the core kernel's are still there
  }
}

TEST_F(Walk, ANameInSeveralModulesIsRefusedUntilQualifiedAndTheCoreKernelWins) {
  k.sym(kText + 0x100, 'T', "shared_helper");
  put({{.name = "a",
        .text = kMod,
        .syms = {{.name = "dup", .value = kMod + 0x10}, {.name = "shared_helper", .value = kMod + 0x20}}},
       {.name = "b", .text = kMod + 0x10000, .syms = {{.name = "dup", .value = kMod + 0x10010}}}});
  auto r = kernel::read_all_module_symbols(k.reader(), walk());
  auto syms = k.symbols();
  ASSERT_TRUE(syms.set_module_functions(r.functions));
  auto d = syms.resolve("dup");
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Errc::InvalidArgument);
  EXPECT_EQ(d.error().what, "function 'dup' is in several loaded modules (a, b): name one, e.g. 'a:dup'");
  EXPECT_EQ(syms.resolve("a:dup")->value, kMod + 0x10);
  EXPECT_EQ(syms.resolve("b:dup")->value, kMod + 0x10010);
  EXPECT_EQ(syms.resolve("shared_helper")->value, kText + 0x100);  // as kallsyms_lookup_name: vmlinux first
  EXPECT_EQ(syms.resolve("a:shared_helper")->value, kMod + 0x20);
  auto none = syms.resolve("c:dup");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::NotFound);
}

TEST_F(Walk, BadModuleSymbolDataIsRefusedAndCountedByReason) {
  kernel::ModuleSymbolLimits l;
  l.max_symbols = 8;
  l.max_strtab = 0x100;
  put({{.name = "huge", .text = kMod, .syms = {{.name = "f", .value = kMod}}, .num_symtab_override = 9},
       {.name = "userptr",
        .text = kMod + 0x10000,
        .syms = {{.name = "f", .value = kMod + 0x10000}},
        .symtab_override = 0x400000},
       {.name = "liar",
        .text = kMod + 0x20000,
        .syms = {{.name = "good", .value = kMod + 0x20010},
                 {.name = "in_core", .value = kText + 0x10},                             // outside its text
                 {.name = "in_other", .value = kMod + 0x10},                             // another module's text
                 {.name = "past_end", .value = kMod + 0x21000},                          // one past its text
                 {.name = "far_name", .value = kMod + 0x20020, .name_override = 0x100},  // st_name at the cap
                 {.name = "bad\x01name", .value = kMod + 0x20030},
                 {.name = "with:colon", .value = kMod + 0x20040}}}});
  auto t = walk();
  ASSERT_TRUE(t.status().found) << t.status().why;
  auto r = kernel::read_all_module_symbols(k.reader(), t, l);
  ASSERT_EQ(r.refused.size(), 2u);
  EXPECT_EQ(r.refused[0], "huge: its num_symtab 9 is more than the limit of 8");
  EXPECT_NE(r.refused[1].find("userptr: its symtab (0x400000)"), std::string::npos) << r.refused[1];
  EXPECT_NE(r.refused[1].find("outside the kernel's half"), std::string::npos) << r.refused[1];
  EXPECT_EQ(r.modules_read, 1u);
  EXPECT_EQ(r.stats.kept, 1u);
  EXPECT_EQ(r.stats.outside_text, 3u);
  EXPECT_EQ(r.stats.strtab_out_of_bounds, 1u);
  EXPECT_EQ(r.stats.bad_name, 2u);
  ASSERT_EQ(r.functions.size(), 1u);
  EXPECT_EQ(r.functions[0].name, "good");
  EXPECT_EQ(r.functions[0].size, 0x1000u - 0x10u);
  EXPECT_EQ(r.stats.describe(),
            "1 functions kept, 3 dropped outside their module's text, 2 dropped with a bad name, 1 dropped with a "
            "name out of strtab");

  // A strtab whose page cannot be read: the names there are out of bounds, the symtab is fine.
  k = FakeKernel{};
  put({{.name = "m", .text = kMod, .syms = {{.name = "f", .value = kMod}}}});
  k.unreadable.push_back(kSymtabs + 0x8000);
  auto u = kernel::read_all_module_symbols(k.reader(), walk());
  EXPECT_EQ(u.stats.strtab_out_of_bounds, 1u);
  EXPECT_EQ(u.stats.kept, 0u);
  // An unreadable symtab refuses the module, naming the address.
  k.unreadable = {kSymtabs + 24};
  auto v = kernel::read_all_module_symbols(k.reader(), walk());
  ASSERT_EQ(v.refused.size(), 1u);
  EXPECT_NE(v.refused[0].find("cannot read its symtab at 0xffffffffc3000000"), std::string::npos) << v.refused[0];
  // The total over all modules is capped as well.
  k = FakeKernel{};
  put({{.name = "a", .text = kMod, .syms = {{.name = "f", .value = kMod}, {.name = "g", .value = kMod + 8}}},
       {.name = "b", .text = kMod + 0x10000, .syms = {{.name = "h", .value = kMod + 0x10000}}}});
  kernel::ModuleSymbolLimits total;
  total.max_total = 4;
  auto w = kernel::read_all_module_symbols(k.reader(), walk(), total);
  EXPECT_EQ(w.modules_read, 1u);
  ASSERT_EQ(w.refused.size(), 1u);
  EXPECT_EQ(w.refused[0], "b: its 2 symbols pass the loaded modules' limit of 4 symbols in all");
}

TEST_F(Walk, ALayoutWithoutCoreKallsymsOrBtfDataReadsNoneAndSaysSo) {
  auto l = kernel::module_layout_from_btf(module_btf(o, "core_kallsyms"));
  ASSERT_TRUE(l) << l.error().what;
  EXPECT_FALSE(l->ksym_symtab.has_value());
  EXPECT_NE(l->describe().find("no core_kallsyms"), std::string::npos) << l->describe();
  auto b = kernel::module_layout_from_btf(module_btf(o, "btf_data"));
  ASSERT_TRUE(b) << b.error().what;
  EXPECT_FALSE(b->btf_data.has_value());
  EXPECT_NE(b->describe().find("no module BTF"), std::string::npos) << b->describe();
  put({{.name = "m", .text = kMod, .syms = {{.name = "f", .value = kMod}}}});
  auto t = ModuleTables::read(k.symbols(), k.reader(), *l, {kText, kTextEnd});
  auto r = kernel::read_all_module_symbols(k.reader(), t);
  EXPECT_EQ(r.modules_read, 1u);
  EXPECT_TRUE(r.functions.empty());
}

// A module's BTF: split over the kernel's (here the hand-made struct module BTF), with a
// struct of its own that points at a kernel type.
std::vector<std::byte> split_btf(const std::vector<std::byte>& base_raw, const char* record) {
  btf* base = btf__new(base_raw.data(), static_cast<__u32>(base_raw.size()));
  btf* b = btf__new_empty_split(base);
  const int lh = btf__find_by_name_kind(base, "list_head", BTF_KIND_STRUCT);
  const int u32 = btf__find_by_name_kind(base, "unsigned int", BTF_KIND_INT);
  btf__add_struct(b, record, 24);
  btf__add_field(b, "flags", u32, 0, 0);
  btf__add_field(b, "link", lh, 64, 0);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> out(raw, raw + n);
  btf__free(b);
  btf__free(base);
  return out;
}

TEST_F(Walk, ModuleBtfIsReadBoundedAndCheckedAsSplitBtf) {
  const auto base = module_btf(o);
  const auto good = split_btf(base, "xfs_inode");
  std::vector<std::byte> junk(64, std::byte{0x5a});
  put({{.name = "xfs", .text = kMod, .btf = good},
       {.name = "nobtf", .text = kMod + 0x10000},
       {.name = "big", .text = kMod + 0x20000, .btf = good, .btf_size_override = (16u << 20) + 1},
       {.name = "junk", .text = kMod + 0x30000, .btf = junk}});
  auto t = walk();
  auto mod = [&](const char* n) -> const Module& {
    for (const Module& m : t.modules())
      if (m.name == n) return m;
    throw std::runtime_error(n);
  };
  auto x = kernel::read_module_btf(k.reader(), mod("xfs"), base);
  ASSERT_TRUE(x) << x.error().what;
  EXPECT_EQ(*x, good);
  EXPECT_EQ(kernel::validate_split_btf(*x, base).value_or(0), 1u);  // one type of its own
  auto none = kernel::read_module_btf(k.reader(), mod("nobtf"), base);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::NotFound);
  auto big = kernel::read_module_btf(k.reader(), mod("big"), base);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, Errc::InvalidArgument);
  EXPECT_EQ(big.error().what, "its btf_data_size 16777217 is more than the limit of 16777216 bytes");
  auto bad = kernel::read_module_btf(k.reader(), mod("junk"), base);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::Io);
  EXPECT_NE(bad.error().what.find("libbpf rejects the module's BTF"), std::string::npos) << bad.error().what;
  // A blob shorter than a BTF header is refused before libbpf sees it.
  auto short_blob = kernel::validate_split_btf(std::span(good.data(), 8), base);
  ASSERT_FALSE(short_blob);
  EXPECT_EQ(short_blob.error().what, "the module's BTF is 8 bytes, shorter than its header");
}

TEST_F(Walk, WalkModulesTakesTheLayoutFromTheKernelsBtf) {
  put_btf();
  put({{.name = "a", .text = kMod}});
  auto btf = kernel::read_kernel_btf(k.symbols(), k.reader());
  ASSERT_TRUE(btf) << btf.error().what;
  auto t = kernel::walk_modules(k.symbols(), k.reader(), *btf);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->summary(), "modules 1 live");
  FakeKernel empty;
  auto none = kernel::walk_modules(empty.symbols(), empty.reader(), *btf);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().what.find("no `modules` list head"), std::string::npos) << none.error().what;
}

}  // namespace
}  // namespace xenprobes::testing

namespace xenprobes::testing {
namespace {

// A module's own ORC table, found through its struct module's arch members (both layouts),
// read with read_module_table, and a walk that goes from the module's text back into the core
// kernel's (whose table here is a single end-of-stack entry).
TEST_F(Walk, AModulesOrcTableThroughItsStructModule) {
  using namespace kernel::orc;
  for (const Offsets* v : {&k61, &k612}) {
    o = *v;
    k = FakeKernel{};
    SCOPED_TRACE(o.mem ? "6.12 layout" : "6.1 layout");
    // The module's table (v1 flags: sp_reg SP 5, type CALL 0): its function at kMod + 0x100,
    // the return address at the stack pointer.
    const std::uint64_t ips = kModTables + 0x8000, orcs = ips + 0x100;
    const std::uint64_t fn = kMod + 0x100;
    k.s32(ips, static_cast<std::int64_t>(fn - ips));
    k.s32(ips + 4, static_cast<std::int64_t>(fn + 0x40 - (ips + 4)));
    const std::int16_t rows[2][3] = {{8, 0, 5}, {0, 0, 0}};  // the second: undefined (v1)
    k.put(orcs, rows, sizeof rows);
    put({{.name = "xfs", .text = kMod, .text_size = 0x1000, .orc_num = 2, .orc_ip = ips, .orc_unwind = orcs},
         {.name = "ext4", .text = kMod + 0x10000, .text_size = 0x1000}});
    ModuleTables t = walk();
    ASSERT_EQ(t.modules().size(), 2u);
    const kernel::Module* xfs = t.live_module_at(fn);
    ASSERT_NE(xfs, nullptr);
    EXPECT_EQ(xfs->orc_num, 2u);
    EXPECT_EQ(xfs->orc_ip, ips);
    EXPECT_EQ(xfs->orc_unwind, orcs);
    EXPECT_EQ(t.live_module_at(kMod + 0x10000)->orc_num, 0u);  // a module without a table
    auto mt = read_module_table(k.reader(), xfs->orc_ip, xfs->orc_unwind, xfs->orc_num, xfs->text, Format::V1);
    ASSERT_TRUE(mt) << mt.error().what;
    EXPECT_EQ(mt->size(), 2u);
    // The core kernel: one end-of-stack entry (v1: sp_reg UNDEFINED with the end bit).
    std::vector<std::byte> cip(4), corc(6);
    const std::uint64_t cbase = kRodata + 0x30000;
    const auto rel = static_cast<std::int32_t>(static_cast<std::int64_t>(kText + 0x10 - cbase));
    std::memcpy(cip.data(), &rel, 4);
    const std::uint16_t end = 1u << 10;
    std::memcpy(corc.data() + 4, &end, 2);
    auto core = Table::parse(cbase, cip, corc, {{kText, kTextEnd}}, Format::V1);
    ASSERT_TRUE(core) << core.error().what;
    Unwinder u(std::move(*core));
    std::vector<Table> mods;
    mods.push_back(std::move(*mt));
    const kernel::Module* ext4 = t.live_module_at(kMod + 0x10000);
    u.set_modules(std::move(mods), {ext4->text});
    // The stack: a return address into the core kernel at sp; a frame pointer's pair (the
    // caller's rbp, then the return address) at bp.
    const std::uint64_t sp = 0xffffc90000001000ull, bp = sp + 0x40;
    const std::map<std::uint64_t, std::uint64_t> words{{sp, kText + 0x20}, {bp, 0}, {bp + 8, kText + 0x20}};
    kernel::ReadFn stack = [&](Gva a, std::span<std::byte> out) -> Result<void> {
      auto it = words.find(a.value);
      if (it == words.end() || out.size() != 8) return fail(Errc::Fault, "not on the stack");
      std::memcpy(out.data(), &it->second, 8);
      return {};
    };
    StartRegs s;
    s.rip = fn + 4, s.rsp = sp;
    kernel::orc::Walk w = u.walk(s, stack);
    EXPECT_EQ(w.ips, (std::vector<std::uint64_t>{fn + 4, kText + 0x20}));
    EXPECT_EQ(w.stop, Stop::EndOfStack);
    EXPECT_FALSE(w.fallback);
    // In the module without a table: no entry, the frame-pointer fallback.
    s.rip = kMod + 0x10010, s.rbp = bp;
    kernel::orc::Walk f = u.walk(s, stack);
    EXPECT_EQ(f.ips, (std::vector<std::uint64_t>{kMod + 0x10010, kText + 0x20}));
    EXPECT_EQ(f.stop, Stop::EndOfStack);
    EXPECT_TRUE(f.fallback);
  }
}

}  // namespace
}  // namespace xenprobes::testing
