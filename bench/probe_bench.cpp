// Probe engine costs (issue #3):
//  - Dom0 CPU per hit inside the library, hypervisor excluded: Engine::on_stop() driven
//    directly with a stopped-vCPU record, for boosted, emulated and post-handler (slot trap) hits;
//  - heap allocations per hit (target: none), counted by replacing operator new;
//  - hypervisor calls per hit through the whole VIRQ_DEBUGGER loop on the simulated Xen;
//  - registering 1000 probes: time, and how many times the domain was paused.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <optional>

#include "channel/debugger.hpp"
#include "demo_abi.h"
#include "probe/engine.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

#include "alloc_counter.hpp"

using namespace xenprobes;

namespace {

std::string demo_map() { return hv::sim::default_guest_dir() + "/System.map"; }

// A paused demo guest with an engine on the debugger channel.
struct Rig {
  std::shared_ptr<hv::sim::SimHost> host = hv::sim::SimHost::create();
  DomId dom;
  std::unique_ptr<hv::Hypervisor> hv;
  std::unique_ptr<channel::DebuggerChannel> ch;
  std::unique_ptr<probe::Engine> engine;

  Rig() {
    hv::sim::DomainConfig c;
    c.vcpus = 1;
    c.start_paused = true;
    dom = *host->create_domain(c);
    hv = host->open();
    ch = std::move(*channel::DebuggerChannel::open(*hv));
    engine = std::make_unique<probe::Engine>(*hv, *ch);
    (void)engine->set_symbols(dom, *symbols::SymbolTable::load(demo_map()));
  }
  std::uint64_t sym(const char* s) { return *host->symbol(dom, s); }
};

// One hit handled by the engine: `trap` is where the vCPU stopped.
void hit_loop(benchmark::State& st, Rig& rig, Gva trap, const hv::VcpuRegs& regs) {
  std::uint64_t allocs = 0, n = 0;
  for (auto _ : st) {
    channel::Stop s{rig.dom, VcpuId{0}, trap, regs};
    std::uint64_t before = g_allocs.load(std::memory_order_relaxed);
    auto v = rig.engine->on_stop(s);
    allocs += g_allocs.load(std::memory_order_relaxed) - before;
    ++n;
    benchmark::DoNotOptimize(v);
    benchmark::DoNotOptimize(s.regs.rip);
  }
  st.counters["allocs_per_hit"] = static_cast<double>(allocs) / static_cast<double>(n);
}

void BM_HitBoosted(benchmark::State& st) {
  Rig rig;
  std::uint64_t at = rig.sym("sys_getppid") + 5;  // mov %rsp,%rax
  std::uint64_t calls = 0;
  auto id = rig.engine->add(rig.dom, Gva{at},
                            [&](HitContext& c) {
                              calls += c.regs().rax & 1;
                              return 0;
                            },
                            {});
  if (!id) return st.SkipWithError(id.error().what.c_str());
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  hit_loop(st, rig, Gva{at}, regs);
  benchmark::DoNotOptimize(calls);
}
BENCHMARK(BM_HitBoosted);

void BM_HitEmulatedCall(benchmark::State& st) {
  Rig rig;
  std::uint64_t at = rig.sym("demo_main") + 0x37;  // call demo_puts: pushes a return address
  auto id = rig.engine->add(rig.dom, Gva{at}, [](HitContext&) { return 0; }, {});
  if (!id) return st.SkipWithError(id.error().what.c_str());
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  regs.rsp = rig.sym(DEMO_SYM_STACKS) + DEMO_STACK_SIZE - 64;
  hit_loop(st, rig, Gva{at}, regs);
}
BENCHMARK(BM_HitEmulatedCall);

void BM_HitPostHandlerSlotTrap(benchmark::State& st) {
  Rig rig;
  std::uint64_t at = rig.sym("sys_getppid") + 5;
  std::uint64_t posts = 0;
  auto id = rig.engine->add(
      rig.dom, Gva{at}, [](HitContext&) { return 0; }, [&](HitContext&) { ++posts; });
  if (!id) return st.SkipWithError(id.error().what.c_str());
  auto info = rig.engine->info(*id);
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  // The second stop of a post-handler hit: at the trap byte after the slot's copy (3 bytes).
  hit_loop(st, rig, Gva{info->slot.value + 3}, regs);
  benchmark::DoNotOptimize(posts);
}
BENCHMARK(BM_HitPostHandlerSlotTrap);

// One return-probe call in the engine: the entry stop (instance taken, return address
// rewritten on the guest stack) and the trampoline stop (instance found by stack slot, return
// handler, resume at the real return address). Compare with BM_HitBoosted (one XP hit).
void BM_HitRetProbePair(benchmark::State& st) {
  Rig rig;
  std::uint64_t at = rig.sym("sys_getppid");
  std::uint64_t returns = 0;
  auto id = rig.engine->add_ret(
      rig.dom, Gva{at}, [](HitContext&, std::span<std::byte>) { return 0; },
      [&](HitContext& c, std::span<std::byte>) { returns += c.regs().rax & 1; }, RetProbeOptions{16, 16});
  if (!id) return st.SkipWithError(id.error().what.c_str());
  Gva tramp = rig.engine->info(*id)->trampoline;
  at = rig.engine->info(*id)->address.value;  // past the function's ftrace site
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  regs.rsp = rig.sym(DEMO_SYM_STACKS) + DEMO_STACK_SIZE - 64;  // a slot in vCPU 0's stack
  const std::uint64_t ret = rig.sym("demo_main");              // any return address
  auto gv = GuestView::open(*rig.hv, rig.dom);
  if (!gv || !(*gv)->write(Gva{regs.rsp}, std::as_bytes(std::span(&ret, 1))))
    return st.SkipWithError("cannot write the stack");
  std::uint64_t allocs = 0, n = 0;
  for (auto _ : st) {
    // The guest's call instruction pushes the return address (the ret left the trampoline's
    // address in the popped slot): one 8-byte write, counted in the time.
    (void)(*gv)->write(Gva{regs.rsp}, std::as_bytes(std::span(&ret, 1)));
    std::uint64_t before = g_allocs.load(std::memory_order_relaxed);
    channel::Stop entry{rig.dom, VcpuId{0}, Gva{at}, regs};
    (void)rig.engine->on_stop(entry);
    hv::VcpuRegs back = regs;
    back.rsp += 8;  // the function's ret popped the trampoline's address
    channel::Stop ret_stop{rig.dom, VcpuId{0}, tramp, back};
    (void)rig.engine->on_stop(ret_stop);
    allocs += g_allocs.load(std::memory_order_relaxed) - before;
    ++n;
    if (ret_stop.regs.rip != ret) return st.SkipWithError("the return did not resume at the real return address");
  }
  st.counters["allocs_per_pair"] = static_cast<double>(allocs) / static_cast<double>(n);
  benchmark::DoNotOptimize(returns);
}
BENCHMARK(BM_HitRetProbePair);

// The same pair when the stop carries the guest's own read of the return slot and takes the
// write back (the guest channel with a module that writes return slots, protocol.h "Return
// slots written by the module"): the engine touches no guest memory.
void BM_HitRetProbePairModuleWrites(benchmark::State& st) {
  Rig rig;
  std::uint64_t at = rig.sym("sys_getppid");
  std::uint64_t returns = 0;
  auto id = rig.engine->add_ret(
      rig.dom, Gva{at}, [](HitContext&, std::span<std::byte>) { return 0; },
      [&](HitContext& c, std::span<std::byte>) { returns += c.regs().rax & 1; }, RetProbeOptions{16, 16});
  if (!id) return st.SkipWithError(id.error().what.c_str());
  Gva tramp = rig.engine->info(*id)->trampoline;
  at = rig.engine->info(*id)->address.value;
  auto regs = *rig.hv->get_vcpu_regs(rig.dom, VcpuId{0});
  regs.rsp = rig.sym(DEMO_SYM_STACKS) + DEMO_STACK_SIZE - 64;
  const std::uint64_t ret = rig.sym("demo_main");
  rig.host->reset_counts();
  std::uint64_t allocs = 0, n = 0;
  for (auto _ : st) {
    std::uint64_t before = g_allocs.load(std::memory_order_relaxed);
    channel::Stop entry{rig.dom, VcpuId{0}, Gva{at}, regs};
    entry.stack_top = ret;
    (void)rig.engine->on_stop(entry);
    if (!entry.ret_write || entry.ret_write->value != tramp.value)
      return st.SkipWithError("no write asked of the guest");
    hv::VcpuRegs back = regs;
    back.rsp += 8;
    channel::Stop ret_stop{rig.dom, VcpuId{0}, tramp, back};
    (void)rig.engine->on_stop(ret_stop);
    allocs += g_allocs.load(std::memory_order_relaxed) - before;
    ++n;
    if (ret_stop.regs.rip != ret) return st.SkipWithError("the return did not resume at the real return address");
  }
  st.counters["allocs_per_pair"] = static_cast<double>(allocs) / static_cast<double>(n);
  st.counters["maps_per_pair"] =
      static_cast<double>(rig.host->op_count(hv::sim::Op::MapFrames)) / static_cast<double>(n);
  benchmark::DoNotOptimize(returns);
}
BENCHMARK(BM_HitRetProbePairModuleWrites);

// Whole hits through the session's loop on the simulated Xen, over the channel the
// benchmark's argument names (0 debugger, 1 guest, 2 vmevent on an HVM guest). `install` puts
// the probe in, counting handled hits in `hits`, and returns the label or an error.
constexpr ChannelKind kLoopChannels[] = {ChannelKind::Debugger, ChannelKind::Guest, ChannelKind::VmEvent};

template <typename Install>
void run_loop(benchmark::State& st, const char* per, Install&& install, bool module_ret_write = true,
              std::optional<ChannelKind> channel = std::nullopt) {
  const ChannelKind kind = channel.value_or(kLoopChannels[st.range(0)]);
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c;
  c.vcpus = 1;
  c.module_ret_write = module_ret_write;
  if (kind == ChannelKind::VmEvent) c.type = hv::GuestType::Hvm;
  DomId dom = *host->create_domain(c);
  auto s = std::move(*Session::open(host->open(), SessionOptions{kind}));
  (void)s->load_symbols(dom, demo_map());
  std::uint64_t hits = 0;
  Result<std::pair<Probe, std::string>> p = install(*s, dom, hits);
  if (!p) return st.SkipWithError(p.error().what.c_str());
  st.SetLabel(std::string(channel_kind_name(kind)) + " " + p->second);
  (void)s->run_once(10);
  host->reset_counts();
  std::uint64_t calls0 = host->total_calls(), hits0 = hits;
  // Every operator new of the process (the simulated Xen's threads included) while the loop runs.
  const std::uint64_t allocs0 = g_allocs.load(std::memory_order_relaxed);
  for (auto _ : st) (void)s->run_once(5);
  const std::uint64_t allocs = g_allocs.load(std::memory_order_relaxed) - allocs0;
  std::uint64_t dh = hits - hits0;
  auto per_hit = [&](double v) { return dh ? v / static_cast<double>(dh) : 0; };
  st.counters[std::string(per) + "s"] = static_cast<double>(dh);
  st.counters[std::string("hv_calls_per_") + per] = per_hit(static_cast<double>(host->total_calls() - calls0));
  st.counters[std::string("maps_per_") + per] = per_hit(static_cast<double>(host->op_count(hv::sim::Op::MapFrames)));
  st.counters[std::string("allocs_per_") + per] = per_hit(static_cast<double>(allocs));
}

void full_loop(benchmark::State& st, const char* where, bool post) {
  run_loop(st, "hit", [&](Session& s, DomId dom, std::uint64_t& hits) -> Result<std::pair<Probe, std::string>> {
    PostHandler ph;
    if (post) ph = [](HitContext&) {};
    auto p = XP_TRY(s.probe(
        dom, where,
        [&hits](HitContext&) {
          ++hits;
          return 0;
        },
        ph));
    const char* mode = "?";
    switch (p.info()->mode) {
      case ExecMode::Boosted: mode = "boosted"; break;
      case ExecMode::Emulated: mode = "emulated"; break;
      case ExecMode::TrapAfter: mode = "trap-after"; break;
      case ExecMode::Skipped: mode = "skipped"; break;
      case ExecMode::Detour: mode = "detour"; break;
    }
    return std::pair{std::move(p), std::string(mode)};
  });
}
void BM_LoopBoosted(benchmark::State& st) { full_loop(st, "sys_getppid+5", false); }
void BM_LoopEmulated(benchmark::State& st) { full_loop(st, "sys_getppid+0x22", false); }  // ja
void BM_LoopPostHandler(benchmark::State& st) { full_loop(st, "sys_getppid+5", true); }
BENCHMARK(BM_LoopBoosted)->DenseRange(0, 2)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_LoopEmulated)->DenseRange(0, 2)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_LoopPostHandler)->DenseRange(0, 2)->UseRealTime()->MinTime(0.5);

// Whole return-probe calls (entry stop + trampoline stop) through the same loop.
void BM_LoopRetProbe(benchmark::State& st) {
  run_loop(st, "pair", [](Session& s, DomId dom, std::uint64_t& returns) -> Result<std::pair<Probe, std::string>> {
    auto p = XP_TRY(s.ret_probe(dom, "sys_getppid", {}, [&returns](HitContext&, std::span<std::byte>) { ++returns; }));
    return std::pair{std::move(p), std::string("return probe")};
  });
}
BENCHMARK(BM_LoopRetProbe)->DenseRange(0, 2)->UseRealTime()->MinTime(0.5);

// The same on the guest channel of a PV guest whose module writes the return slots itself
// (argument 1, protocol.h "Return slots written by the module") or does not (0, an older
// module: Dom0 maps the stack's frame, writes it and unmaps it per call).
void BM_LoopRetProbeGuestPv(benchmark::State& st) {
  const bool module_writes = st.range(0) != 0;
  run_loop(
      st, "pair",
      [&](Session& s, DomId dom, std::uint64_t& returns) -> Result<std::pair<Probe, std::string>> {
        auto p =
            XP_TRY(s.ret_probe(dom, "sys_getppid", {}, [&returns](HitContext&, std::span<std::byte>) { ++returns; }));
        return std::pair{std::move(p), std::string(module_writes ? "module writes the slot" : "older module")};
      },
      module_writes, ChannelKind::Guest);
}
BENCHMARK(BM_LoopRetProbeGuestPv)->DenseRange(0, 1)->UseRealTime()->MinTime(0.5);

// 1000 probes (two per instruction, in address order) registered on a paused guest.
void register_1000(benchmark::State& st, bool batch) {
  double pauses = 0;
  for (auto _ : st) {
    st.PauseTiming();
    auto host = hv::sim::SimHost::create();
    hv::sim::DomainConfig c;
    c.vcpus = 2;
    c.oea_size = 1 << 20;
    DomId dom = *host->create_domain(c);
    auto s = std::move(*Session::open(host->open()));
    (void)s->load_symbols(dom, demo_map());
    auto layout = *host->layout(dom);
    auto t = *symbols::SymbolTable::load(demo_map());
    std::vector<Gva> points;
    for (std::uint64_t a = layout.text_start; a < layout.text_end && points.size() < 500; ++a) {
      auto f = t.function_containing(Gva{a});
      if (!f) continue;
      std::vector<std::uint8_t> bytes(f->size);
      (void)host->peek(dom, f->start.value, std::as_writable_bytes(std::span(bytes)));
      auto insns = x86::decode_function(bytes, f->start);
      if (!insns) continue;
      for (auto& i : *insns)
        if (x86::analyze(i) && points.size() < 500) points.push_back(i.address);
      a = f->start.value + f->size - 1;
    }
    std::vector<Probe> probes;
    probes.reserve(1000);
    host->reset_counts();
    st.ResumeTiming();
    if (batch) (void)s->begin_batch();
    for (int round = 0; round < 2; ++round)
      for (Gva g : points)
        if (auto p = s->probe(dom, g, [](HitContext&) { return 0; })) probes.push_back(std::move(*p));
    if (batch) (void)s->end_batch();
    st.PauseTiming();
    pauses = static_cast<double>(host->op_count(hv::sim::Op::Pause));
    st.counters["probes"] = static_cast<double>(probes.size());
    probes.clear();
    s.reset();
    st.ResumeTiming();
  }
  st.counters["pauses"] = pauses;
}
void BM_Register1000Batched(benchmark::State& st) { register_1000(st, true); }
void BM_Register1000OneByOne(benchmark::State& st) { register_1000(st, false); }
BENCHMARK(BM_Register1000Batched)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Register1000OneByOne)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
