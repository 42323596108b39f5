// The demo guest on the simulated Xen: the one fixture of the tests that run it.
//
//   DemoGuest     a host, one demo-guest domain on it, and what the tests read of it through
//                 the simulation (an oracle that bypasses the library): symbols, bytes, the
//                 workload's statistics, its stacks, decoded functions; the guest module's
//                 clock; waiting for the workload to end.
//   Dom0Guest     + a Dom0 handle on that host and the guest's memory (or that of another
//                 domain on the host) as the library reads it (page-table walk): for tests of
//                 the lower layers (the simulation itself, the channels, probe/).
//   SessionGuest  + a Session over a Dom0 handle, on a channel of the test's choosing, the
//                 demo guest's symbols loaded (which attaches the domain).
//
// The suites add what is theirs in thin subclasses: ProbedGuest (engine/engine_fixture.hpp: the
// channel from XENPROBES_TEST_CHANNEL), ChannelGuest (guestch/guestch_fixture.hpp: a guest
// channel driven by hand), the guardian's Guest (guardian/guardian_fixture.hpp: a session that
// can be abandoned as SIGKILL would leave it).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "demo_abi.h"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {

using namespace std::chrono_literals;

inline std::string demo_map() { return hv::sim::default_guest_dir() + "/System.map"; }

// How long a wait for the simulated guest gives up after: a guard against a hang, not a
// timing expectation (the simulated module's timeouts run on a clock the tests advance,
// docs/simulated-xen.md). A healthy run under ASan on a busy 2-core host has taken ~55 s of
// the 60 s this once was; nothing waits this long unless something is broken.
inline constexpr std::chrono::milliseconds kHangGuard = std::chrono::minutes(5);
inline constexpr std::chrono::milliseconds kShortHangGuard = std::chrono::minutes(1);

// Polls `pred` until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = kShortHangGuard) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// How often the workload calls function `fn` in `iterations` iterations.
inline std::uint64_t expected_calls(unsigned fn, std::uint64_t iterations) {
  static const std::uint64_t k[DEMO_NFUNCS] = DEMO_CALLS_PER_ITER_INIT;
  return k[fn] * iterations;
}

// The channel the suite runs over: XENPROBES_TEST_CHANNEL (debugger, guest or vmevent; the
// CMake file registers each test of an engine suite once per channel, the channel's name
// before the test's). Unset: debugger.
inline ChannelKind test_channel() {
  const char* e = std::getenv("XENPROBES_TEST_CHANNEL");
  if (!e || !*e) return ChannelKind::Debugger;
  const std::string s = e;
  if (s == "debugger") return ChannelKind::Debugger;
  if (s == "guest") return ChannelKind::Guest;
  if (s == "vmevent") return ChannelKind::VmEvent;
  throw std::runtime_error("XENPROBES_TEST_CHANNEL: use debugger, guest or vmevent");
}

// The kind of guest a channel needs: vm_event needs HVM/PVH; the others take the demo's PV guest.
inline hv::GuestType guest_type_for(ChannelKind k = test_channel()) {
  return k == ChannelKind::VmEvent ? hv::GuestType::Hvm : hv::GuestType::Pv;
}

// The demo workload for the test's channel: `vcpus` vCPUs, `iterations` iterations (0: forever).
inline hv::sim::DomainConfig demo_config(unsigned vcpus = 1, std::uint64_t iterations = 5,
                                         ChannelKind channel = test_channel()) {
  hv::sim::DomainConfig c;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.type = guest_type_for(channel);
  return c;
}

// A simulated host with one demo-guest domain (running unless `cfg` says start_paused).
class DemoGuest {
 public:
  std::shared_ptr<hv::sim::SimHost> host;
  DomId dom;
  hv::sim::GuestLayout layout;

  explicit DemoGuest(const hv::sim::DomainConfig& cfg, const hv::sim::SimOptions& opts = {})
      : host(hv::sim::SimHost::create(opts)) {
    auto id = host->create_domain(cfg);
    if (!id) throw std::runtime_error(id.error().what);
    dom = *id;
    auto l = host->layout(dom);
    if (!l) throw std::runtime_error(l.error().what);
    layout = *l;
  }
  virtual ~DemoGuest() = default;
  DemoGuest(DemoGuest&&) = default;
  DemoGuest& operator=(DemoGuest&&) = default;

  // The Dom0 handle the test works through (its own, or its session's; none here: a DemoGuest
  // alone is for runs the test only watches).
  virtual hv::Hypervisor& dom0() { throw std::logic_error("a DemoGuest alone has no Dom0 handle"); }

  // Releases the pause the domain was created with (DomainConfig::start_paused).
  void start() {
    auto r = dom0().unpause(dom);
    if (!r) throw std::runtime_error(r.error().what);
  }
  bool paused() { return dom0().domain_info(dom)->paused; }
  bool crashed() { return !host->crash_reason(dom).empty(); }
  bool halted() { return host->wait_halted(dom, 0ms); }

  // --- Oracle reads through the simulation. A read that fails throws: a zeroed buffer would
  // make every "counter is 0" and "byte restored" check pass without looking.
  std::uint64_t sym(const char* name) {
    auto s = host->symbol(dom, name);
    if (!s) throw std::runtime_error(s.error().what);
    return *s;
  }
  // Where a probe asked for at the function lands: past its 5-byte ftrace site (every C
  // function of the demo guest starts with one, like a distribution kernel's), which belongs
  // to the guest kernel.
  std::uint64_t entry(const char* name) {
    static constexpr std::uint8_t kNop5[] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
    std::uint64_t a = sym(name);
    auto b = peek(a, 5);
    return std::equal(b.begin(), b.end(), kNop5) ? a + 5 : a;
  }
  void peek_into(std::uint64_t va, std::span<std::byte> out) { peek_into_at(dom, va, out); }
  void peek_into_at(DomId d, std::uint64_t va, std::span<std::byte> out) {
    auto r = host->peek(d, va, out);
    if (!r) throw std::runtime_error("peek at " + std::to_string(va) + ": " + r.error().what);
  }
  template <typename T>
  std::vector<T> peek_array(std::uint64_t va, std::size_t n) {
    std::vector<T> v(n);
    if (n) peek_into(va, std::as_writable_bytes(std::span(v)));
    return v;
  }
  std::vector<std::uint8_t> peek(std::uint64_t va, std::size_t n) { return peek_at(dom, va, n); }
  std::vector<std::uint8_t> peek_at(DomId d, std::uint64_t va, std::size_t n) {
    std::vector<std::uint8_t> b(n);
    if (n) peek_into_at(d, va, std::as_writable_bytes(std::span(b)));
    return b;
  }
  // The guest's core kernel text.
  std::vector<std::uint8_t> text() { return peek(layout.text_start, layout.text_end - layout.text_start); }
  // The workload's per-vCPU statistics.
  demo_stats stats(unsigned vcpu) {
    demo_stats st{};
    peek_into(sym(DEMO_SYM_STATS) + vcpu * sizeof(demo_stats), std::as_writable_bytes(std::span(&st, 1)));
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
  // The demo guest's System.map (loaded once).
  const symbols::SymbolTable& demo_symbols() {
    if (!syms_) {
      auto t = symbols::SymbolTable::load(demo_map());
      if (!t) throw std::runtime_error(t.error().what);
      syms_ = std::move(*t);
    }
    return *syms_;
  }
  // The instructions of the function holding symbol `name`, from System.map and the decoder.
  std::vector<x86::Insn> function(const char* name) {
    auto f = demo_symbols().function_containing(Gva{sym(name)});
    if (!f) throw std::runtime_error(f.error().what);
    auto bytes = peek(f->start.value, f->size);
    auto insns = x86::decode_function(bytes, f->start);
    if (!insns) throw std::runtime_error(insns.error().what);
    return *insns;
  }
  // A relative branch inside `fn` past its first instruction (Dom0 emulates it).
  Gva branch_in(const char* fn) {
    auto insns = function(fn);
    for (const auto& i : insns)
      if (i.is_relative_branch() && i.address != insns.front().address) return i.address;
    throw std::runtime_error(std::string("no relative branch in ") + fn);
  }

  // --- The guest module's clock, where the host's is manual (SimOptions::manual_clock).
  // advance() returns once the module has looked at its waiting vCPUs at the new time.
  void advance(std::chrono::milliseconds by) {
    auto r = host->advance_clock(by);
    if (!r) throw std::runtime_error("advance_clock: " + r.error().what);
  }
  // Advances the clock by `step` at a time until pred() holds, the guest crashed, or `limit`
  // of real time passed. For a guest left to its module (Dom0 gone or silent): each step lets
  // the waits that ran out end.
  bool advance_until(const std::function<bool()>& pred, std::chrono::milliseconds step,
                     std::chrono::milliseconds limit = kHangGuard) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (crashed() || std::chrono::steady_clock::now() >= end) return false;
      advance(step);
    }
    return true;
  }
  bool advance_until_halted(std::chrono::milliseconds step, std::chrono::milliseconds limit = kHangGuard) {
    return advance_until([&] { return halted(); }, step, limit);
  }

 private:
  std::optional<symbols::SymbolTable> syms_;
};

// The reference: vCPU `vcpu`'s statistics after the same workload without probes (memoised per
// workload: a run takes a while, and the workload is deterministic, SimGuest.RunsOnSeveralVcpus-
// AndIsDeterministic).
inline demo_stats reference_stats(unsigned vcpu, std::uint64_t iterations, unsigned vcpus = 1,
                                  hv::GuestType type = guest_type_for()) {
  static std::mutex mu;
  static std::map<std::tuple<unsigned, std::uint64_t, hv::GuestType>, std::vector<demo_stats>> memo;
  std::lock_guard lk(mu);
  auto& v = memo[{vcpus, iterations, type}];
  if (v.empty()) {
    hv::sim::DomainConfig c;
    c.vcpus = vcpus;
    c.iterations = iterations;
    c.type = type;
    DemoGuest g(c);
    if (!g.host->wait_halted(g.dom, kHangGuard)) throw std::runtime_error("reference run did not finish");
    v = g.peek_array<demo_stats>(g.sym(DEMO_SYM_STATS), vcpus);
  }
  return v.at(vcpu);
}

// Polls until the domain is paused (by whom: the test says).
inline bool eventually_paused(DemoGuest& g, std::chrono::milliseconds timeout = kShortHangGuard) {
  return eventually([&] { return g.paused(); }, timeout);
}
inline bool eventually_crashed(DemoGuest& g, std::chrono::milliseconds timeout = kShortHangGuard) {
  return eventually([&] { return g.crashed(); }, timeout);
}

// The demo guest and a Dom0 handle of its own on the host.
class Dom0Guest : public DemoGuest {
 public:
  std::unique_ptr<hv::Hypervisor> hv;
  std::unique_ptr<mem::HypervisorFrameSource> source;

  explicit Dom0Guest(const hv::sim::DomainConfig& cfg = {}, const hv::sim::SimOptions& opts = {})
      : DemoGuest(cfg, opts), hv(host->open()), source(std::make_unique<mem::HypervisorFrameSource>(*hv, dom)) {}

  hv::Hypervisor& dom0() override { return *hv; }

  // Guest memory the way the library sees it: page-table walk from vCPU 0's CR3 as it is now.
  std::unique_ptr<mem::GuestMemory> memory_view() { return memory_view_over(dom, *source); }
  // The same for another domain `d` on the host (one the test created), read through this
  // Dom0 handle; its frame source lives as long as this fixture.
  std::unique_ptr<mem::GuestMemory> memory_view(DomId d) {
    if (d == dom) return memory_view();
    other_sources_.push_back(std::make_unique<mem::HypervisorFrameSource>(*hv, d));
    return memory_view_over(d, *other_sources_.back());
  }

 private:
  std::vector<std::unique_ptr<mem::HypervisorFrameSource>> other_sources_;

  std::unique_ptr<mem::GuestMemory> memory_view_over(DomId d, mem::HypervisorFrameSource& src) {
    auto gm = std::make_unique<mem::GuestMemory>(src);
    auto info = hv->domain_info(d);
    auto regs = hv->get_vcpu_regs(d, VcpuId{0});
    if (!info || !regs) throw std::runtime_error("cannot read domain state");
    auto ctx = mem::paging_context(*info, *regs);
    if (!ctx) throw std::runtime_error(ctx.error().what);
    gm->set_context(*ctx);
    return gm;
  }
};

// The demo guest probed through a Session, created paused so that probes are in place before
// it runs. On the guest channel the module's clock is manual (SimOptions::manual_clock): no hit
// times out because the machine is loaded while the test's Dom0 serves it; a test that leaves
// the guest to its module says so (finish_without_dom0, let_module_time_pass).
class SessionGuest : public DemoGuest {
 public:
  // What the guest does before the session sees it (e.g. what its module publishes).
  using BeforeAttach = std::function<void(hv::sim::SimHost&, DomId)>;

  ChannelKind channel;
  std::vector<std::uint8_t> text_before;  // the guest's core text before the session saw it
  std::unique_ptr<Session> session;

  // `so.channel` picks the channel; `cfg`'s guest type must suit it (demo_config). Unless
  // `load_symbols` is false, the demo guest's System.map is loaded, which attaches the domain
  // (its channel, and the guardian with it).
  SessionGuest(hv::sim::DomainConfig cfg, hv::sim::SimOptions opts, const SessionOptions& so, bool load_symbols = true,
               const BeforeAttach& before_attach = {})
      : DemoGuest(created_paused(std::move(cfg)), with_manual_clock(so.channel, opts)), channel(so.channel) {
    text_before = text();
    if (before_attach) before_attach(*host, dom);
    auto s = Session::open(host->open(), so);
    if (!s) throw std::runtime_error(s.error().what);
    session = std::move(*s);
    if (load_symbols)
      if (auto l = session->load_symbols(dom, demo_map()); !l) throw std::runtime_error(l.error().what);
  }

  hv::Hypervisor& dom0() override { return session->hypervisor(); }

  // Runs the session's loop until the workload has finished (true) or something went wrong.
  bool run_to_completion(std::chrono::milliseconds timeout = kHangGuard) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      auto r = session->run_once(2);
      if (!r) {
        ADD_FAILURE() << "run_once: " << r.error().what;
        return false;
      }
      if (crashed()) return false;
      if (halted()) return true;
    }
    return false;
  }

  // Waits for the workload to end once no Dom0 serves the guest any more (the session is gone
  // or never answers): on the guest channel its module's waits for Dom0 run out as the clock
  // advances, 100 ms at a time.
  bool finish_without_dom0(std::chrono::milliseconds timeout) {
    if (channel != ChannelKind::Guest) return host->wait_halted(dom, timeout);
    return advance_until_halted(100ms, timeout);
  }

  // Lets `d` of the guest module's time pass (guest channel; elsewhere nothing). A hit whose
  // answer Dom0 wrote but could not notify (a fault injected into evtchn_notify) is taken up
  // when its wait ends, as a real module's SCHEDOP_poll times out and finds the answer.
  void let_module_time_pass(std::chrono::milliseconds d) {
    if (channel == ChannelKind::Guest) advance(d);
  }

 private:
  static hv::sim::DomainConfig created_paused(hv::sim::DomainConfig c) {
    c.start_paused = true;
    return c;
  }
  static hv::sim::SimOptions with_manual_clock(ChannelKind k, hv::sim::SimOptions o) {
    if (k == ChannelKind::Guest) o.manual_clock = true;
    return o;
  }
};

}  // namespace xenprobes::testing
