// read_module_info against the simulated Xen, the keys the guest channel reads: its control area
// and port, module-text (optional, both keys or neither, validated as hostile input) and the
// functions the module's hook path calls.
#include "unit/probe/module_info_fixture.hpp"

namespace xenprobes::guestmod {
namespace {

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
