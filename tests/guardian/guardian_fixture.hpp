// A demo guest on the simulated Xen, probed through the debugger or vmevent channel, whose
// session can be abandoned as if its process had been killed.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "api/session_testing.hpp"
#include "demo_abi.h"
#include "guardian/journal.hpp"
#include "guardian/recovery.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {

using namespace std::chrono_literals;

inline std::string demo_map() { return hv::sim::default_guest_dir() + "/System.map"; }

struct Guest {
  ChannelKind channel;
  std::shared_ptr<hv::sim::SimHost> host = hv::sim::SimHost::create();
  DomId dom;
  unsigned vcpus;
  std::uint64_t iterations;
  std::unique_ptr<Session> session;
  std::vector<std::uint8_t> text_before;
  hv::sim::GuestLayout layout;

  Guest(ChannelKind ch, unsigned nvcpus, std::uint64_t iters, SessionOptions o = {}, bool load = true)
      : channel(ch), vcpus(nvcpus), iterations(iters) {
    hv::sim::DomainConfig c;
    c.vcpus = nvcpus;
    c.iterations = iters;
    c.start_paused = true;
    if (ch == ChannelKind::VmEvent) c.type = hv::GuestType::Hvm;
    dom = *host->create_domain(c);
    layout = *host->layout(dom);
    text_before = peek(layout.text_start, layout.text_end - layout.text_start);
    o.channel = ch;
    auto s = Session::open(host->open(), o);
    if (!s) throw std::runtime_error(s.error().what);
    session = std::move(*s);
    // Loading symbols attaches the domain (its channel, and the guardian with it).
    if (load)
      if (auto l = session->load_symbols(dom, demo_map()); !l) throw std::runtime_error(l.error().what);
  }

  std::vector<std::uint8_t> peek(std::uint64_t va, std::size_t n) {
    std::vector<std::uint8_t> b(n);
    if (auto r = host->peek(dom, va, std::as_writable_bytes(std::span(b))); !r)
      throw std::runtime_error(r.error().what);
    return b;
  }
  std::vector<std::uint8_t> text() { return peek(layout.text_start, layout.text_end - layout.text_start); }
  std::uint64_t sym(const char* name) { return *host->symbol(dom, name); }

  demo_stats stats(unsigned vcpu) {
    demo_stats st{};
    (void)host->peek(dom, sym(DEMO_SYM_STATS) + vcpu * sizeof(demo_stats), std::as_writable_bytes(std::span(&st, 1)));
    return st;
  }

  // Every occurrence of `value` on the guest's vCPU stacks.
  unsigned on_stacks(std::uint64_t value) {
    auto stacks = peek(sym(DEMO_SYM_STACKS), DEMO_MAX_VCPUS * DEMO_STACK_SIZE);
    unsigned n = 0;
    for (std::size_t i = 0; i + 8 <= stacks.size(); i += 8) {
      std::uint64_t v;
      std::memcpy(&v, stacks.data() + i, 8);
      n += v == value;
    }
    return n;
  }

  // A relative branch inside `fn` (Dom0 emulates it), for an emulated probe.
  Gva branch_in(const char* fn) {
    auto t = symbols::SymbolTable::load(demo_map());
    auto f = t->function_containing(Gva{sym(fn)});
    auto bytes = peek(f->start.value, f->size);
    auto insns = x86::decode_function(bytes, f->start);
    for (const auto& i : *insns)
      if (i.is_relative_branch() && i.address != f->start) return i.address;
    throw std::runtime_error(std::string("no relative branch in ") + fn);
  }

  // A probe on the first instruction of `fn` that runs boosted from a slot.
  Probe boosted_probe(const char* fn, PreHandler pre) {
    auto t = symbols::SymbolTable::load(demo_map());
    auto f = t->function_containing(Gva{sym(fn)});
    auto bytes = peek(f->start.value, f->size);
    auto insns = x86::decode_function(bytes, f->start);
    for (const auto& i : *insns) {
      auto p = session->probe(dom, i.address, pre);
      if (p && p->info()->mode == ExecMode::Boosted) return std::move(*p);
    }
    throw std::runtime_error(std::string("no boostable instruction in ") + fn);
  }

  // Drops the session as SIGKILL would, and the process's hypervisor handle with it. Returns
  // a copy of the journal's file descriptor.
  int abandon() {
    int fd = ::dup(SessionTesting::journal_fd(*session));
    auto hv = SessionTesting::abandon(std::move(session));
    hv.reset();
    return fd;
  }
};

// The reference: the same workload without probes.
inline demo_stats reference_stats(unsigned vcpu, std::uint64_t iterations, unsigned vcpus, hv::GuestType type) {
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.type = type;
  DomId dom = *host->create_domain(c);
  if (!host->wait_halted(dom, 60s)) throw std::runtime_error("reference run did not finish");
  demo_stats st{};
  (void)host->peek(dom, *host->symbol(dom, DEMO_SYM_STATS) + vcpu * sizeof(demo_stats),
                   std::as_writable_bytes(std::span(&st, 1)));
  return st;
}

}  // namespace xenprobes::testing
