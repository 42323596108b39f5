// The sweeps' ground truth (sweep_test.cpp, jump_sweep_test.cpp): every instruction of every
// demo-guest function, and how often each really executes in an unprobed run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {

struct Site {
  std::string function;
  std::uint64_t address;
  std::string text;
};

inline std::vector<Site> all_instructions() {
  hv::sim::DomainConfig c = demo_config(1, 1);
  c.start_paused = true;
  DemoGuest g(c);
  std::vector<Site> sites;
  std::uint64_t at = g.layout.text_start;
  while (at < g.layout.text_end) {
    auto f = g.demo_symbols().function_containing(Gva{at});
    if (!f || f->size == 0) {
      ++at;
      continue;
    }
    auto insns = x86::decode_function(g.peek(f->start.value, f->size), f->start);
    if (!insns) throw std::runtime_error(f->name + ": " + insns.error().what);
    for (const auto& i : *insns) sites.push_back({f->name, i.address.value, i.describe()});
    at = f->start.value + f->size;
  }
  return sites;
}

struct Reference {
  std::map<std::uint64_t, std::uint64_t> executions;
  demo_stats stats;
};

inline Reference reference(const std::vector<Site>& sites, std::uint64_t iterations) {
  hv::sim::DomainConfig c = demo_config(1, iterations);
  for (const auto& s : sites) c.count_executions.push_back(s.address);
  DemoGuest g(c);
  if (!g.host->wait_halted(g.dom, 120s)) throw std::runtime_error("reference run did not finish");
  Reference r;
  for (const auto& s : sites) {
    auto n = g.host->executions(g.dom, s.address);
    if (!n) throw std::runtime_error(n.error().what);
    r.executions[s.address] = *n;
  }
  r.stats = g.stats(0);
  return r;
}

}  // namespace xenprobes::testing
