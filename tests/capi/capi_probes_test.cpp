// The C API's jump probes, async probes, probe info and ring statistics on the simulated Xen
// (domain 1 runs the demo guest forever, one vCPU). The scenarios in C are in capi_c_probes.c;
// these tests pick the channel, give them the guest's counters and check the guest's text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "capi_c_part.h"
#include "demo_abi.h"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::capi_testing {
Session* current_session();  // c_api.cpp, for tests
}

namespace {

using namespace xenprobes;

class CApiProbes : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XENPROBES_BACKEND", "sim", 1);
    setenv("XENPROBES_SIM_VCPUS", "1", 1);  // one vCPU: its counters count every call
    setenv("XENPROBES_CHANNEL", "guest", 1);
    xenprobes_close();
  }
  void TearDown() override {
    xenprobes_close();
    unsetenv("XENPROBES_CHANNEL");
    unsetenv("XENPROBES_SIM_VCPUS");
  }
  void open(const char* channel) {
    setenv("XENPROBES_CHANNEL", channel, 1);
    ASSERT_EQ(xenprobes_open("sim"), 0) << xenprobes_last_error();
    Session* s = capi_testing::current_session();
    ASSERT_NE(s, nullptr);
    hv::sim::SimHost* h = hv::sim::sim_host_of(s->hypervisor());
    ASSERT_NE(h, nullptr);
    host = h->shared_from_this();
  }
  std::uint64_t sym(const char* name) { return *host->symbol(DomId{1}, name); }
  // vCPU 0's calls[fn] in the guest's demo_stats.
  unsigned long counter(int fn) {
    return static_cast<unsigned long>(sym(DEMO_SYM_STATS) + DEMO_STATS_CALLS_OFF + 8 * fn);
  }
  std::vector<std::uint8_t> text() {
    auto l = host->layout(DomId{1});
    std::vector<std::uint8_t> b(l->text_end - l->text_start);
    EXPECT_TRUE(host->peek(DomId{1}, l->text_start, std::as_writable_bytes(std::span(b))));
    return b;
  }

  std::shared_ptr<hv::sim::SimHost> host;
  char msg[512] = {};
};

TEST_F(CApiProbes, AJumpProbeSeesEveryCallAndSaysWhatItBecame) {
  open("guest");
  const auto before = text();
  EXPECT_EQ(capi_c_jump(counter(DEMO_FN_GETPPID), 30, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(text(), before) << "unregistered: the text is the guest's again";
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

TEST_F(CApiProbes, FastestByAddressBecomesAJumpWhereThePointAllowsOne) {
  open("guest");
  xenprobes_handle_t h = register_xenprobe_method(
      1, "sys_getppid", 0, [](xenprobes_handle_t, cpu_user_regs*) {}, nullptr, XENPROBE_METHOD_TRAP);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  xenprobe_info info{};
  info.version = XENPROBE_INFO_VERSION;
  ASSERT_EQ(xenprobes_info(h, &info), 0) << xenprobes_last_error();
  EXPECT_EQ(info.method, static_cast<std::uint32_t>(XENPROBE_METHOD_TRAP));
  EXPECT_NE(info.mode, static_cast<std::uint32_t>(XENPROBE_MODE_DETOUR));
  const unsigned long at = static_cast<unsigned long>(info.address);
  ASSERT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();

  h = register_xenprobe_method(
      1, nullptr, at, [](xenprobes_handle_t, cpu_user_regs*) {}, nullptr, XENPROBE_METHOD_FASTEST);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  info = xenprobe_info{};
  info.version = XENPROBE_INFO_VERSION;
  ASSERT_EQ(xenprobes_info(h, &info), 0) << xenprobes_last_error();
  EXPECT_EQ(info.method, static_cast<std::uint32_t>(XENPROBE_METHOD_JUMP));
  EXPECT_EQ(info.mode, static_cast<std::uint32_t>(XENPROBE_MODE_DETOUR));
  EXPECT_EQ(info.address, at);
  EXPECT_EQ(info.requested, at);
  EXPECT_STREQ(info.not_jump_because, "");
  EXPECT_STREQ(info.moved_because, "");
  EXPECT_EQ(info.jump_pending, 1u) << "the loop has not run: Dom0 cannot have written the jump yet";
  EXPECT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();
}

TEST_F(CApiProbes, JumpRefusalsOnTheGuestChannelSayWhy) {
  open("guest");
  EXPECT_EQ(capi_c_jump_refusals("post-handler", msg, sizeof msg), 0) << msg;
}

TEST_F(CApiProbes, OtherChannelsRefuseJumpAndAsyncProbesSayingWhy) {
  open("debugger");
  EXPECT_EQ(capi_c_jump_refusals("guest channel", msg, sizeof msg), 0) << msg;
  errno = 0;
  EXPECT_EQ(register_xenprobe_async(
                1, "sys_getppid", 0, nullptr, 0, [](const xenprobe_async_hit*, void*) {}, nullptr),
            XENPROBES_HANDLE_ERROR);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_NE(std::string(xenprobes_last_error()).find("guest channel"), std::string::npos) << xenprobes_last_error();
}

TEST_F(CApiProbes, AnAsyncProbeHandsOverEveryCallWithItsCaptures) {
  open("guest");
  const auto before = text();
  EXPECT_EQ(capi_c_async(counter(DEMO_FN_OPEN), 50, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(text(), before) << "unregistered: the text is the guest's again";
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

TEST_F(CApiProbes, AsyncRefusalsGiveErrnoAndAMessage) {
  open("guest");
  EXPECT_EQ(capi_c_async_refusals(msg, sizeof msg), 0) << msg;
}

// XENPROBE_CAPTURE_BY_ADDRESS: a domain of the same host whose image is also mapped as user
// memory; its module's no-fault reads refuse a user read of a kernel address and a kernel read
// of a user one (as the kernel's do), so only the address deciding reads both strings.
TEST_F(CApiProbes, ByAddressCapturesReadAUserAndAKernelString) {
  open("guest");
  hv::sim::DomainConfig cfg;
  cfg.vcpus = 1;
  cfg.user_image_va = 0x400000;
  auto dom = host->create_domain(cfg);
  ASSERT_TRUE(dom) << dom.error().what;
  auto l = host->layout(*dom);
  ASSERT_TRUE(l);
  ASSERT_EQ(l->user_image, cfg.user_image_va);
  // rdi + offset, modulo 2^64: the user alias of the kernel string at rdi.
  const std::uint64_t delta = l->user_image - (l->text_start & ~std::uint64_t{0xfff});
  const auto offset = static_cast<std::int32_t>(delta);
  ASSERT_EQ(static_cast<std::uint64_t>(static_cast<std::int64_t>(offset)), delta) << "within an int32 offset";
  EXPECT_EQ(capi_c_async_by_address(static_cast<domid_t>(dom->value), offset, 40, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(host->crash_reason(*dom), "");
}

TEST_F(CApiProbes, ByAddressCapturesAreRefusedByAModuleThatCannotReadThem) {
  open("guest");
  hv::sim::DomainConfig cfg;
  cfg.vcpus = 1;
  cfg.module_cap_auto = false;  // a module before rings/cap-flags
  auto dom = host->create_domain(cfg);
  ASSERT_TRUE(dom) << dom.error().what;
  EXPECT_EQ(capi_c_async_by_address_refused(static_cast<domid_t>(dom->value), msg, sizeof msg), 0) << msg;
  EXPECT_EQ(host->crash_reason(*dom), "");
}

// header.notify_skipped through xenprobes_ring_stats(): the hits the module did not notify
// because Dom0 said it was polling. The C API has no spin_us, so the test sets dom0_polling
// itself once the trap probe is in: every sys_getppid hit then goes without its notification,
// and the loop still finds it (an async probe makes it look every 20 ms at most). Version 2
// callers get the module's exact count; version 1 callers, whose struct ends at bad_keys, get
// nothing written past it.
namespace skipped {
int hits = 0;
void pre(xenprobes_handle_t, cpu_user_regs*) {
  if (++hits == 20) xenprobes_stop();
}
}  // namespace skipped

TEST_F(CApiProbes, RingStatsVersion2CountsTheHitsTheModuleDidNotNotify) {
  open("guest");
  skipped::hits = 0;
  xenprobes_handle_t wake = register_xenprobe_async(
      1, "sys_open", 0, nullptr, 0, [](const xenprobe_async_hit*, void*) {}, nullptr);
  ASSERT_GT(wake, 0) << xenprobes_last_error();
  xenprobe_ring_stats rs{};
  rs.version = XENPROBE_RING_STATS_VERSION;
  ASSERT_EQ(xenprobes_ring_stats(1, &rs), 0) << xenprobes_last_error();
  EXPECT_EQ(rs.notify_skipped, 0u) << "nobody said Dom0 polls: every hit so far was notified";
  xenprobes_handle_t h = register_xenprobe_symbol(1, "sys_getppid", skipped::pre, nullptr);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  {
    auto gv = GuestView::open(capi_testing::current_session()->hypervisor(), DomId{1});
    ASSERT_TRUE(gv) << gv.error().what;
    const std::uint32_t on = 1;
    ASSERT_TRUE((*gv)->write(Gva{host->layout(DomId{1})->control_addr + offsetof(xenprobes_ctl_header, dom0_polling)},
                             std::as_bytes(std::span(&on, 1))));
  }
  ASSERT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  ASSERT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();  // no more synchronous hits: the count stays
  auto module = host->module_notifications(DomId{1});
  ASSERT_TRUE(module);
  EXPECT_GE(module->skipped, 20u);

  rs = xenprobe_ring_stats{};
  rs.version = XENPROBE_RING_STATS_VERSION;
  ASSERT_EQ(xenprobes_ring_stats(1, &rs), 0) << xenprobes_last_error();
  EXPECT_EQ(rs.notify_skipped, module->skipped) << "the module's count, exactly";
  EXPECT_EQ(rs.rings, 1u);
  EXPECT_EQ(rs.bad_records, 0u);

  // A version 1 caller: its struct ends at bad_keys; the bytes after it are not its own.
  unsigned char buf[sizeof(xenprobe_ring_stats) + 16];
  std::memset(buf, 0xa5, sizeof buf);
  const std::uint32_t v1 = 1;
  std::memcpy(buf, &v1, sizeof v1);
  ASSERT_EQ(xenprobes_ring_stats(1, reinterpret_cast<xenprobe_ring_stats*>(buf)), 0) << xenprobes_last_error();
  xenprobe_ring_stats got{};
  std::memcpy(&got, buf, offsetof(xenprobe_ring_stats, bad_records));
  EXPECT_EQ(got.version, 1u);
  EXPECT_EQ(got.rings, 1u);
  EXPECT_EQ(got.missed, 0u);
  for (std::size_t i = offsetof(xenprobe_ring_stats, bad_records); i < sizeof buf; ++i)
    ASSERT_EQ(buf[i], 0xa5) << "byte " << i << " past a version 1 struct was written";

  for (std::uint32_t bad : {0u, XENPROBE_RING_STATS_VERSION + 1}) {
    rs = xenprobe_ring_stats{};
    rs.version = bad;
    errno = 0;
    EXPECT_EQ(xenprobes_ring_stats(1, &rs), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_NE(std::string(xenprobes_last_error()).find("versions 1 and 2"), std::string::npos)
        << xenprobes_last_error();
  }
  EXPECT_EQ(unregister_xenprobe(wake), 0) << xenprobes_last_error();
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

// xenprobes_read_string() reads as an async string capture of max `size` does: at most
// size - 1 characters, then only the byte after them. The strings sit at the very end of the
// guest image (the padding after .bss, nobody's), right before a page nothing maps.
namespace edge {
std::uint64_t end = 0;
struct Read {
  std::uint64_t from_end;
  size_t size;
  int rc = 0, err = 0;
  std::string buf{};
};
std::vector<Read> reads;
bool done = false;
void pre(xenprobes_handle_t h, cpu_user_regs*) {
  if (done) return;
  for (Read& r : reads) {
    std::vector<char> b(r.size, '\x7f');
    errno = 0;
    r.rc = xenprobes_read_string(h, static_cast<unsigned long>(end - r.from_end), b.data(), r.size);
    r.err = errno;
    r.buf.assign(b.data(), strnlen(b.data(), b.size()));
  }
  done = true;
  xenprobes_stop();
}
}  // namespace edge

TEST_F(CApiProbes, ReadStringReadsNoFurtherThanTheByteAfterSizeMinusOneCharacters) {
  open("guest");
  auto l = host->layout(DomId{1});
  ASSERT_TRUE(l);
  edge::end = l->image_end;
  ASSERT_EQ(edge::end % 4096, 0u);
  ASSERT_LE(sym("demo_ibt_stack") + 4096, edge::end - 64) << "the bytes written are the image's padding: nobody's";
  auto gv = GuestView::open(capi_testing::current_session()->hypervisor(), DomId{1});
  ASSERT_TRUE(gv) << gv.error().what;
  // "ABCDEFG\0" 8 bytes before the end of a page, then 15 characters and no NUL before it ends.
  const std::string tail = std::string("ABCDEFG\0", 8) + "0123456789abcde";
  ASSERT_TRUE((*gv)->write(Gva{edge::end - tail.size()}, std::as_bytes(std::span(tail.data(), tail.size()))));
  edge::done = false;
  edge::reads = {{23, 8}, {23, 9}, {23, 7}, {15, 16}, {15, 17}, {15, 8}, {0, 8}};
  xenprobes_handle_t h = register_xenprobe_symbol(1, "sys_getppid", edge::pre, nullptr);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  ASSERT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  ASSERT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();
  ASSERT_TRUE(edge::done);
  const auto& r = edge::reads;
  EXPECT_EQ(r[0].rc, 7) << "7 characters and the NUL: fits 8 bytes exactly";
  EXPECT_EQ(r[0].buf, "ABCDEFG");
  EXPECT_EQ(r[1].rc, 7);
  EXPECT_EQ(r[2].rc, -1);
  EXPECT_EQ(r[2].err, ERANGE);
  EXPECT_EQ(r[2].buf, "ABCDEF");
  EXPECT_EQ(r[3].rc, -1) << "15 characters, then an unmapped byte: does not fit, no fault";
  EXPECT_EQ(r[3].err, ERANGE);
  EXPECT_EQ(r[3].buf, "0123456789abcde");
  EXPECT_EQ(r[4].rc, -1) << "a 16th character would be on the unmapped page";
  EXPECT_EQ(r[4].err, EFAULT);
  EXPECT_EQ(r[5].rc, -1);
  EXPECT_EQ(r[5].err, ERANGE);
  EXPECT_EQ(r[5].buf, "0123456");
  EXPECT_EQ(r[6].rc, -1);
  EXPECT_EQ(r[6].err, EFAULT);
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

struct SelfRemoval {
  int records = 0;
  int unregister_rc = -2;
  int again_errno = 0;
};

TEST_F(CApiProbes, AnAsyncHandlerMayUnregisterItsOwnProbeByAddress) {
  open("guest");
  const auto before = text();
  SelfRemoval s;
  const unsigned long at = static_cast<unsigned long>(sym("sys_getppid"));  // moved past the ftrace site
  xenprobes_handle_t h = register_xenprobe_async(
      1, nullptr, at, nullptr, 0,
      [](const xenprobe_async_hit* hit, void* arg) {
        auto* s = static_cast<SelfRemoval*>(arg);
        if (++s->records == 1) {
          s->unregister_rc = unregister_xenprobe(hit->handle);
          if (unregister_xenprobe(hit->handle) == -1) s->again_errno = errno;
          xenprobes_stop();
        }
      },
      &s);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  ASSERT_EQ(xenprobes_loop(), 0) << xenprobes_last_error();
  EXPECT_EQ(s.unregister_rc, 0);
  EXPECT_EQ(s.again_errno, EINVAL);
  EXPECT_EQ(s.records, 1) << "no record reaches a handler after its probe is unregistered";
  xenprobe_ring_stats rs{};
  rs.version = XENPROBE_RING_STATS_VERSION;
  ASSERT_EQ(xenprobes_ring_stats(1, &rs), 0) << xenprobes_last_error();
  EXPECT_EQ(rs.records, 1u);
  EXPECT_EQ(rs.missed, 0u);
  EXPECT_EQ(text(), before);
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

// The same from C (capi_c_probes.c), with the loop going on after the removal: the 5th
// record's handler unregisters its own probe; sys_getppid's bytes are the guest's again while
// the other probe (sys_open) still runs, and the whole text once that one goes too.
TEST_F(CApiProbes, ACAsyncHandlerUnregistersItsOwnProbe) {
  open("guest");
  const auto before = text();
  auto l = host->layout(DomId{1});
  ASSERT_TRUE(l);
  const std::size_t at = sym("sys_getppid") - l->text_start;
  xenprobes_handle_t other = 0;
  EXPECT_EQ(capi_c_async_unregister_self(5, 20, &other, msg, sizeof msg), 0) << msg;
  const auto now = text();
  EXPECT_TRUE(std::equal(before.begin() + at, before.begin() + at + 32, now.begin() + at))
      << "sys_getppid's jump is gone";
  EXPECT_NE(now, before) << "sys_open's is still there";
  EXPECT_EQ(unregister_xenprobe(other), 0) << xenprobes_last_error();
  EXPECT_EQ(text(), before);
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

// xenprobes_close() from a C async handler is safe: it closes the session once the call that
// runs the handler returns, xenprobes_loop() or (outside the loop) xenprobes_ring_stats(); every
// byte of the guest is its own again.
TEST_F(CApiProbes, ACAsyncHandlerClosesTheSessionInTheLoop) {
  open("guest");
  const auto before = text();
  EXPECT_EQ(capi_c_async_close_in_handler(3, 1, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(text(), before);
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

TEST_F(CApiProbes, ACAsyncHandlerClosesTheSessionInARingRead) {
  open("guest");
  const auto before = text();
  EXPECT_EQ(capi_c_async_close_in_handler(0, 0, msg, sizeof msg), 0) << msg;
  EXPECT_EQ(text(), before);
  EXPECT_EQ(host->crash_reason(DomId{1}), "");
}

TEST_F(CApiProbes, AnAsyncHandlerThatThrowsStopsTheLoopWithEio) {
  open("guest");
  xenprobes_handle_t h = register_xenprobe_async(
      1, "sys_getppid", 0, nullptr, 0,
      [](const xenprobe_async_hit*, void*) { throw std::runtime_error("a C++ handler behind a C pointer"); }, nullptr);
  ASSERT_GT(h, 0) << xenprobes_last_error();
  errno = 0;
  EXPECT_EQ(xenprobes_loop(), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_NE(std::string(xenprobes_last_error()).find("threw"), std::string::npos) << xenprobes_last_error();
  EXPECT_EQ(unregister_xenprobe(h), 0) << xenprobes_last_error();
}

}  // namespace
