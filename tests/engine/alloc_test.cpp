// No heap allocation on the hit paths that promise none (docs/probes.md, docs/benchmarks.md):
// Engine::on_stop driven directly with a stopped vCPU, as bench/probe_bench measures it, with
// every operator new of the process counted. A regression fails here, not only in a benchmark.
#include <gtest/gtest.h>

#include "alloc_counter.hpp"
#include "channel/debugger.hpp"
#include "demo_abi.h"
#include "probe/engine.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/sim.hpp"

namespace xenprobes {
namespace {

constexpr int kHits = 10000;

// A paused demo guest with an engine on the debugger channel.
struct Rig {
  explicit Rig(hv::GuestType type = hv::GuestType::Pv) {
    hv::sim::DomainConfig c;
    c.vcpus = 1;
    c.start_paused = true;
    c.type = type;
    dom = *host->create_domain(c);
    hv = host->open();
    ch = std::move(*channel::DebuggerChannel::open(*hv));
    engine = std::make_unique<probe::Engine>(*hv, *ch);
    EXPECT_TRUE(engine->set_symbols(dom, *symbols::SymbolTable::load(hv::sim::default_guest_dir() + "/System.map")));
  }
  std::uint64_t sym(const char* s) { return *host->symbol(dom, s); }

  std::shared_ptr<hv::sim::SimHost> host = hv::sim::SimHost::create();
  DomId dom;
  std::unique_ptr<hv::Hypervisor> hv;
  std::unique_ptr<channel::DebuggerChannel> ch;
  std::unique_ptr<probe::Engine> engine;
};

// Allocations made by kHits stops at `trap` (after one warm-up stop: the first hit may fill a
// translation cache).
std::uint64_t allocations(Rig& rig, Gva trap, const hv::VcpuRegs& regs) {
  channel::Stop warm{rig.dom, VcpuId{0}, trap, regs};
  (void)rig.engine->on_stop(warm);
  const std::uint64_t before = g_allocs.load();
  for (int i = 0; i < kHits; ++i) {
    channel::Stop s{rig.dom, VcpuId{0}, trap, regs};
    (void)rig.engine->on_stop(s);
  }
  return g_allocs.load() - before;
}

TEST(Allocations, ABoostedHitAllocatesNothing) {
  Rig rig;
  int calls = 0;
  auto id = rig.engine->add(rig.dom, Gva{rig.sym("sys_getppid") + 5},
                            [&](HitContext&) {
                              ++calls;
                              return 0;
                            },
                            {});
  ASSERT_TRUE(id) << id.error().what;
  ASSERT_EQ(rig.engine->info(*id)->mode, ExecMode::Boosted);
  EXPECT_EQ(allocations(rig, rig.engine->info(*id)->address, *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0})), 0u);
  EXPECT_EQ(calls, kHits + 1);
}

TEST(Allocations, APostHandlerStopAllocatesNothing) {
  Rig rig;
  int posts = 0;
  auto id = rig.engine->add(
      rig.dom, Gva{rig.sym("sys_getppid") + 5}, [](HitContext&) { return 0; }, [&](HitContext&) { ++posts; });
  ASSERT_TRUE(id) << id.error().what;
  // The second stop of such a hit: the trap byte after the slot's 3-byte copy.
  const Gva after{rig.engine->info(*id)->slot.value + 3};
  EXPECT_EQ(allocations(rig, after, *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0})), 0u);
  EXPECT_EQ(posts, kHits + 1);
}

// A return-probe call (entry stop, then the trampoline's) on an HVM guest, whose stack is
// written through cached mappings. (A PV guest's stack frame is mapped per call: about ten
// allocations, docs/benchmarks.md.)
TEST(Allocations, AReturnProbeCallOnAnHvmGuestAllocatesNothing) {
  Rig rig(hv::GuestType::Hvm);
  int returns = 0;
  auto id = rig.engine->add_ret(
      rig.dom, Gva{rig.sym("sys_getppid")}, [](HitContext&, std::span<std::byte>) { return 0; },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{16, 16});
  ASSERT_TRUE(id) << id.error().what;
  const Gva entry = rig.engine->info(*id)->address;  // past the function's ftrace site
  const Gva tramp = rig.engine->info(*id)->trampoline;
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  regs.rsp = rig.sym(DEMO_SYM_STACKS) + DEMO_STACK_SIZE - 64;
  const std::uint64_t ret = rig.sym("demo_main");
  auto gv = GuestView::open(*rig.hv, rig.dom);
  ASSERT_TRUE(gv);
  std::uint64_t allocs = 0;
  auto call = [&] {
    // The guest's call pushes the return address; the function's ret pops the trampoline's.
    ASSERT_TRUE((*gv)->write(Gva{regs.rsp}, std::as_bytes(std::span(&ret, 1))));
    const std::uint64_t before = g_allocs.load();
    channel::Stop in{rig.dom, VcpuId{0}, entry, regs};
    (void)rig.engine->on_stop(in);
    hv::VcpuRegs back = regs;
    back.rsp += 8;
    channel::Stop out{rig.dom, VcpuId{0}, tramp, back};
    (void)rig.engine->on_stop(out);
    allocs += g_allocs.load() - before;
    ASSERT_EQ(out.regs.rip, ret) << "the return must resume at the real return address";
  };
  call();
  allocs = 0;
  for (int i = 0; i < kHits && !HasFatalFailure(); ++i) call();
  EXPECT_EQ(allocs, 0u);
  EXPECT_EQ(returns, kHits + 1);
}

}  // namespace
}  // namespace xenprobes
