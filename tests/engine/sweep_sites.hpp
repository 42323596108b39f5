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
  auto table = symbols::SymbolTable::load(demo_map());
  if (!table) throw std::runtime_error(table.error().what);
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config(1, 1);
  c.start_paused = true;
  DomId dom = *host->create_domain(c);
  auto layout = *host->layout(dom);
  std::vector<Site> sites;
  std::uint64_t at = layout.text_start;
  while (at < layout.text_end) {
    auto f = table->function_containing(Gva{at});
    if (!f || f->size == 0) {
      ++at;
      continue;
    }
    std::vector<std::uint8_t> bytes(f->size);
    if (!host->peek(dom, f->start.value, std::as_writable_bytes(std::span(bytes)))) break;
    auto insns = x86::decode_function(bytes, f->start);
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
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config(1, iterations);
  for (const auto& s : sites) c.count_executions.push_back(s.address);
  DomId dom = *host->create_domain(c);
  if (!host->wait_halted(dom, 120s)) throw std::runtime_error("reference run did not finish");
  Reference r;
  for (const auto& s : sites) r.executions[s.address] = *host->executions(dom, s.address);
  if (!host->peek(dom, *host->symbol(dom, DEMO_SYM_STATS), std::as_writable_bytes(std::span(&r.stats, 1))))
    throw std::runtime_error("reference run: cannot read demo_stats");
  return r;
}

}  // namespace xenprobes::testing
