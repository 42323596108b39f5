// kstack's names when a module comes and goes while xenprobe (or xenprobesd) runs: StackNamer
// fetches the domain's functions again when the library's symbols generation moves, so a frame
// in a module loaded after the start is named `func+0xOFF [module]` and, once it went, is not.
// The guest and its module list: tests/engine/module_guest.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "demo_abi.h"
#include "engine/module_guest.hpp"
#include "kstack.hpp"

namespace xenprobes::testing {
namespace {

TEST(XenprobeModuleStack, AFrameInAModuleLoadedAfterTheStartIsNamedUntilItGoes) {
  ModuleGuest g;
  make_module_guest(g, Split::Caller);
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c;
  c.image = g.image;
  c.iterations = 3;
  c.start_paused = true;
  auto dom = host->create_domain(c);
  ASSERT_TRUE(dom) << dom.error().what;
  auto session = Session::open(host->open(), SessionOptions{ChannelKind::Guest});
  ASSERT_TRUE(session) << session.error().what;
  Session& s = **session;
  ASSERT_TRUE(s.load_symbols(*dom, g.map));
  xenprobe::StackNamer namer(s, *dom);
  auto ready = namer.prepare();
  ASSERT_TRUE(ready) << ready.error().what;

  ModuleWriter w(s.hypervisor(), *dom, g);
  std::vector<std::string> texts;
  unsigned hit = 0;
  auto p = s.probe(*dom, "demo_kstack_leaf", [&](HitContext& ctx) {
    std::string text;
    EXPECT_TRUE(namer.stack(ctx, 127, text)) << "hit " << hit;
    texts.push_back(text);
    // What the program in the guest does between two hits, and a lookup of Dom0's noticing it
    // (a hit's own walk notices too, at a bounded rate: tests/engine/module_refresh_test.cpp).
    if (hit == 0) {
      w.load();
      EXPECT_TRUE(s.resolve(*dom, "kmod:demo_kstack_outer"));
    }
    if (hit == 1) {
      w.unload();
      EXPECT_FALSE(s.resolve(*dom, "kmod:demo_kstack_outer"));
    }
    ++hit;
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_TRUE(s.hypervisor().unpause(*dom));
  for (int i = 0; i < 20000 && !host->wait_halted(*dom, std::chrono::milliseconds(0)); ++i) ASSERT_TRUE(s.run_once(2));
  ASSERT_EQ(texts.size(), 3u);
  // The kernel's frames named as before (demo_kstack_middle shares its address with the moved
  // _stext, which names it), the module's with their module.
  char want[512];
  std::snprintf(want, sizeof want,
                "        demo_kstack_outer+0x%x [kmod]\n        demo_kstack_entry+0x%x [kmod]\n"
                "        demo_kstack_entry+0x%x [kmod]\n",
                DEMO_KSTACK_OUTER_OFF, DEMO_KSTACK_ENTRY_RET_OFF, DEMO_KSTACK_ENTRY_IRQ_OFF);
  EXPECT_EQ(texts[1].rfind("\n        demo_kstack_leaf+0x0\n", 0), 0u) << texts[1];
  ASSERT_GE(texts[1].size(), std::strlen(want));
  EXPECT_EQ(texts[1].substr(texts[1].size() - std::strlen(want)), want) << texts[1];
  EXPECT_EQ(std::count(texts[1].begin(), texts[1].end(), '\n'), 6);  // five frames
  for (unsigned i : {0u, 2u}) {
    EXPECT_EQ(texts[i].find("[kmod]"), std::string::npos) << "hit " << i << ": " << texts[i];
    EXPECT_EQ(texts[i].rfind("\n        demo_kstack_leaf+0x0\n", 0), 0u) << texts[i];
  }
}

}  // namespace
}  // namespace xenprobes::testing
