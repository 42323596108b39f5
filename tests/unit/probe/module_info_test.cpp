// read_module_info against the simulated Xen: the demo guest publishes valid keys; each test
// corrupts them through xenstore to trip exactly one validation rule.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>

#include "guestmod/module_info.hpp"
#include "probe/oea_pool.hpp"
#include "demo_guest.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::guestmod {
namespace {

using testing::Dom0Guest;

std::string hexs(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

CheckMapped all_mapped() {
  return [](Gva) -> Result<void> { return {}; };
}

class ModuleInfoTest : public ::testing::Test {
 protected:
  static hv::sim::DomainConfig paused() {
    hv::sim::DomainConfig c;
    c.start_paused = true;  // nothing here needs the guest to run
    return c;
  }
  Dom0Guest g{paused()};
  hv::sim::GuestLayout layout = *g.host->layout(g.dom);

  void put(std::string_view key, const std::string& value) {
    ASSERT_TRUE(g.hv->xs_write(module_key(g.dom, key), value).has_value());
  }
  void rm(std::string_view key) { ASSERT_TRUE(g.hv->xs_rm(module_key(g.dom, key)).has_value()); }
  Result<ModuleInfo> read(const CheckMapped& cm = all_mapped()) { return read_module_info(*g.hv, g.dom, cm); }
  // Expects `code` and a message containing every one of `parts`.
  void expect_error(Errc code, std::initializer_list<std::string> parts, const CheckMapped& cm = all_mapped()) {
    auto r = read(cm);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, code) << r.error().what;
    for (const auto& p : parts)
      EXPECT_NE(r.error().what.find(p), std::string::npos) << "'" << p << "' not in: " << r.error().what;
  }
  std::string path(std::string_view key) { return module_key(g.dom, key); }
  // For tests of other keys that move the module's text or grow its area past the slots: the
  // keys that must lie inside the module's text (the fixup slots, the jump entry) go.
  void rm_text_bound_keys() {
    for (auto k : {XENPROBES_XS_FIXUP_SLOTS_ADDR, XENPROBES_XS_FIXUP_SLOTS_COUNT, XENPROBES_XS_FIXUP_SLOTS_TABLE,
                   XENPROBES_XS_JUMP_ENTRY})
      rm(k);
  }
};

TEST_F(ModuleInfoTest, ReadsWhatTheDemoGuestPublishes) {
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_EQ(r->version, unsigned{XENPROBES_PROTOCOL_VERSION});
  EXPECT_EQ(r->kernel_text, Gva{layout.text_start});
  EXPECT_EQ(r->release, "6.1.0-sim");
  EXPECT_EQ(r->nr_cpus, 1u);
  ASSERT_EQ(r->areas.size(), 1u);
  EXPECT_EQ(r->areas[0], (OeaArea{Gva{layout.oea_addr}, layout.oea_size}));
  auto pool = probe::OeaPool::create(r->areas);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->total(), layout.oea_size / 32);
  // The module's own text: like a real module's, it holds the OEA pool (oea/0 here).
  ASSERT_TRUE(r->has_module_text());
  EXPECT_EQ(r->module_text_start, Gva{layout.oea_addr});
  EXPECT_GT(r->module_text_end.value, layout.oea_addr + layout.oea_size);
  EXPECT_LE(r->module_text_end.value - r->module_text_start.value, kMaxModuleText);
  EXPECT_TRUE(r->in_module_text(Gva{layout.oea_addr}));
  EXPECT_TRUE(r->in_module_text(Gva{r->module_text_end.value - 1}));
  EXPECT_FALSE(r->in_module_text(r->module_text_end));
  EXPECT_FALSE(r->in_module_text(Gva{layout.text_start}));
}

TEST_F(ModuleInfoTest, RealPageTableCheck) {
  auto mem = g.memory_view();
  auto r = read(check_mapped_via(*mem));
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_EQ(r->areas.size(), 1u);
  EXPECT_TRUE(r->fixup_slots) << "the fixup slots' page is mapped and executable";
  // Grown over the fixup slots' page (executable) and their entries' page (NX): that one is
  // not usable for slots.
  rm_text_bound_keys();
  put("oea/0/size", std::to_string(layout.oea_size + 2 * 4096));
  expect_error(Errc::Fault, {path("oea/0/addr"), hexs(layout.oea_addr + layout.oea_size + 4096), "not usable"},
               check_mapped_via(*mem));
  // Kernel data is mapped NX: not usable for slots. (The guard is shrunk to the demo guest's
  // text so that its data page passes every other rule.)
  const std::uint64_t data = (layout.text_end + 4095) & ~4095ull;
  put("oea/0/addr", hexs(data));
  put("oea/0/size", "4096");
  auto nx = read_module_info(*g.hv, g.dom, check_mapped_via(*mem), {.kernel_text_guard = data - layout.text_start});
  ASSERT_FALSE(nx.has_value());
  EXPECT_EQ(nx.error().code, Errc::Fault);
  EXPECT_NE(nx.error().what.find("NX"), std::string::npos) << nx.error().what;
}

TEST(ModuleInfoNoModule, NotLoadedNamesTheAlternatives) {
  hv::sim::DomainConfig c;
  c.start_paused = true;
  c.publish_module = false;
  Dom0Guest g{c};
  auto r = read_module_info(*g.hv, g.dom, all_mapped());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::NotFound);
  const std::string n = std::to_string(g.dom.value);
  EXPECT_NE(r.error().what.find("guest module xenprobesU is not loaded in domain " + n), std::string::npos)
      << r.error().what;
  EXPECT_NE(r.error().what.find("insmod xenprobesU.ko"), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("vmevent"), std::string::npos) << r.error().what;
}

TEST_F(ModuleInfoTest, OtherXenstoreErrorsPropagate) {
  g.host->fail_op(hv::sim::Op::XsRead, Errc::Io);
  expect_error(Errc::Io, {path(XENPROBES_XS_VERSION)});
  g.host->fail_op(hv::sim::Op::XsRead, Errc::Io, 2);  // version, state, then kernel-text
  expect_error(Errc::Io, {path(XENPROBES_XS_KERNEL_TEXT)});
}

TEST_F(ModuleInfoTest, MissingCallbackRefused) { expect_error(Errc::InvalidArgument, {"check_mapped"}, CheckMapped{}); }

TEST_F(ModuleInfoTest, WrongVersion) {
  put(XENPROBES_XS_VERSION, "2");
  expect_error(Errc::NotSupported, {"guest module speaks protocol 2, this library speaks 1"});
  put(XENPROBES_XS_VERSION, "1x");
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_VERSION), "'1x'"});
}

TEST_F(ModuleInfoTest, NotReady) {
  put(XENPROBES_XS_STATE, "starting");
  expect_error(Errc::Again, {"guest module not ready", "'starting'"});
  rm(XENPROBES_XS_STATE);
  expect_error(Errc::Again, {"guest module not ready"});
}

TEST_F(ModuleInfoTest, MissingKeyIsNamed) {
  rm(XENPROBES_XS_NR_CPUS);
  expect_error(Errc::NotFound, {path(XENPROBES_XS_NR_CPUS), "missing"});
}

struct Junk {
  const char* key;
  const char* value;
};

TEST_F(ModuleInfoTest, JunkNumbersAreRefusedNamingKeyAndValue) {
  const Junk cases[] = {
      {XENPROBES_XS_OEA_COUNT, ""},
      {XENPROBES_XS_OEA_COUNT, "1 "},
      {XENPROBES_XS_OEA_COUNT, " 1"},
      {XENPROBES_XS_OEA_COUNT, "+1"},
      {XENPROBES_XS_OEA_COUNT, "-1"},
      {XENPROBES_XS_OEA_COUNT, "01"},
      {XENPROBES_XS_OEA_COUNT, "1\n"},
      {XENPROBES_XS_OEA_COUNT, "0x1"},
      {XENPROBES_XS_OEA_COUNT, "0"},
      {XENPROBES_XS_OEA_COUNT, "17"},
      {XENPROBES_XS_OEA_COUNT, "18446744073709551617"},
      {XENPROBES_XS_OEA_COUNT, "99999999999999999999999"},
      {XENPROBES_XS_NR_CPUS, "0"},
      {XENPROBES_XS_NR_CPUS, "two"},
      {XENPROBES_XS_NR_CPUS, "8193"},
      {"oea/0/size", "262144x"},
      {"oea/0/size", "-4096"},
      {"oea/0/size", "1e6"},
      {"oea/0/size", "18446744073709551616"},
      {"oea/0/addr", "ffffffffa0000000"},
      {"oea/0/addr", "0x"},
      {"oea/0/addr", "0xffffffffa0000000z"},
      {"oea/0/addr", "0x1ffffffffa0000000"},
      {"oea/0/addr", "-0xffffffffa0000000"},
      {"oea/0/addr", "0x ffffffffa0000000"},
      {XENPROBES_XS_KERNEL_TEXT, "0xg"},
      {XENPROBES_XS_KERNEL_TEXT, "0x1000"},
      {XENPROBES_XS_KERNEL_TEXT, "0xffffffff81000800"},
      {XENPROBES_XS_RELEASE, ""},
      {XENPROBES_XS_RELEASE, "6.1 evil"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = '" + c.value + "'");
    auto r = read_module_info(*g.hv, g.dom, all_mapped());
    ASSERT_TRUE(r.has_value()) << "previous case not restored: " << r.error().what;
    auto old = *g.hv->xs_read(path(c.key));
    put(c.key, c.value);
    expect_error(Errc::InvalidArgument, {path(c.key)});
    put(c.key, old);
  }
  // Hostile values are sanitised in messages.
  put(XENPROBES_XS_NR_CPUS, std::string("\x1b[2J") + std::string(200, 'A'));
  auto r = read();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().what.find("'?[2JAAAA"), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("...'"), std::string::npos) << r.error().what;
  EXPECT_LT(r.error().what.size(), 200u);
}

TEST_F(ModuleInfoTest, ReadsTheFixupSlots) {
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  ASSERT_TRUE(r->fixup_slots);
  EXPECT_EQ(r->fixup_slots->addr, Gva{layout.fixup_slots});
  EXPECT_EQ(r->fixup_slots->count, layout.fixup_count);
  EXPECT_EQ(r->fixup_slots->table, Gva{layout.fixup_table});
  EXPECT_EQ(r->fixup_slots->slot(2), Gva{layout.fixup_slots + 64});
  EXPECT_EQ(r->fixup_slots->entry(2), Gva{layout.fixup_table + 24});
  EXPECT_TRUE(r->fixup_slots->contains(Gva{layout.fixup_slots + 32ull * layout.fixup_count - 1}));
  EXPECT_FALSE(r->fixup_slots->contains(Gva{layout.fixup_slots + 32ull * layout.fixup_count}));
  // None published (an older module): none, and no error.
  rm_text_bound_keys();
  r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_FALSE(r->fixup_slots);
}

TEST_F(ModuleInfoTest, ReadsTheJumpEntryAndRefusesOneOutsideTheModulesText) {
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  ASSERT_TRUE(r->jump_entry);
  EXPECT_EQ(*r->jump_entry, Gva{layout.jump_entry});
  EXPECT_TRUE(r->in_module_text(*r->jump_entry));
  const std::string good = hexs(layout.jump_entry);
  struct Case {
    std::string value;
    const char* why;
  };
  for (const Case& c :
       {Case{"12345", "hex"}, Case{hexs(layout.text_start), "not inside the module's published text"},
        Case{hexs(layout.oea_addr + 64), "inside oea/0"}, Case{hexs(layout.fixup_slots + 32), "fixup slots"}}) {
    put(XENPROBES_XS_JUMP_ENTRY, c.value);
    expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_JUMP_ENTRY), c.why});
  }
  put(XENPROBES_XS_JUMP_ENTRY, good);
  // Only with module-text: a module that does not say where its text is cannot say this.
  for (auto k : {XENPROBES_XS_FIXUP_SLOTS_ADDR, XENPROBES_XS_FIXUP_SLOTS_COUNT, XENPROBES_XS_FIXUP_SLOTS_TABLE}) rm(k);
  rm(XENPROBES_XS_MODULE_TEXT_START);
  rm(XENPROBES_XS_MODULE_TEXT_END);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_JUMP_ENTRY), "module-text is missing"});
  // None published (an older module): none, and no error.
  rm(XENPROBES_XS_JUMP_ENTRY);
  r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_FALSE(r->jump_entry);
}

TEST_F(ModuleInfoTest, FixupSlotRules) {
  const std::string addr = hexs(layout.fixup_slots), table = hexs(layout.fixup_table);
  auto reset = [&] {
    put(XENPROBES_XS_FIXUP_SLOTS_ADDR, addr);
    put(XENPROBES_XS_FIXUP_SLOTS_COUNT, std::to_string(layout.fixup_count));
    put(XENPROBES_XS_FIXUP_SLOTS_TABLE, table);
  };
  rm(XENPROBES_XS_FIXUP_SLOTS_TABLE);
  expect_error(Errc::NotFound, {"all three or none"});
  reset();
  for (const char* count : {"0", "4097", "-1", "12x"}) {
    put(XENPROBES_XS_FIXUP_SLOTS_COUNT, count);
    expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_COUNT), "decimal count"});
  }
  reset();
  put(XENPROBES_XS_FIXUP_SLOTS_ADDR, hexs(layout.fixup_slots + 32));
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "page aligned"});
  put(XENPROBES_XS_FIXUP_SLOTS_ADDR, hexs(layout.oea_addr));  // oea/0 itself
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "overlap oea/0"});
  put(XENPROBES_XS_FIXUP_SLOTS_ADDR, hexs(layout.oea_addr - 4096));  // before the module's text
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "not inside the module's published text"});
  reset();
  put(XENPROBES_XS_FIXUP_SLOTS_COUNT, "4096");  // 128 KiB of slots: past the module's text
  expect_error(Errc::InvalidArgument, {"not inside the module's published text"});
  reset();
  put(XENPROBES_XS_FIXUP_SLOTS_TABLE, hexs(layout.fixup_table + 2));
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_TABLE), "4-byte aligned"});
  put(XENPROBES_XS_FIXUP_SLOTS_TABLE, "0x1000");
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_TABLE), "upper-half"});
  put(XENPROBES_XS_FIXUP_SLOTS_TABLE, addr);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_TABLE), "overlap the slots"});
  put(XENPROBES_XS_FIXUP_SLOTS_TABLE, hexs(layout.fixup_slots - (4ull << 30)));
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_TABLE), "rel32"});
  put(XENPROBES_XS_FIXUP_SLOTS_TABLE, hexs(layout.oea_addr + 64));  // inside oea/0's slot code
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_TABLE), "the entries overlap oea/0"});
  reset();
  // Slot pages must be mapped and executable.
  expect_error(Errc::Fault, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "not usable"}, [&](Gva p) -> Result<void> {
    if (p.value == layout.fixup_slots) return fail(Errc::Fault, "not mapped");
    return {};
  });
  EXPECT_TRUE(read().has_value());
}

TEST_F(ModuleInfoTest, AreaSizeRules) {
  put("oea/0/size", "0");
  expect_error(Errc::InvalidArgument, {path("oea/0/size"), "'0'", "nonzero multiple of 4096"});
  put("oea/0/size", "4097");
  expect_error(Errc::InvalidArgument, {path("oea/0/size"), "'4097'", "multiple of 4096"});
  put("oea/0/size", std::to_string(XENPROBES_OEA_MAX_SIZE + 4096));
  expect_error(Errc::InvalidArgument, {path("oea/0/size"), "larger than"});
  put("oea/0/size", std::to_string(XENPROBES_OEA_MAX_SIZE));
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "overlap oea/0"});  // over the slots now
  rm_text_bound_keys();
  EXPECT_TRUE(read().has_value());  // the bound itself is fine
}

TEST_F(ModuleInfoTest, AreaUnaligned) {
  put("oea/0/addr", hexs(layout.oea_addr + 0x800));
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), hexs(layout.oea_addr + 0x800), "not page aligned"});
}

TEST_F(ModuleInfoTest, AreaWrapsAround) {
  put("oea/0/addr", "0xfffffffffffff000");
  put("oea/0/size", "8192");
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), "wraps around"});
  put("oea/0/size", "4096");  // ends exactly at the top: no wrap, and within reach of text
  EXPECT_TRUE(read().has_value());
}

TEST_F(ModuleInfoTest, AreaNotCanonicalKernelAddress) {
  put("oea/0/addr", "0x7fffa0000000");
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), "canonical"});
  put("oea/0/addr", "0xffff7fffa0000000");  // non-canonical hole
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), "canonical"});
}

TEST_F(ModuleInfoTest, AreaOutOfRel32Reach) {
  rm(XENPROBES_XS_JUMP_ENTRY);  // the area moves out of the jump entry's reach (a rule of its own)
  const std::uint64_t text = layout.text_start;
  const std::uint64_t lowest = text - 0x80000000ull;  // text - 2 GiB: still reachable
  put("oea/0/addr", hexs(lowest));
  put("oea/0/size", "8192");
  EXPECT_TRUE(read().has_value()) << read().error().what;
  put("oea/0/addr", hexs(lowest - 4096));  // first page 4 KiB too far, second page fine
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), hexs(lowest - 4096), "rel32"});
  put("oea/0/addr", "0xffff888000000000");  // the direct map: far away
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), "rel32"});
}

TEST_F(ModuleInfoTest, AreaOverlapsKernelText) {
  const std::uint64_t text = layout.text_start;
  put("oea/0/addr", hexs(text + 0x100000));
  expect_error(Errc::InvalidArgument, {path("oea/0/addr"), "overlaps the kernel image"});
  put("oea/0/addr", hexs(text - 4096));  // ends inside the guard
  expect_error(Errc::InvalidArgument, {"overlaps the kernel image"});
  put("oea/0/addr", hexs(text - layout.oea_size));  // ends right below text
  EXPECT_TRUE(read().has_value());
  put("oea/0/addr", hexs(text + (16u << 20)));  // right after the guard
  EXPECT_TRUE(read().has_value());
  // The guard is an option.
  EXPECT_FALSE(read_module_info(*g.hv, g.dom, all_mapped(), {.kernel_text_guard = 32u << 20}).has_value());
}

TEST_F(ModuleInfoTest, AreasOverlapEachOther) {
  put(XENPROBES_XS_OEA_COUNT, "2");
  put("oea/1/addr", hexs(layout.oea_addr + layout.oea_size - 4096));
  put("oea/1/size", "8192");
  expect_error(Errc::InvalidArgument, {path("oea/1/addr"), "overlaps oea/0"});
  put("oea/1/addr", hexs(layout.oea_addr - 4096));
  expect_error(Errc::InvalidArgument, {path("oea/1/addr"), "overlaps oea/0"});
  put("oea/1/addr", hexs(layout.oea_addr + layout.oea_size));  // adjacent is fine
  expect_error(Errc::InvalidArgument,
               {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "overlap oea/1"});  // the sim's slots are there
  rm_text_bound_keys();
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_EQ(r->areas.size(), 2u);
}

TEST_F(ModuleInfoTest, CountTooLargeOrKeysMissing) {
  put(XENPROBES_XS_OEA_COUNT, std::to_string(XENPROBES_OEA_MAX_AREAS + 1));
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_OEA_COUNT), "up to 16"});
  put(XENPROBES_XS_OEA_COUNT, "2");  // oea/1 never written
  expect_error(Errc::NotFound, {path("oea/1/addr")});
}

TEST_F(ModuleInfoTest, UnmappedPageRefused) {
  const std::uint64_t bad = layout.oea_addr + 3 * 4096;
  unsigned calls = 0;
  CheckMapped cm = [&](Gva page) -> Result<void> {
    ++calls;
    EXPECT_EQ(page.value % 4096, 0u);
    if (page.value == bad) return fail(Errc::Fault, "not present");
    return {};
  };
  expect_error(Errc::Fault, {path("oea/0/addr"), hexs(bad), "not present"}, cm);
  EXPECT_EQ(calls, 4u);  // pages 0..2 good, page 3 refused, nothing after
  calls = 0;
  cm = [&](Gva) -> Result<void> {
    ++calls;
    return {};
  };
  ASSERT_TRUE(read(cm).has_value());
  EXPECT_EQ(calls, layout.oea_size / 4096 + 1);  // every page, and the fixup slots' page
}

TEST_F(ModuleInfoTest, GrowthRequestAndReRead) {
  auto first = read();
  ASSERT_TRUE(first.has_value());
  auto pool = probe::OeaPool::create(first->areas);
  ASSERT_TRUE(pool.has_value());

  EXPECT_EQ(request_growth(*g.hv, g.dom, 0).error().code, Errc::InvalidArgument);
  EXPECT_EQ(request_growth(*g.hv, g.dom, XENPROBES_OEA_MAX_SIZE + 1).error().code, Errc::InvalidArgument);
  put(XENPROBES_XS_OEA_ERROR, "vmalloc failed");  // a previous refusal is cleared
  ASSERT_TRUE(request_growth(*g.hv, g.dom, 5000).has_value());
  EXPECT_EQ(*g.hv->xs_read(path(XENPROBES_XS_OEA_REQUEST)), "8192");  // whole pages
  EXPECT_EQ(g.hv->xs_read(path(XENPROBES_XS_OEA_ERROR)).error().code, Errc::NotFound);
  ASSERT_TRUE(request_growth(*g.hv, g.dom, 4096).has_value());  // no stale error: fine too
  EXPECT_EQ(*g.hv->xs_read(path(XENPROBES_XS_OEA_REQUEST)), "4096");

  // What the guest module does: append the area, bump the count last. (The sim's own
  // implementation comes with the guest-module issue.)
  const std::uint64_t grown = layout.oea_addr + 0x1000000;
  put("oea/1/addr", hexs(grown));
  put("oea/1/size", "8192");
  put(XENPROBES_XS_OEA_COUNT, "2");
  auto second = read();
  ASSERT_TRUE(second.has_value()) << second.error().what;
  auto added = added_areas(*second, pool->areas());
  ASSERT_TRUE(added.has_value()) << added.error().what;
  ASSERT_EQ(added->size(), 1u);
  EXPECT_EQ((*added)[0], (OeaArea{Gva{grown}, 8192}));
  for (const auto& a : *added) ASSERT_TRUE(pool->add_area(a).has_value());
  EXPECT_EQ(pool->total(), (layout.oea_size + 8192) / 32);
  auto none = added_areas(*second, pool->areas());
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());

  // A guest that moves a known area, or withdraws one, is refused.
  put("oea/0/addr", hexs(layout.oea_addr + 0x2000000));
  auto moved = read();
  ASSERT_TRUE(moved.has_value()) << moved.error().what;
  auto r = added_areas(*moved, pool->areas());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::Io);
  EXPECT_NE(r.error().what.find("moved out-of-line execution area oea/0"), std::string::npos) << r.error().what;
  ModuleInfo fewer = *first;
  fewer.areas.clear();
  EXPECT_EQ(added_areas(fewer, pool->areas()).error().code, Errc::Io);

  g.host->fail_op(hv::sim::Op::XsWrite, Errc::Io);
  EXPECT_EQ(request_growth(*g.hv, g.dom, 4096).error().code, Errc::Io);
}

// ---- the guest channel's keys ----

class GuestChannelKeysTest : public ModuleInfoTest {
 protected:
  ModuleInfo mi() {
    auto r = read();
    if (!r) throw std::runtime_error(r.error().what);
    return *r;
  }
  Result<GuestChannelInfo> read_ch() { return read_guest_channel_info(*g.hv, g.dom, mi()); }
  void expect_ch_error(Errc code, std::initializer_list<std::string> parts) {
    auto r = read_ch();
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, code) << r.error().what;
    for (const auto& p : parts)
      EXPECT_NE(r.error().what.find(p), std::string::npos) << "'" << p << "' not in: " << r.error().what;
  }
};

TEST_F(GuestChannelKeysTest, ReadsWhatTheSimulatedModulePublishes) {
  auto r = read_ch();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_EQ(r->control, Gva{layout.control_addr});
  EXPECT_EQ(r->size(), layout.control_size);
  EXPECT_GE(r->pages, 1u);
  EXPECT_LE(r->pages, unsigned{XENPROBES_CTL_MAX_PAGES});
  EXPECT_GE(r->evtchn, 1u);
  // The port is a real unbound port of the guest: Dom0 can bind it.
  EXPECT_TRUE(g.hv->evtchn_bind_interdomain(g.dom, r->evtchn).has_value());
}

TEST_F(GuestChannelKeysTest, AnOlderModuleIsNamedWithTheAlternatives) {
  rm(XENPROBES_XS_CONTROL_ADDR);
  expect_ch_error(Errc::NotFound,
                  {path(XENPROBES_XS_CONTROL_ADDR), "predates the guest channel", "debugger", "vmevent"});
  // The other keys alone do not make a guest channel either, and the rest still reads.
  EXPECT_TRUE(read().has_value());
}

TEST_F(GuestChannelKeysTest, MissingKeysAreNamed) {
  rm(XENPROBES_XS_CONTROL_PAGES);
  expect_ch_error(Errc::NotFound, {path(XENPROBES_XS_CONTROL_PAGES), "missing"});
  put(XENPROBES_XS_CONTROL_PAGES, "1");
  rm(XENPROBES_XS_EVTCHN);
  expect_ch_error(Errc::NotFound, {path(XENPROBES_XS_EVTCHN), "missing"});
}

TEST_F(GuestChannelKeysTest, JunkIsRefusedNamingKeyAndValue) {
  const Junk cases[] = {
      {XENPROBES_XS_CONTROL_ADDR, "ffffffffc0000000"},
      {XENPROBES_XS_CONTROL_ADDR, "0x"},
      {XENPROBES_XS_CONTROL_ADDR, "0xffffffffc0000000 "},
      {XENPROBES_XS_CONTROL_ADDR, "0x1ffffffffc0000000"},
      {XENPROBES_XS_CONTROL_ADDR, "-0x1000"},
      {XENPROBES_XS_CONTROL_ADDR, ""},
      {XENPROBES_XS_CONTROL_ADDR, "0xffffffffc0000800"},  // unaligned
      {XENPROBES_XS_CONTROL_ADDR, "0x7fffc0000000"},      // user half
      {XENPROBES_XS_CONTROL_ADDR, "0xffff7fffc0000000"},  // non-canonical hole
      {XENPROBES_XS_CONTROL_PAGES, "0"},
      {XENPROBES_XS_CONTROL_PAGES, "65"},
      {XENPROBES_XS_CONTROL_PAGES, "01"},
      {XENPROBES_XS_CONTROL_PAGES, "1 "},
      {XENPROBES_XS_CONTROL_PAGES, "+1"},
      {XENPROBES_XS_CONTROL_PAGES, "0x1"},
      {XENPROBES_XS_CONTROL_PAGES, "18446744073709551617"},
      {XENPROBES_XS_EVTCHN, "0"},
      {XENPROBES_XS_EVTCHN, "131072"},
      {XENPROBES_XS_EVTCHN, "-1"},
      {XENPROBES_XS_EVTCHN, "1x"},
      {XENPROBES_XS_EVTCHN, "4294967297"},
      {XENPROBES_XS_EVTCHN, ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = '" + c.value + "'");
    ASSERT_TRUE(read_ch().has_value()) << "previous case not restored";
    auto old = *g.hv->xs_read(path(c.key));
    put(c.key, c.value);
    expect_ch_error(Errc::InvalidArgument, {path(c.key)});
    put(c.key, old);
  }
  put(XENPROBES_XS_CONTROL_PAGES, std::to_string(XENPROBES_CTL_MAX_PAGES));  // the bound itself is fine
  EXPECT_TRUE(read_ch().has_value());
  put(XENPROBES_XS_EVTCHN, std::to_string(kMaxEvtchnPort));
  EXPECT_TRUE(read_ch().has_value());
  // Hostile values are sanitised in messages.
  put(XENPROBES_XS_CONTROL_ADDR, std::string("\x1b[2J") + std::string(200, 'A'));
  expect_ch_error(Errc::InvalidArgument, {"'?[2JAAAA", "...'"});
}

TEST_F(GuestChannelKeysTest, AreaRules) {
  put(XENPROBES_XS_CONTROL_ADDR, "0xfffffffffffff000");
  put(XENPROBES_XS_CONTROL_PAGES, "2");
  expect_ch_error(Errc::InvalidArgument, {path(XENPROBES_XS_CONTROL_ADDR), "wraps around"});
  put(XENPROBES_XS_CONTROL_PAGES, "1");  // ends exactly at the top
  EXPECT_TRUE(read_ch().has_value());

  // Not in the first 16 MiB of the kernel image, nor ending inside them.
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.text_start + 0x200000));
  expect_ch_error(Errc::InvalidArgument, {path(XENPROBES_XS_CONTROL_ADDR), "overlaps the kernel image"});
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.text_start - 4096));
  put(XENPROBES_XS_CONTROL_PAGES, "2");
  expect_ch_error(Errc::InvalidArgument, {"overlaps the kernel image"});
  put(XENPROBES_XS_CONTROL_PAGES, "1");  // ends right below text
  EXPECT_TRUE(read_ch().has_value());
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.text_start + (16u << 20)));  // right after the guard
  EXPECT_TRUE(read_ch().has_value());

  // Not in any OEA area: the first, or one published later.
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.oea_addr + layout.oea_size - 4096));
  put(XENPROBES_XS_CONTROL_PAGES, "4");
  expect_ch_error(Errc::InvalidArgument, {path(XENPROBES_XS_CONTROL_ADDR), "overlaps oea/0"});
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.oea_addr - 4 * 4096));  // ends right below it
  EXPECT_TRUE(read_ch().has_value());
  put(XENPROBES_XS_OEA_COUNT, "2");
  put("oea/1/addr", hexs(layout.oea_addr + 0x1000000));
  put("oea/1/size", "8192");
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.oea_addr + 0x1000000 + 4096));
  expect_ch_error(Errc::InvalidArgument, {"overlaps oea/1"});
  put(XENPROBES_XS_OEA_COUNT, "1");

  // Nor the fixup slots or their entries: Dom0 writes those as well.
  put(XENPROBES_XS_CONTROL_PAGES, "1");
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.fixup_slots));
  expect_ch_error(Errc::InvalidArgument, {path(XENPROBES_XS_CONTROL_ADDR), "overlaps the fixup slots"});
  put(XENPROBES_XS_CONTROL_ADDR, hexs(layout.fixup_table & ~0xfffull));
  expect_ch_error(Errc::InvalidArgument, {path(XENPROBES_XS_CONTROL_ADDR), "overlaps the fixup slots' entries"});
}

TEST_F(GuestChannelKeysTest, OtherXenstoreErrorsPropagate) {
  ModuleInfo info = mi();
  g.host->fail_op(hv::sim::Op::XsRead, Errc::Io);
  auto r = read_guest_channel_info(*g.hv, g.dom, info);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::Io);
  EXPECT_NE(r.error().what.find(path(XENPROBES_XS_CONTROL_ADDR)), std::string::npos) << r.error().what;
}

TEST(ModuleInfoParse, StrictNumbers) {
  EXPECT_EQ(parse_decimal("0", 10), 0u);
  EXPECT_EQ(parse_decimal("18446744073709551615", ~0ull), ~0ull);
  EXPECT_FALSE(parse_decimal("18446744073709551616", ~0ull));
  EXPECT_FALSE(parse_decimal("11", 10));
  EXPECT_FALSE(parse_decimal("00", 10));
  EXPECT_EQ(parse_hex("0xFFFFffffA0000000"), 0xffffffffa0000000ull);
  EXPECT_EQ(parse_hex("0X0"), 0u);
  EXPECT_EQ(parse_hex("0x0000000000000001"), 1u);
  EXPECT_FALSE(parse_hex("0x00000000000000001"));
  EXPECT_FALSE(parse_hex("x1"));
  EXPECT_FALSE(parse_hex("01"));
  EXPECT_EQ(sanitize("a\tb"), "a?b");
}

// ---- module-text: optional, both keys or neither, validated as hostile input ----

TEST_F(ModuleInfoTest, ModuleTextIsOptional) {
  rm(XENPROBES_XS_MODULE_TEXT_START);
  rm(XENPROBES_XS_MODULE_TEXT_END);
  // Fixup slots must lie in the module's text: without it they are refused.
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_FIXUP_SLOTS_ADDR), "module-text is missing"});
  rm_text_bound_keys();
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;  // an older module: still valid
  EXPECT_FALSE(r->has_module_text());
  EXPECT_EQ(r->module_text_start, Gva{0});
  EXPECT_EQ(r->module_text_end, Gva{0});
  EXPECT_FALSE(r->in_module_text(Gva{0}));
  EXPECT_FALSE(r->in_module_text(Gva{layout.oea_addr}));
}

TEST_F(ModuleInfoTest, ModuleTextBothKeysOrNeither) {
  const std::string start = *g.hv->xs_read(path(XENPROBES_XS_MODULE_TEXT_START));
  rm(XENPROBES_XS_MODULE_TEXT_END);
  expect_error(Errc::NotFound, {path(XENPROBES_XS_MODULE_TEXT_END), "is missing although",
                                path(XENPROBES_XS_MODULE_TEXT_START), "both or neither"});
  rm(XENPROBES_XS_MODULE_TEXT_START);
  put(XENPROBES_XS_MODULE_TEXT_END, "0xffffffffa0400000");
  expect_error(Errc::NotFound,
               {path(XENPROBES_XS_MODULE_TEXT_START), "is missing although", path(XENPROBES_XS_MODULE_TEXT_END)});
  put(XENPROBES_XS_MODULE_TEXT_START, start);
  EXPECT_TRUE(read().has_value());
}

TEST_F(ModuleInfoTest, ModuleTextJunkIsRefusedNamingKeyAndValue) {
  const char* s = XENPROBES_XS_MODULE_TEXT_START;
  const char* e = XENPROBES_XS_MODULE_TEXT_END;
  const Junk cases[] = {
      {s, ""},
      {s, "ffffffffa0000000"},
      {s, "0x"},
      {s, "0xg"},
      {s, "0x1ffffffffa0000000"},
      {s, " 0xffffffffa0000000"},
      {s, "0xffffffffa0000000 "},
      {s, "-0xffffffffa0000000"},
      {s, "18446744072098938880"},  // decimal
      {e, ""},
      {e, "0x"},
      {e, "0xffffffffa0400000\n"},
      {e, "0xffffffffa04000000000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = '" + c.value + "'");
    auto r = read();
    ASSERT_TRUE(r.has_value()) << "previous case not restored: " << r.error().what;
    auto old = *g.hv->xs_read(path(c.key));
    put(c.key, c.value);
    expect_error(Errc::InvalidArgument, {path(c.key), "hex address"});
    put(c.key, old);
  }
  // Sanitised in messages.
  put(e, std::string("0x\x1b[2J") + std::string(200, 'f'));
  auto r = read();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().what.find("'0x?[2Jffff"), std::string::npos) << r.error().what;
  EXPECT_LT(r.error().what.size(), 250u);
}

TEST_F(ModuleInfoTest, ModuleTextRangeRules) {
  auto put_range = [&](std::uint64_t start, std::uint64_t end) {
    put(XENPROBES_XS_MODULE_TEXT_START, hexs(start));
    put(XENPROBES_XS_MODULE_TEXT_END, hexs(end));
  };
  const std::uint64_t base = 0xffffffffc0200000ull;
  rm_text_bound_keys();  // they must lie in the module's text, which moves here
  // Lower half, or the non-canonical hole: not a kernel address.
  put_range(0x7fffc0200000ull, base);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_START), "canonical"});
  put_range(0xffff7fffc0200000ull, base);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_START), "canonical"});
  put_range(0x1000, 0x2000);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_START), "canonical"});
  put_range(base, 0x7fffc0300000ull);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_END), "canonical"});
  // Empty or backwards.
  put_range(base, base);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_END), "not above", hexs(base)});
  put_range(base, base - 4096);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_END), "not above"});
  // At most 64 MiB: the bound itself is fine, a byte more is not.
  put_range(base, base + kMaxModuleText);
  auto r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_EQ(r->module_text_start, Gva{base});
  EXPECT_EQ(r->module_text_end, Gva{base + kMaxModuleText});
  put_range(base, base + kMaxModuleText + 1);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_END), "more than 67108864 bytes"});
  put_range(0xffff800000000000ull, 0xfffffffffffff000ull);  // the whole upper half
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_END), "not a module's text"});
  // Kernel text is not the module's (a confused module would make Dom0 refuse every probe).
  put_range(layout.text_start, layout.text_start + 0x10000);
  expect_error(Errc::InvalidArgument, {path(XENPROBES_XS_MODULE_TEXT_START), "overlaps the kernel image"});
  put_range(layout.text_start - 0x1000, layout.text_start + 1);  // its last byte is _text
  expect_error(Errc::InvalidArgument, {"overlaps the kernel image"});
  put_range(layout.text_start - 0x1000, layout.text_start);  // ends right below _text
  EXPECT_TRUE(read().has_value());
  // Not unaligned-sensitive, and one byte is a range.
  put_range(base + 3, base + 4);
  r = read();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_TRUE(r->in_module_text(Gva{base + 3}));
  EXPECT_FALSE(r->in_module_text(Gva{base + 4}));
}

TEST_F(ModuleInfoTest, ModuleTextReadErrorsPropagate) {
  // version, state, kernel-text, release, nr-cpus, oea/count, oea/0/addr, oea/0/size: then
  // module-text/start.
  g.host->fail_op(hv::sim::Op::XsRead, Errc::Io, 8);
  expect_error(Errc::Io, {path(XENPROBES_XS_MODULE_TEXT_START)});
}

// hook-path/* (protocol.h): the kernel functions the module's hit path calls.
class HookPathTest : public ModuleInfoTest {
 protected:
  Result<std::optional<std::vector<std::uint64_t>>> hook() { return read_hook_path(*g.hv, g.dom); }
  std::string entry(unsigned i) { return "hook-path/" + std::to_string(i); }
  void expect_bad(std::initializer_list<std::string> parts) {
    auto r = hook();
    ASSERT_FALSE(r.has_value()) << "accepted";
    EXPECT_EQ(r.error().code, Errc::InvalidArgument) << r.error().what;
    for (const auto& p : parts)
      EXPECT_NE(r.error().what.find(p), std::string::npos) << "'" << p << "' not in: " << r.error().what;
  }
};

TEST_F(HookPathTest, TheSimulatedModulePublishesAnEmptyListByDefault) {
  auto r = hook();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  ASSERT_TRUE(r->has_value());
  EXPECT_TRUE((*r)->empty());
}

TEST_F(HookPathTest, ReadsTheAddressesSortedWithoutDuplicates) {
  put(XENPROBES_XS_HOOK_PATH_COUNT, "4");
  put(entry(0), "0xffffffff81000100");
  put(entry(1), "0xFFFFFFFF81000010");
  put(entry(2), "0xffffffff81000100");
  put(entry(3), "0xffff800000000000");  // the lowest upper-half address
  auto r = hook();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, (std::vector<std::uint64_t>{0xffff800000000000ull, 0xffffffff81000010ull, 0xffffffff81000100ull}));
  // Entries past the count are not read.
  put(entry(4), "junk");
  EXPECT_TRUE(hook().has_value());
}

TEST_F(HookPathTest, AnOlderModulePublishesNone) {
  rm(XENPROBES_XS_HOOK_PATH_COUNT);
  auto r = hook();
  ASSERT_TRUE(r.has_value()) << r.error().what;
  EXPECT_FALSE(r->has_value());
  // The module's other keys do not depend on it.
  EXPECT_TRUE(read().has_value());
}

TEST_F(HookPathTest, HostileValuesAreRefusedNamingKeyAndValue) {
  // The count: strict decimal, bounded.
  for (const char* bad : {"", "-1", "+1", "01", "0x2", "1 ", " 1", "65", "99999999999999999999999", "1\n"}) {
    put(XENPROBES_XS_HOOK_PATH_COUNT, bad);
    SCOPED_TRACE(bad);
    expect_bad({path(XENPROBES_XS_HOOK_PATH_COUNT)});
  }
  put(XENPROBES_XS_HOOK_PATH_COUNT, "64");
  expect_bad({path(entry(0)), "is missing although"});  // the bound itself is fine, the entries are not
  // An entry: strict hex, upper half.
  put(XENPROBES_XS_HOOK_PATH_COUNT, "1");
  for (const char* bad : {"", "0x", "ffffffff81000000", "0xffffffff8100000g", "0x1ffffffff81000000",
                          " 0xffffffff81000000", "0xffffffff81000000 ", "0xffffffff81000000\x01", "-0x1"}) {
    put(entry(0), bad);
    SCOPED_TRACE(bad);
    expect_bad({path(entry(0))});
  }
  for (const char* low : {"0x0", "0x7fffffffffff", "0xffff7fffffffffff"}) {
    put(entry(0), low);
    expect_bad({path(entry(0)), "not a kernel (upper-half) address"});
  }
  // Hostile bytes never reach the message.
  put(entry(0), std::string("0x\x1b[2J\xff") + std::string(100, 'A'));
  auto r = hook();
  ASSERT_FALSE(r.has_value());
  for (char c : r.error().what) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << r.error().what;
  // An entry without the count.
  rm(XENPROBES_XS_HOOK_PATH_COUNT);
  put(entry(0), "0xffffffff81000000");
  expect_bad({path(entry(0)), "without"});
}

TEST_F(HookPathTest, ReadErrorsPropagate) {
  put(XENPROBES_XS_HOOK_PATH_COUNT, "2");
  put(entry(0), "0xffffffff81000000");
  put(entry(1), "0xffffffff81000040");
  for (unsigned k = 0; k < 3; ++k) {  // the count, then each entry
    g.host->fail_op(hv::sim::Op::XsRead, Errc::Io, k);
    auto r = hook();
    g.host->clear_faults();
    ASSERT_FALSE(r.has_value()) << k;
    EXPECT_EQ(r.error().code, Errc::Io) << r.error().what;
  }
  EXPECT_TRUE(hook().has_value());
}

}  // namespace
}  // namespace xenprobes::guestmod
