// The guest kernel's loaded modules: struct module's layout from BTF (kernel/modules_layout.cpp;
// hand-made with libbpf's writer in both shapes, 6.1's core_layout and 6.4+'s mem[], and
// Debian's real kernels when their images are cached), then the module list walked in a fake
// guest memory (kernel/modules.cpp), hostile layouts included, and the address rules over
// module text.
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

// ---- the address rules over module text

x86::Insn insn(std::uint64_t at, std::vector<std::uint8_t> bytes) {
  auto i = x86::decode(bytes, Gva{at});
  if (!i) throw std::runtime_error(i.error().what);
  return *i;
}

// A kernel with one live module "ext4" whose tables hold one entry of each kind, a GOING
// module, and a NOKPROBE range and .kprobes.text inside ext4.
struct ModuleRules : Walk {
  static constexpr std::uint64_t kFn = kMod + 0x100;       // ext4_fn, 0x100 bytes
  static constexpr std::uint64_t kCopy = kFn + 0x20;       // ext4's __ex_table instruction
  static constexpr std::uint64_t kJump = kFn + 0x40;       // ext4's jump-label site
  static constexpr std::uint64_t kCall = kFn + 0x60;       // ext4's static-call site
  static constexpr std::uint64_t kKprobes = kMod + 0x800;  // ext4's .kprobes.text, 0x100 bytes
  static constexpr std::uint64_t kNok = kMod + 0xa00;      // a NOKPROBE function of ext4
  kernel::KernelTables tables;
  symbols::SymbolTable syms;
  symbols::Function fn{"ext4_fn", Gva{kFn}, 0x100};

  void SetUp() override {
    k.blacklist({{kNok, kNok + 0x40}, {kKprobes, kKprobes + 0x100}});
    k.smp_locks({kText + 0x10});  // still mapped: the kernel may still rewrite lock prefixes
    k.ex_table({});
    k.jump_table({});
    k.static_calls({});
    put_btf();
    put({{.name = "ext4",
          .text = kMod,
          .init = kMod + 0x100000,
          .init_size = 0x1000,
          .ex = {{kCopy, kFn + 0xf0, 3}},
          .jumps = {{kJump, kFn + 0xe0, kData + 0x800}},
          .calls = {{kCall, kData + 0x900}},
          .kprobes = kKprobes,
          .kprobes_size = 0x100},
         {.name = "dying", .state = 2, .text = kMod + 0x10000}});
    tables = k.read();
    tables.refresh_modules(k.symbols(), k.reader());
    syms = k.symbols();
  }
  kernel::RuleContext ctx(bool guest) {
    kernel::RuleContext c;
    c.tables = &tables;
    c.syms = &syms;
    c.guest_channel = guest;
    return c;
  }
  std::string rule(const x86::Insn& i, bool guest = true, const symbols::Function* f = nullptr) {
    auto r = kernel::check_address(ctx(guest), i, f ? f : &fn);
    return r ? r->rule : "";
  }
};

TEST_F(ModuleRules, ALiveModulesTextIsKernelText) {
  ASSERT_TRUE(tables.modules()->status().found) << tables.modules()->status().why;
  EXPECT_TRUE(kernel::in_kernel_text(ctx(false), kFn));
  EXPECT_EQ(rule(insn(kFn + 4, {0x48, 0x89, 0xe5})), "");        // mov rbp, rsp
  EXPECT_EQ(rule(insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08})), "");  // mov rax, [rdi+8]
  EXPECT_EQ(rule(insn(kFn + 8, {0x48, 0x8b, 0x47, 0x08}), false), "");
}

TEST_F(ModuleRules, ItsOwnTablesApply) {
  auto r = kernel::check_address(ctx(false), insn(kCopy, {0xf3, 0xa4}), &fn);  // rep movsb
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "exception-table");
  EXPECT_NE(r->entry.find("module ext4 __ex_table entry"), std::string::npos) << r->entry;
  EXPECT_EQ(rule(insn(kJump, {0x0f, 0x1f, 0x44, 0x00, 0x00})), "jump-label");  // nop5
  EXPECT_EQ(rule(insn(kJump - 2, {0x48, 0x89, 0xc8})), "jump-label");          // overlaps it
  EXPECT_EQ(rule(insn(kCall, {0xe8, 0x00, 0x10, 0x00, 0x00})), "static-call");
  // The same bytes elsewhere in the module are no site.
  EXPECT_EQ(rule(insn(kFn + 0x80, {0x0f, 0x1f, 0x44, 0x00, 0x00})), "");
}

TEST_F(ModuleRules, LockPrefixesAreRefusedWhileTheKernelMayRewriteThem) {
  auto r = kernel::check_address(ctx(false), insn(kFn + 0x90, {0xf0, 0x48, 0xff, 0x00}), &fn);  // lock inc
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "smp-lock");
  EXPECT_NE(r->reason.find("module"), std::string::npos);
  // Once the kernel freed its .smp_locks (no prefix is rewritten any more), accepted.
  k.unreadable.push_back(kRodata + 0x3000);
  tables = k.read();
  ASSERT_TRUE(tables.smp_locks_status().freed);
  tables.refresh_modules(k.symbols(), k.reader());
  EXPECT_EQ(rule(insn(kFn + 0x90, {0xf0, 0x48, 0xff, 0x00}), false), "");
}

TEST_F(ModuleRules, KprobesTextAndTheBlacklistApplyOnTheGuestChannel) {
  symbols::Function kp{"ext4_kp", Gva{kKprobes}, 0x100};
  EXPECT_EQ(rule(insn(kKprobes + 0x10, {0x48, 0x89, 0xe5}), true, &kp), "kprobes-text");
  EXPECT_EQ(rule(insn(kKprobes + 0x10, {0x48, 0x89, 0xe5}), false, &kp), "");
  symbols::Function nok{"ext4_nok", Gva{kNok}, 0x40};
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), true, &nok), "kprobe-blacklist");
  EXPECT_EQ(rule(insn(kNok + 4, {0x48, 0x89, 0xe5}), false, &nok), "");
  EXPECT_EQ(rule(insn(kNok + 0x40, {0x48, 0x89, 0xe5}), true, &nok), "");  // past it
}

TEST_F(ModuleRules, GoingInitUnknownAndUnreadableModulesStayRefused) {
  auto why = [&](std::uint64_t a) {
    auto r = kernel::check_address(ctx(false), insn(a, {0x48, 0x89, 0xe5}), &fn);
    return r ? std::string(r->rule) + ": " + r->reason + " (" + r->entry + ")" : std::string();
  };
  EXPECT_NE(why(kMod + 0x10010).find("GOING"), std::string::npos) << why(kMod + 0x10010);
  EXPECT_NE(why(kMod + 0x100010).find("init text of a module"), std::string::npos) << why(kMod + 0x100010);
  EXPECT_NE(why(kMod + 0x50000).find("every live module"), std::string::npos) << why(kMod + 0x50000);
  EXPECT_EQ(why(kMod + 0x50000).substr(0, 15), "not-kernel-text");
  // An instruction that runs past the end of the module's text.
  EXPECT_NE(why(kMod + 0xffe).find("runs past the end"), std::string::npos) << why(kMod + 0xffe);
  // The guest module's own text keeps its own rule.
  kernel::RuleContext c = ctx(true);
  c.module_text = {kMod, kMod + 0x1000};
  EXPECT_STREQ(kernel::check_address(c, insn(kFn + 4, {0x48, 0x89, 0xe5}), &fn)->rule, "module-text");
  // No BTF: module text is refused, saying why.
  FakeKernel bare;
  auto t = bare.read();
  t.refresh_modules(bare.symbols(), bare.reader());
  c.tables = &t;
  c.module_text = {};
  auto r = kernel::check_address(c, insn(kFn + 4, {0x48, 0x89, 0xe5}), &fn);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->rule, "not-kernel-text");
  EXPECT_NE(r->reason.find("could not be read"), std::string::npos) << r->reason;
  EXPECT_NE(r->entry.find("BTF"), std::string::npos) << r->entry;
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
