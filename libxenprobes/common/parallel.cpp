#include "common/parallel.hpp"

#include <algorithm>
#include <exception>
#include <system_error>
#include <thread>

namespace xenprobes {

unsigned worker_threads(std::size_t items, std::size_t min_per_thread, unsigned max) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t by_work = std::max<std::size_t>(1, items / std::max<std::size_t>(1, min_per_thread));
  return static_cast<unsigned>(std::min<std::size_t>({hw, std::max(1u, max), by_work}));
}

std::vector<std::pair<std::size_t, std::size_t>> split_by_weight(
    std::size_t n, std::size_t parts, const std::function<std::uint64_t(std::size_t)>& weight) {
  const std::size_t count = std::clamp<std::size_t>(parts, 1, std::max<std::size_t>(1, n));
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) total += weight(i);
  std::vector<std::pair<std::size_t, std::size_t>> out(count);
  std::uint64_t acc = 0;
  std::size_t k = 0;
  for (std::size_t p = 0; p < count; ++p) {
    out[p].first = k;
    const std::uint64_t goal = p + 1 == count ? total : total / count * (p + 1);
    while (k < n && (p + 1 == count || acc < goal)) acc += weight(k++);
    out[p].second = k;
  }
  return out;
}

void run_parts(std::size_t parts, const std::function<void(std::size_t)>& work) {
  std::vector<std::exception_ptr> errors(parts);
  auto one = [&](std::size_t p) noexcept {
    try {
      work(p);
    } catch (...) { errors[p] = std::current_exception(); }
  };
  {
    // Every thread joined (the jthreads' destructors) before anything is rethrown.
    std::vector<std::jthread> workers;
    workers.reserve(parts);
    for (std::size_t p = 1; p < parts; ++p) {
      try {
        workers.emplace_back(one, p);
      } catch (const std::system_error&) { one(p); }
    }
    if (parts > 0) one(0);
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace xenprobes
