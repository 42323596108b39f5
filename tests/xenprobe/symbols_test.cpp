// Session::find_symbols (the public API xenprobe lists and expands wildcards with) and the
// SymbolTable::matching behind it.
#include <gtest/gtest.h>

#include <algorithm>

#include "demo_abi.h"
#include "symbols/symbol_table.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {
namespace {

TEST(SymbolTableMatching, GlobsInNameThenAddressOrder) {
  auto t = symbols::SymbolTable::parse(
      "ffffffff81000000 T _text\n"
      "ffffffff81000100 T vfs_read\n"
      "ffffffff81000200 t vfs_open\n"
      "ffffffff81000300 T vfs_write\n"
      "ffffffff81000400 D vfs_stats\n"
      "ffffffff81000500 t vfs_open\n"
      "ffffffff81000600 T do_sys_open\n",
      "test map");
  ASSERT_TRUE(t) << t.error().what;
  std::vector<std::pair<std::string, std::uint64_t>> got;
  for (const auto& s : t->matching("vfs_*")) got.emplace_back(s.name, s.address.value);
  EXPECT_EQ(got, (std::vector<std::pair<std::string, std::uint64_t>>{{"vfs_open", 0xffffffff81000200},
                                                                     {"vfs_open", 0xffffffff81000500},
                                                                     {"vfs_read", 0xffffffff81000100},
                                                                     {"vfs_stats", 0xffffffff81000400},
                                                                     {"vfs_write", 0xffffffff81000300}}));
  EXPECT_EQ(t->matching("vfs_?ead").size(), 1u);
  EXPECT_EQ(t->matching("*open").size(), 3u);
  EXPECT_TRUE(t->matching("nothing*").empty());
  EXPECT_EQ(t->matching("do_sys_open").front().kind, symbols::SymbolKind::Text);
  // The slide applies, as everywhere in the table.
  ASSERT_TRUE(t->set_slide(0x200000));
  EXPECT_EQ(t->matching("vfs_read").front().address.value, 0xffffffff81200100u);
}

TEST(SessionFindSymbols, TheDemoGuestsFunctionsAndData) {
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c;
  c.start_paused = true;
  auto dom = host->create_domain(c);
  ASSERT_TRUE(dom);
  auto s = Session::open(host->open());
  ASSERT_TRUE(s) << s.error().what;
  // On the simulated Xen the demo guest's System.map is the default, as for resolve().
  auto sys = (*s)->find_symbols(*dom, "sys_*");
  ASSERT_TRUE(sys) << sys.error().what;
  std::vector<std::string> names;
  for (const SymbolInfo& i : *sys) {
    names.push_back(i.name);
    EXPECT_TRUE(i.function) << i.name;
    EXPECT_EQ(i.address.value, *host->symbol(*dom, i.name)) << i.name;
    EXPECT_GT(i.size, 0u) << i.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"sys_getppid", "sys_open", "sys_read", "sys_unlink", "sys_write"}));
  auto stats = (*s)->find_symbols(*dom, DEMO_SYM_STATS);
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->size(), 1u);
  EXPECT_FALSE(stats->front().function);
  EXPECT_EQ(stats->front().type, 'B');
  auto none = (*s)->find_symbols(*dom, "no_such_*");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

// The demo guest has no BTF (no __start_BTF): module_btf says so instead of walking anything,
// and loading its symbols reads no module functions (it has no module list either).
TEST(SessionModuleBtf, AGuestWithoutBtfSaysWhy) {
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c;
  c.start_paused = true;
  auto dom = host->create_domain(c);
  ASSERT_TRUE(dom);
  auto s = Session::open(host->open());
  ASSERT_TRUE(s) << s.error().what;
  auto m = (*s)->module_btf(*dom);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, Errc::NotFound);
  EXPECT_NE(m.error().what.find("no __start_BTF in"), std::string::npos) << m.error().what;
  auto sys = (*s)->find_symbols(*dom, "*:*");  // no module functions: nothing has a ':'
  ASSERT_TRUE(sys) << sys.error().what;
  EXPECT_TRUE(sys->empty());
}

}  // namespace
}  // namespace xenprobes::testing
