// The control area is guest memory: a hostile guest writes anything there at any time. Dom0
// must neither crash nor write outside the area, whatever the header, the mailboxes and the
// tables hold; and the simulated module must survive whatever Dom0 writes into its tables.
#include <atomic>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "guestch/guestch_fixture.hpp"

namespace xenprobes::testing {
namespace {

using channel::GuestChannel;

// Guest RAM through the direct map, minus [skip_first, skip_end).
std::vector<std::uint8_t> ram_outside(ChannelGuest& g, std::uint64_t ram_bytes, std::uint64_t skip_first,
                                      std::uint64_t skip_end) {
  auto all = g.peek(g.layout.physmap_base, ram_bytes);
  std::fill(all.begin() + static_cast<std::ptrdiff_t>(skip_first), all.begin() + static_cast<std::ptrdiff_t>(skip_end),
            0);
  return all;
}

// An HVM guest (frames are GFNs, so the area's place in RAM is its translation), paused for
// good: the only writers of guest memory are the "guest" (this test) and the channel.
struct FuzzGuest : ChannelGuest {
  static constexpr std::uint64_t kRamMb = 64;
  static hv::sim::DomainConfig cfg() {
    auto c = guest_config(2, 1);
    c.type = hv::GuestType::Hvm;
    c.ram_mb = kRamMb;
    return c;
  }
  FuzzGuest() : ChannelGuest(cfg()) {
    auto t = memory->translate(Gva{layout.control_addr});
    if (!t) throw std::runtime_error(t.error().what);
    area_gpa = t->address.value;
    good = header();
  }
  std::vector<std::uint8_t> snapshot() {
    return ram_outside(*this, kRamMb << 20, area_gpa, area_gpa + layout.control_size);
  }
  void write_area(std::uint64_t off, std::span<const std::uint8_t> b) {
    ASSERT_TRUE(memory->write(Gva{layout.control_addr + off}, std::as_bytes(b)));
  }
  template <typename T>
  void write_area_as(std::uint64_t off, const T& v) {
    write_area(off, std::span(reinterpret_cast<const std::uint8_t*>(&v), sizeof v));
  }
  std::uint64_t area_gpa = 0;
  xenprobes_ctl_header good{};
};

std::uint32_t interesting(std::mt19937_64& rng, std::uint32_t orig, std::uint32_t size) {
  const std::uint32_t vals[] = {0,          1,          7,          8,          135,      136,      224,
                                256,        4095,       4096,       size - 8,   size - 1, size,     size + 8,
                                0x7fffffff, 0x80000000, 0xfffffff8, 0xffffffff, orig - 8, orig + 8, orig - 1};
  if (rng() % 4 == 0) return static_cast<std::uint32_t>(rng());
  return vals[rng() % std::size(vals)];
}

TEST(GuestChannelFuzz, HostileHeadersAtAttach) {
  FuzzGuest g;
  const auto before = g.snapshot();
  std::mt19937_64 rng(0x5eed);
  FakeSink sink;
  const std::uint32_t size = static_cast<std::uint32_t>(g.layout.control_size);
  unsigned accepted = 0, refused = 0;
  for (int i = 0; i < 1500; ++i) {
    xenprobes_ctl_header h = g.good;
    auto* words = reinterpret_cast<std::uint32_t*>(&h);
    const unsigned changes = 1 + rng() % 3;
    for (unsigned c = 0; c < changes; ++c) {
      const unsigned w = rng() % 12;  // the u32 fields up to dom0_polling
      words[w] = interesting(rng, words[w], size);
    }
    if (rng() % 10 == 0)  // or plain noise
      for (unsigned b = 0; b < sizeof h; ++b) reinterpret_cast<std::uint8_t*>(&h)[b] = static_cast<std::uint8_t>(rng());
    g.write_area_as(0, h);
    GuestChannel ch(*g.hv);
    auto r = ch.attach(g.dom);
    if (!r) {
      ++refused;
      EXPECT_TRUE(r.error().code == Errc::InvalidArgument || r.error().code == Errc::Busy) << r.error().what;
      continue;
    }
    ++accepted;
    // Accepted (a layout that is valid, if not the module's): use it, with noise in it.
    std::vector<std::uint8_t> noise(size);
    for (auto& b : noise) b = static_cast<std::uint8_t>(rng());
    g.write_area(sizeof h, std::span(noise).subspan(sizeof h));
    TrapEntry e;
    e.addr = Gva{0xffffffff81000000ull + rng() % 4096};
    e.fallback = TrapEntry::Fallback::Emulate;
    e.len = 1;
    e.insn[0] = 0xc3;  // ret: a form the module can emulate (the channel refuses others)
    sink.probes[e.addr.value];
    (void)ch.trap_added(g.dom, e);
    (void)ch.return_added(g.dom, Gva{0xffff888000100000ull}, Gva{0xffffffff81000000ull});
    ASSERT_TRUE(ch.process(sink));
    ASSERT_TRUE(ch.flush(g.dom, sink));
    ch.trap_removed(g.dom, e.addr);
    ASSERT_TRUE(ch.detach(g.dom));
  }
  g.write_area_as(0, g.good);
  EXPECT_GT(accepted, 10u);
  EXPECT_GT(refused, 1000u);
  EXPECT_TRUE(g.snapshot() == before) << "Dom0 wrote outside the control area";
  // The real header still attaches afterwards (no port left bound by a refusal).
  g.attach();
}

TEST(GuestChannelFuzz, HostileMailboxesAndTables) {
  FuzzGuest g;
  g.attach();
  const auto before = g.snapshot();
  const auto& h = g.good;
  std::mt19937_64 rng(42);
  FakeSink sink;
  std::set<std::uint64_t> table;
  for (unsigned i = 0; i < 6; ++i) {  // traps in the table (no bytes written: the guest never runs)
    TrapEntry e;
    e.addr = Gva{0xffffffff81001000ull + i * 0x40};
    e.fallback = TrapEntry::Fallback::ResumeAt;
    e.resume_at = Gva{e.addr.value + 1};
    e.len = 1;
    ASSERT_TRUE(g.ch->trap_added(g.dom, e));
    table.insert(e.addr.value);
    if (i % 2) sink.probes[e.addr.value];  // some also owned by the "engine"
  }
  const std::uint64_t owned_only = 0xffffffffa0000100ull;  // a disarmed trap the engine still owns
  sink.probes[owned_only];
  std::uint64_t handled = 0, bad_stops = 0;
  sink.observer = [&](channel::Stop& s) {
    ++handled;
    if (!table.contains(s.trap.value) && !sink.probes.contains(s.trap.value)) ++bad_stops;
    if (s.vcpu.value >= 2) ++bad_stops;
    if (rng() % 3 == 0) s.regs.rax = rng();  // handlers change registers
    s.regs.rip = rng() % 2 ? s.trap.value + 1 : rng();
  };
  for (auto& [a, p] : sink.probes)
    if (rng() % 2) p.verdict = channel::Verdict::NotOurs;

  auto pick_trap = [&]() -> std::uint64_t {
    switch (rng() % 4) {
      case 0: return rng();
      case 1: return owned_only;
      default: {
        auto it = table.begin();
        std::advance(it, rng() % table.size());
        return *it;
      }
    }
  };
  std::uint64_t answered_checked = 0;
  for (int i = 0; i < 20000; ++i) {
    const unsigned v = rng() % 2;
    const std::uint64_t mb = h.mailbox_offset + v * sizeof(xenprobes_mailbox);
    switch (rng() % 8) {
      case 0: {  // noise anywhere in the area, the header included
        std::vector<std::uint8_t> noise(1 + rng() % 64);
        for (auto& b : noise) b = static_cast<std::uint8_t>(rng());
        const std::uint64_t off = rng() % (g.layout.control_size - noise.size());
        g.write_area(off, noise);
        break;
      }
      case 1:  // the table changes under the guest's writes
        if (rng() % 2) {
          TrapEntry e;
          e.addr = Gva{0xffffffff81001000ull + (rng() % 8) * 0x40};
          e.fallback = TrapEntry::Fallback::Emulate;
          e.len = 2;
          e.insn[0] = 0xeb;  // jmp .+2: a form the module can emulate
          if (g.ch->trap_added(g.dom, e)) table.insert(e.addr.value);
        } else if (table.size() > 1) {
          const std::uint64_t a = *table.begin();
          g.ch->trap_removed(g.dom, Gva{a});
          table.erase(a);
        }
        break;
      case 2:
        (void)g.ch->return_added(g.dom, Gva{rng() | 1}, Gva{rng()});
        g.ch->return_removed(g.dom, Gva{rng()});
        break;
      default: {  // a mailbox: mostly plausible hits, sometimes garbage
        xenprobes_mailbox m{};
        for (unsigned b = 0; b < sizeof m; ++b)
          reinterpret_cast<std::uint8_t*>(&m)[b] = static_cast<std::uint8_t>(rng());
        m.state = rng() % 4 ? XENPROBES_MBOX_HIT : static_cast<std::uint32_t>(rng() % 6);
        m.trap = pick_trap();
        if (rng() % 4) m.regs.rip = m.trap;
        g.write_area_as(mb, m);
        auto r = rng() % 2 ? g.ch->process(sink) : g.ch->flush(g.dom, sink);
        ASSERT_TRUE(r) << r.error().what;
        // An answer is exactly: DONE, answer_seq = seq; anything not answered is untouched.
        xenprobes_mailbox after{};
        g.peek_into(g.layout.control_addr + mb, std::as_writable_bytes(std::span(&after, 1)));
        if (after.state == XENPROBES_MBOX_DONE && m.state == XENPROBES_MBOX_HIT) {
          EXPECT_EQ(after.answer_seq, m.seq);
          EXPECT_EQ(after.seq, m.seq);
          EXPECT_EQ(after.trap, m.trap);
          EXPECT_EQ(after.regs.cs, m.regs.cs);
          ++answered_checked;
        } else {
          EXPECT_EQ(std::memcmp(&after, &m, sizeof m), 0) << "an unanswered mailbox was written";
        }
        break;
      }
    }
  }
  EXPECT_EQ(bad_stops, 0u);
  EXPECT_GT(handled, 1000u);
  EXPECT_GT(answered_checked, 1000u);
  EXPECT_GT(g.ch->stats(g.dom).rejected, 1000u);
  EXPECT_TRUE(g.snapshot() == before) << "Dom0 wrote outside the control area";
  ASSERT_TRUE(g.ch->detach(g.dom));
}

TEST(GuestChannelFuzz, TheGuestScribblesWhileDom0Reads) {
  // A writer racing the reader: every field Dom0 uses is read once, so whatever it sees it
  // stays inside the area and never hands the engine a stop that fails its own checks.
  FuzzGuest g;
  g.attach();
  const auto before = g.snapshot();
  FakeSink sink;
  TrapEntry e;
  e.addr = Gva{0xffffffff81002000ull};
  e.fallback = TrapEntry::Fallback::Emulate;
  e.len = 1;
  e.insn[0] = 0xc3;  // ret: a form the module can emulate (the channel refuses others)
  ASSERT_TRUE(g.ch->trap_added(g.dom, e));
  sink.probes[e.addr.value];
  std::atomic<bool> stop{false};
  const mem::PagingContext ctx = g.memory->context();
  std::thread guest([&] {
    auto hv = g.host->open();
    mem::HypervisorFrameSource src(*hv, g.dom);
    mem::GuestMemory gm(src);
    gm.set_context(ctx);
    std::mt19937_64 rng(3);
    while (!stop) {
      xenprobes_mailbox m{};
      m.state = XENPROBES_MBOX_HIT;
      m.seq = static_cast<std::uint32_t>(rng());
      m.trap = rng() % 2 ? e.addr.value : rng();
      m.regs.rip = rng() % 2 ? m.trap : rng();
      const unsigned v = rng() % 2;
      (void)gm.write_as(Gva{g.layout.control_addr + g.good.mailbox_offset + v * sizeof m}, m);
    }
  });
  std::uint64_t stops = 0;
  sink.observer = [&](channel::Stop& s) {
    ++stops;
    EXPECT_EQ(s.trap.value, e.addr.value);
  };
  auto end = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < end) ASSERT_TRUE(g.ch->process(sink));
  stop = true;
  guest.join();
  EXPECT_GT(stops, 0u);
  EXPECT_TRUE(g.snapshot() == before) << "Dom0 wrote outside the control area";
}

TEST(GuestChannelFuzz, TheGuestFlipsStatesAtRandom) {
  // A guest writing any state value at any moment (CLAIMED, DONE, garbage, HIT again) while Dom0
  // claims, runs handlers and answers: Dom0 stays inside the area, and every handler it runs
  // is for a hit it claimed, so each ends in exactly one answer or one late drop.
  FuzzGuest g;
  g.attach();
  const auto before = g.snapshot();
  FakeSink sink;
  TrapEntry e;
  e.addr = Gva{0xffffffff81002000ull};
  e.fallback = TrapEntry::Fallback::Emulate;
  e.len = 1;
  e.insn[0] = 0xc3;  // ret: a form the module can emulate (the channel refuses others)
  ASSERT_TRUE(g.ch->trap_added(g.dom, e));
  sink.probes[e.addr.value];
  std::atomic<bool> stop{false};
  std::thread guest([&] {
    auto hv = g.host->open();
    const hv::ForeignMapping map = g.map_control(*hv);
    std::mt19937_64 rng(17);
    while (!stop) {
      const unsigned v = rng() % 2;
      auto state = ChannelGuest::mailbox_word(map, g.good, v, offsetof(xenprobes_mailbox, state));
      if (rng() % 4 == 0) {  // a plausible hit
        xenprobes_mailbox m{};
        m.seq = static_cast<std::uint32_t>(rng());
        m.trap = e.addr.value;
        m.regs.rip = m.trap;
        std::memcpy(map.data() + g.good.mailbox_offset + v * sizeof m + offsetof(xenprobes_mailbox, seq), &m.seq,
                    sizeof m - offsetof(xenprobes_mailbox, seq));
        state.store(XENPROBES_MBOX_HIT, std::memory_order_release);
      } else {
        const std::uint32_t vals[] = {XENPROBES_MBOX_IDLE,
                                      XENPROBES_MBOX_HIT,
                                      XENPROBES_MBOX_DONE,
                                      XENPROBES_MBOX_ABANDONED,
                                      XENPROBES_MBOX_CLAIMED,
                                      5,
                                      static_cast<std::uint32_t>(rng())};
        state.store(vals[rng() % std::size(vals)]);
      }
    }
  });
  std::uint64_t stops = 0;
  sink.observer = [&](channel::Stop& s) {
    ++stops;
    EXPECT_EQ(s.trap.value, e.addr.value);
    s.regs.rip = s.trap.value + 1;
  };
  auto end = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < end) ASSERT_TRUE(g.ch->process(sink));
  stop = true;
  guest.join();
  const auto st = g.ch->stats(g.dom);
  EXPECT_GT(stops, 0u);
  EXPECT_EQ(stops, st.answered + st.late) << "a handler ran without a claim";
  EXPECT_TRUE(g.snapshot() == before) << "Dom0 wrote outside the control area";
}

TEST(GuestChannelFuzz, AModuleRacingDom0) {
  // This thread plays the module, racing Dom0 on one mailbox and publishing the next hit at
  // once. Each hit, at random: races the claim (a timeout of a few microseconds), waits for the
  // answer, or lets Dom0 claim it and then gives it up at once (an expired claim: the module
  // abandons it while the handlers run; some handlers wait for exactly that). Dom0 must never
  // run a handler for a hit the module abandoned unclaimed (its writes would land on a stack
  // that moved on), never hand a handler registers that are not the module's for that hit (a
  // late answer's registers landing on the next hit), and every answer the module takes must
  // be Dom0's for that very hit.
  //
  // Claims expire on every machine, however loaded: half the hits of the third kind are
  // "held" (rcx says so): Dom0's handler keeps its claim, with no time limit, until the
  // module gives it up, and the module waits for that claim until Dom0 has had a whole look
  // at the mailbox (a process() begun after the hit was published) rather than for a time.
  // Each held claim is then an expired claim, which Dom0 must find late. (With only real-time
  // bounds, a loaded machine that ran the two threads by turns saw 0 claims expire in 10 s:
  // the module never ran while Dom0 held a claim, Dom0's slow handler gave up after 1 ms.)
  // The other hits race as before: a random bound after the claim, quick or slow handlers.
  FuzzGuest g;
  g.attach();
  const auto before = g.snapshot();
  TrapEntry e;
  e.addr = Gva{0xffffffff81003000ull};
  e.fallback = TrapEntry::Fallback::Emulate;
  e.len = 1;
  e.insn[0] = 0xc3;  // ret: a form the module can emulate (the channel refuses others)
  ASSERT_TRUE(g.ch->trap_added(g.dom, e));
  FakeSink sink;
  sink.probes[e.addr.value];
  // A hit's registers carry its seq (rbx) and a checksum of it (rax); Dom0's answers carry
  // another checksum, and rip = the trap (as a NotOurs answer does), so that a late answer's
  // registers look like a hit to every other check.
  auto hit_sum = [](std::uint64_t seq) { return seq * 0x9e3779b97f4a7c15ull; };
  auto answer_sum = [](std::uint64_t seq) { return ~(seq * 0x9e3779b97f4a7c15ull); };
  auto dom0_hv = g.host->open();
  const hv::ForeignMapping dom0_view = g.map_control(*dom0_hv);
  auto dom0_state = ChannelGuest::mailbox_word(dom0_view, g.good, 0, offsetof(xenprobes_mailbox, state));
  std::set<std::uint32_t> handled;
  std::uint64_t foreign_regs = 0, held_claims = 0;
  constexpr std::uint64_t kHeld = 0x4e4c44;  // rcx of a held hit
  std::atomic<std::uint64_t> looks{0};       // process() calls Dom0 finished
  std::mt19937_64 dom0_rng(23);
  sink.observer = [&](channel::Stop& s) {
    if (s.regs.rax != hit_sum(s.regs.rbx)) ++foreign_regs;
    handled.insert(static_cast<std::uint32_t>(s.regs.rbx));
    const bool held = s.regs.rcx == kHeld;
    s.regs.rax = answer_sum(s.regs.rbx);
    s.regs.rip = s.trap.value;
    if (held) {  // until the module gives the claim up, however long that takes
      ++held_claims;
      while (dom0_state.load() == XENPROBES_MBOX_CLAIMED) {}
      return;
    }
    // A slow handler (until the module gives up on it, 1 ms at most), or a quick one.
    const bool slow = dom0_rng() % 2;
    const auto until = std::chrono::steady_clock::now() +
                       (slow ? std::chrono::microseconds(1000) : std::chrono::microseconds(dom0_rng() % 50));
    while (std::chrono::steady_clock::now() < until && (!slow || dom0_state.load() == XENPROBES_MBOX_CLAIMED)) {}
  };

  std::atomic<bool> stop{false};
  std::vector<std::uint32_t> abandoned_unclaimed;
  std::atomic<std::uint64_t> taken{0}, unclaimed{0}, claims_expired{0};
  std::uint64_t wrong_answers = 0;
  std::thread module([&] {
    auto hv = g.host->open();
    const hv::ForeignMapping map = g.map_control(*hv);
    std::byte* mb = map.data() + g.good.mailbox_offset;  // vCPU 0
    auto state = ChannelGuest::mailbox_word(map, g.good, 0, offsetof(xenprobes_mailbox, state));
    auto seq_w = ChannelGuest::mailbox_word(map, g.good, 0, offsetof(xenprobes_mailbox, seq));
    auto answer_w = ChannelGuest::mailbox_word(map, g.good, 0, offsetof(xenprobes_mailbox, answer_seq));
    std::atomic_ref<std::uint64_t> trap_w(*reinterpret_cast<std::uint64_t*>(mb + offsetof(xenprobes_mailbox, trap)));
    std::mt19937_64 rng(5);
    for (std::uint32_t seq = 1; !stop; ++seq) {
      const unsigned mode = rng() % 3;  // 0: race the claim, 1: wait for the answer, 2: expire the claim
      const bool held = mode == 2 && rng() % 2;
      // Step 1 in the module's order: seq, trap, regs, then state (release).
      seq_w.store(seq, std::memory_order_relaxed);
      trap_w.store(e.addr.value, std::memory_order_relaxed);
      xenprobes_regs r{};
      r.rip = e.addr.value;
      r.rbx = seq;
      r.rax = hit_sum(seq);
      r.rcx = held ? kHeld : 0;
      std::memcpy(mb + offsetof(xenprobes_mailbox, regs), &r, sizeof r);
      state.store(XENPROBES_MBOX_HIT, std::memory_order_release);
      const auto t0 = std::chrono::steady_clock::now();
      const std::uint64_t looks_at_publish = looks.load();  // read after the HIT is visible
      // Mode 0 races for a time; 1 and 2 wait until Dom0 has looked and not claimed (refused).
      const std::chrono::microseconds timeout(mode == 0 ? rng() % 60 : 0);
      const std::chrono::microseconds bound(mode == 2 ? rng() % 50 : 50000);  // after the claim is seen
      std::optional<std::chrono::steady_clock::time_point> claimed;
      while (!stop) {
        const std::uint32_t st = state.load(std::memory_order_acquire);
        if (st == XENPROBES_MBOX_DONE && answer_w.load() == seq) {
          xenprobes_regs a;
          std::memcpy(&a, mb + offsetof(xenprobes_mailbox, regs), sizeof a);
          if (a.rbx != seq || a.rax != answer_sum(seq)) ++wrong_answers;
          state.store(XENPROBES_MBOX_IDLE, std::memory_order_release);
          ++taken;
          break;
        }
        const auto now = std::chrono::steady_clock::now();
        if (st == XENPROBES_MBOX_CLAIMED && !claimed) claimed = now;
        // A look begun after the publication (two finished since) saw this HIT.
        const bool timed_out = mode == 0 ? now - t0 >= timeout : looks.load() >= looks_at_publish + 2;
        if ((st == XENPROBES_MBOX_HIT && timed_out) || (st == XENPROBES_MBOX_CLAIMED && now - *claimed >= bound)) {
          std::uint32_t expected = st;
          if (state.compare_exchange_strong(expected, XENPROBES_MBOX_ABANDONED, std::memory_order_acq_rel)) {
            if (st == XENPROBES_MBOX_HIT) {
              abandoned_unclaimed.push_back(seq);
              ++unclaimed;
            } else {
              ++claims_expired;
            }
            break;
          }
        }
      }
    }
  });
  // Until every kind of race happened often enough (or 10 s on a machine under load), the
  // rarest being the module abandoning a hit between Dom0's look at it and its claim.
  const auto start = std::chrono::steady_clock::now();
  auto enough = [&] {
    return std::chrono::steady_clock::now() - start >= 1s && taken >= 100 && unclaimed >= 100 &&
           claims_expired >= 100 && g.ch->stats(g.dom).abandoned >= 5;
  };
  while (std::chrono::steady_clock::now() - start < 10s && !enough()) {
    ASSERT_TRUE(g.ch->process(sink));
    ++looks;
  }
  stop = true;
  module.join();

  for (std::uint32_t seq : abandoned_unclaimed) EXPECT_FALSE(handled.contains(seq)) << "hit " << seq;
  EXPECT_EQ(foreign_regs, 0u) << "a handler got registers that were not its hit's";
  EXPECT_EQ(wrong_answers, 0u);
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(sink.total, st.answered + st.late);
  EXPECT_GE(st.answered, taken);
  EXPECT_LE(st.answered, taken + 1);  // the last answer may not have been taken up
  EXPECT_GE(st.late, claims_expired);
  // Each kind of race happened.
  EXPECT_GT(taken, 0u);
  EXPECT_GT(unclaimed, 0u);
  EXPECT_GT(claims_expired, 0u);
  EXPECT_GT(held_claims, 0u) << "Dom0 claimed no held hit";
  EXPECT_GE(claims_expired, held_claims) << "every claim Dom0 held until the module gave it up expired";
  std::cout << "racing module: " << taken << " answers taken, " << unclaimed << " hits abandoned unclaimed, "
            << claims_expired << " claims expired (" << held_claims << " held); Dom0: " << st.answered << " answered, "
            << st.late << " late, " << st.abandoned << " claims lost, " << st.rejected << " refused\n";
  EXPECT_TRUE(g.snapshot() == before) << "Dom0 wrote outside the control area";
}

TEST(GuestChannelFuzz, TheModuleSurvivesGarbageTables) {
  // The other direction: Dom0 (here: noise) fills the module's tables. The guest may oops on
  // nonsense entries (that is Dom0's to get right); the host never crashes, and a crash has a
  // reason.
  std::mt19937_64 rng(11);
  unsigned crashed = 0, finished = 0;
  for (int round = 0; round < 12; ++round) {
    ChannelGuest g(guest_config(1, 2, 2));
    const std::uint64_t fn = g.sym("sys_open");
    const auto h = g.header();
    std::vector<std::uint8_t> noise(g.layout.control_size - h.trap_offset);
    for (auto& b : noise) b = static_cast<std::uint8_t>(rng());
    ASSERT_TRUE(g.memory->write(Gva{g.layout.control_addr + h.trap_offset}, std::as_bytes(std::span(noise))));
    // One entry for sys_open with random flags and bytes, first in the table; a huge count.
    xenprobes_trap t{};
    for (unsigned b = 0; b < sizeof t; ++b) reinterpret_cast<std::uint8_t*>(&t)[b] = static_cast<std::uint8_t>(rng());
    t.addr = fn;
    if (round % 2) t.flags = 1u << (rng() % 3);
    ASSERT_TRUE(g.memory->write_as(Gva{g.layout.control_addr + h.trap_offset}, t));
    const std::uint32_t count = round % 3 ? 1 : 0xffffffff;
    ASSERT_TRUE(g.memory->write_as(Gva{g.layout.control_addr + offsetof(xenprobes_ctl_header, nr_traps)}, count));
    const std::uint8_t cc = 0xcc;
    ASSERT_TRUE(g.memory->write(Gva{fn}, std::as_bytes(std::span(&cc, 1))));
    g.start();
    // Dom0 never answers: each hit lasts until the module's clock passes its timeout.
    if (g.advance_until_halted(2ms, 20s)) {
      ++finished;
    } else {
      ASSERT_FALSE(g.host->crash_reason(g.dom).empty()) << "neither finished nor crashed";
      ++crashed;
    }
  }
  std::cout << "garbage tables: " << finished << " guests finished, " << crashed << " oopsed\n";
}

}  // namespace
}  // namespace xenprobes::testing
