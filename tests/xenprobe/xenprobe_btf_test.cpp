// xenprobe with types: BTF from a file against the demo guest's memory, and a loaded module's
// functions and BTF read from the guest's memory (tests/module_btf_guest.hpp).

#include "module_btf_guest.hpp"

#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// ---- BTF ----

std::string test_btf() {
  std::string p = XENPROBE_TEST_BTF;
  return !p.empty() && fs::exists(p) ? p : std::string{};
}

// Casts, fields, arrays and pointer indexing through BTF against the demo guest's memory.
TEST(XenprobeBtf, FieldsOfTheGuestsOwnStructures) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  constexpr std::uint64_t K = 8;
  const std::string prog = R"(
    kprobe:sys_getppid {
      $files = (struct demo_file *)kaddr("demo_files");
      @path = str($files[3].path);
      @mode = $files[3].mode;
      @size = $files[2].size;
      @first = str($files->path);
      @calls = max(((struct demo_stats *)kaddr("demo_stats"))->calls[0]);
      @iters = max(((struct demo_stats *)kaddr("demo_stats"))->iterations);
    }
  )";
  ToolRun r = run(args(kSim1, {"--sim-iterations", std::to_string(K), "--btf", btf, "-f", "json", "-e", prog}));
  ASSERT_EQ(r.status, 0) << r.err;
  auto recs = records(r.out);
  EXPECT_EQ(map_data(recs, "@path"), "/etc/passwd");
  EXPECT_EQ(map_data(recs, "@mode"), 2);   // DEMO_F_IMMUTABLE
  EXPECT_EQ(map_data(recs, "@size"), 11);  // "demo-guest\n"
  EXPECT_EQ(map_data(recs, "@first"), "/");
  // The probe sits before the function counts its own call: the n-th call sees n - 1.
  EXPECT_EQ(map_data(recs, "@calls"), 2 * K - 1);
  EXPECT_EQ(map_data(recs, "@iters"), K - 1);
  EXPECT_EQ(r.err.find("reads failed"), std::string::npos) << r.err;
}

TEST(XenprobeBtf, TheIssuesOneLinerChecksAgainstBtf) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r =
      run({"--check", "--btf", btf, "-e",
           "kprobe:vfs_open { @[str(((struct file *)arg1)->f_path.dentry->d_name.name), comm, pid, tid] = count(); "
           "@len = hist(((struct file *)arg1)->f_path.dentry->d_name.len); }"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(XenprobeBtf, TheHostsKernelBtfWhenThereIsOne) {
  // The same path as the test above with a real kernel's BTF (6.2+ keeps the task pointer in
  // pcpu_hot, older ones in current_task: either is found).
  if (!fs::exists("/sys/kernel/btf/vmlinux")) GTEST_SKIP() << "this kernel has no /sys/kernel/btf/vmlinux";
  ToolRun r =
      run({"--check", "--btf", "/sys/kernel/btf/vmlinux", "-e",
           "kprobe:vfs_open { @[str(((struct file *)arg1)->f_path.dentry->d_name.name), comm, pid] = count(); }"});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(XenprobeBtf, CommPidTidRunAndCountUnreadableMemory) {
  // The demo guest has no tasks: its gs base is 0, so the task pointer is unreadable. The run
  // goes on, the keys read as "" and 0, and the tool says how many reads failed.
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r = run(args(kSim1, {"--sim-iterations", "3", "--btf", btf, "-f", "json", "-e",
                               "kprobe:sys_getppid { @[comm, pid, tid] = count(); }"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(map_data(records(r.out), "@"), json({{",0,0", 6}}));
  EXPECT_NE(r.err.find("sim-1: 18 guest memory reads failed"), std::string::npos) << r.err;
}

TEST(XenprobeBtf, FieldErrorsNameTheFieldsThereAre) {
  const std::string btf = test_btf();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  ToolRun r = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_pth; }"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "-e:1:39: error: struct file has no field 'f_pth'\n"
            "kprobe:f { @ = ((struct file *)arg0)->f_pth; }\n"
            "                                      ^~~~~\n"
            "its fields: f_u, f_path, f_flags\n");
  ToolRun bf = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_flags; }"});
  EXPECT_EQ(bf.status, 0) << bf.err;  // a bitfield (read: XenprobeBuiltins.BitfieldsReadAsCStoresThem)
  ToolRun st = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_path; }"});
  EXPECT_EQ(st.status, 1);
  EXPECT_TRUE(
      st.err.ends_with("not a struct\nkprobe:f { @ = ((struct file *)arg0)->f_path; }\n"
                       "                                      ^~~~~~\n"
                       "store one of its fields (.FIELD) or elements ([N])\n"))
      << st.err;
  ToolRun vp = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct file *)arg0)->f_u->x; }"});
  EXPECT_EQ(vp.status, 1);
  EXPECT_EQ(vp.err,
            "-e:1:44: error: '->x' needs a pointer to a struct, not to void\n"
            "kprobe:f { @ = ((struct file *)arg0)->f_u->x; }\n"
            "                                           ^\n"
            "cast the pointer to the struct it points to: ((struct NAME *)PTR)->x\n");
  ToolRun ns = run({"--check", "--btf", btf, "-e", "kprobe:f { @ = ((struct inode *)arg0)->i_mode; }"});
  EXPECT_NE(ns.err.find("no struct inode in BTF file " + btf), std::string::npos) << ns.err;
  // A file that is not BTF at all.
  ToolRun nb = run({"--check", "--btf", XENPROBES_DEMO_GUEST_SYSTEM_MAP, "-e", "BEGIN { }"});
  EXPECT_EQ(nb.status, 1);
  EXPECT_NE(nb.err.find(std::string("xenprobe: cannot read BTF from ") + XENPROBES_DEMO_GUEST_SYSTEM_MAP),
            std::string::npos)
      << nb.err;
}

// ---- a loaded module, end to end: its functions and its BTF read from the guest's memory ----
//
// The guest: tests/module_btf_guest.hpp (the demo guest with a LIVE module "xfs", its functions
// and its split BTF in its memory), given with --sim-image and its System.map with --symbols.

using xenprobes::testing::module_btf_guest;
using ModuleGuest = xenprobes::testing::ModuleBtfGuest;
constexpr std::uint64_t kIno = ModuleGuest::kIno;

ModuleGuest module_guest() { return module_btf_guest(); }

TEST(XenprobeModules, AModulesFunctionsAreListedAndResolvedFromItsMemory) {
  ModuleGuest g = module_guest();
  const std::vector<std::string> base = {"--sim",     "--sim-vcpus",   "1", "--sim-image", g.image,
                                         "--symbols", "sim-1=" + g.map};
  ToolRun l = run(args(base, {"list", "xfs*"}));
  ASSERT_EQ(l.status, 0) << l.err;
  EXPECT_EQ(l.out, "kprobe:xfs_file_read_iter [xfs]\n");  // its data symbol is not a function
  ToolRun q = run(args(base, {"list", "xfs:*"}));
  EXPECT_EQ(q.out, "kprobe:xfs_file_read_iter [xfs]\n") << q.err;
  ToolRun c = run(args(base, {"list", "sys_getppid"}));  // the core kernel's are still there
  EXPECT_EQ(c.out, "kprobe:sys_getppid\n") << c.err;
}

// The module's BTF where a real kernel keeps it once the module's init ran (struct module's
// btf_data NULL, the BTF on the kernel's btf_modules list), and where a guest that keeps
// btf_data has it: the same values either way.
TEST(XenprobeModules, AProgramReadsThroughAModulesStructAndFunctionAddress) {
  for (bool btf_data : {false, true}) {
    SCOPED_TRACE(btf_data ? "through btf_data" : "through btf_modules");
    ModuleGuest g = module_btf_guest({.btf_data = btf_data});
    const std::vector<std::string> base = {"--sim",     "--sim-vcpus",   "1", "--sim-image", g.image,
                                           "--symbols", "sim-1=" + g.map};
    // No --btf: the kernel's BTF and the module's split BTF, both read from the guest.
    ToolRun r =
        run(args(base, {"--sim-iterations", "2", "-f", "json", "-e",
                        "kprobe:sys_getppid { @ino = max(((struct xfs_inode *)kaddr(\"xfs_file_read_iter\"))->i_ino); "
                        "@flags = max(((struct xfs_inode *)kaddr(\"xfs:xfs_file_read_iter\"))->i_flags); "
                        "@calls = count(); }"}),
            {}, {}, {{"XENPROBES_LOG", "debug"}});
    ASSERT_EQ(r.status, 0) << r.err;
    auto recs = records(r.out);
    EXPECT_EQ(map_data(recs, "@ino"), static_cast<std::int64_t>(kIno));
    EXPECT_EQ(map_data(recs, "@flags"), 42);
    EXPECT_EQ(map_data(recs, "@calls"), 4);  // two getppid calls per iteration
    EXPECT_EQ(r.err.find("reads failed"), std::string::npos) << r.err;
    // Where the types came from.
    const std::string from = btf_data ? "guest module xfs: its BTF (100 bytes) from its struct module's btf_data\n"
                                      : "guest module xfs: its BTF (100 bytes) from the kernel's btf_modules list\n";
    EXPECT_NE(r.err.find(from), std::string::npos) << r.err;
  }
  // The demo guest without the module has neither.
  ToolRun none = run(args(kSim1, {"--sim-iterations", "1", "-e", "kprobe:xfs_file_read_iter { }"}));
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("no symbol 'xfs_file_read_iter'"), std::string::npos) << none.err;
}

// Types are read once, when xenprobe starts (as bpftrace reads them when it loads a program):
// a program naming a type of a module that is not loaded then fails before anything is
// attached, saying where the type was looked for, when the modules' types are read and what to
// do; a module whose types could not be used is named with the reason.
TEST(XenprobeModules, ATypeOfAModuleNotLoadedAtTheStartIsAnErrorSayingWhatToDo) {
  const std::string prog = "kprobe:sys_getppid { @ = ((struct xfs_inode *)kaddr(\"sys_getppid\"))->i_ino; }";
  const std::string where =
      "-e:1:27: error: no struct xfs_inode in the BTF of sim-1's kernel (read from its memory)\n" + prog +
      "\n                          ^~~~~~~~~~~~~~~~~~~~\n"
      "a module's types are read with the kernel's when xenprobe starts, from the modules loaded then (as bpftrace "
      "reads them when it loads a program): if the type is a module's, load that module in the guest, then start "
      "xenprobe\n";
  // No module loaded.
  ModuleGuest none = module_btf_guest({.module = false});
  ToolRun n =
      run({"--sim", "--sim-vcpus", "1", "--sim-image", none.image, "--symbols", "sim-1=" + none.map, "-e", prog});
  EXPECT_EQ(n.status, 1);
  EXPECT_TRUE(n.err.ends_with(where)) << n.err;
  EXPECT_EQ(n.out, "");  // nothing attached
  // The module loaded, without BTF: named, with the reason.
  ModuleGuest no_btf = module_btf_guest({.module = true, .module_btf = false});
  ToolRun b =
      run({"--sim", "--sim-vcpus", "1", "--sim-image", no_btf.image, "--symbols", "sim-1=" + no_btf.map, "-e", prog});
  EXPECT_EQ(b.status, 1);
  EXPECT_TRUE(b.err.ends_with(
      where +
      "types left out:\n"
      "  module xfs: it has no BTF: the kernel's btf_modules list has no entry for it (the module was built without "
      "BTF, or the kernel refused its BTF when it loaded it), and its struct module's btf_data is NULL (Linux 5.11 "
      "and later clear it once the module's init ran)\n"))
      << b.err;
  EXPECT_EQ(b.out, "");
  // With the module's BTF, a name neither has: the modules looked at are named.
  ModuleGuest with = module_guest();
  ToolRun w = run({"--sim", "--sim-vcpus", "1", "--sim-image", with.image, "--symbols", "sim-1=" + with.map, "-e",
                   "kprobe:sys_getppid { @ = ((struct xfs_inod *)kaddr(\"sys_getppid\"))->i_ino; }"});
  EXPECT_EQ(w.status, 1);
  EXPECT_NE(w.err.find("error: no struct xfs_inod in the BTF of sim-1's kernel (read from its memory), with the BTF "
                       "of loaded module(s) xfs\n"),
            std::string::npos)
      << w.err;
  // A module's function named with its module, the module not loaded.
  ToolRun f = run({"--sim", "--sim-vcpus", "1", "--sim-image", none.image, "--symbols", "sim-1=" + none.map, "-e",
                   "kprobe:xfs:xfs_file_read_iter { }"});
  EXPECT_EQ(f.status, 1);
  EXPECT_NE(f.err.find("xenprobe: domain sim-1: kprobe:xfs:xfs_file_read_iter: no symbol 'xfs:xfs_file_read_iter'"),
            std::string::npos)
      << f.err;
  EXPECT_TRUE(
      f.err.ends_with("; a module's functions are those of the modules loaded when xenprobe starts: if xfs "
                      "is not loaded, load it in the guest, then start xenprobe\n"))
      << f.err;
  // --btf gives the kernel's types only, and says so.
  const std::string btf = test_btf();
  if (!btf.empty()) {
    ToolRun k = run({"--check", "--btf", btf, "-e", prog});
    EXPECT_EQ(k.status, 1);
    EXPECT_TRUE(
        k.err.ends_with("--btf gives the kernel's types only: without it, xenprobe reads the guest kernel's "
                        "BTF and its loaded modules' from its memory\n"))
        << k.err;
  }
}

}  // namespace
}  // namespace xenprobes::testing
