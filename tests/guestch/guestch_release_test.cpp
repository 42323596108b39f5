// protocol.h "Letting go": Dom0 says it holds the guest module's areas (header.dom0_hold =
// MAPPED, at attach) and that it let go of them (RELEASED, its last write); the module, once
// detached, frees its control area and rings only after the release, or when no Dom0 held
// them, and keeps them (never frees them) otherwise. The simulated module decides with the
// module's own code (guest-module/xp_release.h) and remembers what it freed, so a write of Dom0
// into freed memory shows (SimHost::module_freed_bytes_written).
#include <cstring>

#include "api/session_testing.hpp"
#include "guestch/guestch_fixture.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {
namespace {

using Release = hv::sim::SimHost::ModuleRelease;

std::uint32_t hold_word(ChannelGuest& g) { return g.header().dom0_hold; }

// A Session on the guest channel over the host of `g` (its own Dom0 handle), probing sys_open.
struct Dom0Session {
  std::unique_ptr<Session> session;
  std::optional<Probe> probe;
  std::optional<Probe> async;
  std::uint64_t hits = 0, records = 0;

  explicit Dom0Session(ChannelGuest& g) {
    SessionOptions so{ChannelKind::Guest};
    auto s = Session::open(g.host->open(), so);
    if (!s) throw std::runtime_error(s.error().what);
    session = std::move(*s);
    if (auto l = session->load_symbols(g.dom, demo_map()); !l) throw std::runtime_error(l.error().what);
    auto p = session->probe(g.dom, "sys_open", [this](HitContext&) {
      ++hits;
      return 0;
    });
    if (!p) throw std::runtime_error(p.error().what);
    probe = std::move(*p);
    // An async probe too: Dom0 then maps the rings and writes their tails.
    auto a = session->probe_async(g.dom, "sys_getppid", [this](const AsyncHit&) { ++records; });
    if (!a) throw std::runtime_error(a.error().what);
    async = std::move(*a);
  }
  // The event loop until pred() holds (false after `limit` of real time).
  bool run_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 30s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      auto r = session->run_once(2);
      if (!r) {
        ADD_FAILURE() << "run_once: " << r.error().what;
        return false;
      }
    }
    return true;
  }
};

// ---- the channel on its own ----

TEST(GuestChannelRelease, AttachSaysMappedAndADetachReleasesAfterEmptyingTheTables) {
  ChannelGuest g(guest_config(1, 0));
  EXPECT_EQ(hold_word(g), 0u) << "the module writes 0";
  g.attach();
  EXPECT_EQ(hold_word(g), XENPROBES_DOM0_MAPPED);
  g.arm_skip("sys_open");
  ASSERT_TRUE(g.ch->return_added(g.dom, Gva{0xffff888000001000}, Gva{0xffffffff81000000}));
  ASSERT_EQ(g.header().nr_traps, 1u);
  // release() drops the mapping with its store: a write of the detach after it would fault.
  ASSERT_TRUE(g.ch->detach(g.dom));
  const auto h = g.header();
  EXPECT_EQ(h.dom0_hold, XENPROBES_DOM0_RELEASED);
  EXPECT_EQ(h.nr_traps, 0u);
  for (const auto& e : g.peek_array<xenprobes_trap>(g.layout.control_addr + h.trap_offset, 1))
    EXPECT_EQ(e.addr, 0u) << "the table is emptied before the release";
  for (const auto& r : g.return_table()) EXPECT_EQ(r.slot, 0u);

  // The module detaches later: Dom0 let go, so it frees at once, and nothing writes there after.
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Released);
  EXPECT_EQ(*g.host->module_freed_bytes_written(g.dom), 0u);
  EXPECT_NE(g.host->console(g.dom).find("Dom0 released them: freed"), std::string::npos) << g.host->console(g.dom);
}

TEST(GuestChannelRelease, OnceTheModuleLeavesTheDetachWritesTheReleaseAlone) {
  ChannelGuest g(guest_config(1, 0));
  g.attach();
  g.arm_skip("sys_open");
  ASSERT_TRUE(g.host->module_detach(g.dom));  // closing, `state` removed, its restore pass
  // The detach waits for Dom0: nothing is freed yet, whatever the time.
  auto early = g.host->module_unload(g.dom);
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, Errc::Busy);
  auto area = g.peek(g.layout.control_addr, g.layout.control_size);
  ASSERT_TRUE(g.ch->detach(g.dom));
  auto after = g.peek(g.layout.control_addr, g.layout.control_size);
  const std::size_t at = offsetof(xenprobes_ctl_header, dom0_hold);
  std::uint32_t word;
  std::memcpy(&word, after.data() + at, sizeof word);
  EXPECT_EQ(word, XENPROBES_DOM0_RELEASED);
  std::memcpy(after.data() + at, area.data() + at, sizeof word);
  EXPECT_EQ(after, area) << "the area changed in more than the release word (the module may free it)";
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Released);
}

TEST(GuestChannelRelease, AnAttachToAModuleThatBeganDetachingWritesNothing) {
  // protocol.h "Letting go": the MAPPED store is made paused, after closing was read as 0. The
  // module's closing store and `state` removal are two steps in a real guest: here closing is
  // set and `state` still says ready (the moment between them).
  ChannelGuest g(guest_config(1, 0));
  std::uint64_t one = 1;
  ASSERT_TRUE(g.memory->write(Gva{g.layout.control_addr + offsetof(xenprobes_ctl_header, closing)},
                              std::as_bytes(std::span(&one, 1))));
  const auto area = g.peek(g.layout.control_addr, g.layout.control_size);
  auto r = g.ch->attach(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Busy);
  EXPECT_NE(r.error().what.find("closing"), std::string::npos) << r.error().what;
  EXPECT_EQ(g.peek(g.layout.control_addr, g.layout.control_size), area) << "a byte was written";
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "only the creation's pause is left";
  // Its port was given back: the module sees no Dom0, and frees at once.
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::NoDom0);
}

TEST(GuestChannelRelease, NoDom0EverFreesAtOnce) {
  ChannelGuest g(guest_config(1, 0));
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::NoDom0);
  // The sim's oracle itself: a write into the freed control area is seen.
  auto m = g.map_control(*g.hv);
  std::memset(m.data() + 8, 0x5a, 4);
  EXPECT_EQ(*g.host->module_freed_bytes_written(g.dom), 4u);
}

TEST(GuestChannelRelease, AKilledDom0sAreasAreKeptAtOnce) {
  ChannelGuest g(guest_config(1, 0));
  g.attach();
  g.arm_skip("sys_open");
  g.kill_dom0();  // a killed process says nothing: its port and mappings just go
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);  // no wait: the port was closed without a release
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Killed);
  EXPECT_FALSE(hv::sim::SimHost::frees(*u));
  EXPECT_NE(g.host->console(g.dom).find("kept, not freed"), std::string::npos) << g.host->console(g.dom);
}

TEST(GuestChannelRelease, AHungDom0sAreasAreKeptOnceTheWaitRunsOut) {
  ChannelGuest g(guest_config(1, 0));
  ASSERT_TRUE(g.host->set_module_release_wait(g.dom, 200ms));
  g.attach();  // and then never looks again: a Dom0 stopped or hung
  g.start();   // (the module's clock moves for a running guest)
  ASSERT_TRUE(g.host->module_detach(g.dom));
  g.advance(199ms);
  auto early = g.host->module_unload(g.dom);
  ASSERT_FALSE(early) << "decided before the wait ran out";
  EXPECT_EQ(early.error().code, Errc::Busy);
  g.advance(1ms);
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::TimedOut);
  // Dom0 wakes up and writes: into pages the module kept, not freed ones.
  ASSERT_TRUE(g.ch->detach(g.dom));
  EXPECT_EQ(*g.host->module_freed_bytes_written(g.dom), 0u);
}

TEST(GuestChannelRelease, AnOlderDom0ThatNeverSaysMappedIsWaitedForAndItsAreasKept) {
  // An older Dom0 binds the port and maps the area, and knows nothing of dom0_hold.
  ChannelGuest g(guest_config(1, 0));
  auto port =
      g.hv->xs_read("/local/domain/" + std::to_string(g.dom.value) + "/" XENPROBES_XS_DIR "/" XENPROBES_XS_EVTCHN);
  ASSERT_TRUE(port);
  auto bound = g.hv->evtchn_bind_interdomain(g.dom, static_cast<std::uint32_t>(std::stoul(*port)));
  ASSERT_TRUE(bound) << bound.error().what;
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto early = g.host->module_unload(g.dom);
  ASSERT_FALSE(early) << "a bound port is a Dom0 holding the areas";
  EXPECT_EQ(early.error().code, Errc::Busy);
  ASSERT_TRUE(g.hv->evtchn_unbind(*bound));  // it lets go the only way it knows
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Killed) << "no release came: kept";
}

// ---- a whole Dom0 session ----

TEST(GuestChannelRelease, ASessionReleasesWhenTheModuleDetachesAndWritesNothingAfter) {
  ChannelGuest g(guest_config(1, 0));
  Dom0Session d(g);
  EXPECT_EQ(hold_word(g), XENPROBES_DOM0_MAPPED);
  g.start();
  ASSERT_TRUE(d.run_until([&] { return d.hits >= 3 && d.records >= 3; })) << g.host->crash_reason(g.dom);
  ASSERT_TRUE(g.host->module_detach(g.dom));
  // Dom0 sees `state` go in its loop, forgets the domain (rings and OEA first), releases.
  ASSERT_TRUE(d.run_until([&] { return hold_word(g) == XENPROBES_DOM0_RELEASED; }));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Released);
  // The session goes on, and ends: not a byte more in what the module freed.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(d.session->run_once(2));
  d.probe.reset();
  d.async.reset();
  d.session.reset();
  EXPECT_EQ(*g.host->module_freed_bytes_written(g.dom), 0u);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

TEST(GuestChannelRelease, ASessionEndingReleasesTheAreas) {
  ChannelGuest g(guest_config(1, 0));
  {
    Dom0Session d(g);
    g.start();
    ASSERT_TRUE(d.run_until([&] { return d.hits >= 1; })) << g.host->crash_reason(g.dom);
  }
  EXPECT_EQ(hold_word(g), XENPROBES_DOM0_RELEASED);
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Released);
}

TEST(GuestChannelRelease, ASessionKilledWithoutDetachingLeavesTheAreasKept) {
  ChannelGuest g(guest_config(1, 0));
  auto d = std::make_unique<Dom0Session>(g);
  g.start();
  ASSERT_TRUE(d->run_until([&] { return d->hits >= 1; })) << g.host->crash_reason(g.dom);
  d->probe.reset();
  d->async.reset();
  // What kill -9 leaves: no detach, no release; the handle (its port, its mappings) goes too.
  (void)SessionTesting::abandon(std::move(d->session));
  EXPECT_EQ(hold_word(g), XENPROBES_DOM0_MAPPED);
  ASSERT_TRUE(g.host->module_detach(g.dom));
  auto u = g.host->module_unload(g.dom);
  ASSERT_TRUE(u) << u.error().what;
  EXPECT_EQ(*u, Release::Killed);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

}  // namespace
}  // namespace xenprobes::testing
