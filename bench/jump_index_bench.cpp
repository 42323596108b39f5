// The jump probes' index build (probe/jump_index.hpp; docs/probes.md "Jump probes"): every
// function of Debian 6.1's core text decoded for its branches into the middle of another
// function, as a domain's first jump or async probe does it, from the image's bytes (no guest):
//   - BM_IndexOld: the engine's loop before the lean decoder (x86::decode_function(), an Insn
//     per instruction, one thread);
//   - BM_IndexLean/threads:N: decode_cross_branches() with x86::relative_branches() on N
//     threads (the engine picks index_threads()).
// And the tail-call proof's reading of the image (kernel::addresses_taken(), as the engine's
// first jump probe does it given the vmlinux), of Debian's 6.1 and 6.12 each:
//   - BM_TakenOld/<kernel>: before the lean decoder (x86::decode_function() and
//     materialized_addresses() of every instruction, one thread, the data scan as it was);
//   - BM_TakenLean/<kernel>/threads:N: addresses_taken() with x86::formed_addresses() on N
//     threads (the engine picks taken_threads()).
// Skipped without the cached kernels (sh tools/fetch-debian-kernels.sh; XENPROBES_KERNEL_CACHE).
// Each iteration decodes the whole text (seconds): run with --benchmark_min_time=0 or the
// default (one or two iterations each).
#include <benchmark/benchmark.h>

#include <cstdio>

#include <map>
#include <memory>

#include "addresses_taken_reference.hpp"
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

// ---- The tail-call proof

struct TakenImage {
  std::unique_ptr<symbols::KernelImage> img;
  kernel::Range core, init;
  std::size_t functions = 0;
};

// The image of the cached kernel whose version starts with `version`, loaded once.
const TakenImage* taken_image(const std::string& version, std::string& why) {
  static std::map<std::string, std::pair<std::optional<TakenImage>, std::string>> loaded;
  auto [it, fresh] = loaded.try_emplace(version);
  auto& [k, error] = it->second;
  if (fresh) {
    const auto dir = testing::cached_debian_kernel(version);
    auto elf = dir ? elf::load(*dir / "vmlinux") : Result<elf::Image>(fail(Errc::NotFound, "no kernel"));
    auto syms = dir ? symbols::SymbolTable::load(*dir / "System.map")
                    : Result<symbols::SymbolTable>(fail(Errc::NotFound, "no kernel"));
    if (!dir) {
      error = "no Debian " + version + "x kernel cached: run sh tools/fetch-debian-kernels.sh";
    } else if (!elf || !syms) {
      error = !elf ? elf.error().what : syms.error().what;
    } else {
      TakenImage t;
      t.img = std::make_unique<symbols::KernelImage>(
          symbols::KernelImage::with_symbols(std::move(*elf), std::move(*syms), (*dir / "vmlinux").string()));
      const kernel::KernelTables tables = kernel::KernelTables::read(
          t.img->symbols(), [&](Gva a, std::span<std::byte> out) { return t.img->read(a, out); });
      t.core = tables.core_text();
      t.init = tables.init_text();
      t.functions = testing::taken_functions(t.img->symbols(), t.core, t.init).size();
      std::fprintf(stderr, "%s: %zu functions in its core and init text\n", dir->filename().c_str(), t.functions);
      k = std::move(t);
    }
  }
  why = error;
  return k ? &*k : nullptr;
}

void set_taken_counters(benchmark::State& st, const TakenImage& k, const std::vector<kernel::TakenAddress>& taken) {
  st.counters["functions"] = static_cast<double>(k.functions);
  st.counters["taken"] = static_cast<double>(taken.size());
  st.counters["by_code"] =
      static_cast<double>(std::count_if(taken.begin(), taken.end(), [](const auto& t) { return !t.data; }));
}

void BM_TakenOld(benchmark::State& st, const std::string& version) {
  std::string why;
  const TakenImage* k = taken_image(version, why);
  if (k == nullptr) return st.SkipWithError(why.c_str());
  std::vector<kernel::TakenAddress> taken;
  for (auto _ : st) {
    taken = testing::old_addresses_taken(*k->img, k->core, k->init);
    benchmark::DoNotOptimize(taken.data());
  }
  set_taken_counters(st, *k, taken);
}

void BM_TakenLean(benchmark::State& st, const std::string& version) {
  std::string why;
  const TakenImage* k = taken_image(version, why);
  if (k == nullptr) return st.SkipWithError(why.c_str());
  std::vector<kernel::TakenAddress> taken;
  for (auto _ : st) {
    taken = kernel::addresses_taken(*k->img, k->core, k->init, {}, static_cast<unsigned>(st.range(0)));
    benchmark::DoNotOptimize(taken.data());
  }
  set_taken_counters(st, *k, taken);
  st.counters["engine_threads"] = kernel::taken_threads(k->functions);
}

void register_taken() {
  for (const std::string version : {"6.1.", "6.12."}) {
    const std::string name = "v" + version.substr(0, version.size() - 1);
    benchmark::RegisterBenchmark(("BM_TakenOld/" + name).c_str(), BM_TakenOld, version)
        ->Unit(benchmark::kSecond)
        ->MeasureProcessCPUTime()
        ->UseRealTime();
    benchmark::RegisterBenchmark(("BM_TakenLean/" + name).c_str(), BM_TakenLean, version)
        ->ArgName("threads")
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->Unit(benchmark::kSecond)
        ->MeasureProcessCPUTime()
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_taken();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
