// Guest-channel tests: the Dom0 side (channel/guest.hpp) over the simulated Xen, whose guest
// module (hv/sim/sim_module.cpp) plays the other side of include/xenprobes/protocol.h.
//
// The module's clock is manual here (SimOptions::manual_clock): a hit times out only when a
// test advances the clock past its timeout, never because the machine is loaded. A test that
// expects the module to give up on Dom0 says when (advance, advance_until).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "channel/event_ports.hpp"
#include "channel/guest.hpp"
#include "demo_guest.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {

using channel::TrapEntry;

// Created paused, so traps are in place before the guest runs.
inline hv::sim::DomainConfig guest_config(unsigned vcpus, std::uint64_t iterations, unsigned timeout_ms = 10000) {
  hv::sim::DomainConfig c;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.start_paused = true;
  c.module_timeout_ms = timeout_ms;
  return c;
}

// A host whose guest module's clock moves only when the test advances it.
inline hv::sim::SimOptions manual_clock() {
  hv::sim::SimOptions o;
  o.manual_clock = true;
  return o;
}

// protocol.h, "The claim bound": how long the module waits for a hit Dom0 claimed.
inline std::chrono::milliseconds claim_bound(unsigned timeout_ms) {
  return std::chrono::milliseconds(std::max<std::uint64_t>(
      timeout_ms, std::min<std::uint64_t>(XENPROBES_CLAIM_FACTOR * std::uint64_t{timeout_ms}, XENPROBES_CLAIM_MAX_MS)));
}

// A StopSink standing in for the engine: the traps it owns, what each hit does.
struct FakeSink : channel::StopSink {
  struct Probe {
    std::function<void(channel::Stop&)> on_hit;  // edits the registers for the resume
    channel::Verdict verdict = channel::Verdict::Resume;
    std::uint64_t hits = 0;
    std::map<unsigned, std::uint64_t> per_vcpu;
  };
  std::map<std::uint64_t, Probe> probes;  // by trap address
  std::uint64_t unknown = 0, failures = 0, total = 0;
  std::function<void(channel::Stop&)> observer;  // sees every stop first

  bool owns_trap(DomId, Gva a) const override { return probes.contains(a.value); }
  channel::Verdict on_stop(channel::Stop& s) override {
    ++total;
    EXPECT_EQ(s.regs.rip, s.trap.value) << "a stop is reported with rip on the trap byte";
    if (observer) observer(s);
    auto it = probes.find(s.trap.value);
    if (it == probes.end()) {
      ++unknown;
      return channel::Verdict::NotOurs;
    }
    ++it->second.hits;
    ++it->second.per_vcpu[s.vcpu.value];
    if (it->second.on_hit) it->second.on_hit(s);
    return it->second.verdict;
  }
  void on_channel_failure(DomId, const Error&) override { ++failures; }

  // The common case: skip an instruction of `len` bytes (the ftrace nop5 at function entry).
  Probe& skip(std::uint64_t addr, unsigned len = 5) {
    auto& p = probes[addr];
    p.on_hit = [len](channel::Stop& s) { s.regs.rip = s.trap.value + len; };
    return p;
  }
};

// A demo guest, a Dom0 handle with its GuestMemory and a guest channel on that handle.
struct ChannelGuest : Dom0Guest {
  std::unique_ptr<mem::GuestMemory> memory;
  std::unique_ptr<channel::GuestChannel> ch;
  unsigned max_batch = 0;  // most stops one process() handled

  explicit ChannelGuest(const hv::sim::DomainConfig& cfg, const hv::sim::SimOptions& opts = manual_clock())
      : Dom0Guest(cfg, opts), memory(memory_view()), ch(std::make_unique<channel::GuestChannel>(*hv)) {}

  void attach() {
    auto r = ch->attach(dom);
    if (!r) throw std::runtime_error(r.error().what);
  }

  // The control area as the module laid it out (read through the sim, not the channel).
  xenprobes_ctl_header header() {
    xenprobes_ctl_header h{};
    peek_into(layout.control_addr, std::as_writable_bytes(std::span(&h, 1)));
    return h;
  }
  xenprobes_mailbox mailbox(unsigned v) {
    xenprobes_mailbox m{};
    const auto h = header();
    peek_into(layout.control_addr + h.mailbox_offset + v * sizeof m, std::as_writable_bytes(std::span(&m, 1)));
    return m;
  }
  // The module's return table, every entry (read through the sim).
  std::vector<xenprobes_ret> return_table() {
    const auto h = header();
    return peek_array<xenprobes_ret>(layout.control_addr + h.ret_offset, h.ret_capacity);
  }

  // The control area mapped through handle `h` (as Dom0 maps it), so a test can compare-and-
  // swap a mailbox's state the way the module or the channel does. Keep the mapping alive
  // while using the words it gives.
  hv::ForeignMapping map_control(hv::Hypervisor& h) {
    std::vector<Frame> frames;
    for (std::uint64_t off = 0; off < layout.control_size; off += 4096) {
      auto t = memory->translate(Gva{layout.control_addr + off});
      if (!t) throw std::runtime_error(t.error().what);
      frames.push_back(t->frame());
    }
    auto m = h.map_frames(dom, frames, hv::MapAccess::ReadWrite);
    if (!m) throw std::runtime_error(m.error().what);
    return std::move(*m);
  }
  static std::atomic_ref<std::uint32_t> mailbox_word(const hv::ForeignMapping& m, const xenprobes_ctl_header& h,
                                                     unsigned v, std::size_t field) {
    return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(
        m.data() + h.mailbox_offset + std::size_t{v} * sizeof(xenprobes_mailbox) + field));
  }
  unsigned mailboxes_in(std::uint32_t state, unsigned vcpus) {
    unsigned n = 0;
    for (unsigned v = 0; v < vcpus; ++v) n += mailbox(v).state == state;
    return n;
  }

  // What the engine does to arm a trap: with the domain paused, the table entry, then the byte.
  TrapEntry arm(std::uint64_t addr, TrapEntry::Fallback fb, std::uint64_t resume_at = 0) {
    auto insn = x86::decode(peek(addr, 15), Gva{addr});
    if (!insn) throw std::runtime_error(insn.error().what);
    TrapEntry e;
    e.addr = Gva{addr};
    e.fallback = fb;
    e.resume_at = Gva{resume_at};
    e.len = insn->length;
    std::copy_n(insn->bytes.begin(), insn->length, e.insn);
    if (!hv->pause(dom)) throw std::runtime_error("pause");
    auto r = ch->trap_added(dom, e);
    if (!r) throw std::runtime_error(r.error().what);
    std::uint8_t cc = 0xcc;
    if (!memory->write(Gva{addr}, std::as_bytes(std::span(&cc, 1)))) throw std::runtime_error("write");
    if (!hv->unpause(dom)) throw std::runtime_error("unpause");
    return e;
  }
  TrapEntry arm_skip(const char* fn) {  // the ftrace nop5 at a function's entry, skipped
    const std::uint64_t a = sym(fn);
    EXPECT_EQ(peek(a, 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00})) << fn;
    return arm(a, TrapEntry::Fallback::ResumeAt, a + 5);
  }

  // What the session's event loop does with the ports fired on the handle: reads and unmasks
  // them (the channel leaves that to the loop, channel/event_ports.hpp).
  void acknowledge() {
    channel::EventPorts ports(*hv);
    channel::Channel* c = ch.get();
    std::vector<channel::EventPorts::Wake> woken;
    auto r = ports.take(std::span(&c, 1), woken);
    EXPECT_TRUE(r.has_value()) << r.error().what;
  }

  // One round of the event loop: wait for the channel's fd, acknowledge, then process.
  unsigned pump(channel::StopSink& sink, int timeout_ms = 2) {
    pollfd p{ch->fd(), POLLIN, 0};
    (void)::poll(&p, 1, timeout_ms);
    acknowledge();
    auto r = ch->process(sink);
    EXPECT_TRUE(r.has_value()) << r.error().what;
    unsigned n = r ? *r : 0;
    max_batch = std::max(max_batch, n);
    return n;
  }
  bool pump_until(channel::StopSink& sink, const std::function<bool()>& pred, std::chrono::milliseconds timeout = 30s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      pump(sink);
      if (crashed()) return false;
    }
    return pred();
  }
  bool run_to_completion(channel::StopSink& sink, std::chrono::milliseconds timeout = 60s) {
    return pump_until(
        sink, [&] { return halted(); }, timeout);
  }

  // Dom0 goes away without a word: the channel (unbinding its ports) and the handle close.
  // What kill -9 of the Dom0 process leaves: no detach, no release (protocol.h "Letting go"),
  // its port and mappings gone.
  void kill_dom0() {
    if (ch) ch->abandon();
    ch.reset();
    memory.reset();
    source.reset();
    hv.reset();
  }
};

// The xenstore path of the module's key `k` (protocol.h, XENPROBES_XS_DIR).
inline std::string key(ChannelGuest& g, const char* k) {
  return "/local/domain/" + std::to_string(g.dom.value) + "/" XENPROBES_XS_DIR "/" + k;
}

// Whether vCPU 0's mailbox comes to hold hit number `seq` in state HIT (waiting for it).
inline bool hit_with_seq(ChannelGuest& g, std::uint32_t seq) {
  return eventually([&] { return g.mailbox(0).state == XENPROBES_MBOX_HIT && g.mailbox(0).seq == seq; });
}

}  // namespace xenprobes::testing
