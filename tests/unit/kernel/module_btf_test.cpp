// Loaded modules' BTF (kernel/module_btf.cpp): struct btf_module and struct btf from the
// kernel's BTF (hand-made, and Debian's real 6.1 and 6.12 when their images are cached), the
// kernel's btf_modules list walked in a fake guest (module_walk.hpp) as a real kernel has it
// once a module's init ran (struct module's btf_data NULL), the btf_data path kept, and a
// hostile list: every bad entry refused with its reason, every other module's BTF still read.
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "kernel/btf.hpp"
#include "kernel/module_btf.hpp"
#include "kernel/module_symbols.hpp"
#include "unit/kernel/module_walk.hpp"

namespace xenprobes::testing {
namespace {

namespace fs = std::filesystem;
using kernel::BtfListLayout;
using kernel::BtfModuleList;

constexpr std::uint64_t kBtfHead = kData + 0x3000;          // `btf_modules`
constexpr std::uint64_t kEntries = 0xffffffffc5000000ull;   // struct btf_module (0x100 apart)
constexpr std::uint64_t kBtfObjs = 0xffffffffc5100000ull;   // struct btf (0x1000 apart)
constexpr std::uint64_t kListData = 0xffffffffc6000000ull;  // each struct btf's data (0x100000 apart)

// A module's split BTF over the kernel's: one struct of its own.
std::vector<std::byte> split_btf(const std::vector<std::byte>& base_raw, const char* record) {
  btf* base = btf__new(base_raw.data(), static_cast<__u32>(base_raw.size()));
  btf* b = btf__new_empty_split(base);
  const int u32 = btf__find_by_name_kind(base, "unsigned int", BTF_KIND_INT);
  btf__add_struct(b, record, 8);
  btf__add_field(b, "flags", u32, 0, 0);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> out(raw, raw + n);
  btf__free(b);
  btf__free(base);
  return out;
}

// One struct btf_module as the guest holds it.
struct Entry {
  std::size_t module = 0;        // index of the struct module it names (put()'s order)
  std::vector<std::byte> btf{};  // its struct btf's data
  std::optional<std::uint64_t> module_ptr{}, btf_ptr{}, data_ptr{}, size{};  // written instead
};

struct BtfList : Walk {
  std::vector<std::uint64_t> structs;  // put()'s struct modules
  std::vector<std::byte> base;         // the kernel's BTF

  void SetUp() override { base = module_btf(o); }
  void modules(const std::vector<FakeModule>& mods) {
    put_btf();
    structs = put(mods);
  }
  std::uint64_t entry_at(std::size_t i) const { return kEntries + 0x100 * i; }
  // The entries linked head -> e[0] -> ... -> head (as list_add at the head leaves them, the
  // newest first); `next_of`: a node's next written instead (a loop, a wild pointer).
  void list(const std::vector<Entry>& es, std::map<std::size_t, std::uint64_t> next_of = {}) {
    k.sym(kBtfHead, 'd', "btf_modules");
    std::uint64_t prev = kBtfHead;
    for (std::size_t i = 0; i < es.size(); ++i) {
      const Entry& e = es[i];
      const std::uint64_t at = entry_at(i), bt = kBtfObjs + 0x1000 * i, data = kListData + 0x100000 * i;
      k.u64(prev, at);  // prev->next
      k.u64(at + 8, prev);
      k.u64(at + kBtfModuleModule, e.module_ptr.value_or(e.module < structs.size() ? structs[e.module] : 0));
      k.u64(at + kBtfModuleBtf, e.btf_ptr.value_or(bt));
      k.u64(bt + kBtfData, e.data_ptr.value_or(data));
      k.s32(bt + kBtfDataSize, static_cast<std::int64_t>(e.size.value_or(e.btf.size())));
      k.put(data, e.btf.data(), e.btf.size());
      prev = at;
    }
    k.u64(prev, kBtfHead);
    k.u64(kBtfHead + 8, prev);
    for (auto [i, next] : next_of) k.u64(entry_at(i), next);
  }
  std::map<std::string, kernel::ModuleBtfBlob> read() {
    auto r = kernel::read_guest_module_btf(k.symbols(), k.reader());
    if (!r) throw std::runtime_error(r.error().what);
    std::map<std::string, kernel::ModuleBtfBlob> out;
    for (auto& b : *r) out.emplace(b.module, std::move(b));
    return out;
  }
  BtfModuleList walk_list(kernel::BtfListLimits lim = {}) {
    auto l = kernel::btf_list_layout_from_btf(base);
    if (!l) throw std::runtime_error(l.error().what);
    auto mods = walk();
    return kernel::read_btf_module_list(k.symbols(), k.reader(), *l, mods.modules(), lim);
  }
};

void expect_debian_layout(const BtfListLayout& l) {
  EXPECT_FALSE(l.assumed);
  EXPECT_EQ(l.entry_size, kBtfModuleSize);
  EXPECT_EQ(l.list, 0u);
  EXPECT_EQ(l.module, kBtfModuleModule);
  EXPECT_EQ(l.btf, kBtfModuleBtf);
  EXPECT_EQ(l.data.offset, kBtfData);
  EXPECT_EQ(l.data.size, 8u);
  EXPECT_EQ(l.data_size.offset, kBtfDataSize);
  EXPECT_EQ(l.data_size.size, 4u);
}

TEST(BtfListLayout, FromHandMadeBtfAndWithoutStructBtfModuleOrStructBtf) {
  for (const Offsets* o : {&k61, &k612}) {
    auto l = kernel::btf_list_layout_from_btf(module_btf(*o));
    ASSERT_TRUE(l) << l.error().what;
    expect_debian_layout(*l);
    EXPECT_EQ(l->btf_struct_size, o->btf_struct);
    EXPECT_EQ(
        l->describe(),
        "struct btf_module 48 bytes (list +0, module +16, btf +24), struct btf's data at +0 and data_size at +80");
  }
  // No struct btf_module: Linux's shape, said so.
  auto a = kernel::btf_list_layout_from_btf(module_btf(k612, "struct btf_module"));
  ASSERT_TRUE(a) << a.error().what;
  EXPECT_TRUE(a->assumed);
  EXPECT_EQ(a->module, 16u);
  EXPECT_EQ(a->btf, 24u);
  EXPECT_NE(a->describe().find("not in the kernel's BTF: Linux's shape taken"), std::string::npos) << a->describe();
  // No struct btf: its members are not guessed.
  auto n = kernel::btf_list_layout_from_btf(module_btf(k612, "struct btf"));
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error().code, Errc::NotFound);
  EXPECT_EQ(n.error().what,
            "the guest's BTF has no struct btf (where the kernel keeps a module's BTF): the btf_modules list "
            "cannot be read");
}

// Debian's 6.1 and 6.12 (the image cache of tools/fetch-debian-kernels.sh) have both structs
// in their BTF, with the offsets pahole prints for them.
TEST(BtfListLayout, FromRealKernelBtf) {
  const char* e = std::getenv("XENPROBES_KERNEL_CACHE");
  const fs::path cache = e && *e ? fs::path(e) : fs::path("/var/cache/xenprobes-kernels");
  int seen = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(cache, ec)) {
    const fs::path img = d.path() / "vmlinux";
    if (!fs::exists(img)) continue;
    SCOPED_TRACE(img.string());
    btf* b = btf__parse_elf(img.c_str(), nullptr);
    ASSERT_FALSE(libbpf_get_error(b));
    std::uint32_t n = 0;
    auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
    auto l = kernel::btf_list_layout_from_btf(std::span(raw, n));
    btf__free(b);
    ASSERT_TRUE(l) << l.error().what;
    expect_debian_layout(*l);
    ++seen;
  }
  EXPECT_GT(seen, 0) << "no kernel image in " << cache << ": run sh tools/fetch-debian-kernels.sh";
}

// A real kernel once the modules' init ran: btf_data NULL, the BTF on btf_modules only.
TEST_F(BtfList, EachModulesBtfIsFoundThroughTheListByItsStructModule) {
  for (const Offsets* v : {&k61, &k612}) {
    o = *v;
    k = FakeKernel{};
    SetUp();
    SCOPED_TRACE(o.mem ? "6.12 layout" : "6.1 layout");
    modules({{.name = "xfs", .text = kMod},
             {.name = "ext4", .text = kMod + 0x10000},
             {.name = "nobtf", .text = kMod + 0x20000}});
    const auto xfs = split_btf(base, "xfs_inode"), ext4 = split_btf(base, "ext4_inode_info");
    // The list's order is not the module list's: entries match by struct module.
    list({{.module = 1, .btf = ext4}, {.module = 0, .btf = xfs}});
    auto got = read();
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got["xfs"].btf, xfs);
    EXPECT_EQ(got["xfs"].why, "");
    EXPECT_EQ(got["ext4"].btf, ext4);
    EXPECT_TRUE(got["nobtf"].btf.empty());
    EXPECT_EQ(got["nobtf"].why,
              "it has no BTF: the kernel's btf_modules list has no entry for it (the module was built without BTF, or "
              "the kernel refused its BTF when it loaded it), and its struct module's btf_data is NULL (Linux 5.11 "
              "and later clear it once the module's init ran)");
  }
}

// Where a module still has btf_data (a guest that keeps it) and no entry, btf_data serves; an
// entry wins over btf_data.
TEST_F(BtfList, BtfDataServesAModuleWithoutAnEntryAndTheListWins) {
  const auto a = split_btf(base, "from_list"), b = split_btf(base, "from_btf_data");
  modules({{.name = "both", .text = kMod, .btf = b}, {.name = "kept", .text = kMod + 0x10000, .btf = b}});
  list({{.module = 0, .btf = a}});
  auto got = read();
  EXPECT_EQ(got["both"].btf, a);
  EXPECT_EQ(got["kept"].btf, b);
  // No btf_modules symbol at all: btf_data still serves.
  k = FakeKernel{};
  modules({{.name = "kept", .text = kMod, .btf = b}, {.name = "none", .text = kMod + 0x10000}});
  auto old = read();
  EXPECT_EQ(old["kept"].btf, b);
  EXPECT_EQ(old["none"].why,
            "it has no BTF: the kernel's btf_modules list is not read: no btf_modules in fake System.map (a kernel "
            "without CONFIG_DEBUG_INFO_BTF_MODULES, or symbols without static data: KALLSYMS_ALL), and its struct "
            "module's btf_data is NULL (Linux 5.11 and later clear it once the module's init ran)");
}

// A kernel BTF without struct btf: the list is not read, and each module without btf_data says so.
TEST_F(BtfList, AKernelBtfWithoutStructBtfSaysWhyTheListIsNotRead) {
  base = module_btf(o, "struct btf");
  const std::uint64_t at = kRodata + 0x10000;
  k.put(at, base.data(), base.size());
  k.sym(at, 'R', "__start_BTF");
  k.sym(at + base.size(), 'R', "__stop_BTF");
  structs = put({{.name = "xfs", .text = kMod}});
  list({{.module = 0, .btf = split_btf(base, "xfs_inode")}});
  auto got = read();
  EXPECT_NE(got["xfs"].why.find("the kernel's btf_modules list is not read: the guest's BTF has no struct btf"),
            std::string::npos)
      << got["xfs"].why;
}

// Every hostile entry is refused with its reason; the other modules' BTF is read.
TEST_F(BtfList, HostileEntriesAreRefusedEachWithItsReasonAndNothingElseIsLost) {
  modules({{.name = "good", .text = kMod},
           {.name = "bigsize", .text = kMod + 0x10000},
           {.name = "magic", .text = kMod + 0x20000},
           {.name = "wildbtf", .text = kMod + 0x30000},
           {.name = "wilddata", .text = kMod + 0x40000},
           {.name = "unread", .text = kMod + 0x50000},
           {.name = "junk", .text = kMod + 0x60000},
           {.name = "tiny", .text = kMod + 0x70000}});
  const auto good = split_btf(base, "good_one");
  auto bad_magic = good;
  bad_magic[0] = std::byte{0xeb};
  bad_magic[1] = std::byte{0x9f};                                // big-endian
  std::vector<std::byte> junk(good.begin(), good.begin() + 24);  // a header whose sections are missing
  junk.resize(64, std::byte{0x5a});
  k.unreadable.push_back(kListData + 0x100000 * 5);
  list({{.module = 0, .btf = good},
        {.module = 1, .btf = good, .size = 0xffffffffu},
        {.module = 2, .btf = bad_magic},
        {.module = 3, .btf = good, .btf_ptr = 0x1000},
        {.module = 4, .btf = good, .data_ptr = 0x7fff00000000},
        {.module = 5, .btf = good},
        {.module = 6, .btf = junk},
        {.module = 7, .btf = good, .size = 16},
        {.module = 99, .btf = good, .module_ptr = kStructs + 0x800},  // inside a struct module: no module
        {.module = 0, .btf = junk}});                                 // "good" again
  auto l = walk_list();
  EXPECT_TRUE(l.read);
  EXPECT_EQ(l.why, "");
  EXPECT_EQ(l.nodes, 10u);
  ASSERT_EQ(l.stray.size(), 2u);
  EXPECT_EQ(l.stray[0],
            "the entry at 0xffffffffc5000800: its module pointer 0xffffffffc1000800 is no module on the "
            "module list");
  EXPECT_EQ(l.stray[1], "the entry at 0xffffffffc5000900: a second entry for module good (the first one counts)");
  auto got = read();
  EXPECT_EQ(got["good"].btf, good);
  EXPECT_EQ(got["bigsize"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000100: its BTF's "
            "data_size 4294967295 is not between a BTF header's 24 bytes and the limit of 16777216");
  EXPECT_EQ(got["magic"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000200: its BTF at "
            "0xffffffffc6200000 starts with magic 0x9feb version 1, not BTF's 0xeb9f version 1");
  EXPECT_EQ(got["wildbtf"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000300: its struct btf "
            "pointer 0x1000 is outside the kernel's half");
  EXPECT_EQ(got["wilddata"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000400: its BTF's data "
            "0x7fff00000000 is outside the kernel's half");
  EXPECT_EQ(got["unread"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000500: cannot read its "
            "BTF at 0xffffffffc6500000: not mapped");
  EXPECT_TRUE(
      got["junk"].why.starts_with("its BTF in the kernel's btf_modules list (0xffffffffc6600000, 64 bytes) is "
                                  "refused: libbpf rejects the module's BTF as split BTF over the kernel's"))
      << got["junk"].why;
  EXPECT_EQ(got["tiny"].why,
            "its entry in the kernel's btf_modules list is refused: the entry at 0xffffffffc5000700: its BTF's "
            "data_size 16 is not between a BTF header's 24 bytes and the limit of 16777216");
  for (const auto& [name, b] : got) EXPECT_EQ(b.btf.empty(), name != "good") << name;
}

// The walk stops at a loop, a wild or unreadable node, a node that does not point back, or
// past its limit; the entries read before it are kept (each was checked on its own) and the
// modules whose entries were not reached say where the walk stopped.
TEST_F(BtfList, ABrokenListKeepsTheEntriesReadBeforeTheBreak) {
  const auto a = split_btf(base, "a_type"), b = split_btf(base, "b_type");
  struct Case {
    const char* what;
    std::map<std::size_t, std::uint64_t> next_of;
    std::size_t limit;
    std::string why;
  };
  const std::vector<Case> cases = {
      {"a loop", {{1, kEntries}}, 4096, "the list loops without returning to its head"},
      {"a user-half node",
       {{1, 0x7fff12345000}},
       4096,
       "a node outside the kernel's half or not 8-byte aligned (0x7fff12345000)"},
      {"a misaligned node",
       {{1, kEntries + 0x203}},
       4096,
       "a node outside the kernel's half or not 8-byte aligned (0xffffffffc5000203)"},
      {"an unreadable node",
       {{1, kEntries + 0x700}},
       4096,
       "cannot read the struct btf_module at 0xffffffffc5000700: not mapped"},
      {"a node whose prev is not its predecessor",
       {{1, kEntries + 0x600}},
       4096,
       "the node at 0xffffffffc5000600 does not point back at its predecessor"},
      {"the limit", {}, 2, "more than 2 entries"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    k = FakeKernel{};
    modules(
        {{.name = "a", .text = kMod}, {.name = "b", .text = kMod + 0x10000}, {.name = "c", .text = kMod + 0x20000}});
    list({{.module = 0, .btf = a}, {.module = 1, .btf = b}, {.module = 2, .btf = a}}, c.next_of);
    k.unreadable.push_back(kEntries + 0x700);
    k.u64(kEntries + 0x600 + 8, kEntries + 0x500);  // a node elsewhere that points back at another
    kernel::BtfListLimits lim;
    lim.max_entries = c.limit;
    auto l = walk_list(lim);
    EXPECT_TRUE(l.read);
    EXPECT_EQ(l.why, c.why);
    EXPECT_EQ(l.entries.size(), 2u);
    if (c.limit == 4096) {
      auto got = read();
      EXPECT_EQ(got["a"].btf, a);
      EXPECT_EQ(got["b"].btf, b);
      EXPECT_EQ(got["c"].why,
                "it has no BTF: the kernel's btf_modules list has no entry for it among the 2 read (its "
                "walk stopped: " +
                    c.why +
                    "), and its struct module's btf_data is NULL (Linux 5.11 and later clear it once "
                    "the module's init ran)");
    }
  }
}

// An unreadable head: the list is not read, the modules say why.
TEST_F(BtfList, AnUnreadableHeadIsNoListAndSaysWhy) {
  modules({{.name = "a", .text = kMod}});
  list({{.module = 0, .btf = split_btf(base, "a_type")}});
  k.unreadable.push_back(kBtfHead + 8);
  auto l = walk_list();
  EXPECT_FALSE(l.read);
  EXPECT_EQ(l.why, "cannot read its head at 0xffffffff81303000: not mapped");
  EXPECT_TRUE(l.entries.empty());
}

}  // namespace
}  // namespace xenprobes::testing
