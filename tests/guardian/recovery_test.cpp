// Recovery from the journal on the simulated Xen: a session abandoned with probes armed and
// hits in flight (as SIGKILL leaves it) is undone from its journal alone.
#include "guardian/guardian_fixture.hpp"

#include "common/hex.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace xenprobes::testing {
namespace {

class Abandoned : public ::testing::TestWithParam<ChannelKind> {};

// Every kind of probe, hits in flight, then the process "dies".
// What the shell script `script` prints for `input` on its stdin ("" if it fails).
std::string read_by_script(const char* script, const std::string& input) {
  char in[] = "/tmp/xp-account-XXXXXX";
  int fd = ::mkstemp(in);
  if (fd < 0) return "";
  const bool wrote = ::write(fd, input.data(), input.size()) == static_cast<ssize_t>(input.size());
  ::close(fd);
  std::string out;
  if (wrote) {
    FILE* sh = ::popen((std::string("sh '") + script + "' < '" + in + "'").c_str(), "r");
    if (sh) {
      char buf[256];
      while (std::fgets(buf, sizeof buf, sh)) out += buf;
      const int rc = ::pclose(sh);
      if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) out.clear();
    }
  }
  ::unlink(in);
  return out;
}

TEST_P(Abandoned, RecoveryFromTheJournalRestoresTheGuest) {
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 30;
  Guest g(GetParam(), kVcpus, kIters);
  std::uint64_t boosted = 0, emulated = 0, posts = 0, entries = 0, returns = 0;
  auto p1 = std::optional<Probe>(g.boosted_probe("sys_read", [&](HitContext&) {
    ++boosted;
    return 0;
  }));
  auto p2 = g.session->probe(
      g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [&](HitContext&) { ++posts; });
  auto p3 = g.session->probe(g.dom, g.branch_in("demo_recurse"), [&](HitContext&) {
    ++emulated;
    return 0;
  });
  auto p4 = g.session->ret_probe(
      g.dom, "demo_recurse",
      [&](HitContext& c, std::span<std::byte>) {
        // Deep in a recursion, well into the run: calls in flight on the stack.
        if (++entries > 40 && c.regs().rdi == 3) c.stop();
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{32, 0});
  ASSERT_TRUE(p1 && p2 && p3 && p4);
  EXPECT_EQ(p1->info()->mode, ExecMode::Boosted);
  EXPECT_EQ(p2->info()->mode, ExecMode::TrapAfter);
  EXPECT_EQ(p3->info()->mode, ExecMode::Emulated);
  const Gva tramp = p4->info()->trampoline;
  for (Probe* p : {&*p1, &*p2, &*p3, &*p4}) p->release();
  ASSERT_NE(g.text(), g.text_before) << "probes armed";

  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  EXPECT_GT(boosted + posts + emulated, 0u);
  EXPECT_GT(g.on_stacks(tramp.value), 0u) << "return-probe calls in flight";
  // Nobody answers from here on: the vCPUs pile up on the traps.
  std::this_thread::sleep_for(50ms);

  int jfd = g.abandon();
  ASSERT_GE(jfd, 0);
  EXPECT_FALSE(g.host->wait_halted(g.dom, 300ms)) << "without recovery the guest is stuck";

  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap) << snap.error().what;
  EXPECT_FALSE(snap->clean);
  EXPECT_EQ(snap->torn, 0u);
  ASSERT_EQ(snap->domains.size(), 1u);
  EXPECT_GE(snap->patches.size(), 6u) << "4 points, a slot trap and the trampoline";
  EXPECT_GT(snap->returns.size(), 0u);

  auto hv = g.host->open();  // the guardian's own handle
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(rep.domains, 1u);
  // (Popped slots below a stack pointer may still hold the trampoline's address: dead data.)
  for (const auto& r : snap->returns) {
    std::uint64_t v = 0;
    std::memcpy(&v, g.peek(r.slot.value, 8).data(), 8);
    EXPECT_NE(v, tramp.value) << "a call in flight still returns to the trampoline";
  }
  EXPECT_GE(rep.restored, 4u);
  EXPECT_EQ(rep.left_alone, 0u);
  EXPECT_GT(rep.returns_restored, 0u);
  // The account's lines as the real-Xen scenarios read them (tools/e2e/guardian-account.sh):
  // a change of wording fails here, not in a real-Xen run an hour later.
  const std::string account = "xenprobes-guardian[1]: " + guardian::describe_journal("owner 1", *snap) +
                              "\nxenprobes-guardian[1]: domain 1: text at 0x0 restored\nxenprobes-guardian[1]: " +
                              guardian::describe_report(rep) + "\n";
  auto fields = [](const std::vector<std::size_t>& v) {
    std::string r;
    for (auto n : v) r += (r.empty() ? "" : " ") + std::to_string(n);
    return r + "\n";
  };
  EXPECT_EQ(
      read_by_script(XP_GUARDIAN_ACCOUNT_SH, account),
      fields({snap->domains.size(), snap->patches.size(), snap->returns.size(), rep.domains, rep.gone, rep.restored,
              rep.left_alone, rep.vcpus_moved, rep.returns_restored, rep.unpaused, rep.failures, rep.reused}))
      << account;

  EXPECT_EQ(g.text(), g.text_before) << "kernel text byte-identical";
  EXPECT_EQ(*g.host->pause_count(g.dom), 0u) << "no pause left";
  auto info = hv->domain_info(g.dom);
  EXPECT_FALSE(info->debugged);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
  for (unsigned v = 0; v < kVcpus; ++v)
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus, info->type).checksum) << "vCPU " << v;
  if (GetParam() == ChannelKind::VmEvent) {
    // The ring is gone: a new monitor can be enabled.
    auto ring = hv->monitor_enable(g.dom);
    EXPECT_TRUE(ring) << ring.error().what;
  }
}

// A vCPU stopped in a post-handler slot, and the slot's trap: both go on without Dom0.
TEST_P(Abandoned, VcpusInsidePostHandlerSlotsGoOn) {
  constexpr std::uint64_t kIters = 200;
  Guest g(GetParam(), 2, kIters);
  std::uint64_t posts = 0;
  auto p = g.session->probe(
      g.dom, "sys_getppid+5", [](HitContext&) { return 0; },
      [&](HitContext& c) {
        if (++posts == 40) c.stop();
      });
  ASSERT_TRUE(p);
  p->release();
  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  std::this_thread::sleep_for(30ms);
  int jfd = g.abandon();
  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto hv = g.host->open();
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(g.text(), g.text_before);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  auto type = GetParam() == ChannelKind::VmEvent ? hv::GuestType::Hvm : hv::GuestType::Pv;
  for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, 2, type).checksum);
}

// Bytes that changed since we wrote them are not ours any more: left alone, and the
// administrator's own pause (the domain was created paused) is not released either.
TEST_P(Abandoned, ChangedBytesAreLeftAloneAndForeignPausesKept) {
  Guest g(GetParam(), 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  auto b = g.session->probe(g.dom, "sys_write", [](HitContext&) { return 0; });
  ASSERT_TRUE(a && b);
  const Gva changed = a->info()->address, kept = b->info()->address;
  a->release();
  b->release();
  int jfd = g.abandon();
  auto hv = g.host->open();
  // Someone else rewrote the byte at `changed` meanwhile.
  {
    mem::HypervisorFrameSource src(*hv, g.dom);
    mem::GuestMemory m(src);
    m.set_context(*mem::paging_context(*hv->domain_info(g.dom), *hv->get_vcpu_regs(g.dom, VcpuId{0})));
    std::uint8_t cc = 0xcc;
    ASSERT_TRUE(m.write(changed, std::as_bytes(std::span(&cc, 1))));
  }
  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.left_alone, 1u);
  EXPECT_EQ(rep.restored, 1u);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(g.peek(changed.value, 1)[0], 0xcc) << "not ours: untouched";
  const auto off = kept.value - g.layout.text_start;
  EXPECT_EQ(g.peek(kept.value, 1)[0], g.text_before[off]) << "ours: restored";
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "the creation pause is not ours to release";
}

// A patch in a loaded module's text carries the module's identity (its struct module, where
// the name and the text base are in it, a hash of both). Recovery restores the byte only while
// that struct module still names the same module at the same text: unloaded and replaced by
// another (another name or another base), or unreadable, the patch is left alone. The demo
// guest has no modules: the test journals a real probe and gives its record the identity of a
// struct module it writes into guest memory itself.
TEST_P(Abandoned, APatchInAModuleGoneIsLeftAlone) {
  struct Case {
    const char* what;
    const char* name_now;    // what the struct module holds at recovery (nullptr: unmapped address)
    std::uint64_t base_now;  // its text base then
    bool restored;
  };
  constexpr std::uint64_t kBase = 0xffffffffc0200000ull;
  const Case cases[] = {
      {"the same module", "xpdemo", kBase, true},
      {"another module in its place", "xpother", kBase, false},
      {"the same name at another text", "xpdemo", kBase + 0x10000, false},
      {"no name any more", "", kBase, false},
      {"its struct module unmapped", nullptr, kBase, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Guest g(GetParam(), 1, 5);
    auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
    ASSERT_TRUE(a);
    const Gva at = a->info()->address;
    a->release();
    int jfd = g.abandon();
    auto snap = guardian::read_journal_fd(jfd);
    ::close(jfd);
    ASSERT_TRUE(snap);
    auto text_patch = std::find_if(snap->patches.begin(), snap->patches.end(),
                                   [&](const auto& p) { return p.kind == guardian::PatchKind::Text && p.gva == at; });
    ASSERT_NE(text_patch, snap->patches.end());
    // A struct module of 256 bytes at the end of the out-of-line area, which no probe here uses:
    // the name at +24, the text base at +200. An unmapped one: in the vmalloc range, which the demo guest does not map.
    const std::uint64_t mod = c.name_now ? g.layout.oea_addr + g.layout.oea_size - 256 : 0xffffc90000000000ull;
    text_patch->module = guardian::JournalModule{Gva{mod}, guardian::module_hash("xpdemo", kBase), 24, 200};
    auto hv = g.host->open();
    if (c.name_now) {
      mem::HypervisorFrameSource src(*hv, g.dom);
      mem::GuestMemory m(src);
      m.set_context(*mem::paging_context(*hv->domain_info(g.dom), *hv->get_vcpu_regs(g.dom, VcpuId{0})));
      std::array<char, guardian::kJournalModuleNameMax> name{};
      std::copy_n(c.name_now, std::strlen(c.name_now), name.begin());
      ASSERT_TRUE(m.write(Gva{mod + 24}, std::as_bytes(std::span(name))));
      ASSERT_TRUE(m.write_u64_transient(Gva{mod + 200}, c.base_now));
    }
    std::vector<std::string> lines;
    auto rep = guardian::recover(*hv, *snap, [&](log::Level, const std::string& l) { lines.push_back(l); });
    EXPECT_EQ(rep.failures, 0u);
    const auto off = at.value - g.layout.text_start;
    if (c.restored) {
      EXPECT_EQ(rep.left_alone, 0u);
      EXPECT_EQ(g.peek(at.value, 1)[0], g.text_before[off]) << "the module is still there: restored";
    } else {
      EXPECT_EQ(rep.left_alone, 1u);
      EXPECT_NE(g.peek(at.value, 1)[0], g.text_before[off]) << "the module is gone: its bytes are not ours";
      const bool said = std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
        return l.find(hex(at.value) + " is in the text of a module that is gone") != std::string::npos;
      });
      EXPECT_TRUE(said) << "the account says why the patch was left alone";
    }
  }
}

// Page-table isolation: vCPU 0 running a user task holds the user half of its top-level table
// pair, which maps no kernel text. Recovery goes through the kernel half (the simulated Xen
// allocates the pair as Linux does): before, every restore failed and the traps stayed.
TEST(AbandonedWithPti, AVcpuOnItsUserPageTablesDoesNotHideTheKernelText) {
  Guest g(ChannelKind::VmEvent, 1, 5);  // HVM: PV guests have no such pair
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  auto b = g.session->probe(g.dom, "sys_write", [](HitContext&) { return 0; });
  ASSERT_TRUE(a && b);
  a->release();
  b->release();
  ASSERT_NE(g.text(), g.text_before) << "probes armed";
  int jfd = g.abandon();
  auto hv = g.host->open();
  hv::VcpuRegs r = *hv->get_vcpu_regs(g.dom, VcpuId{0});
  const std::uint64_t kernel_cr3 = r.cr3;
  ASSERT_EQ(kernel_cr3 & 0x1fffu, 0u) << "the kernel half of an 8 KiB pair";
  r.cr3 = kernel_cr3 | 0x1000;
  ASSERT_TRUE(hv->set_vcpu_regs(g.dom, VcpuId{0}, r));
  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(rep.restored, 2u);
  EXPECT_EQ(g.text(), g.text_before) << "kernel text byte-identical";
  // Back in the kernel, the guest runs its workload to the end as if never probed.
  r.cr3 = kernel_cr3;
  ASSERT_TRUE(hv->set_vcpu_regs(g.dom, VcpuId{0}, r));
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "only the creation pause";
  ASSERT_TRUE(hv->unpause(g.dom));
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, 5, 1, hv::GuestType::Hvm).checksum);
}

// A domain that died meanwhile is skipped, and nothing fails.
TEST_P(Abandoned, ADomainGoneIsSkipped) {
  Guest g(GetParam(), 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a);
  a->release();
  int jfd = g.abandon();
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto hv = g.host->open();
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.gone, 1u);
  EXPECT_EQ(rep.domains, 0u);
  EXPECT_EQ(rep.failures, 0u);
}

// The journaled domain was destroyed and another one was given its domid. Recovery refuses
// it (its handle is not the journal's) with a line that says so, and touches nothing of it,
// although everything a recovery fooled by the domid would act on is there: the journaled
// trap bytes at the journaled address, a vCPU just past one (a debugger stop), a pause, and
// (debugger) debugging mode, all the new domain's own.
TEST_P(Abandoned, ADomidReusedByAnotherDomainIsRefused) {
  Guest g(GetParam(), 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a);
  a->release();
  int jfd = g.abandon();
  auto hv = g.host->open();
  const hv::DomainHandle old_handle = hv->domain_info(g.dom)->handle;
  ASSERT_TRUE(g.host->destroy_domain(g.dom));

  hv::sim::DomainConfig c;
  c.domid = g.dom.value;
  c.vcpus = 1;
  c.iterations = 5;
  c.start_paused = true;  // its creator's pause
  if (GetParam() == ChannelKind::VmEvent) c.type = hv::GuestType::Hvm;
  auto reused = g.host->create_domain(c);
  ASSERT_TRUE(reused) << reused.error().what;
  ASSERT_EQ(*reused, g.dom) << "the same domid";
  ASSERT_NE(hv->domain_info(g.dom)->handle, old_handle) << "another domain: another handle";

  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap) << snap.error().what;
  ASSERT_EQ(snap->domains.size(), 1u);
  EXPECT_EQ(snap->domains[0].handle, old_handle) << "the journal names the domain by its handle";
  const guardian::JournalSnapshot::Patch* text = nullptr;
  for (const auto& p : snap->patches)
    if (p.kind == guardian::PatchKind::Text) text = &p;
  ASSERT_NE(text, nullptr);
  {
    mem::HypervisorFrameSource src(*hv, g.dom);
    mem::GuestMemory m(src);
    m.set_context(*mem::paging_context(*hv->domain_info(g.dom), *hv->get_vcpu_regs(g.dom, VcpuId{0})));
    ASSERT_TRUE(m.write(text->gva, std::as_bytes(std::span(text->written))));
  }
  auto regs = *hv->get_vcpu_regs(g.dom, VcpuId{0});
  regs.rip = text->gva.value + 1;
  ASSERT_TRUE(hv->set_vcpu_regs(g.dom, VcpuId{0}, regs));
  if (GetParam() == ChannelKind::Debugger) { ASSERT_TRUE(hv->set_debugging(g.dom, true)); }
  const auto text_now = g.text();

  std::vector<std::string> lines;
  auto rep = guardian::recover(*hv, *snap, [&](log::Level, const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(rep.reused, 1u);
  EXPECT_EQ(rep.domains + rep.gone + rep.restored + rep.vcpus_moved + rep.unpaused + rep.failures, 0u);
  const std::string want = "domain " + std::to_string(g.dom.value) + ": refusing to recover: its handle is ";
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind(want, 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("its domid was reused); not touched"), std::string::npos) << lines[0];

  EXPECT_EQ(g.text(), text_now) << "its bytes untouched";
  EXPECT_EQ(hv->get_vcpu_regs(g.dom, VcpuId{0})->rip, text->gva.value + 1) << "its vCPU not moved";
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "its creator's pause kept";
  EXPECT_EQ(hv->domain_info(g.dom)->debugged, GetParam() == ChannelKind::Debugger) << "its debugging mode kept";
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
}

// An orderly end leaves the guardian nothing: the clean flag, and no record.
TEST_P(Abandoned, TheCleanPathLeavesNothingToDo) {
  Guest g(GetParam(), 2, 20);
  std::uint64_t entries = 0;
  auto a = g.session->probe(
      g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [](HitContext&) {});
  auto r = g.session->ret_probe(
      g.dom, "demo_recurse",
      [&](HitContext& c, std::span<std::byte>) {
        if (++entries == 30) c.stop();
        return 0;
      },
      nullptr, RetProbeOptions{32, 0});
  ASSERT_TRUE(a && r);
  a->release();
  r->release();
  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  int jfd = ::dup(SessionTesting::journal_fd(*g.session));
  g.session.reset();  // the orderly end
  auto snap = guardian::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  EXPECT_TRUE(snap->clean);
  EXPECT_TRUE(snap->domains.empty() && snap->patches.empty() && snap->returns.empty());
  auto hv = g.host->open();
  auto rep = guardian::recover(*hv, *snap);
  EXPECT_EQ(rep.domains + rep.restored + rep.unpaused + rep.failures, 0u);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
}

INSTANTIATE_TEST_SUITE_P(Channels, Abandoned, ::testing::Values(ChannelKind::Debugger, ChannelKind::VmEvent),
                         [](const auto& i) { return std::string(channel_kind_name(i.param)); });

// The simulated Xen gives every domain a handle of its own, as xl does: a domid given again
// after a destroy comes with a new handle; a domid in use is not given again.
TEST(GuardianDomainHandle, EveryDomainHasItsOwn) {
  auto host = hv::sim::SimHost::create();
  auto hv = host->open();
  hv::sim::DomainConfig c;
  c.start_paused = true;
  DomId a = *host->create_domain(c), b = *host->create_domain(c);
  const hv::DomainHandle ha = hv->domain_info(a)->handle, hb = hv->domain_info(b)->handle;
  EXPECT_NE(ha, hv::DomainHandle{});
  EXPECT_NE(ha, hb);
  c.domid = a.value;
  auto taken = host->create_domain(c);
  ASSERT_FALSE(taken) << "domain " << a.value << " is alive";
  EXPECT_EQ(taken.error().code, Errc::Exists);
  ASSERT_TRUE(host->destroy_domain(a));
  auto again = host->create_domain(c);
  ASSERT_TRUE(again) << again.error().what;
  EXPECT_EQ(*again, a);
  const hv::DomainHandle hc = hv->domain_info(a)->handle;
  EXPECT_NE(hc, ha);
  EXPECT_NE(hc, hb);
}

// The guest channel is never journaled: its module has a fail-safe of its own.
TEST(GuardianJournalScope, TheGuestChannelIsNotJournaled) {
  Guest g(ChannelKind::Guest, 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a);
  auto snap = guardian::read_journal_fd(SessionTesting::journal_fd(*g.session));
  ASSERT_TRUE(snap);
  EXPECT_TRUE(snap->domains.empty() && snap->patches.empty());
}

}  // namespace
}  // namespace xenprobes::testing
