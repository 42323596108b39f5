// read_module_info against the simulated Xen: the demo guest publishes valid keys; each test
// corrupts them through xenstore to trip exactly one validation rule. The keys, the areas, the
// fixup slots, the jump entry, growth; the guest channel's keys, module-text and the hook path
// are in module_info_channel_test.cpp.
#include "unit/probe/module_info_fixture.hpp"

namespace xenprobes::guestmod {
namespace {

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

}  // namespace
}  // namespace xenprobes::guestmod
