// The async ring (protocol.h "Async rings"): how fast Dom0 drains records (issue 14's goal: at
// least 1 M records/s with no heap allocation per record) and what one record costs the
// producer (the guest module's xp_ring.c, here compiled for userspace: the guest's side without
// the detour around it). Results: docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "guestmod/ring.hpp"
#include "xp_ring.h"

#include "alloc_counter.hpp"

namespace {

using xenprobes::guestmod::RingReader;
using xenprobes::guestmod::RingRecord;

constexpr unsigned kOrder = 20;  // 1 MiB of data

struct Bench {
  Bench() : bytes(XENPROBES_RING_DATA_OFFSET + (std::size_t{1} << kOrder)) {
    mem = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
    std::memset(mem, 0, bytes);
    xp_ring_init(&ring, mem, kOrder, 0);
    reader.emplace(std::move(*RingReader::open({mem, bytes}, 0)));
    regs.rdi = reinterpret_cast<std::uint64_t>(path);
    regs.rsi = 0x1234;
  }
  ~Bench() { std::free(mem); }
  // Writes records until the ring is full; returns how many.
  std::uint64_t fill(const xenprobes_capture_spec* specs, unsigned n, const xp_read_ops* ops) {
    std::uint64_t k = 0;
    while (xp_ring_write_hit(&ring, 1, k, &regs, specs, n, ops) <= XP_RING_NOTIFY) ++k;
    return k;
  }
  std::size_t bytes;
  std::byte* mem;
  xp_ring ring{};
  std::optional<RingReader> reader;
  xenprobes_regs regs{};
  char path[64] = "/usr/lib/x86_64-linux-gnu/libc.so.6";
};

int read_mem(void*, void* dst, std::uint64_t addr, std::uint32_t len, bool) {
  std::memcpy(dst, reinterpret_cast<const void*>(addr), len);
  return 0;
}
long read_str(void*, void* dst, std::uint64_t addr, std::uint32_t max, bool) {
  const char* s = reinterpret_cast<const char*>(addr);
  const std::size_t n = strnlen(s, max);
  std::memcpy(dst, s, n < max ? n + 1 : max);
  return n < max ? static_cast<long>(n + 1) : max;
}
const xp_read_ops kOps{&read_mem, &read_str, nullptr};
const xenprobes_capture_spec kPath{XENPROBES_CAP_STRING, 5, 64, 0};  // the string at rdi

// Dom0's drain: records already in the ring, each copied out, checked and handed to a handler.
void drain(benchmark::State& state, const xenprobes_capture_spec* specs, unsigned n) {
  Bench b;
  std::uint64_t records = 0, allocs = 0, sum = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::uint64_t k = b.fill(specs, n, &kOps);
    const std::uint64_t a0 = g_allocs.load();
    state.ResumeTiming();
    const std::size_t got = b.reader->drain([&](const RingRecord& r) { sum += r.regs->rsi + r.captures.size(); });
    state.PauseTiming();
    allocs += g_allocs.load() - a0;
    if (got != k) state.SkipWithError("records lost");
    records += got;
    state.ResumeTiming();
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<std::int64_t>(records));
  state.counters["allocs_per_record"] = records ? static_cast<double>(allocs) / static_cast<double>(records) : 0;
  state.counters["record_bytes"] = static_cast<double>(xp_ring_record_max(specs, n));
}

void BM_DrainRegisters(benchmark::State& state) { drain(state, nullptr, 0); }
void BM_DrainRegistersAndAPath(benchmark::State& state) { drain(state, &kPath, 1); }

// The producer: one record written (registers, and the path when asked); when the ring is
// full, Dom0's side empties it outside the timing.
void produce(benchmark::State& state, const xenprobes_capture_spec* specs, unsigned n) {
  Bench b;
  std::uint64_t k = 0;
  for (auto _ : state) {
    if (xp_ring_write_hit(&b.ring, 1, k, &b.regs, specs, n, &kOps) > XP_RING_NOTIFY) {
      state.PauseTiming();
      b.reader->drain([](const RingRecord&) {});
      state.ResumeTiming();
      continue;
    }
    ++k;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(k));
}

void BM_ProduceRegisters(benchmark::State& state) { produce(state, nullptr, 0); }
void BM_ProduceRegistersAndAPath(benchmark::State& state) { produce(state, &kPath, 1); }

}  // namespace

BENCHMARK(BM_DrainRegisters);
BENCHMARK(BM_DrainRegistersAndAPath);
BENCHMARK(BM_ProduceRegisters);
BENCHMARK(BM_ProduceRegistersAndAPath);
BENCHMARK_MAIN();
