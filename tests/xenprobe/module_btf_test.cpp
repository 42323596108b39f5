// Loaded modules' BTF in xenprobe's TypeSource (xenprobe/btf.cpp, open_btf_bytes with modules):
// split BTF over the kernel's, as Session::module_btf hands it out. Built here with libbpf's
// writer: a "kernel" with struct file and struct list_head, and two modules whose own types get
// the same local ids (both start right after the kernel's), one of them also defining a
// struct file of its own.
#include <bpf/btf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "compile.hpp"
#include "lang.hpp"
#include "types.hpp"

namespace xenprobe {
namespace {

std::vector<std::byte> raw_of(btf* b) {
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  return {raw, raw + n};
}

struct Btfs {
  std::vector<std::byte> kernel;
  std::vector<ModuleTypes> modules;
};

Btfs make() {
  Btfs out;
  btf* k = btf__new_empty();
  const int u32 = btf__add_int(k, "unsigned int", 4, 0);
  const int u64 = btf__add_int(k, "long long unsigned int", 8, 0);
  // (libbpf adds fields to the type added last: the pointer comes after, at the next id.)
  const int lh = btf__add_struct(k, "list_head", 16);
  btf__add_field(k, "next", lh + 1, 0, 0);
  btf__add_field(k, "prev", lh + 1, 64, 0);
  btf__add_ptr(k, lh);
  btf__add_struct(k, "file", 16);
  btf__add_field(k, "f_mode", u32, 0, 0);
  btf__add_field(k, "f_pos", u64, 64, 0);
  out.kernel = raw_of(k);

  // xfs: struct xfs_inode { u64 i_ino; struct list_head i_lru; struct xfs_mount *i_mount; }
  //      struct xfs_mount { u32 m_flags; u32 m_blocks; } and its own struct file.
  btf* x = btf__new_empty_split(k);
  const int xm = btf__add_struct(x, "xfs_mount", 8);
  btf__add_field(x, "m_flags", u32, 0, 0);
  btf__add_field(x, "m_blocks", u32, 32, 0);
  const int xmp = btf__add_ptr(x, xm);
  btf__add_struct(x, "xfs_inode", 32);
  btf__add_field(x, "i_ino", u64, 0, 0);
  btf__add_field(x, "i_lru", lh, 64, 0);
  btf__add_field(x, "i_mount", xmp, 192, 0);
  btf__add_struct(x, "file", 4);  // a module's own struct file: the kernel's wins
  btf__add_field(x, "not_the_kernels", u32, 0, 0);
  out.modules.push_back({"xfs", raw_of(x)});
  btf__free(x);

  // ext4: struct ext4_sb_info { u32 s_pad; u32 s_count; } at the same local id as xfs_mount.
  btf* e = btf__new_empty_split(k);
  btf__add_struct(e, "ext4_sb_info", 8);
  btf__add_field(e, "s_pad", u32, 0, 0);
  btf__add_field(e, "s_count", u32, 32, 0);
  out.modules.push_back({"ext4", raw_of(e)});
  btf__free(e);
  btf__free(k);
  return out;
}

TEST(XenprobeModuleBtf, ModuleStructsAreFoundWithTheirFieldsAndTheKernelsTypesWin) {
  Btfs b = make();
  std::vector<std::string> refused;
  auto t = open_btf_bytes(b.kernel, "test kernel BTF", b.modules, &refused);
  EXPECT_TRUE(refused.empty());
  EXPECT_EQ(t->description(), "test kernel BTF, with the BTF of loaded module(s) xfs, ext4");

  auto xi = t->find_record("xfs_inode", false);
  ASSERT_TRUE(xi);
  TypeDesc d = t->describe(*xi);
  EXPECT_EQ(d.kind, TypeDesc::Kind::Record);
  EXPECT_EQ(d.size, 32u);
  EXPECT_EQ(d.name, "struct xfs_inode");
  auto lru = t->member(*xi, "i_lru");
  ASSERT_TRUE(lru);
  EXPECT_EQ(lru->offset, 8u);
  EXPECT_EQ(t->describe(lru->type).name, "struct list_head");  // a kernel type from a module's
  auto next = t->member(t->describe(lru->type).id, "prev");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->offset, 8u);
  auto mnt = t->member(*xi, "i_mount");
  ASSERT_TRUE(mnt);
  EXPECT_EQ(mnt->offset, 24u);
  TypeDesc p = t->describe(mnt->type);
  ASSERT_EQ(p.kind, TypeDesc::Kind::Ptr);
  TypeDesc target = t->describe(p.target);  // the module's own type behind the pointer
  EXPECT_EQ(target.name, "struct xfs_mount");
  auto blocks = t->member(target.id, "m_blocks");
  ASSERT_TRUE(blocks);
  EXPECT_EQ(blocks->offset, 4u);
  EXPECT_EQ(t->member_names(*xi), (std::vector<std::string>{"i_ino", "i_lru", "i_mount"}));

  // ext4's type has the same local id as xfs_mount; here they are two types.
  auto sb = t->find_record("ext4_sb_info", false);
  auto xm = t->find_record("xfs_mount", false);
  ASSERT_TRUE(sb && xm);
  EXPECT_NE(*sb, *xm);
  EXPECT_EQ(t->describe(*sb).name, "struct ext4_sb_info");
  EXPECT_EQ(t->member(*sb, "s_count")->offset, 4u);
  EXPECT_FALSE(t->member(*sb, "m_blocks"));

  // struct file is in the kernel and in xfs: the kernel's.
  auto f = t->find_record("file", false);
  ASSERT_TRUE(f);
  EXPECT_EQ(t->describe(*f).size, 16u);
  EXPECT_TRUE(t->member(*f, "f_pos"));
  EXPECT_FALSE(t->member(*f, "not_the_kernels"));
  EXPECT_FALSE(t->find_record("nowhere", false));
}

TEST(XenprobeModuleBtf, AProgramCastsToAModulesStruct) {
  Btfs b = make();
  auto t = open_btf_bytes(b.kernel, "test kernel BTF", b.modules);
  Compiled c =
      compile(parse("kprobe:xfs:xfs_iget { @[((struct xfs_inode *)arg0)->i_mount->m_blocks] = count(); }"), t.get());
  ASSERT_EQ(c.program.blocks.size(), 1u);
  ASSERT_EQ(c.program.blocks[0].specs.size(), 1u);
  EXPECT_EQ(c.program.blocks[0].specs[0].function, "xfs:xfs_iget");
  try {
    (void)compile(parse("kprobe:f { @ = ((struct xfs_inode *)arg0)->i_size; }"), t.get());
    ADD_FAILURE() << "no error";
  } catch (const ProgramError& e) {
    EXPECT_EQ(std::string(e.what()), "struct xfs_inode has no field 'i_size'");
    EXPECT_EQ(e.hint, "its fields: i_ino, i_lru, i_mount");
  }
  // Without the modules' BTF the struct does not exist.
  auto kernel_only = open_btf_bytes(b.kernel, "test kernel BTF");
  EXPECT_THROW((void)compile(parse("kprobe:f { @ = ((struct xfs_inode *)arg0)->i_ino; }"), kernel_only.get()),
               ProgramError);
}

TEST(XenprobeModuleBtf, AModulesBtfLibbpfRefusesIsLeftOutWithTheReason) {
  Btfs b = make();
  std::vector<ModuleTypes> mods = {{"junk", std::vector<std::byte>(64, std::byte{0x5a})}, b.modules[1]};
  std::vector<std::string> refused;
  auto t = open_btf_bytes(b.kernel, "test kernel BTF", mods, &refused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(refused[0].starts_with("junk: libbpf refused its BTF: ")) << refused[0];
  EXPECT_EQ(t->description(), "test kernel BTF, with the BTF of loaded module(s) ext4");  // not junk
  EXPECT_TRUE(t->find_record("ext4_sb_info", false));
}

// Hostile kernel BTF (found by the fuzz target xenprobe_btf): a struct named `void` is never a
// record (libbpf's lookup never answers one either), and a record whose anonymous members all
// share one type, itself such a record, 20 deep (2^20 paths), is walked within a bound: the
// record's own named member is still found, the lookup ends.
TEST(XenprobeHostileBtf, AStructNamedVoidIsNeverFound) {
  btf* k = btf__new_empty();
  const int u32 = btf__add_int(k, "unsigned int", 4, 0);
  btf__add_struct(k, "void", 4);
  btf__add_field(k, "x", u32, 0, 0);
  auto t = open_btf_bytes(raw_of(k), "hostile BTF", {}, nullptr);
  btf__free(k);
  EXPECT_FALSE(t->find_record("void", false));
}

TEST(XenprobeHostileBtf, AnonymousMembersSharingOneTypeAreWalkedWithinABound) {
  btf* k = btf__new_empty();
  const int u32 = btf__add_int(k, "unsigned int", 4, 0);
  int inner = btf__add_struct(k, "", 4);  // the innermost anonymous struct: { u32 leaf; }
  btf__add_field(k, "leaf", u32, 0, 0);
  for (int level = 0; level < 20; ++level) {  // each: { <inner>; <inner>; } with both anonymous
    const int s = btf__add_struct(k, "", 4);
    btf__add_field(k, nullptr, inner, 0, 0);
    btf__add_field(k, nullptr, inner, 0, 0);
    inner = s;
  }
  btf__add_struct(k, "fan", 8);
  btf__add_field(k, nullptr, inner, 0, 0);
  btf__add_field(k, "own", u32, 32, 0);
  auto t = open_btf_bytes(raw_of(k), "hostile BTF", {}, nullptr);
  btf__free(k);
  auto rec = t->find_record("fan", false);
  ASSERT_TRUE(rec);
  const std::vector<std::string> names = t->member_names(*rec);
  EXPECT_LE(names.size(), 8192u);        // not 2^20 + 1
  EXPECT_FALSE(t->member(*rec, "own"));  // past the bound: not reached, the lookup ends
  EXPECT_EQ(std::count(names.begin(), names.end(), "own"), 0);
  auto leaf = t->member(*rec, "leaf");  // the first path down is within it
  ASSERT_TRUE(leaf);
  EXPECT_EQ(leaf->offset, 0u);
}

}  // namespace
}  // namespace xenprobe
