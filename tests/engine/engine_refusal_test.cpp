// XP probes on the simulated Xen, on the test's channel: what is refused and why, slots running
// out and growing, registration in one pause, faults at every hypervisor call, and the session's
// end restoring everything.
#include <cstring>
#include <set>
#include <tuple>
#include <thread>

#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"
#include "api/session_testing.hpp"
#include "xenprobes/guest_view.hpp"

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

TEST(Probe, BadProbePointsAreRefusedWithTheReason) {
  ProbedGuest g;
  auto nop = [](HitContext&) { return 0; };
  auto text = g.peek(g.sym("sys_open"), 64);

  auto unmapped = g.session->probe(g.dom, Gva{0xffffffff90000000ull}, nop);
  ASSERT_FALSE(unmapped);
  EXPECT_EQ(unmapped.error().code, Errc::InvalidArgument) << unmapped.error().what;
  EXPECT_NE(unmapped.error().what.find("rule 'not-kernel-text'"), std::string::npos) << unmapped.error().what;

  auto mid = g.session->probe(g.dom, Gva{g.sym("sys_open") + 6}, nop);  // inside mov %rsp,%rax
  ASSERT_FALSE(mid);
  EXPECT_EQ(mid.error().code, Errc::IllegalSequence) << mid.error().what;
  EXPECT_NE(mid.error().what.find("sys_open"), std::string::npos) << mid.error().what;

  auto layout = g.host->layout(g.dom);
  auto slot = g.session->probe(g.dom, Gva{layout->oea_addr + 64}, nop);
  ASSERT_FALSE(slot);
  EXPECT_EQ(slot.error().code, Errc::InvalidArgument);
  EXPECT_NE(slot.error().what.find("out-of-line"), std::string::npos) << slot.error().what;

  auto unknown = g.session->probe(g.dom, "no_such_function", nop);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::NotFound);

  auto past = g.session->probe(g.dom, "sys_open+0x10000", nop);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, Errc::Range);

  EXPECT_EQ(g.peek(g.sym("sys_open"), 64), text) << "refusals patch nothing";
}

TEST(Probe, ForeignBreakpointIsRefused) {
  ProbedGuest g;
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv);
  std::uint64_t at = g.sym("demo_classify") + 5;
  std::uint8_t orig = g.peek(at, 1)[0], cc = 0xcc;
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&cc, 1))));
  auto r = g.session->probe(g.dom, Gva{at}, [](HitContext&) { return 0; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Busy);
  EXPECT_NE(r.error().what.find("breakpoint"), std::string::npos) << r.error().what;
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&orig, 1))));
}

TEST(Probe, NoGdbsxHypervisorIsRefusedBeforeAnythingIsPatched) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  hv::sim::SimOptions o;
  o.gdbsx = false;
  auto host = hv::sim::SimHost::create(o);
  DomId d = *host->create_domain(demo_config());
  auto s = Session::open(host->open(), SessionOptions{ChannelKind::Debugger});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::NotSupported);
  EXPECT_NE(s.error().what.find("CONFIG_GDBSX"), std::string::npos) << s.error().what;
  EXPECT_NE(s.error().what.find("guest channel"), std::string::npos) << s.error().what;
  EXPECT_FALSE(host->open()->domain_info(d)->debugged) << "debugging mode was never switched on";
}

TEST(Probe, SecondSessionOnTheHostIsToldTheVirqIsTaken) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  ProbedGuest g;
  auto second = Session::open(g.host->open(), SessionOptions{ChannelKind::Debugger});
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::Busy);
  EXPECT_NE(second.error().what.find("VIRQ_DEBUGGER"), std::string::npos);
}

TEST(Probe, ExhaustedSlotsGiveEnospcAndChangeNothing) {
  hv::sim::DomainConfig c = demo_config(1, 2);
  c.oea_size = 4096;        // 128 slots of 32 bytes
  c.oea_reserve_areas = 0;  // and a guest module that cannot grow the area
  ProbedGuest g(c);
  // Instructions of the demo guest that run from a slot, one probe each, until the area is full.
  auto table = symbols::SymbolTable::load(demo_map());
  ASSERT_TRUE(table);
  std::vector<Probe> probes;
  Result<Probe> last = std::unexpected(Error{});
  std::uint64_t next_try = 0;
  for (const char* fn : {"demo_dispatch", "sys_read", "sys_write", "sys_open", "sys_unlink", "demo_classify",
                         "demo_recurse", "sys_getppid", "demo_workload"}) {
    auto a = table->resolve(fn);
    if (!a) continue;
    auto f = table->function_containing(*a);
    if (!f) continue;
    for (std::uint64_t off = 0; off < f->size && probes.size() < 200; ++off) {
      next_try = f->start.value + off;
      last = g.session->probe(g.dom, Gva{next_try}, [](HitContext&) { return 0; });
      if (last) {
        // Kept while it holds a slot: a released slot waits for quiescence before reuse.
        if (last->info()->slot.value != 0) probes.push_back(std::move(*last));
      } else if (last.error().code == Errc::NoSpace) {
        break;
      }
    }
    if (!last && last.error().code == Errc::NoSpace) break;
  }
  ASSERT_FALSE(last);
  ASSERT_EQ(last.error().code, Errc::NoSpace) << last.error().what;
  EXPECT_NE(last.error().what.find("exhausted"), std::string::npos) << last.error().what;
  // (A probe asked for at a function's start shares the slot of the one past its ftrace site.)
  std::set<std::uint64_t> slots;
  for (auto& pr : probes) slots.insert(pr.info()->slot.value);
  EXPECT_EQ(slots.size(), 128u);
  EXPECT_NE(g.peek(next_try, 1)[0], trap_byte()) << "the refused probe patched nothing";
  probes.clear();  // releases the slots: reusable once the guest module confirms quiescence
  auto again = g.session->probe(g.dom, Gva{next_try}, [](HitContext&) { return 0; });
  ASSERT_FALSE(again) << "the paused guest cannot have confirmed quiescence yet";
  EXPECT_NE(again.error().what.find("quiescence"), std::string::npos) << again.error().what;
  g.start();
  auto end = std::chrono::steady_clock::now() + 30s;
  while (!again && std::chrono::steady_clock::now() < end) {
    ASSERT_TRUE(g.session->run_once(5));
    again = g.session->probe(g.dom, Gva{next_try}, [](HitContext&) { return 0; });
  }
  ASSERT_TRUE(again) << again.error().what;
  ASSERT_TRUE(again->unregister());
  ASSERT_TRUE(g.run_to_completion());
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 2).checksum);
}

TEST(Probe, SlotAreaGrowsOnRequest) {
  hv::sim::DomainConfig c = demo_config(1, 2);
  c.oea_size = 4096;  // 128 slots per area; the simulated module can add 3 more areas
  ProbedGuest g(c);
  auto table = symbols::SymbolTable::load(demo_map());
  ASSERT_TRUE(table);
  std::vector<Probe> probes;
  auto layout = g.host->layout(g.dom);
  for (std::uint64_t a = layout->text_start; a < layout->text_end && probes.size() < 300; ++a) {
    auto p = g.session->probe(g.dom, Gva{a}, [](HitContext&) { return 0; });
    if (!p) {
      ASSERT_NE(p.error().code, Errc::NoSpace) << p.error().what;
      continue;
    }
    if (p->info()->mode == ExecMode::Boosted) probes.push_back(std::move(*p));
  }
  EXPECT_EQ(probes.size(), 300u);
  std::string dir = "/local/domain/" + std::to_string(g.dom.value) + "/data/xenprobes/";
  EXPECT_EQ(*g.session->hypervisor().xs_read(dir + "oea/count"), "3") << "two areas were added";
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 2).checksum);
}

TEST(Probe, BatchRegistrationPausesOnce) {
  ProbedGuest g;
  auto table = symbols::SymbolTable::load(demo_map());
  auto f = table->function_containing(*table->resolve("demo_dispatch"));
  ASSERT_TRUE(f);
  std::uint64_t pauses_before = g.host->op_count(hv::sim::Op::Pause);
  ASSERT_TRUE(g.session->begin_batch());
  std::vector<Probe> probes;
  for (std::uint64_t off = 0; off < f->size; ++off) {
    auto p = g.session->probe(g.dom, Gva{f->start.value + off}, [](HitContext&) { return 0; });
    if (p) probes.push_back(std::move(*p));
  }
  ASSERT_TRUE(g.session->end_batch());
  EXPECT_GT(probes.size(), 10u);
  EXPECT_EQ(g.host->op_count(hv::sim::Op::Pause) - pauses_before, 1u);
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "only the creation pause is left";
}

// Registration is transactional: a fault in any hypervisor call leaves guest memory and the
// library as they were, and the same registration succeeds once the fault is gone.
TEST(Probe, FaultAtEveryHypervisorCallDuringRegistration) {
  ProbedGuest g;
  auto layout = g.host->layout(g.dom);
  auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  auto oea = g.peek(layout->oea_addr, layout->oea_size);
  // A post-handler: slot with a trap tail; the probe point: a RIP-relative instruction.
  std::uint64_t at = g.sym("sys_getppid") + 0x38;
  unsigned failures = 0;
  for (std::uint64_t n = 0; n < 200; ++n) {
    g.host->fail_nth_call(n, Errc::Io);
    auto p = g.session->probe(
        g.dom, Gva{at}, [](HitContext&) { return 0; }, [](HitContext&) {});
    g.host->clear_faults();
    if (p) {
      // The fault was past the last call: registration is done. Check it works, then stop.
      EXPECT_EQ(g.peek(at, 1)[0], trap_byte());
      ASSERT_TRUE(p->unregister());
      break;
    }
    ++failures;
    EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "fault at call " << n;
    EXPECT_EQ(g.peek(layout->oea_addr, oea.size()), oea) << "fault at call " << n;
    EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "fault at call " << n << " left a pause behind";
  }
  EXPECT_GT(failures, 3u);
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text);
}

// A fault in any hypervisor call while hits are handled: the loop reports it and the next
// round finishes the job; the guest never notices.
TEST(Probe, FaultsWhileHandlingHitsDoNotHurtTheGuest) {
  ProbedGuest g(demo_config(2, 6));
  auto p = g.session->probe(
      g.dom, "demo_classify", [](HitContext&) { return 0; }, [](HitContext&) {});
  ASSERT_TRUE(p);
  g.start();
  unsigned errors = 0;
  auto end = std::chrono::steady_clock::now() + 60s;
  for (std::uint64_t n = 0; !g.host->wait_halted(g.dom, 0ms) && std::chrono::steady_clock::now() < end; ++n) {
    g.host->fail_nth_call(n % 7, Errc::Io);
    if (!g.session->run_once(2)) ++errors;
    g.host->clear_faults();
    g.let_module_time_pass(10ms);
    ASSERT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
  }
  ASSERT_TRUE(g.host->wait_halted(g.dom, 0ms));
  EXPECT_GT(errors, 0u);
  for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(g.stats(v).checksum, reference_stats(v, 6, 2).checksum);
}

TEST(Probe, SessionEndRestoresEverything) {
  ProbedGuest g(demo_config(2, 0));
  auto layout = g.host->layout(g.dom);
  auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  for (const char* fn : {"sys_open", "sys_read", "demo_dispatch", "demo_recurse"}) {
    auto p = g.session->probe(
        g.dom, fn, [](HitContext&) { return 0; }, [](HitContext&) {});
    ASSERT_TRUE(p);
    p->release();  // owned by the session from now on
  }
  g.start();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(g.session->run_once(1));
  g.session.reset();
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text);
  auto hv = g.host->open();
  EXPECT_FALSE(hv->domain_info(g.dom)->paused) << "a stop was left behind";
  EXPECT_FALSE(hv->domain_info(g.dom)->debugged);
  auto it = g.stats(0).iterations;
  std::this_thread::sleep_for(50ms);
  EXPECT_GT(g.stats(0).iterations, it) << "the guest runs on";
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty());
}

}  // namespace
}  // namespace xenprobes::testing
