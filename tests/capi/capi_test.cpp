// The paper's C API on the simulated Xen (XENPROBES_BACKEND=sim: domain 1 runs the demo guest
// forever). The C scenarios live in capi_c_part.c; these tests drive them and check the guest
// through the simulated Xen's own API.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "capi_c_part.h"
#include "demo_abi.h"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::capi_testing {
Session* current_session();  // c_api.cpp, for tests
}

namespace {

using namespace xenprobes;
using namespace std::chrono_literals;

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XENPROBES_BACKEND", "sim", 1);
    setenv("XENPROBES_SIM_VCPUS", "1", 1);  // exact hit counts
    xenprobes_close();
  }
  void TearDown() override {
    xenprobes_close();
    unsetenv("XENPROBES_CHANNEL");
    unsetenv("XENPROBES_SIM_VCPUS");
  }

  // The simulated host behind the C API's implicit session (kept alive past its close).
  std::shared_ptr<hv::sim::SimHost> host() {
    Session* s = capi_testing::current_session();
    if (!s) return nullptr;
    hv::sim::SimHost* h = hv::sim::sim_host_of(s->hypervisor());
    return h ? h->shared_from_this() : nullptr;
  }
  std::uint64_t sym(const char* name) { return *host()->symbol(DomId{1}, name); }
  std::vector<std::uint8_t> peek(hv::sim::SimHost& h, std::uint64_t va, std::size_t n) {
    std::vector<std::uint8_t> b(n);
    EXPECT_TRUE(h.peek(DomId{1}, va, std::as_writable_bytes(std::span(b))));
    return b;
  }
  demo_stats guest_stats(hv::sim::SimHost& h) {
    demo_stats st{};
    EXPECT_TRUE(h.peek(DomId{1}, *h.symbol(DomId{1}, DEMO_SYM_STATS), std::as_writable_bytes(std::span(&st, 1))));
    return st;
  }

  char msg[512] = {};
};

// Handler state for the C++-side tests (handlers are plain C function pointers).
struct Counts {
  std::atomic<int> hits{0}, posts{0}, target{0}, bad{0};
  xenprobes_handle_t clock = 0;
  std::uint64_t addr = 0;
  void reset() {
    hits = posts = target = bad = 0;
    clock = 0;
    addr = 0;
  }
} g;

void count_and_stop(xenprobes_handle_t, cpu_user_regs*) {
  if (++g.hits == g.target) xenprobes_stop();
}
void count_only(xenprobes_handle_t, cpu_user_regs*) { ++g.posts; }

TEST_F(CApi, RegsLayoutIsXens) {
  EXPECT_EQ(capi_c_regs_size(), 200u);
  EXPECT_EQ(capi_c_regs_rip_offset(), 128u);
  EXPECT_EQ(capi_c_xen_regs_size(), capi_c_regs_size());
  EXPECT_EQ(capi_c_xen_regs_rip_offset(), capi_c_regs_rip_offset());
}

TEST_F(CApi, Figure2FromC) { EXPECT_EQ(capi_c_fig2(10, 1, msg, sizeof msg), 0) << msg; }

TEST_F(CApi, Figure2FromCWithTwoVcpus) {
  setenv("XENPROBES_SIM_VCPUS", "2", 1);
  EXPECT_EQ(capi_c_fig2(10, 0, msg, sizeof msg), 0) << msg;
}

TEST_F(CApi, ReturnProbeWithPerCallData) {
  ASSERT_EQ(xenprobes_open("sim"), 0) << xenprobes_last_error();
  auto h = host();
  ASSERT_TRUE(h);
  auto before = peek(*h, sym("demo_recurse"), 64);
  EXPECT_EQ(capi_c_retprobe(40, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(peek(*h, sym("demo_recurse"), 64), before) << "unregister restores the text";
}

TEST_F(CApi, ChannelFromTheEnvironment) {
  setenv("XENPROBES_CHANNEL", "carrier-pigeon", 1);
  errno = 0;
  EXPECT_EQ(xenprobes_open("sim"), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_NE(std::string(xenprobes_last_error()).find("XENPROBES_CHANNEL"), std::string::npos) << xenprobes_last_error();
  // The simulated domain is PV: the vm_event channel refuses it, saying why.
  setenv("XENPROBES_CHANNEL", "vmevent", 1);
  ASSERT_EQ(xenprobes_open("sim"), 0) << xenprobes_last_error();
  EXPECT_EQ(register_xenprobe_symbol(
                1, "sys_read", [](xenprobes_handle_t, cpu_user_regs*) {}, nullptr),
            XENPROBES_HANDLE_ERROR);
  EXPECT_NE(std::string(xenprobes_last_error()).find("PV"), std::string::npos) << xenprobes_last_error();
  xenprobes_close();
  setenv("XENPROBES_CHANNEL", "debugger", 1);
  ASSERT_EQ(xenprobes_open("sim"), 0) << xenprobes_last_error();
  xenprobes_handle_t h = register_xenprobe_symbol(
      1, "sys_read", [](xenprobes_handle_t, cpu_user_regs*) {}, nullptr);
  EXPECT_GT(h, 0) << xenprobes_last_error();
  ASSERT_TRUE(host());
  EXPECT_EQ(peek(*host(), sym("sys_read") + 5, 1)[0], 0xf1) << "the debugger channel's ICEBP, past the ftrace nop";
  unsetenv("XENPROBES_CHANNEL");
}

TEST_F(CApi, ErrorsGiveErrnoAndAMessage) {
  ASSERT_EQ(xenprobes_open("sim"), 0) << xenprobes_last_error();
  EXPECT_EQ(capi_c_errors(msg, sizeof msg), 0) << msg;
}

TEST_F(CApi, OpenRejectsAnUnknownBackend) {
  errno = 0;
  EXPECT_EQ(xenprobes_open("vmware"), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_NE(std::string(xenprobes_last_error()).find("vmware"), std::string::npos) << xenprobes_last_error();
  EXPECT_EQ(capi_testing::current_session(), nullptr);
  xenprobes_close();  // nothing open: a no-op
  xenprobes_close();
}

TEST_F(CApi, ByAddressWithAPostHandlerThatSeesTheEffect) {
  ASSERT_EQ(xenprobes_open(nullptr), 0) << xenprobes_last_error();
  g.reset();
  g.addr = sym("sys_getppid") + 5;  // mov %rsp,%rax
  g.target = 20;
  auto pre = [](xenprobes_handle_t, cpu_user_regs* r) {
    if (r->rip != g.addr) ++g.bad;
    ++g.hits;
  };
  auto post = [](xenprobes_handle_t, cpu_user_regs* r) {
    if (r->rip != g.addr + 3 || r->rax != r->rsp) ++g.bad;  // the mov has run
    if (++g.posts == g.target) xenprobes_stop();            // (the post-handler is a hit of its own)
  };
  xenprobes_handle_t h = register_xenprobe(1, g.addr, pre, post);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  ASSERT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  EXPECT_EQ(g.hits, 20);
  EXPECT_EQ(g.posts, 20);
  EXPECT_EQ(g.bad, 0);
  xenprobe_stats st{};
  st.version = XENPROBE_STATS_VERSION;
  ASSERT_EQ(xenprobes_stats(h, &st), 0);
  EXPECT_EQ(st.hits, 20u);
  EXPECT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();
}

TEST_F(CApi, PreHandlerRedirectsGetppidToReturn42) {
  xenprobes_handle_t probe = 0, site = 0;
  ASSERT_EQ(capi_c_redirect_getppid(&probe, &site, msg, sizeof msg), 0) << msg;
  auto h = host();
  ASSERT_TRUE(h);
  demo_stats before = guest_stats(*h);
  ASSERT_EQ(capi_c_redirect_more(20, msg, sizeof msg), 0) << msg;
  demo_stats after = guest_stats(*h);
  EXPECT_EQ(after.calls[DEMO_FN_GETPPID], before.calls[DEMO_FN_GETPPID]) << "the body never ran";
  EXPECT_GT(after.iterations, before.iterations) << "the workload went on";
  EXPECT_GT(after.calls[DEMO_FN_READ], before.calls[DEMO_FN_READ]);
  EXPECT_EQ(h->crash_reason(DomId{1}), "");
  EXPECT_EQ(unregister_xenprobe(site), 0) << xenprobes_last_error();
  EXPECT_EQ(unregister_xenprobe(probe), 0) << xenprobes_last_error();
}

TEST_F(CApi, HandlersWriteGuestMemory) {
  // sys_getppid's pre-handler sets the guest's demo_ppid to 7; the post-handler of the load
  // at sys_getppid+0x38 sees the guest read it.
  ASSERT_EQ(xenprobes_open("sim"), 0);
  g.reset();
  g.addr = sym(DEMO_SYM_PPID);
  g.target = 10;
  auto writer = [](xenprobes_handle_t h, cpu_user_regs*) {
    std::int32_t v = 7;
    if (xenprobes_write(h, g.addr, &v, sizeof v) != 0) ++g.bad;
  };
  auto reader = [](xenprobes_handle_t, cpu_user_regs* r) {
    if (r->rax != 7) ++g.bad;
    if (++g.hits == g.target) xenprobes_stop();
  };
  xenprobes_handle_t w = register_xenprobe_symbol(1, "sys_getppid", writer, nullptr);
  xenprobes_handle_t r = register_xenprobe_symbol(1, "sys_getppid+0x38", nullptr, reader);
  ASSERT_GT(w, 0) << xenprobes_last_error();
  ASSERT_GT(r, 0) << xenprobes_last_error();
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_EQ(g.hits, 10);
  EXPECT_EQ(g.bad, 0);
}

TEST_F(CApi, DisableRestoresTheByteAndEnableRearms) {
  ASSERT_EQ(xenprobes_open("sim"), 0);
  auto h = host();
  std::uint64_t fn = sym("sys_unlink");
  auto original = peek(*h, fn, 16);
  g.reset();
  xenprobes_handle_t p = register_xenprobe_symbol(1, "sys_unlink", count_only, nullptr);
  xenprobes_handle_t clock = register_xenprobe_symbol(1, "sys_read", count_and_stop, nullptr);
  ASSERT_GT(p, 0);
  ASSERT_GT(clock, 0);
  EXPECT_NE(peek(*h, fn, 16), original);
  g.target = 10;
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_GT(g.posts, 0);
  ASSERT_EQ(xenprobes_enable(p, 0), 0) << xenprobes_last_error();
  EXPECT_EQ(peek(*h, fn, 16), original);
  int at_disable = g.posts;
  g.target = g.hits + 10;
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_EQ(g.posts, at_disable) << "no hits while disabled";
  ASSERT_EQ(xenprobes_enable(p, 1), 0) << xenprobes_last_error();
  g.target = g.hits + 10;
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_GT(g.posts, at_disable);
}

TEST_F(CApi, CloseRestoresTextAndLaterCallsReopen) {
  ASSERT_EQ(xenprobes_open("sim"), 0);
  auto h = host();
  auto layout = h->layout(DomId{1});
  ASSERT_TRUE(layout);
  auto text = peek(*h, layout->text_start, layout->text_end - layout->text_start);
  g.reset();
  xenprobes_handle_t a = register_xenprobe_symbol(1, "demo_classify", count_and_stop, nullptr);
  xenprobes_handle_t b = register_xenprobe_symbol(1, "demo_classify+0x5", nullptr, count_only);
  xenprobes_handle_t c = register_xenprobe_symbol(1, "sys_getppid+0x22", count_only, nullptr);  // ja: emulated
  ASSERT_TRUE(a > 0 && b > 0 && c > 0) << xenprobes_last_error();
  EXPECT_NE(peek(*h, layout->text_start, text.size()), text);
  g.target = 30;
  ASSERT_EQ(xenprobes_loop(), 0);
  xenprobes_close();
  EXPECT_EQ(capi_testing::current_session(), nullptr);
  EXPECT_EQ(peek(*h, layout->text_start, text.size()), text) << "every byte restored";
  EXPECT_EQ(h->crash_reason(DomId{1}), "");
  xenprobe_stats st{};
  st.version = XENPROBE_STATS_VERSION;
  EXPECT_EQ(xenprobes_stats(a, &st), -1);
  EXPECT_EQ(errno, EINVAL);

  // The next registration opens a new session by itself; handles are not reused.
  g.reset();
  g.target = 3;
  xenprobes_handle_t d = register_xenprobe_symbol(1, "sys_open", count_and_stop, nullptr);
  ASSERT_GT(d, c) << xenprobes_last_error();
  ASSERT_NE(capi_testing::current_session(), nullptr);
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_EQ(g.hits, 3);
}

TEST_F(CApi, StopFromAnotherThreadAndOtherThreadsGetEbusy) {
  g.reset();
  xenprobes_handle_t h = register_xenprobe_symbol(1, "sys_read", count_only, nullptr);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  std::atomic<int> stats_errno{0};
  std::thread other([&] {
    while (g.posts < 5) std::this_thread::sleep_for(1ms);
    xenprobe_stats st{};
    st.version = XENPROBE_STATS_VERSION;
    if (xenprobes_stats(h, &st) == -1) stats_errno = errno;
    xenprobes_stop();
  });
  EXPECT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  other.join();
  EXPECT_EQ(stats_errno, EBUSY);
  EXPECT_GE(g.posts, 5);
  // Not running now: the same call works from any thread.
  std::thread later([&] {
    xenprobe_stats st{};
    st.version = XENPROBE_STATS_VERSION;
    stats_errno = xenprobes_stats(h, &st) == 0 ? 0 : errno;
  });
  later.join();
  EXPECT_EQ(stats_errno, 0);
}

TEST_F(CApi, StopBeforeTheLoopIsRemembered) {
  ASSERT_EQ(xenprobes_open("sim"), 0);
  xenprobes_stop();
  EXPECT_EQ(xenprobes_loop(), 0);
}

TEST_F(CApi, CloseFromAHandlerHappensWhenTheLoopReturns) {
  ASSERT_EQ(xenprobes_open("sim"), 0);
  auto h = host();
  std::uint64_t fn = sym("sys_write");
  auto original = peek(*h, fn, 8);
  g.reset();
  auto closer = [](xenprobes_handle_t, cpu_user_regs*) {
    if (++g.hits == 3) xenprobes_close();
  };
  xenprobes_handle_t p = register_xenprobe_symbol(1, "sys_write", closer, nullptr);
  ASSERT_GT(p, 0);
  EXPECT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  EXPECT_EQ(g.hits, 3);
  EXPECT_EQ(capi_testing::current_session(), nullptr);
  EXPECT_EQ(peek(*h, fn, 8), original);
  EXPECT_EQ(unregister_xenprobe(p), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CApi, UnregisterFromItsOwnHandler) {
  ASSERT_EQ(xenprobes_open("sim"), 0);
  auto h = host();
  std::uint64_t fn = sym("sys_open");
  auto original = peek(*h, fn, 8);
  g.reset();
  auto self_removing = [](xenprobes_handle_t me, cpu_user_regs*) {
    ++g.hits;
    if (unregister_xenprobe(me) != 0) ++g.bad;
    xenprobes_stop();
  };
  ASSERT_GT(register_xenprobe_symbol(1, "sys_open", self_removing, nullptr), 0);
  ASSERT_EQ(xenprobes_loop(), 0);
  EXPECT_EQ(g.hits, 1);
  EXPECT_EQ(g.bad, 0);
  EXPECT_EQ(peek(*h, fn, 8), original);
}

}  // namespace
