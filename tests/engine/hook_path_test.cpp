// The guest module's hit path (protocol.h "hook-path"): the kernel functions it calls out to,
// which it publishes, and the hits nested in them. The simulated module's exchange calls a
// guest function of the demo kernel, sys_getppid, as a real one calls its clock
// (SimHost::set_module_hook_calls): real guest code on the hitting vCPU.
//  - Published: the guest channel refuses a probe in it (rule 'guest-hook-path', naming the
//    published entry), though no name Dom0 knows is sys_getppid; the other channels accept it.
//  - Not published (a module from before the keys): accepted as before, and then every hit
//    the module hands to Dom0 calls into the probe from inside the hook: a nested hit, which
//    the module's depth guard sends on without Dom0 (an int3 through its fallback, a jump hit
//    counted in header.nested), once per outer hit, never recursing.
#include "api/session_testing.hpp"
#include "engine/engine_fixture.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 3;

// A demo guest whose module's hit path calls sys_getppid, published or not.
ProbedGuest hooked_guest(bool publish) {
  return ProbedGuest(demo_config(1, kIterations), {}, {}, 0, [publish](hv::sim::SimHost& h, DomId d) {
    auto fn = h.symbol(d, "sys_getppid");
    if (!fn) throw std::runtime_error(fn.error().what);
    if (auto r = h.set_module_hook_calls(d, {*fn}, publish); !r) throw std::runtime_error(r.error().what);
  });
}

TEST(HookPath, AFunctionTheModulePublishesIsRefusedOnTheGuestChannelOnly) {
  ProbedGuest g = hooked_guest(true);
  const std::uint64_t fn = g.sym("sys_getppid");
  const auto before = g.peek(fn, 32);
  auto p = g.session->probe(g.dom, "sys_getppid", [](HitContext&) { return 0; });
  if (test_channel() != ChannelKind::Guest) {
    // Xen takes the trap before the guest's int3 path: nothing of the module runs.
    ASSERT_TRUE(p) << p.error().what;
    return;
  }
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::InvalidArgument);
  char published[32];
  std::snprintf(published, sizeof published, "published as 0x%llx in hook-path", static_cast<unsigned long long>(fn));
  EXPECT_NE(p.error().what.find("refused by rule 'guest-hook-path'"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find(std::string("sys_getppid, ") + published), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("vmevent"), std::string::npos)
      << "names the channels that accept it: " << p.error().what;
  EXPECT_EQ(g.peek(fn, 32), before) << "nothing written";
  // Every instruction of it, not only the entry (the second: mov %rsp,%rax is 3 bytes).
  auto mid = g.session->probe(g.dom, Gva{g.entry("sys_getppid") + 3}, [](HitContext&) { return 0; });
  ASSERT_FALSE(mid);
  EXPECT_NE(mid.error().what.find("guest-hook-path"), std::string::npos) << mid.error().what;
  // Other functions are not on the list.
  auto other = g.session->probe(g.dom, "demo_classify", [](HitContext&) { return 0; });
  EXPECT_TRUE(other) << other.error().what;
}

TEST(HookPath, WithoutTheKeysTheProbeIsAcceptedAsBefore) {
  ProbedGuest g = hooked_guest(false);
  auto p = g.session->probe(g.dom, "sys_getppid", [](HitContext&) { return 0; });
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(g.peek(g.entry("sys_getppid"), 1)[0], trap_byte());
}

// Keys Dom0 cannot read (here a count without its entries): it cannot tell the module's hit
// path from other code, so the guest channel refuses every point, saying why; the other
// channels do not use them.
TEST(HookPath, KeysThatCannotBeReadRefuseEveryPointOnTheGuestChannel) {
  ProbedGuest g(demo_config(1, kIterations), {}, {}, 0, [](hv::sim::SimHost& h, DomId d) {
    auto hv = h.open();
    const std::string key =
        "/local/domain/" + std::to_string(d.value) + "/" XENPROBES_XS_DIR "/" XENPROBES_XS_HOOK_PATH_COUNT;
    if (auto r = hv->xs_write(key, "2"); !r) throw std::runtime_error(r.error().what);
  });
  auto p = g.session->probe(g.dom, "demo_classify", [](HitContext&) { return 0; });
  if (test_channel() != ChannelKind::Guest) {
    EXPECT_TRUE(p) << p.error().what;
    return;
  }
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("refused by rule 'guest-hook-path'"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("hook-path/0 is missing although"), std::string::npos) << p.error().what;
}

// The nested hit, int3 or jump: the workload's own calls of sys_getppid reach Dom0 exactly;
// the hook's calls (one per hit it hands to Dom0) each hit the probe once more inside the hook
// and go on without Dom0; the function ran every time (its own call count says so); the rest of
// the workload is exactly as without probes.
void nested_hits(const ProbeOptions& how) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g = hooked_guest(false);
  std::uint64_t in_getppid = 0, in_classify = 0;
  auto p = g.session->probe(
      g.dom, "sys_getppid",
      [&](HitContext&) {
        ++in_getppid;
        return 0;
      },
      {}, how);
  ASSERT_TRUE(p) << p.error().what;
  auto q = g.session->probe(g.dom, "demo_classify", [&](HitContext&) {
    ++in_classify;
    return 0;
  });
  ASSERT_TRUE(q) << q.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  const std::uint64_t direct = expected_calls(DEMO_FN_GETPPID, kIterations);
  EXPECT_EQ(in_getppid, direct) << "only the workload's own calls reach Dom0";
  EXPECT_EQ(in_classify, expected_calls(DEMO_FN_CLASSIFY, kIterations));
  const std::uint64_t outer = in_getppid + in_classify;  // hits the module handed to Dom0
  auto c = SessionTesting::module_counters(*g.session, g.dom);
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_EQ(c->hits, outer);
  if (how.method == ProbeMethod::Jump) {
    // Before the jump is in place a trap byte sends every hit to the detour (a REDIRECT
    // entry): either way the detour's call of the jump entry is the nested hit.
    EXPECT_EQ(c->nested, outer) << "one nested jump hit per outer hit";
    EXPECT_EQ(c->timeouts, 0u);
  } else {
    EXPECT_EQ(c->timeouts, outer) << "one nested int3 per outer hit, through its fallback";
    EXPECT_EQ(c->nested, 0u);
  }
  // The function ran in the hook every time, and returned there.
  const demo_stats st = g.stats(0), ref = reference_stats(0, kIterations);
  EXPECT_EQ(st.calls[DEMO_FN_GETPPID], direct + outer);
  for (unsigned f = 1; f < DEMO_NFUNCS; ++f) EXPECT_EQ(st.calls[f], ref.calls[f]) << f;
  EXPECT_EQ(st.checksum, ref.checksum);
  EXPECT_EQ(st.iterations, kIterations);
}

TEST(HookPath, AnInt3HitInsideTheModulesHookTakesItsFallbackWithoutDom0) { nested_hits({}); }

TEST(HookPath, AJumpHitInsideTheModulesHookIsCountedNestedWithoutDom0) { nested_hits(ProbeOptions{ProbeMethod::Jump}); }

}  // namespace
}  // namespace xenprobes::testing
