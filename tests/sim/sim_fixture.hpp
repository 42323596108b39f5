// Shared helpers for tests that run the demo guest on the simulated Xen.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "demo_abi.h"
#include "hv/sim/sim.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes::testing {

using namespace std::chrono_literals;

// Polls `pred` until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 10s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// A simulated host with one demo-guest domain and a Dom0 handle on it.
struct SimGuest {
  std::shared_ptr<hv::sim::SimHost> host;
  std::unique_ptr<hv::Hypervisor> hv;
  DomId dom;

  explicit SimGuest(hv::sim::DomainConfig cfg = {}, hv::sim::SimOptions opts = {}) {
    host = hv::sim::SimHost::create(opts);
    auto id = host->create_domain(cfg);
    if (!id) throw std::runtime_error(id.error().what);
    dom = *id;
    hv = host->open();
  }

  std::uint64_t sym(const char* name) {
    auto s = host->symbol(dom, name);
    if (!s) throw std::runtime_error(s.error().what);
    return *s;
  }

  // Oracle read of the guest's per-vCPU statistics (through the sim, not the library).
  demo_stats stats(unsigned vcpu) {
    demo_stats st{};
    auto r =
        host->peek(dom, sym(DEMO_SYM_STATS) + vcpu * sizeof(demo_stats), std::as_writable_bytes(std::span(&st, 1)));
    if (!r) throw std::runtime_error(r.error().what);
    return st;
  }

  // Guest memory the way the library sees it: page-table walk from vCPU 0's CR3.
  std::unique_ptr<mem::GuestMemory> memory() {
    source = std::make_unique<mem::HypervisorFrameSource>(*hv, dom);
    auto gm = std::make_unique<mem::GuestMemory>(*source);
    auto info = hv->domain_info(dom);
    auto regs = hv->get_vcpu_regs(dom, VcpuId{0});
    if (!info || !regs) throw std::runtime_error("cannot read domain state");
    auto ctx = mem::paging_context(*info, *regs);
    if (!ctx) throw std::runtime_error(ctx.error().what);
    gm->set_context(*ctx);
    return gm;
  }

  std::unique_ptr<mem::FrameSource> source;
};

inline std::uint64_t expected_calls(unsigned fn, std::uint64_t iterations) {
  static const std::uint64_t k[DEMO_NFUNCS] = DEMO_CALLS_PER_ITER_INIT;
  return k[fn] * iterations;
}

}  // namespace xenprobes::testing
