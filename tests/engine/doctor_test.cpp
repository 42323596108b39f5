// doctor(): per domain, the guest module and every channel with its reason, on simulated
// hosts with and without GDBSX and with PV/HVM guests with and without the module.
#include "xenprobes/doctor.hpp"

#include "engine/engine_fixture.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

const ChannelCheck& check(const DomainReport& d, ChannelKind k) {
  for (const ChannelCheck& c : d.channels)
    if (c.kind == k) return c;
  throw std::runtime_error("no check for that channel");
}

hv::sim::DomainConfig guest(hv::GuestType type, bool module) {
  hv::sim::DomainConfig c;
  c.type = type;
  c.publish_module = module;
  c.start_paused = true;
  return c;
}

TEST(Doctor, StockXenLikeDebians) {
  hv::sim::SimOptions o;
  o.gdbsx = false;
  auto host = hv::sim::SimHost::create(o);
  DomId pv_mod = *host->create_domain(guest(hv::GuestType::Pv, true));
  DomId pv_bare = *host->create_domain(guest(hv::GuestType::Pv, false));
  DomId hvm_bare = *host->create_domain(guest(hv::GuestType::Hvm, false));
  auto hv = host->open();
  auto rep = doctor(*hv);
  ASSERT_TRUE(rep) << rep.error().what;
  EXPECT_EQ(rep->backend, "sim");
  EXPECT_FALSE(rep->gdbsx);
  EXPECT_TRUE(rep->vm_event);
  ASSERT_EQ(rep->domains.size(), 3u);
  const DomainReport& a = rep->domains[0];
  EXPECT_EQ(a.domid, pv_mod);
  EXPECT_TRUE(a.module) << a.module_problem;
  EXPECT_EQ(a.module_version, unsigned(XENPROBES_PROTOCOL_VERSION));
  EXPECT_TRUE(check(a, ChannelKind::Guest).available) << check(a, ChannelKind::Guest).detail;
  EXPECT_FALSE(check(a, ChannelKind::VmEvent).available);
  EXPECT_NE(check(a, ChannelKind::VmEvent).detail.find("PV"), std::string::npos);
  EXPECT_FALSE(check(a, ChannelKind::Debugger).available);
  EXPECT_NE(check(a, ChannelKind::Debugger).detail.find("CONFIG_GDBSX"), std::string::npos);
  EXPECT_EQ(a.auto_choice, ChannelKind::Guest);

  const DomainReport& b = rep->domains[1];
  EXPECT_EQ(b.domid, pv_bare);
  EXPECT_FALSE(b.module);
  EXPECT_NE(b.module_problem.find("not loaded"), std::string::npos) << b.module_problem;
  EXPECT_FALSE(b.auto_choice) << "nothing can probe a PV guest without the module on stock Xen";

  const DomainReport& c = rep->domains[2];
  EXPECT_EQ(c.domid, hvm_bare);
  EXPECT_TRUE(check(c, ChannelKind::VmEvent).available);
  EXPECT_NE(check(c, ChannelKind::VmEvent).detail.find("agentless"), std::string::npos);
  EXPECT_EQ(c.auto_choice, ChannelKind::VmEvent);

  std::string text = format(*rep);
  EXPECT_NE(text.find("auto picks: guest"), std::string::npos) << text;
  EXPECT_NE(text.find("auto picks: nothing"), std::string::npos) << text;
}

TEST(Doctor, GdbsxHostAndTheVirqInUse) {
  auto host = hv::sim::SimHost::create();
  DomId d = *host->create_domain(guest(hv::GuestType::Pv, true));
  auto hv = host->open();
  auto rep = doctor(*hv, d);
  ASSERT_TRUE(rep) << rep.error().what;
  EXPECT_TRUE(rep->gdbsx);
  EXPECT_EQ(rep->virq_debugger, "free");
  ASSERT_EQ(rep->domains.size(), 1u);
  EXPECT_TRUE(check(rep->domains[0], ChannelKind::Debugger).available);
  // Another process holds the VIRQ: the report says so, and nothing was disturbed.
  auto other = Session::open(host->open(), SessionOptions{ChannelKind::Debugger});
  ASSERT_TRUE(other);
  auto again = doctor(*hv, d);
  ASSERT_TRUE(again);
  EXPECT_NE(again->virq_debugger.find("another process"), std::string::npos) << again->virq_debugger;
  EXPECT_FALSE(check(again->domains[0], ChannelKind::Debugger).available);
  EXPECT_EQ(*host->pause_count(d), 1u) << "the doctor pauses nothing (the domain was created paused)";
}

// The doctor and the session decide with the same functions (channel/eligibility.hpp): for
// every kind of domain, what the doctor says Auto picks is the channel a session with Auto
// attaches, and a domain nothing can probe is refused by both. Before, the doctor ignored
// debugging mode, which the vmevent channel refuses.
TEST(Doctor, WhatItSaysAutoPicksIsWhatASessionPicks) {
  auto host = hv::sim::SimHost::create();
  std::vector<DomId> doms = {
      *host->create_domain(guest(hv::GuestType::Pv, true)), *host->create_domain(guest(hv::GuestType::Pv, false)),
      *host->create_domain(guest(hv::GuestType::Hvm, true)), *host->create_domain(guest(hv::GuestType::Hvm, false)),
      *host->create_domain(guest(hv::GuestType::Hvm, false))};
  auto hv = host->open();
  ASSERT_TRUE(hv->set_debugging(doms[4], true)) << "an HVM guest in debugging mode (gdbsx)";
  auto rep = doctor(*hv);
  ASSERT_TRUE(rep) << rep.error().what;
  ASSERT_EQ(rep->domains.size(), doms.size());
  const DomainReport& debugged = rep->domains[4];
  EXPECT_FALSE(check(debugged, ChannelKind::VmEvent).available);
  EXPECT_NE(check(debugged, ChannelKind::VmEvent).detail.find("debugging mode"), std::string::npos)
      << check(debugged, ChannelKind::VmEvent).detail;
  auto s = Session::open(host->open(), SessionOptions{});
  ASSERT_TRUE(s) << s.error().what;
  for (std::size_t k = 0; k < doms.size(); ++k) {
    SCOPED_TRACE("domain " + std::to_string(doms[k].value));
    const DomainReport& d = rep->domains[k];
    auto attached = (*s)->load_symbols(doms[k], demo_map());
    if (!d.auto_choice) {
      EXPECT_FALSE(attached) << "the doctor says nothing can probe it";
      continue;
    }
    ASSERT_TRUE(attached) << attached.error().what;
    auto name = (*s)->channel_name(doms[k]);
    ASSERT_TRUE(name) << name.error().what;
    EXPECT_EQ(*name, channel_kind_name(*d.auto_choice));
  }
  EXPECT_FALSE(rep->domains[1].auto_choice) << "PV without the module";
  EXPECT_FALSE(rep->domains[4].auto_choice) << "debugged HVM without the module";
  EXPECT_NE(check(debugged, ChannelKind::Debugger).detail.find("already in debugging mode"), std::string::npos)
      << check(debugged, ChannelKind::Debugger).detail;
  EXPECT_TRUE(hv->domain_info(doms[4])->debugged) << "somebody else's debugging mode is left alone";
}

// Channel by channel, not only Auto's pick: for every situation the eligibility functions and
// the module checks tell apart (a host with and without GDBSX; PV or HVM; with or without the
// guest module; in somebody else's debugging mode or not), the doctor says a channel can
// probe the domain exactly when a session asking for that channel attaches it.
TEST(Doctor, EachChannelsVerdictIsWhatASessionAskingForItGets) {
  for (bool gdbsx : {true, false}) {
    SCOPED_TRACE(gdbsx ? "GDBSX host" : "stock host");
    hv::sim::SimOptions o;
    o.gdbsx = gdbsx;
    auto host = hv::sim::SimHost::create(o);
    struct Case {
      const char* what;
      hv::GuestType type;
      bool module, debugged;
    };
    const Case cases[] = {{"PV with the module", hv::GuestType::Pv, true, false},
                          {"PV without it", hv::GuestType::Pv, false, false},
                          {"HVM with the module", hv::GuestType::Hvm, true, false},
                          {"HVM without it", hv::GuestType::Hvm, false, false},
                          {"PV with the module, debugged", hv::GuestType::Pv, true, true},
                          {"HVM without the module, debugged", hv::GuestType::Hvm, false, true}};
    std::vector<DomId> doms;
    auto hv = host->open();
    for (const Case& c : cases) {
      doms.push_back(*host->create_domain(guest(c.type, c.module)));
      if (c.debugged) { ASSERT_TRUE(hv->set_debugging(doms.back(), true)); }
    }
    auto rep = doctor(*hv);
    ASSERT_TRUE(rep) << rep.error().what;
    ASSERT_EQ(rep->domains.size(), doms.size());
    unsigned available = 0, refused = 0;
    for (std::size_t k = 0; k < doms.size(); ++k) {
      for (ChannelKind kind : {ChannelKind::Guest, ChannelKind::VmEvent, ChannelKind::Debugger}) {
        SCOPED_TRACE(std::string(cases[k].what) + ", the " + channel_kind_name(kind) + " channel");
        const ChannelCheck& said = check(rep->domains[k], kind);
        auto s = Session::open(host->open(), SessionOptions{kind});
        Result<void> attached = s ? (*s)->load_symbols(doms[k], demo_map()) : Result<void>(std::unexpected(s.error()));
        EXPECT_EQ(said.available, attached.has_value())
            << "doctor: " << said.detail << "; session: " << (attached ? "attached" : attached.error().what);
        if (attached) {
          auto name = (*s)->channel_name(doms[k]);
          ASSERT_TRUE(name);
          EXPECT_EQ(*name, channel_kind_name(kind));
        }
        ++(said.available ? available : refused);
      }
      EXPECT_EQ(hv->domain_info(doms[k])->debugged, cases[k].debugged) << "debugging mode left as it was";
    }
    EXPECT_GT(available, 0u);
    EXPECT_GT(refused, 0u);
  }
}

TEST(Doctor, UnknownDomainIsAnError) {
  auto host = hv::sim::SimHost::create();
  auto hv = host->open();
  auto rep = doctor(*hv, DomId{42});
  ASSERT_FALSE(rep);
  EXPECT_EQ(rep.error().code, Errc::NoSuchDomain);
}

}  // namespace
}  // namespace xenprobes::testing
