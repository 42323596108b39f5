// Entry placement in functions built with indirect branch tracking, as Linux 6.12 starts them
// in Debian 13: `endbr64`, then the 5-byte ftrace nop (guest/ibt.S). A probe asked for at such
// a function's first byte, by name or by address, lands past both (past the endbr64 alone when
// there is no ftrace nop), every byte before it stays the guest's, and every call is counted
// exactly: the guest counts its own entries, and vCPU 0 starts at demo_ibt_entry, which calls
// each function kIbtCalls times through a register before the ordinary workload.
#include <algorithm>

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIbtCalls = 7;  // DEMO_IBT_CALLS in guest/ibt.S
constexpr std::uint64_t kIterations = 2;
const std::vector<std::uint8_t> kEndbr64 = {0xf3, 0x0f, 0x1e, 0xfa};
const std::vector<std::uint8_t> kNop5 = {0x0f, 0x1f, 0x44, 0x00, 0x00};

// The demo guest with vCPU 0 sent to demo_ibt_entry (same RDI/RSI as demo_vcpu_entry).
struct IbtGuest : ProbedGuest {
  IbtGuest() : ProbedGuest(demo_config(1, kIterations)) {
    hv::Hypervisor& hv = session->hypervisor();
    hv::VcpuRegs r = *hv.get_vcpu_regs(dom, VcpuId{0});
    EXPECT_EQ(r.rip, sym(DEMO_SYM_ENTRY));
    r.rip = sym("demo_ibt_entry");
    if (auto s = hv.set_vcpu_regs(dom, VcpuId{0}, r); !s) throw std::runtime_error(s.error().what);
  }
  std::uint64_t counter(const char* name) {
    auto b = peek(sym(name), 8);
    std::uint64_t v = 0;
    std::copy_n(b.begin(), 8, reinterpret_cast<std::uint8_t*>(&v));
    return v;
  }
  // The run after probing: the guest's own counters, and the ordinary workload unchanged.
  void run_and_check_workload() {
    start();
    ASSERT_TRUE(run_to_completion()) << host->crash_reason(dom);
    demo_stats st = stats(0);
    demo_stats ref = reference_stats(0, kIterations);
    EXPECT_EQ(st.iterations, kIterations);
    EXPECT_EQ(st.checksum, ref.checksum);
  }
};

std::vector<std::uint8_t> cat(std::vector<std::uint8_t> a, const std::vector<std::uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(IbtEntryPlacement, PastEndbr64AndTheFtraceNopByNameAndByAddressWithEveryCallCounted) {
  IbtGuest g;
  const std::uint64_t fn = g.sym("demo_ibt_fn");
  ASSERT_EQ(g.peek(fn, 9), cat(kEndbr64, kNop5)) << "guest/ibt.S's function must start endbr64 + nop5";
  const std::uint64_t body = fn + 9;
  std::uint64_t by_name_hits = 0, by_addr_hits = 0;
  auto by_name = g.session->probe(g.dom, "demo_ibt_fn", [&](HitContext& c) {
    EXPECT_EQ(c.regs().rip, body);
    ++by_name_hits;
    return 0;
  });
  ASSERT_TRUE(by_name) << by_name.error().what;
  auto by_addr = g.session->probe(g.dom, Gva{fn}, [&](HitContext& c) {
    EXPECT_EQ(c.regs().rip, body);
    ++by_addr_hits;
    return 0;
  });
  ASSERT_TRUE(by_addr) << by_addr.error().what;
  for (Probe* p : {&*by_name, &*by_addr}) {
    auto info = p->info();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->address.value, body);
    EXPECT_EQ(info->requested.value, fn);
    EXPECT_NE(info->moved_because.find("endbr64"), std::string::npos) << info->moved_because;
    EXPECT_NE(info->moved_because.find("ftrace"), std::string::npos) << info->moved_because;
  }
  // endbr64 and the ftrace nop stay the guest's; the trap is on the body's first instruction.
  EXPECT_EQ(g.peek(fn, 9), cat(kEndbr64, kNop5));
  EXPECT_EQ(g.peek(body, 1)[0], trap_byte());
  g.run_and_check_workload();
  EXPECT_EQ(g.counter("demo_ibt_calls"), kIbtCalls) << "the guest's own count";
  EXPECT_EQ(by_name_hits, kIbtCalls);
  EXPECT_EQ(by_addr_hits, kIbtCalls);
  EXPECT_EQ(by_name->stats().hits, kIbtCalls);
  ASSERT_TRUE(by_name->unregister());
  ASSERT_TRUE(by_addr->unregister());
  EXPECT_EQ(g.peek(fn, 10), cat(cat(kEndbr64, kNop5), {0x48}));
}

TEST(IbtEntryPlacement, PastEndbr64AloneWhenNoFtraceNopFollows) {
  IbtGuest g;
  const std::uint64_t fn = g.sym("demo_ibt_bare");
  ASSERT_EQ(g.peek(fn, 4), kEndbr64);
  const auto before = g.peek(fn, 16);
  std::uint64_t hits = 0;
  auto p = g.session->probe(g.dom, "demo_ibt_bare", [&](HitContext& c) {
    EXPECT_EQ(c.regs().rip, fn + 4);
    ++hits;
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(p->info()->address.value, fn + 4);
  EXPECT_NE(p->info()->moved_because.find("endbr64"), std::string::npos) << p->info()->moved_because;
  EXPECT_EQ(p->info()->moved_because.find("ftrace"), std::string::npos) << p->info()->moved_because;
  EXPECT_EQ(g.peek(fn, 4), kEndbr64);
  EXPECT_EQ(g.peek(fn + 4, 1)[0], trap_byte());
  g.run_and_check_workload();
  EXPECT_EQ(g.counter("demo_ibt_bare_calls"), kIbtCalls);
  EXPECT_EQ(hits, kIbtCalls);
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(fn, 16), before);
}

// A return probe asked for at the function: its entry lands past endbr64 + nop5 too, where the
// return address is still on top of the stack, and every call returns through it.
TEST(IbtEntryPlacement, AReturnProbeSeesEveryEntryAndReturn) {
  IbtGuest g;
  const std::uint64_t fn = g.sym("demo_ibt_fn");
  std::uint64_t entries = 0, returns = 0, last_rax = 0;
  auto p = g.session->ret_probe(
      g.dom, "demo_ibt_fn",
      [&](HitContext& c, std::span<std::byte>) {
        EXPECT_EQ(c.regs().rip, fn + 9);
        ++entries;
        return 0;
      },
      [&](HitContext& c, std::span<std::byte>) {
        ++returns;
        last_rax = c.regs().rax;
      });
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(p->info()->address.value, fn + 9);
  g.run_and_check_workload();
  EXPECT_EQ(g.counter("demo_ibt_calls"), kIbtCalls);
  EXPECT_EQ(entries, kIbtCalls);
  EXPECT_EQ(returns, kIbtCalls);
  EXPECT_EQ(last_rax, kIbtCalls) << "the last call returns the count after its own increment";
  EXPECT_EQ(p->stats().returns, kIbtCalls);
}

// The ftrace site asked for by address is refused with its rule and nothing is written: 6.12's
// ftrace site sits at +4, where an int3 would meet ftrace_bug().
TEST(IbtEntryPlacement, TheFtraceSiteAskedForByAddressIsRefused) {
  IbtGuest g;
  const std::uint64_t fn = g.sym("demo_ibt_fn");
  const auto before = g.peek(fn, 16);
  auto site = g.session->probe(g.dom, Gva{fn + 4}, [](HitContext&) { return 0; });
  ASSERT_FALSE(site) << "a probe on the ftrace site";
  EXPECT_EQ(site.error().code, Errc::Busy);
  EXPECT_NE(site.error().what.find("rule 'ftrace-site'"), std::string::npos) << site.error().what;
  EXPECT_EQ(g.peek(fn, 16), before) << "nothing written";
}

}  // namespace
}  // namespace xenprobes::testing
