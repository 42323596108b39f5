// Work over a list split into contiguous ranges, one per thread, each range's output merged in
// list order afterwards by the caller: the result is the one a single thread makes. For the
// decoders that read a whole kernel once per build (the jump probes' index,
// probe/jump_index_decode.cpp; the tail-call proof, kernel/addresses_taken.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace xenprobes {

// At most this many threads decode a kernel (the jump index and the tail-call proof alike).
inline constexpr unsigned kMaxWorkerThreads = 4;

// How many threads work on `items` items: min(the hardware's threads, `max`), and no more than
// one per `min_per_thread` items; at least 1.
unsigned worker_threads(std::size_t items, std::size_t min_per_thread, unsigned max = kMaxWorkerThreads);

// [0, n) as min(parts, n) contiguous ranges [lo, hi), in order (at least one, maybe empty), of
// about the same total `weight(i)`: range p ends once its running total reached p+1 parts of
// the whole; the last takes the rest.
std::vector<std::pair<std::size_t, std::size_t>> split_by_weight(
    std::size_t n, std::size_t parts, const std::function<std::uint64_t(std::size_t)>& weight);

// work(p) for every p in [0, parts): p = 0 on the calling thread, the others on threads of their
// own (on the calling thread when no thread can be started). Returns once every one ended; the
// first exception by p (memory) is rethrown then. work(p) must touch only what is p's own and
// what no thread writes.
void run_parts(std::size_t parts, const std::function<void(std::size_t)>& work);

}  // namespace xenprobes
