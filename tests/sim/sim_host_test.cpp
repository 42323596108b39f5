// The simulated Xen's host: event channels, xenstore, domain death, fault injection and the
// choice of backend, as docs/simulated-xen.md says they behave.
#include <cstdlib>

#include "sim/sim_fixture.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

// ---- event channels ----

TEST(SimEvtchn, GlobalVirqHasOneBinderPerHost) {
  Dom0Guest g(finite(1, 1));
  auto other = g.host->open();
  ASSERT_TRUE(g.hv->evtchn_bind_virq(hv::kVirqDebugger));
  auto second = other->evtchn_bind_virq(hv::kVirqDebugger);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::Exists);
  EXPECT_NE(second.error().what.find("one binder per host"), std::string::npos);
}

TEST(SimEvtchn, InterdomainPendingMaskAndCoalescing) {
  Dom0Guest g(finite(1, 1));
  auto gport = g.host->guest_evtchn_alloc_unbound(g.dom);
  ASSERT_TRUE(gport);
  auto port = g.hv->evtchn_bind_interdomain(g.dom, *gport);
  ASSERT_TRUE(port);
  EXPECT_FALSE(*g.hv->evtchn_pending());

  // Two notifications before Dom0 looks coalesce into one.
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *port);
  EXPECT_FALSE(*g.hv->evtchn_pending());
  // While masked an event stays pending and is delivered on unmask.
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *gport));
  EXPECT_FALSE(*g.hv->evtchn_pending());
  ASSERT_TRUE(g.hv->evtchn_unmask(*port));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *port);
  ASSERT_TRUE(g.hv->evtchn_unmask(*port));

  ASSERT_TRUE(g.hv->evtchn_notify(*port));
  ASSERT_TRUE(g.hv->evtchn_notify(*port));
  EXPECT_EQ(*g.host->guest_evtchn_notifications(g.dom, *gport), 2u);
  EXPECT_EQ(g.hv->evtchn_bind_interdomain(g.dom, *gport).error().code, Errc::Busy);
  EXPECT_EQ(g.hv->evtchn_bind_interdomain(g.dom, 999).error().code, Errc::InvalidArgument);
}

// Two ports pending at once are read one per call, in the order they fired; the fd stays
// readable until the last is read, and each stays masked (a new event on it queues nothing)
// until it is unmasked, as libxenevtchn's xenevtchn_pending/xenevtchn_unmask behave.
TEST(SimEvtchn, PendingPortsAreReadOneAtATimeAndStayMaskedUntilUnmasked) {
  Dom0Guest g(finite(1, 1));
  auto g1 = g.host->guest_evtchn_alloc_unbound(g.dom), g2 = g.host->guest_evtchn_alloc_unbound(g.dom);
  ASSERT_TRUE(g1 && g2);
  auto p1 = g.hv->evtchn_bind_interdomain(g.dom, *g1), p2 = g.hv->evtchn_bind_interdomain(g.dom, *g2);
  ASSERT_TRUE(p1 && p2);
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g2));
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g1));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000));
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p2);
  EXPECT_TRUE(readable(g.hv->evtchn_fd(), 0)) << "one port read, one still queued";
  ASSERT_TRUE(g.host->guest_evtchn_notify(g.dom, *g2));  // masked: stays pending, not queued
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p1);
  EXPECT_FALSE(*g.hv->evtchn_pending());
  EXPECT_FALSE(readable(g.hv->evtchn_fd(), 0));
  ASSERT_TRUE(g.hv->evtchn_unmask(*p1));
  EXPECT_FALSE(*g.hv->evtchn_pending()) << "nothing came on p1 while it was masked";
  ASSERT_TRUE(g.hv->evtchn_unmask(*p2));
  ASSERT_TRUE(readable(g.hv->evtchn_fd(), 1000)) << "p2's event while masked comes with the unmask";
  EXPECT_EQ(g.hv->evtchn_pending()->value(), *p2);
  ASSERT_TRUE(g.hv->evtchn_unmask(*p2));
  ASSERT_TRUE(g.hv->evtchn_unbind(*p1));
  ASSERT_TRUE(g.hv->evtchn_unbind(*p2));
}

// ---- xenstore ----

TEST(SimXenstore, ModuleKeysArePublished) {
  Dom0Guest g(finite(2, 1));
  std::string dir = "/local/domain/" + std::to_string(g.dom.value) + "/" XENPROBES_XS_DIR "/";
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_VERSION), std::to_string(XENPROBES_PROTOCOL_VERSION));
  EXPECT_EQ(std::stoull(*g.hv->xs_read(dir + XENPROBES_XS_KERNEL_TEXT), nullptr, 16), g.sym("_text"));
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_NR_CPUS), "2");
  EXPECT_EQ(*g.hv->xs_read(dir + XENPROBES_XS_STATE), XENPROBES_XS_STATE_READY);
  auto oea = std::stoull(*g.hv->xs_read(dir + "oea/0/addr"), nullptr, 16);
  auto text = g.sym("_text");
  EXPECT_LT(oea > text ? oea - text : text - oea, 1ull << 31) << "OEA within rel32 reach of text";
  EXPECT_EQ(*g.hv->xs_read("/local/domain/" + std::to_string(g.dom.value) + "/name"), "demo");
}

TEST(SimXenstore, WatchesFireOnceAtOnceThenOnChanges) {
  Dom0Guest g(finite(1, 1));
  ASSERT_TRUE(g.hv->xs_write("/test/a", "1"));
  ASSERT_TRUE(g.hv->xs_watch("/test", "tok"));
  ASSERT_TRUE(readable(g.hv->xs_fd(), 1000));
  auto ev = g.hv->xs_read_watches();
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].path, "/test");
  EXPECT_EQ((*ev)[0].token, "tok");
  ASSERT_TRUE(g.hv->xs_write("/test/a/b", "2"));
  ASSERT_TRUE(g.hv->xs_write("/other", "3"));
  ev = g.hv->xs_read_watches();
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].path, "/test/a/b");
  auto dir = g.hv->xs_directory("/test/a");
  ASSERT_TRUE(dir);
  EXPECT_EQ(*dir, std::vector<std::string>{"b"});
  ASSERT_TRUE(g.hv->xs_rm("/test/a"));
  EXPECT_EQ(g.hv->xs_read("/test/a/b").error().code, Errc::NotFound);
  EXPECT_EQ(g.hv->xs_read_watches()->size(), 1u);
  ASSERT_TRUE(g.hv->xs_unwatch("/test", "tok"));
  ASSERT_TRUE(g.hv->xs_write("/test/c", "4"));
  EXPECT_TRUE(g.hv->xs_read_watches()->empty());
  EXPECT_EQ(g.hv->xs_write("relative", "x").error().code, Errc::InvalidArgument);
}

TEST(SimXenstore, DomainLifecycleWatches) {
  Dom0Guest g(finite(1, 0));
  ASSERT_TRUE(g.hv->xs_watch("@introduceDomain", "intro"));
  ASSERT_TRUE(g.hv->xs_watch("@releaseDomain", "release"));
  ASSERT_TRUE(g.hv->xs_read_watches());  // the initial firing
  auto second = g.host->create_domain(finite(1, 0));
  ASSERT_TRUE(second);
  auto ev = g.hv->xs_read_watches();
  ASSERT_TRUE(std::any_of(ev->begin(), ev->end(), [](auto& e) { return e.token == "intro"; }));
  ASSERT_TRUE(g.host->destroy_domain(*second));
  ev = g.hv->xs_read_watches();
  ASSERT_TRUE(std::any_of(ev->begin(), ev->end(), [](auto& e) { return e.token == "release"; }));
}

// ---- domain death ----

TEST(SimDomain, DestroyWhileRunning) {
  Dom0Guest g(finite(2, 0));
  ASSERT_TRUE(eventually([&] { return g.stats(0).iterations > 0; }));
  auto fn = g.sym("sys_getppid");
  auto gm = g.memory_view();
  auto before = gm->read_u64(Gva{fn});
  ASSERT_TRUE(before);
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
  EXPECT_EQ(g.hv->domain_info(g.dom).error().code, Errc::NoSuchDomain);
  EXPECT_EQ(g.hv->pause(g.dom).error().code, Errc::NoSuchDomain);
  EXPECT_EQ(g.hv->get_vcpu_regs(g.dom, VcpuId{0}).error().code, Errc::NoSuchDomain);
  // Frames mapped before the death stay readable (Xen keeps mapped pages referenced).
  auto after = gm->read_u64(Gva{fn});
  ASSERT_TRUE(after);
  EXPECT_EQ(*after, *before);
  EXPECT_FALSE(g.host->destroy_domain(g.dom));
}

TEST(SimDomain, ListsDom0AndGuests) {
  Dom0Guest g(finite(3, 1));
  auto doms = g.hv->list_domains();
  ASSERT_TRUE(doms);
  ASSERT_EQ(doms->size(), 2u);
  EXPECT_EQ((*doms)[0].domid.value, 0u);
  EXPECT_EQ((*doms)[1].domid, g.dom);
  EXPECT_EQ((*doms)[1].vcpus, 3u);
  EXPECT_EQ((*doms)[1].type, GuestType::Pv);
  EXPECT_EQ((*doms)[1].guest_width, 8u);
}

TEST(SimDomain, BadImagesAreRefusedWithTheReason) {
  auto host = hv::sim::SimHost::create();
  DomainConfig c;
  c.image = "/nonexistent/vmlinux";
  auto r = host->create_domain(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what.find("/nonexistent/vmlinux"), std::string::npos);
  c.image = "/proc/self/status";  // not an ELF
  r = host->create_domain(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what.find("ELF"), std::string::npos);
}

// ---- fault injection ----

TEST(SimFaults, InjectedFaultsSurfaceAsErrors) {
  Dom0Guest g(finite(1, 0));
  g.host->fail_op(Op::Pause, Errc::Io);
  auto r = g.hv->pause(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
  EXPECT_NE(r.error().what.find("injected"), std::string::npos);
  EXPECT_FALSE(g.hv->domain_info(g.dom)->paused) << "a failed pause changes nothing";
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(g.hv->unpause(g.dom));

  g.host->fail_op(Op::MapFrames, Errc::Fault, 1, 1);  // the second map fails
  Frame f{0x100000 * g.dom.value + 0x1000};
  EXPECT_TRUE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));
  EXPECT_FALSE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));
  EXPECT_TRUE(g.hv->map_frames(g.dom, std::span(&f, 1), hv::MapAccess::Read));

  g.host->fail_nth_call(2, Errc::Again);
  EXPECT_TRUE(g.hv->version());
  EXPECT_TRUE(g.hv->version());
  EXPECT_EQ(g.hv->version().error().code, Errc::Again);
  EXPECT_TRUE(g.hv->version());

  // A fault in every kind of operation in turn never crashes the library or the guest.
  for (unsigned op = 0; op < static_cast<unsigned>(Op::Count_); ++op) {
    g.host->fail_op(static_cast<Op>(op), Errc::Io);
    (void)g.hv->domain_info(g.dom);
    (void)g.hv->xs_read("/local/domain/0/name");
    (void)g.hv->get_vcpu_regs(g.dom, VcpuId{0});
    g.host->clear_faults();
  }
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
  EXPECT_GT(g.host->op_count(Op::GetRegs), 0u);
}

// ---- selecting the backend ----

TEST(OpenHypervisor, BackendComesFromTheEnvironment) {
  ::setenv("XENPROBES_BACKEND", "bogus", 1);
  auto bad = hv::open_hypervisor();
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::InvalidArgument);
  EXPECT_NE(bad.error().what.find("'xen' or 'sim'"), std::string::npos);

  ::setenv("XENPROBES_BACKEND", "sim", 1);
  auto sim = hv::open_hypervisor();
  ASSERT_TRUE(sim) << sim.error().what;
  EXPECT_EQ((*sim)->name(), "sim");
  auto info = (*sim)->domain_info(DomId{1});
  ASSERT_TRUE(info);
  EXPECT_EQ(info->name, "demo");
  EXPECT_EQ(info->vcpus, 2u);
  ASSERT_NE(hv::sim::sim_host_of(**sim), nullptr);
  ::unsetenv("XENPROBES_BACKEND");
}

}  // namespace
}  // namespace xenprobes::testing
