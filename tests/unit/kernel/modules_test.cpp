// The guest kernel's loaded modules: struct module's layout from BTF (kernel/modules_layout.cpp;
// hand-made with libbpf's writer in both shapes, 6.1's core_layout and 6.4+'s mem[], and
// Debian's real kernels when their images are cached), then the module list walked in a fake
// guest memory (kernel/modules.cpp), hostile layouts included. The address rules over module
// text: modules_rules_test.cpp; the modules' symbols, BTF and ORC tables: modules_symbols_test.cpp.
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
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

namespace fs = std::filesystem;
using kernel::Module;
using kernel::ModuleLayout;
using kernel::ModuleTables;

void expect_layout(const ModuleLayout& l, const Offsets& o) {
  EXPECT_EQ(l.struct_size, o.size);
  EXPECT_EQ(l.mem_array, o.mem);
  EXPECT_EQ(l.state.offset, o.state);
  EXPECT_EQ(l.state.size, 4u);
  EXPECT_EQ(l.list.offset, o.list);
  EXPECT_EQ(l.name.offset, o.name);
  EXPECT_EQ(l.name.size, 56u);
  EXPECT_EQ(l.core_base.offset, o.text);
  EXPECT_EQ(l.core_text_size.offset, o.text + (o.mem ? 8 : 12));  // module_memory.size / module_layout.text_size
  EXPECT_EQ(l.init_base.offset, o.init_text);
  EXPECT_EQ(l.extable.offset, o.extable);
  EXPECT_EQ(l.num_exentries.offset, o.num_exentries);
  EXPECT_EQ(l.jump_entries.offset, o.jump);
  EXPECT_EQ(l.num_jump_entries.offset, o.num_jump);
  EXPECT_EQ(l.static_call_sites.offset, o.sc);
  EXPECT_EQ(l.num_static_call_sites.offset, o.num_sc);
  ASSERT_TRUE(l.kprobes_text_start && l.noinstr_text_start);
  EXPECT_EQ(l.kprobes_text_start->offset, o.kprobes);
  EXPECT_EQ(l.kprobes_text_size->offset, o.kprobes_size);
  EXPECT_EQ(l.noinstr_text_start->offset, o.noinstr);
  EXPECT_EQ(l.noinstr_text_size->offset, o.noinstr_size);
  EXPECT_EQ(l.state_going, 2u);
  ASSERT_TRUE(l.ksym_symtab && l.ksym_num_symtab && l.ksym_strtab && l.ksym_typetab);
  EXPECT_EQ(l.ksym_symtab->offset, o.core_kallsyms);
  EXPECT_EQ(l.ksym_num_symtab->offset, o.core_kallsyms + 8);
  EXPECT_EQ(l.ksym_num_symtab->size, 4u);
  EXPECT_EQ(l.ksym_strtab->offset, o.core_kallsyms + 16);
  EXPECT_EQ(l.ksym_typetab->offset, o.core_kallsyms + 24);
  ASSERT_TRUE(l.btf_data && l.btf_data_size);
  EXPECT_EQ(l.btf_data->offset, o.btf_data);
  EXPECT_EQ(l.btf_data_size->offset, o.btf_size);
  EXPECT_EQ(l.btf_data_size->size, 4u);
}

TEST(ModuleLayout, FromA61StyleBtf) {
  auto l = kernel::module_layout_from_btf(module_btf(k61));
  ASSERT_TRUE(l) << l.error().what;
  expect_layout(*l, k61);
}

TEST(ModuleLayout, FromA612StyleBtfWithMemArray) {
  auto l = kernel::module_layout_from_btf(module_btf(k612));
  ASSERT_TRUE(l) << l.error().what;
  expect_layout(*l, k612);
  EXPECT_NE(l->describe().find("mem[MOD_TEXT]"), std::string::npos) << l->describe();
}

TEST(ModuleLayout, MissingOrBrokenBtfIsRefusedWithTheReason) {
  auto no_list = kernel::module_layout_from_btf(module_btf(k61, "list"));
  ASSERT_FALSE(no_list);
  EXPECT_EQ(no_list.error().code, Errc::NotFound);
  // A kernel without jump labels has no such member: fine, and said.
  auto no_jumps = kernel::module_layout_from_btf(module_btf(k61, "jump_entries"));
  ASSERT_FALSE(no_jumps);  // the count without the pointer: a layout we do not know
  EXPECT_EQ(no_jumps.error().code, Errc::InvalidArgument);
  // Not BTF at all.
  std::vector<std::byte> junk(64, std::byte{0x5a});
  auto bad = kernel::module_layout_from_btf(junk);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::Io);
  // BTF without struct module.
  btf* b = btf__new_empty();
  btf__add_int(b, "int", 4, BTF_INT_SIGNED);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> empty(raw, raw + n);
  btf__free(b);
  auto none = kernel::module_layout_from_btf(empty);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::NotFound);
}

// Real kernels: Debian's 6.1 (core_layout) and 6.12 (mem[]) from the image cache the test
// command fills (tools/fetch-debian-kernels.sh), and this machine's own BTF when readable.
TEST(ModuleLayout, FromRealKernelBtf) {
  const char* e = std::getenv("XENPROBES_KERNEL_CACHE");
  const fs::path cache = e && *e ? fs::path(e) : fs::path("/var/cache/xenprobes-kernels");
  int seen = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(cache, ec)) {
    const fs::path img = d.path() / "vmlinux";
    if (!fs::exists(img)) continue;
    btf* b = btf__parse_elf(img.c_str(), nullptr);
    ASSERT_FALSE(libbpf_get_error(b)) << img;
    std::uint32_t n = 0;
    auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
    auto l = kernel::module_layout_from_btf(std::span(raw, n));
    btf__free(b);
    ASSERT_TRUE(l) << img << ": " << l.error().what;
    const std::string v = d.path().filename();
    SCOPED_TRACE(v);
    if (v.starts_with("6.1.")) expect_layout(*l, k61);
    if (v.starts_with("6.12.")) expect_layout(*l, k612);
    // The module's ORC tables (struct mod_arch_specific: num_orcs, then the two pointers).
    ASSERT_TRUE(l->orc_num && l->orc_ip && l->orc_unwind) << l->describe();
    // Where Debian's builds put it (their BTF, read when this was written): arch at +480 in 6.1,
    // +824 in 6.12, num_orcs its first member.
    if (v.starts_with("6.1.")) {
      EXPECT_EQ(l->orc_num->offset, 480u) << l->describe();
    } else if (v.starts_with("6.12.")) {
      EXPECT_EQ(l->orc_num->offset, 824u) << l->describe();
    }
    EXPECT_EQ(l->orc_num->size, 4u);
    EXPECT_EQ(l->orc_ip->offset, l->orc_num->offset + 8);
    EXPECT_EQ(l->orc_unwind->offset, l->orc_num->offset + 16);
    ++seen;
  }
  EXPECT_GT(seen, 0) << "no kernel image in " << cache << ": run sh tools/fetch-debian-kernels.sh";
  // This machine's own kernel, whatever its version (6.18 where this was written: mem[] of a
  // 16-byte struct module_memory, no kprobes members): a kernel with modules gives a layout.
  btf* own = btf__parse("/sys/kernel/btf/vmlinux", nullptr);
  if (libbpf_get_error(own) || !own) return;
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(own, &n));
  const bool has_modules = btf__find_by_name_kind(own, "module", BTF_KIND_STRUCT) > 0;
  auto l = kernel::module_layout_from_btf(std::span(raw, n));
  btf__free(own);
  if (has_modules) { EXPECT_TRUE(l) << "/sys/kernel/btf/vmlinux: " << l.error().what; }
}

// ---- the walk (the fixture: unit/kernel/module_walk.hpp)

TEST_F(Walk, ANormalListIsReadWithEachModulesTables) {
  for (const Offsets* v : {&k61, &k612}) {
    o = *v;
    k = FakeKernel{};
    SCOPED_TRACE(o.mem ? "6.12 layout" : "6.1 layout");
    put({{.name = "xfs",
          .text = kMod,
          .text_size = 0x3000,
          .init = kMod + 0x100000,
          .init_size = 0x1000,
          .ex = {{kMod + 0x120, kMod + 0x2000, 3}, {kMod + 0x100010, kMod, 3}},
          .jumps = {{kMod + 0x200, kMod + 0x210, kData + 0x10}},
          .calls = {{kMod + 0x300, kData + 0x20 + 1}}},
         {.name = "nf_tables", .text = kMod + 0x10000}});
    auto t = walk();
    ASSERT_TRUE(t.status().found) << t.status().why;
    EXPECT_EQ(t.status().entries, 2u);
    const Module* x = t.live_module_at(kMod + 0x2fff);
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->name, "xfs");
    EXPECT_EQ(x->text.end, kMod + 0x3000);
    EXPECT_EQ(x->ex_status.entries, 1u);
    EXPECT_EQ(x->ex_status.init_entries, 1u);  // the one in its (freed) init text
    ASSERT_EQ(x->jumps.size(), 1u);
    EXPECT_EQ(x->jumps[0].key, kData + 0x10);
    ASSERT_EQ(x->calls.size(), 1u);
    EXPECT_EQ(x->calls[0].key, kData + 0x20);  // flag bits cleared
    EXPECT_EQ(t.live_module_at(kMod + 0x3000), nullptr);
    ASSERT_NE(t.live_module_at(kMod + 0x10000), nullptr);
    EXPECT_EQ(t.live_module_at(kMod + 0x10000)->name, "nf_tables");
    EXPECT_EQ(t.summary(), "modules 2 live");
  }
}

TEST_F(Walk, ACycleStopsTheWalkAndNoModuleIsTrusted) {
  auto at = put({{.name = "a", .text = kMod}, {.name = "b", .text = kMod + 0x10000}});
  k.u64(at[1] + o.list, at[0] + o.list);  // b->next = a: head -> a -> b -> a -> …
  auto t = walk();
  EXPECT_FALSE(t.status().found);
  EXPECT_NE(t.status().why.find("loops"), std::string::npos) << t.status().why;
  EXPECT_EQ(t.live_module_at(kMod), nullptr);
  // a->prev = b: a back link that is not the node the walk came from.
  k.u64(at[0] + o.list + 8, at[1] + o.list);
  auto u = walk();
  EXPECT_FALSE(u.status().found);
  EXPECT_NE(u.status().why.find("does not point back"), std::string::npos) << u.status().why;
}

TEST_F(Walk, TheNodeLimitAndNodesOutsideTheKernelHalfStopTheWalk) {
  put({{.name = "a", .text = kMod}, {.name = "b", .text = kMod + 0x10000}});
  kernel::Limits l;
  l.max_modules = 1;
  auto t = walk(l);
  EXPECT_FALSE(t.status().found);
  EXPECT_NE(t.status().why.find("more than 1 modules"), std::string::npos) << t.status().why;
  k.u64(kModules, 0x1000);
  auto u = walk();
  EXPECT_FALSE(u.status().found);
  EXPECT_NE(u.status().why.find("outside the kernel's half"), std::string::npos) << u.status().why;
}

TEST_F(Walk, AHugeCountKeepsThatModuleOutAndTheOthersIn) {
  put({{.name = "evil", .text = kMod, .num_ex_override = 0xfffffff0}, {.name = "good", .text = kMod + 0x10000}});
  auto t = walk();
  ASSERT_TRUE(t.status().found);
  EXPECT_EQ(t.live_module_at(kMod), nullptr);
  const Module* evil = t.module_at(kMod);
  ASSERT_NE(evil, nullptr);
  EXPECT_FALSE(evil->usable);
  EXPECT_NE(evil->why.find("limit"), std::string::npos) << evil->why;
  EXPECT_NE(t.live_module_at(kMod + 0x10000), nullptr);
  EXPECT_EQ(t.status().invalid, 1u);
  EXPECT_NE(t.summary().find("evil invalid"), std::string::npos) << t.summary();
}

TEST_F(Walk, EntriesOutsideTheModulesTextAreDroppedAndCounted) {
  put({{.name = "m",
        .text = kMod,
        .ex = {{kMod + 0x10, kMod, 1}, {kText + 0x10, kText, 1}, {kMod + 0x1000, kMod, 1}},
        .jumps = {{kMod + 0x20000, kMod, kData}},
        .calls = {{0x1234, kData}}},
       {.name = "n", .text = kMod + 0x10000}});
  auto t = walk();
  const Module* m = t.live_module_at(kMod);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->ex_status.entries, 1u);
  EXPECT_EQ(m->ex_status.invalid, 2u);    // in the core kernel, and one past its text
  EXPECT_EQ(m->jump_status.invalid, 1u);  // in another module's text
  EXPECT_EQ(m->sc_status.invalid, 1u);
  EXPECT_TRUE(m->jumps.empty());
}

TEST_F(Walk, ComingGoingBadNamesAndOverlapsAreKeptOutWithTheReason) {
  put({{.name = "going", .state = 2, .text = kMod},
       {.name = "coming", .state = 1, .text = kMod + 0x10000},
       {.name = "bad name!", .text = kMod + 0x20000},
       {.name = "over1", .text = kMod + 0x30000, .text_size = 0x2000},
       {.name = "over2", .text = kMod + 0x31000, .text_size = 0x2000},
       {.name = "core", .text = kText + 0x1000}});
  auto t = walk();
  ASSERT_TRUE(t.status().found) << t.status().why;
  EXPECT_EQ(t.status().entries, 0u);
  EXPECT_EQ(t.status().invalid, 6u);
  auto why = [&](std::uint64_t a) { return t.module_at(a) ? t.module_at(a)->why : std::string("none"); };
  EXPECT_NE(why(kMod).find("GOING"), std::string::npos) << why(kMod);
  EXPECT_NE(why(kMod + 0x10000).find("COMING"), std::string::npos);
  EXPECT_NE(why(kMod + 0x30000).find("overlaps module over2"), std::string::npos) << why(kMod + 0x30000);
  EXPECT_NE(why(kMod + 0x32800).find("overlaps module over1"), std::string::npos) << why(kMod + 0x32800);
  for (const Module& m : t.modules()) {
    EXPECT_FALSE(m.usable) << m.name;
    if (m.name == "?") { EXPECT_NE(m.why.find("name"), std::string::npos); }
    if (m.name == "core") { EXPECT_NE(m.why.find("core kernel"), std::string::npos); }
  }
}

TEST_F(Walk, NoListHeadOrNoBtfSaysWhy) {
  auto tables = k.read();
  EXPECT_TRUE(tables.refresh_modules(k.symbols(), k.reader()));
  ASSERT_NE(tables.modules(), nullptr);
  EXPECT_FALSE(tables.modules()->status().found);
  EXPECT_NE(tables.modules()->status().why.find("CONFIG_DEBUG_INFO_BTF"), std::string::npos)
      << tables.modules()->status().why;
  // BTF but no list head.
  put_btf();
  auto t2 = k.read();
  t2.refresh_modules(k.symbols(), k.reader());
  EXPECT_NE(t2.modules()->status().why.find("no `modules`"), std::string::npos) << t2.modules()->status().why;
}

TEST_F(Walk, RefreshReadsTheBtfOnceAndRewalksOnlyWhenTheListChanged) {
  for (const Offsets* v : {&k61, &k612}) {
    o = *v;
    k = FakeKernel{};
    put_btf();
    auto at = put({{.name = "a", .text = kMod}, {.name = "b", .text = kMod + 0x10000}});
    auto t = k.read();
    ASSERT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
    ASSERT_TRUE(t.modules()->status().found) << t.modules()->status().why;
    EXPECT_NE(t.live_module_at(kMod), nullptr);
    EXPECT_FALSE(t.refresh_modules(k.symbols(), k.reader()));  // nothing changed: no walk
    // b starts going away: its state changes before its links.
    k.u64(at[1] + o.state, 2);
    EXPECT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
    EXPECT_EQ(t.live_module_at(kMod + 0x10000), nullptr);
    EXPECT_NE(t.live_module_at(kMod), nullptr);
    // a and b unloaded, c loaded: its struct module where a's was, with the same links.
    k = FakeKernel{};
    put_btf();
    put({{.name = "c", .text = kMod + 0x40000}, {.name = "a", .text = kMod}});
    EXPECT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
    EXPECT_NE(t.live_module_at(kMod + 0x40000), nullptr);
    EXPECT_EQ(t.live_module_at(kMod + 0x10000), nullptr);
  }
}

// ---- hostile guests, found by review of the walk ----------------------------------------

// struct module holding 64 anonymous members of a union that holds 64 of the next, 8 deep, and
// no `list`: each anonymous type is searched once (64^8 members otherwise: a hang) and the
// layout is refused naming what is missing.
TEST(ModuleLayout, NestedAnonymousMembersAreSearchedOnce) {
  btf* b = btf__new_empty();
  const int u32 = btf__add_int(b, "unsigned int", 4, 0);
  int inner = btf__add_union(b, nullptr, 4);
  btf__add_field(b, "x", u32, 0, 0);
  for (int level = 0; level < 8; ++level) {
    const int outer = btf__add_union(b, nullptr, 4);
    for (int i = 0; i < 64; ++i) btf__add_field(b, nullptr, inner, 0, 0);
    inner = outer;
  }
  btf__add_struct(b, "module", 896);
  for (int i = 0; i < 64; ++i) btf__add_field(b, nullptr, inner, 0, 0);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> blob(raw, raw + n);
  btf__free(b);
  auto l = kernel::module_layout_from_btf(blob);
  ASSERT_FALSE(l.has_value());
  EXPECT_NE(l.error().what.find("no member state"), std::string::npos) << l.error().what;
}

// Every module may claim up to max_entries per table, all in one buffer: the walk has a budget
// for all of them together, and the module that passes it is kept out, saying so.
TEST_F(Walk, TheModulesTablesTogetherHaveOneLimit) {
  const std::vector<std::array<std::uint64_t, 3>> three = {
      {kMod + 0x10, kMod + 0x80, 3}, {kMod + 0x20, kMod + 0x80, 3}, {kMod + 0x30, kMod + 0x80, 3}};
  auto shifted = three;
  for (auto& e : shifted) e[0] += 0x10000, e[1] += 0x10000;
  put({{.name = "a", .text = kMod, .ex = three}, {.name = "b", .text = kMod + 0x10000, .ex = shifted}});
  kernel::Limits l;
  l.max_module_entries = 4;
  auto t = walk(l);
  ASSERT_TRUE(t.status().found) << t.status().why;
  ASSERT_NE(t.live_module_at(kMod), nullptr);
  EXPECT_EQ(t.live_module_at(kMod)->ex.size(), 3u);
  EXPECT_EQ(t.live_module_at(kMod + 0x10000), nullptr);
  const Module* b = t.module_at(kMod + 0x10000);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(b->why.find("limit of 4 entries in all"), std::string::npos) << b->why;
  l.max_module_entries = 6;
  EXPECT_NE(walk(l).live_module_at(kMod + 0x10000), nullptr);
}

// A module still loading when the list was walked becomes LIVE without its neighbours' links
// changing: the next refresh sees it.
TEST_F(Walk, AModuleStillLoadingIsTakenOnceItIsLive) {
  put_btf();
  auto at = put({{.name = "a", .text = kMod}, {.name = "late", .state = 1, .text = kMod + 0x10000}});
  auto t = k.read();
  ASSERT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
  EXPECT_EQ(t.live_module_at(kMod + 0x10000), nullptr);
  EXPECT_FALSE(t.refresh_modules(k.symbols(), k.reader()));
  k.u64(at[1] + o.state, 0);  // MODULE_STATE_LIVE
  EXPECT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
  EXPECT_NE(t.live_module_at(kMod + 0x10000), nullptr);
}

// A module loaded after the kernel's tables were read adds its NOKPROBE functions to
// kprobe_blacklist; one unloaded takes its own out. Both are seen at the next refresh.
TEST_F(Walk, TheBlacklistIsWalkedAgainWithTheModules) {
  const std::uint64_t nok = kMod + 0x10a00;
  // The guest as it is at each step: its blacklist and its modules.
  auto guest = [&](const std::vector<std::array<std::uint64_t, 2>>& bl, const std::vector<FakeModule>& mods) {
    k = FakeKernel{};
    k.blacklist(bl);
    put_btf();
    put(mods);
  };
  guest({}, {{.name = "a", .text = kMod}});
  auto t = k.read();
  ASSERT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
  EXPECT_EQ(t.blacklisted(nok), nullptr);
  // "late" loads at kMod + 0x10000 with a NOKPROBE function.
  guest({{nok, nok + 0x40}}, {{.name = "a", .text = kMod}, {.name = "late", .text = kMod + 0x10000}});
  ASSERT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
  ASSERT_NE(t.live_module_at(nok), nullptr) << t.modules()->summary();
  EXPECT_NE(t.blacklisted(nok), nullptr);
  // It unloads; "other" loads at the same address, with nothing blacklisted.
  guest({}, {{.name = "a", .text = kMod}, {.name = "other", .text = kMod + 0x10000, .text_size = 0x2000}});
  ASSERT_TRUE(t.refresh_modules(k.symbols(), k.reader()));
  ASSERT_NE(t.live_module_at(nok), nullptr);
  EXPECT_EQ(t.blacklisted(nok), nullptr);
}

// A probe point keeps its module's identity; Dom0 writes its trap byte back only while that
// very module is there (engine: disarm and arm ask module_replaced).
TEST_F(Walk, AModuleUnloadedOrReplacedIsNoLongerThePointsModule) {
  put({{.name = "a", .text = kMod}, {.name = "b", .text = kMod + 0x10000}});
  auto before = walk();
  ASSERT_NE(before.live_module_at(kMod + 0x10010), nullptr);
  const auto b = kernel::ModuleIdentity::of(*before.live_module_at(kMod + 0x10010));
  EXPECT_EQ(kernel::module_replaced(before, kMod + 0x10010, b), std::nullopt);
  // b going away: its text is still there, still b's.
  k = FakeKernel{};
  put({{.name = "a", .text = kMod}, {.name = "b", .state = 2, .text = kMod + 0x10000}});
  EXPECT_EQ(kernel::module_replaced(walk(), kMod + 0x10010, b), std::nullopt);
  // b gone.
  k = FakeKernel{};
  put({{.name = "a", .text = kMod}});
  auto r = kernel::module_replaced(walk(), kMod + 0x10010, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, "module b was unloaded");
  // c loaded where b was.
  k = FakeKernel{};
  put({{.name = "a", .text = kMod}, {.name = "c", .text = kMod + 0x10000}});
  r = kernel::module_replaced(walk(), kMod + 0x10010, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, "module b was unloaded and c loaded over its text");
  k = FakeKernel{};
  // b loaded again at the same text, its struct module elsewhere (third in the list now).
  put({{.name = "a", .text = kMod}, {.name = "x", .text = kMod + 0x40000}, {.name = "b", .text = kMod + 0x10000}});
  EXPECT_TRUE(kernel::module_replaced(walk(), kMod + 0x10010, b).has_value());
  // A list that cannot be walked knows nothing: the caller's byte check decides.
  EXPECT_EQ(kernel::module_replaced(kernel::ModuleTables::unavailable("no BTF"), kMod + 0x10010, b), std::nullopt);
}

}  // namespace
}  // namespace xenprobes::testing
