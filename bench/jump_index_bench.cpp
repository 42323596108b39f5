// The jump probes' index build (probe/jump_index.hpp; docs/probes.md "Jump probes"): every
// function of Debian 6.1's core text decoded for its branches into the middle of another
// function, as a domain's first jump or async probe does it, from the image's bytes (no guest):
//   - BM_IndexOld: the engine's loop before the lean decoder (x86::decode_function(), an Insn
//     per instruction, one thread);
//   - BM_IndexLean/threads:N: decode_cross_branches() with x86::relative_branches() on N
//     threads (the engine picks index_threads()).
// Skipped without the cached kernel (sh tools/fetch-debian-kernels.sh; XENPROBES_KERNEL_CACHE).
// Each iteration decodes the whole text (seconds): run with --benchmark_min_time=0 or the
// default (one or two iterations each).
#include <benchmark/benchmark.h>

#include <cstdio>

#include "jump_index_kernel.hpp"

using namespace xenprobes;

namespace {

const testing::IndexKernel* kernel(std::string& why) {
  static std::string error;
  static const std::optional<testing::IndexKernel> k = [] {
    const auto dir = testing::cached_debian_kernel("6.1.");
    if (!dir) {
      error = "no Debian 6.1 kernel cached: run sh tools/fetch-debian-kernels.sh";
      return std::optional<testing::IndexKernel>();
    }
    auto r = testing::load_index_kernel(*dir / "vmlinux", *dir / "System.map", error);
    if (r)
      std::fprintf(stderr, "%s: %zu functions, %zu bytes of core text\n", dir->filename().c_str(), r->fns.size(),
                   r->text.size());
    return r;
  }();
  why = error;
  return k ? &*k : nullptr;
}

void set_counters(benchmark::State& st, const testing::IndexKernel& k, const probe::CrossBranches& idx) {
  st.counters["functions"] = static_cast<double>(k.fns.size());
  st.counters["branches"] = static_cast<double>(idx.branches.size());
  st.counters["unknown"] = static_cast<double>(idx.unknown);
  st.counters["MB/s"] =
      benchmark::Counter(static_cast<double>(k.text.size()) / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_IndexOld(benchmark::State& st) {
  std::string why;
  const testing::IndexKernel* k = kernel(why);
  if (k == nullptr) return st.SkipWithError(why.c_str());
  probe::CrossBranches idx;
  for (auto _ : st) {
    idx = testing::old_index(*k);
    benchmark::DoNotOptimize(idx.branches.data());
  }
  set_counters(st, *k, idx);
}
BENCHMARK(BM_IndexOld)->Unit(benchmark::kSecond)->MeasureProcessCPUTime()->UseRealTime();

void BM_IndexLean(benchmark::State& st) {
  std::string why;
  const testing::IndexKernel* k = kernel(why);
  if (k == nullptr) return st.SkipWithError(why.c_str());
  probe::CrossBranches idx;
  for (auto _ : st) {
    idx = {};
    probe::decode_cross_branches(k->text, k->base, k->unread, k->fns, static_cast<unsigned>(st.range(0)), idx);
    benchmark::DoNotOptimize(idx.branches.data());
  }
  set_counters(st, *k, idx);
  st.counters["engine_threads"] = probe::index_threads(k->fns.size());
}
BENCHMARK(BM_IndexLean)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Unit(benchmark::kSecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
