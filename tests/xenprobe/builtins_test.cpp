// The builtins the demo guest cannot give exact values for, through the evaluator itself: the
// demo guest's functions take at most three arguments (arg3 ... arg5 are whatever its code left
// in rcx, r8 and r9) and it has no tasks (comm, pid and tid read as "" and 0 on the simulated
// Xen: XenprobeBtf.CommPidTidRunAndCountUnreadableMemory). Here a hit is a HitContext whose
// registers and guest memory the test lays out: argN must be the N-th argument register,
// retval rax, cpu the vCPU, and comm/pid/tid the current task's comm, tgid and pid, found
// through the kernel GS base and the per-CPU task pointer of the BTF (tests/xenprobe/btf_types.c,
// whose task_struct has pid at 8, tgid at 12, comm[16] at 16, and whose .data..percpu holds
// the one variable current_task, at 0).

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "compile.hpp"
#include "runtime.hpp"
#include "types.hpp"
#include "xenprobe/xenprobe_fixture.hpp"

namespace xenprobes::testing {
namespace {

// A hit: its registers, its vCPU, its kernel GS base and the guest memory it can read (byte
// ranges at addresses); a read outside them fails as an unmapped page does.
class FakeHit final : public HitContext {
 public:
  Regs r{};
  unsigned cpu = 0;
  std::uint64_t gs = 0;
  std::map<std::uint64_t, std::vector<std::byte>> mem;

  void put(std::uint64_t va, const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    mem[va].assign(b, b + n);
  }
  DomId domain() const override { return DomId{1}; }
  VcpuId vcpu() const override { return VcpuId{cpu}; }
  Gva address() const override { return Gva{r.rip}; }
  Regs& regs() override { return r; }
  Result<void> read(Gva va, std::span<std::byte> out) override {
    for (const auto& [at, bytes] : mem)
      if (va.value >= at && va.value + out.size() <= at + bytes.size()) {
        std::memcpy(out.data(), bytes.data() + (va.value - at), out.size());
        return {};
      }
    return std::unexpected(Error{Errc::Fault, "not mapped"});
  }
  Result<void> write(Gva, std::span<const std::byte>) override {
    return std::unexpected(Error{Errc::Permission, "read-only"});
  }
  Result<std::uint64_t> read_u64(Gva va) override {
    std::uint64_t v = 0;
    if (auto ok = read(va, std::as_writable_bytes(std::span(&v, 1))); !ok) return std::unexpected(ok.error());
    return v;
  }
  Result<std::string> read_string(Gva va, std::size_t max_len) override {
    std::string s;
    for (std::size_t i = 0; i < max_len; ++i) {
      std::byte b{};
      if (auto ok = read(Gva{va.value + i}, std::span(&b, 1)); !ok) {
        if (i == 0) return std::unexpected(ok.error());
        break;
      }
      if (b == std::byte{0}) break;
      s.push_back(static_cast<char>(b));
    }
    return s;
  }
  Result<std::uint64_t> kernel_gs_base() override { return gs; }
  void stop() override {}
};

constexpr std::uint64_t kPercpu = 0xffff888000100000ull;  // the vCPU's GS base
constexpr std::uint64_t kTask = 0xffff888000200000ull;    // its current task_struct

// One vCPU's current task: *(gs + 0) = task; task->pid, ->tgid, ->comm.
void lay_out_task(FakeHit& h, std::uint64_t task, std::int32_t pid, std::int32_t tgid, const char* comm) {
  h.gs = kPercpu + 0x1000 * h.cpu;
  h.put(h.gs, &task, 8);
  unsigned char t[32] = {};
  std::memcpy(t + 8, &pid, 4);
  std::memcpy(t + 12, &tgid, 4);
  std::memcpy(t + 16, comm, std::min<std::size_t>(std::strlen(comm), 16));  // comm[16]: 16 bytes, no NUL
  h.put(task, t, sizeof t);
}

TEST(XenprobeBuiltins, ArgumentsRetvalCpuAndTheCurrentTasksCommPidTid) {
  const std::string btf = test_btf_path();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  auto types = xenprobe::open_btf_file(btf);
  xenprobe::Compiled c =
      xenprobe::compile(xenprobe::parse("kprobe:f { @args[arg0, arg1, arg2, arg3, arg4, arg5] = count(); "
                                        "@who[comm, pid, tid, cpu] = count(); @site[func, probe] = count(); }\n"
                                        "kretprobe:f { @ret = sum(retval); @rcpu[cpu] = count(); }"),
                        types.get());
  // The layout the BTF gives, as btf_types.c declares it.
  ASSERT_TRUE(c.task.available) << c.task.why_not;
  EXPECT_EQ(c.task.current_percpu, 0u);
  EXPECT_EQ(c.task.pid_offset, 8u);
  EXPECT_EQ(c.task.tgid_offset, 12u);
  EXPECT_EQ(c.task.comm_offset, 16u);
  EXPECT_EQ(c.task.comm_size, 16u);

  std::FILE* sink = std::fopen("/dev/null", "w");
  ASSERT_NE(sink, nullptr);
  xenprobe::Output out(xenprobe::OutputFormat::Json, sink, false);
  xenprobe::Instance inst(c, out, "d", {});
  const xenprobe::ProbeSite site{"f", "kprobe:f"}, ret{"f", "kretprobe:f"};

  // vCPU 0: task 100 of process 90, "worker"; called twice. vCPU 1: task 7 of process 7, a
  // comm of the full 16 bytes (no NUL in the task), once.
  FakeHit a;
  a.cpu = 0;
  a.r.rdi = 1, a.r.rsi = 2, a.r.rdx = 3, a.r.rcx = 4, a.r.r8 = 5, a.r.r9 = static_cast<std::uint64_t>(-6);
  a.r.rax = 0xdead;  // not an argument
  lay_out_task(a, kTask, 100, 90, "worker");
  inst.run(0, site, &a);
  inst.run(0, site, &a);
  a.r.rax = 40;
  inst.run(1, ret, &a);
  FakeHit b;
  b.cpu = 1;
  b.r.rdi = 10, b.r.rsi = 20, b.r.rdx = 30, b.r.rcx = 40, b.r.r8 = 50, b.r.r9 = 60;
  lay_out_task(b, kTask + 0x1000, 7, 7, "0123456789abcdefXX");
  inst.run(0, site, &b);
  b.r.rax = static_cast<std::uint64_t>(-2);
  inst.run(1, ret, &b);

  EXPECT_EQ(inst.read_errors(), 0u);
  EXPECT_EQ(inst.snapshot("@args"),
            (std::map<std::string, std::int64_t>{{"1,2,3,4,5,-6", 2}, {"10,20,30,40,50,60", 1}}));
  EXPECT_EQ(inst.snapshot("@who"),
            (std::map<std::string, std::int64_t>{{"worker,90,100,0", 2}, {"0123456789abcdef,7,7,1", 1}}));
  EXPECT_EQ(inst.snapshot("@site"), (std::map<std::string, std::int64_t>{{"f,kprobe:f", 3}}));
  EXPECT_EQ(inst.snapshot("@ret"), (std::map<std::string, std::int64_t>{{"", 38}}));
  EXPECT_EQ(inst.snapshot("@rcpu"), (std::map<std::string, std::int64_t>{{"0", 1}, {"1", 1}}));

  // A task pointer that cannot be read: "" and 0, each read counted.
  FakeHit lost;
  lost.cpu = 2;
  lost.gs = kPercpu + 0x9000;  // nothing there
  inst.run(0, site, &lost);
  EXPECT_EQ(inst.snapshot("@who").at(",0,0,2"), 1);
  EXPECT_EQ(inst.read_errors(), 3u);
  std::fclose(sink);
}

// Bitfields through BTF: btf_types.c's struct demo_bits, compiled here for the host too (the
// same C, the same little-endian layout), filled by C's own assignments; each field read by a
// program is the value C stored, signed ones sign-extended.
struct demo_bits {
  std::uint32_t lo : 3;
  std::uint32_t mid : 9;
  std::int32_t neg : 5;
  std::uint64_t wide : 40;
  std::int64_t swide : 33;
  std::uint8_t byte;
};

TEST(XenprobeBuiltins, BitfieldsReadAsCStoresThem) {
  const std::string btf = test_btf_path();
  if (btf.empty()) GTEST_SKIP() << "no clang to build the test BTF";
  auto types = xenprobe::open_btf_file(btf);
  xenprobe::Compiled c = xenprobe::compile(
      xenprobe::parse("kprobe:f { $b = (struct demo_bits *)arg0; @lo = $b->lo; @mid = $b->mid; @neg = $b->neg; "
                      "@wide = $b->wide; @swide = $b->swide; @byte = $b->byte; }"),
      types.get());
  std::FILE* sink = std::fopen("/dev/null", "w");
  ASSERT_NE(sink, nullptr);
  xenprobe::Output out(xenprobe::OutputFormat::Json, sink, false);
  xenprobe::Instance inst(c, out, "d", {});
  const xenprobe::ProbeSite site{"f", "kprobe:f"};
  const std::pair<std::int64_t, std::int64_t> cases[] = {{-7, -(std::int64_t{1} << 31) - 5}, {15, (1ll << 32) - 1}};
  for (const auto& [neg, swide] : cases) {
    unsigned char mem[64];
    std::memset(mem, 0xa5, sizeof mem);  // bits around the fields are set: the masks must drop them
    demo_bits b;
    std::memcpy(&b, mem, sizeof b);
    b.lo = 5, b.mid = 300, b.neg = static_cast<std::int32_t>(neg), b.wide = 0xabcdef1234ull, b.swide = swide;
    b.byte = 0x7f;
    std::memcpy(mem, &b, sizeof b);
    FakeHit h;
    h.r.rdi = 0xffff888000300000ull;
    h.put(h.r.rdi, mem, sizeof mem);
    inst.run(0, site, &h);
    EXPECT_EQ(inst.read_errors(), 0u);
    using M = std::map<std::string, std::int64_t>;
    EXPECT_EQ(inst.snapshot("@lo"), (M{{"", 5}}));
    EXPECT_EQ(inst.snapshot("@mid"), (M{{"", 300}}));
    EXPECT_EQ(inst.snapshot("@neg"), (M{{"", neg}}));
    EXPECT_EQ(inst.snapshot("@wide"), (M{{"", 0xabcdef1234ll}}));
    EXPECT_EQ(inst.snapshot("@swide"), (M{{"", swide}}));
    EXPECT_EQ(inst.snapshot("@byte"), (M{{"", 0x7f}}));
  }
  std::fclose(sink);
}

// bpftrace's builtins and functions xenprobe does not have fail when the program is checked, at
// their position, each saying what to use instead (never a bare "not supported").
TEST(XenprobeBuiltins, EachUnsupportedOneSaysWhatToUseInstead) {
  for (const char* name : {"cgroup", "rand", "numaid", "ntop", "sizeof", "offsetof", "uptr", "macaddr", "cgroup_path",
                           "uid", "elapsed", "ksym", "stats", "curtask", "jiffies"}) {
    const std::string prog = std::string("kprobe:f { @ = ") + name + "(arg0); }";
    try {
      xenprobe::compile(xenprobe::parse(prog), nullptr);
      ADD_FAILURE() << prog << " was accepted";
    } catch (const xenprobe::ProgramError& e) {
      EXPECT_EQ(e.pos.line, 1) << name;
      EXPECT_EQ(e.pos.col, 16) << name;
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      // What to use, or why it is not needed: more than the words "not supported".
      EXPECT_NE(e.hint, "not supported") << name;
      EXPECT_GE(e.hint.size(), 20u) << name << ": " << e.hint;
    }
  }
}

}  // namespace
}  // namespace xenprobes::testing
