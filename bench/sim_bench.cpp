// Costs of the simulated Xen's primitives, and of one complete debug stop (ICEBP hit → VIRQ →
// find the vCPU → set registers → unpause), the round trip the debugger channel will make.
// These are simulation costs (Unicorn + threads), not Xen's: they bound how fast the engine
// test suite can go, and give the per-hit baseline the library's own costs are added to.
#include <benchmark/benchmark.h>
#include <poll.h>

#include <thread>

#include "demo_abi.h"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/sim.hpp"

using namespace xenprobes;

namespace {

struct Guest {
  std::shared_ptr<hv::sim::SimHost> host = hv::sim::SimHost::create();
  std::unique_ptr<hv::Hypervisor> hv;
  DomId dom;
  explicit Guest(unsigned vcpus = 1) {
    hv::sim::DomainConfig c;
    c.vcpus = vcpus;
    dom = *host->create_domain(c);
    hv = host->open();
  }
};

void BM_PauseUnpause(benchmark::State& st) {
  Guest g;
  for (auto _ : st) {
    (void)g.hv->pause(g.dom);
    (void)g.hv->unpause(g.dom);
  }
}
BENCHMARK(BM_PauseUnpause);

void BM_GetSetRegs(benchmark::State& st) {
  Guest g;
  (void)g.hv->pause(g.dom);
  for (auto _ : st) {
    auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
    (void)g.hv->set_vcpu_regs(g.dom, VcpuId{0}, *r);
  }
  (void)g.hv->unpause(g.dom);
}
BENCHMARK(BM_GetSetRegs);

void BM_MapFrame(benchmark::State& st) {
  Guest g;
  Frame f{0x100000 * g.dom.value + 0x1000};
  for (auto _ : st) {
    auto m = g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read);
    benchmark::DoNotOptimize(m->data());
  }
}
BENCHMARK(BM_MapFrame);

// Guest instructions the simulated vCPU runs: demo workload iterations per second.
void BM_GuestIterations(benchmark::State& st) {
  Guest g;
  std::uint64_t stats = *g.host->symbol(g.dom, DEMO_SYM_STATS);
  auto iterations = [&] {
    std::uint64_t v = 0;
    (void)g.host->peek(g.dom, stats + DEMO_STATS_ITERATIONS_OFF, std::as_writable_bytes(std::span(&v, 1)));
    return v;
  };
  std::uint64_t start = iterations();
  for (auto _ : st) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  st.counters["guest_iterations_per_s"] =
      benchmark::Counter(static_cast<double>(iterations() - start), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GuestIterations)->UseRealTime()->Iterations(50);

// One debug stop handled the way the debugger channel does it.
void BM_IcebpStopRoundTrip(benchmark::State& st) {
  Guest g;
  auto port = g.hv->evtchn_bind_virq(hv::kVirqDebugger);
  (void)g.hv->set_debugging(g.dom, true);
  std::uint64_t fn = *g.host->symbol(g.dom, "sys_getppid");
  auto view = GuestView::open(*g.hv, g.dom);
  (void)g.hv->pause(g.dom);
  std::uint8_t icebp = 0xf1;
  (void)(*view)->write(Gva{fn}, std::as_bytes(std::span(&icebp, 1)));
  (void)g.hv->unpause(g.dom);
  std::uint64_t hits = 0;
  for (auto _ : st) {
    pollfd p{g.hv->evtchn_fd(), POLLIN, 0};
    poll(&p, 1, 5000);
    (void)g.hv->evtchn_pending();
    (void)g.hv->evtchn_unmask(*port);
    auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{0});
    if (r->rip != fn + 1) continue;
    // Return at once from the probed function (the slot is the next issue's business).
    r->rip = *(*view)->read_u64(Gva{r->rsp});
    r->rsp += 8;
    r->rax = 1;
    (void)g.hv->set_vcpu_regs(g.dom, VcpuId{0}, *r);
    (void)g.hv->unpause(g.dom);
    ++hits;
  }
  st.counters["hits"] = static_cast<double>(hits);
}
BENCHMARK(BM_IcebpStopRoundTrip)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
