// mem/ benchmarks: translation (cached vs walked) and guest reads, over a FakeFrameSource.
// The fake's map() is a hash lookup; on Xen a map is a hypercall, which is what the caches
// are for — these numbers are the library's own overhead.
#include <benchmark/benchmark.h>

#include <vector>

#include "mem/fake_frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/walker.hpp"
// The tests' page-table builder (bench/CMakeLists.txt does not add tests/ to the include path).
#include "../tests/unit/mem/page_table_builder.hpp"

namespace {

using namespace xenprobes;
using namespace xenprobes::mem;
using namespace xenprobes::mem::testing;

constexpr std::uint64_t kDirectMap = 0xFFFF'8880'0000'0000ull;  // 4 KiB pages
constexpr std::uint64_t kLargeMap = 0xFFFF'C900'0000'0000ull;   // 2 MiB pages
constexpr unsigned kPages = 512;

// A Long4 guest with kPages 4 KiB pages at kDirectMap and kPages 2 MiB pages at kLargeMap.
struct Guest {
  FakeFrameSource ram;
  PageTableBuilder tables{ram, PagingMode::Long4};
  Guest() {
    for (unsigned i = 0; i < kPages; ++i) {
      tables.map(kDirectMap + i * 4 * KiB, 0x1000'0000 + i * 4 * KiB);
      ram.add_frame(Frame{0x1'0000 + i});
      tables.map(kLargeMap + i * 2 * MiB, 0x1'0000'0000 + i * 2 * MiB, 2 * MiB);
    }
  }
  PagingContext ctx() const { return {.mode = PagingMode::Long4, .cr3 = tables.cr3()}; }
};

Guest& guest() {
  static Guest g;
  return g;
}

std::uint64_t base_for(std::int64_t page_kind) { return page_kind == 4 ? kDirectMap : kLargeMap; }
std::uint64_t stride_for(std::int64_t page_kind) { return page_kind == 4 ? 4 * KiB : 2 * MiB; }

// Arg: 4 = 4 KiB pages, 2 = 2 MiB pages.
void BM_TranslateCached(benchmark::State& state) {
  Guest& g = guest();
  GuestMemory mem(g.ram);
  mem.set_context(g.ctx());
  const std::uint64_t base = base_for(state.range(0)), stride = stride_for(state.range(0));
  for (unsigned i = 0; i < kPages; ++i) (void)mem.translate(Gva{base + i * stride});
  unsigned i = 0;
  for (auto _ : state) {
    auto t = mem.translate(Gva{base + (i++ % kPages) * stride + 0x18});
    benchmark::DoNotOptimize(t);
  }
  state.counters["walks"] = static_cast<double>(mem.stats().translations_walked);
}
BENCHMARK(BM_TranslateCached)->Arg(4)->Arg(2);

// Full walk every time (translation cache dropped), table frames already mapped.
void BM_TranslateUncached(benchmark::State& state) {
  Guest& g = guest();
  GuestMemory mem(g.ram);
  mem.set_context(g.ctx());
  const std::uint64_t base = base_for(state.range(0)), stride = stride_for(state.range(0));
  unsigned i = 0;
  for (auto _ : state) {
    mem.invalidate_translations();
    auto t = mem.translate(Gva{base + (i++ % kPages) * stride + 0x18});
    benchmark::DoNotOptimize(t);
  }
  state.counters["maps"] = static_cast<double>(mem.stats().maps);
}
BENCHMARK(BM_TranslateUncached)->Arg(4)->Arg(2);

// The bare walker over a warm MapCache (no GuestMemory around it).
void BM_Walk(benchmark::State& state) {
  Guest& g = guest();
  MapCache cache(g.ram, 256);
  const PagingContext ctx = g.ctx();
  const std::uint64_t base = base_for(state.range(0)), stride = stride_for(state.range(0));
  unsigned i = 0;
  for (auto _ : state) {
    auto t = walk(ctx, Gva{base + (i++ % kPages) * stride}, cache);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_Walk)->Arg(4)->Arg(2);

// Full walk with every table frame mapped again (mapping cache flushed): the cost shape of a
// cold cache, minus the hypercalls.
void BM_TranslateColdMappings(benchmark::State& state) {
  Guest& g = guest();
  GuestMemory mem(g.ram);
  mem.set_context(g.ctx());
  unsigned i = 0;
  for (auto _ : state) {
    mem.flush();
    auto t = mem.translate(Gva{kDirectMap + (i++ % kPages) * 4 * KiB});
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_TranslateColdMappings);

// Reads of range(0) bytes at page offset range(1), cycling over 64 4 KiB pages with warm
// caches. {8, 0x10} and {8, 0x800}: a u64; {4096, 0}: one page; {4096, 0x800}: across two pages;
// {8, 0xffc}: a u64 straddling two pages.
void BM_Read(benchmark::State& state) {
  Guest& g = guest();
  GuestMemory mem(g.ram);
  mem.set_context(g.ctx());
  const auto size = static_cast<std::size_t>(state.range(0));
  const auto offset = static_cast<std::uint64_t>(state.range(1));
  std::vector<std::byte> buf(size);
  // 64 pages (+1 for the cross-page case) fit the default 256-frame mapping cache: this
  // measures the warm path. (Cycling over more frames than the cache holds remaps each time.)
  const unsigned pages = 64;
  for (unsigned i = 0; i <= pages; ++i) (void)mem.read(Gva{kDirectMap + i * 4 * KiB}, std::span(buf).first(1));
  unsigned i = 0;
  for (auto _ : state) {
    auto r = mem.read(Gva{kDirectMap + (i++ % pages) * 4 * KiB + offset}, buf);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
  state.counters["maps"] = static_cast<double>(mem.stats().maps);
}
BENCHMARK(BM_Read)->Args({8, 0x10})->Args({8, 0x800})->Args({4096, 0})->Args({4096, 0x800})->Args({8, 0xFFC});

}  // namespace

BENCHMARK_MAIN();
