#include "symbols/symbol_table.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>

#include <unistd.h>

namespace xenprobes::symbols {
namespace {

// A small x86-64 System.map (`nm -n`): a per-CPU offset, three aliases at _text, two static
// functions named `helper`, the end of .text, then data.
constexpr const char* kMap =
    "0000000000000000 D fixed_percpu_data\n"
    "ffffffff81000000 T _stext\n"
    "ffffffff81000000 T _text\n"
    "ffffffff81000000 T startup_64\n"
    "ffffffff81000100 T sys_open\n"  // size 0x80
    "ffffffff81000180 t helper\n"    // static, size 0x40
    "ffffffff810001c0 t helper\n"    // another static of the same name, size 0x40
    "ffffffff81000200 W weak_fn\n"
    "ffffffff81000240 T last_fn\n"  // size 0xc0, ends at _etext
    "ffffffff81000300 T _etext\n"
    "ffffffff81001000 R rodata_thing\n"
    "ffffffff81002000 D data_var\n"
    "ffffffff81002010 b bss_var\n";  // last: size unknown

constexpr std::uint64_t kText = 0xffffffff81000000;

SymbolTable map() {
  auto t = SymbolTable::parse(kMap, "test.map");
  EXPECT_TRUE(t.has_value()) << t.error().what;
  return std::move(*t);
}

template <typename T>
Errc code(const Result<T>& r) {
  EXPECT_FALSE(r.has_value());
  return r ? Errc::Io : r.error().code;
}

template <typename T>
std::string what(const Result<T>& r) {
  return r ? std::string("<success>") : r.error().what;
}

TEST(SymbolTable, ParsesSystemMap) {
  SymbolTable t = map();
  EXPECT_EQ(t.stats().lines, 13u);
  EXPECT_EQ(t.stats().text, 9u);
  EXPECT_EQ(t.stats().data, 3u);
  EXPECT_EQ(t.stats().other_types, 1u);  // the per-CPU offset
  EXPECT_EQ(t.stats().malformed, 0u);
  EXPECT_EQ(t.size(), 12u);
  auto s = t.lookup("weak_fn");
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].address, Gva{kText + 0x200});
  EXPECT_EQ((*s)[0].type, 'W');
  EXPECT_EQ((*s)[0].kind, SymbolKind::Text);
  EXPECT_EQ((*s)[0].size, 0x40u);
  auto d = t.lookup("data_var");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)[0].kind, SymbolKind::Data);
  EXPECT_EQ(code(t.lookup("fixed_percpu_data")), Errc::NotFound);
}

TEST(SymbolTable, ResolveForms) {
  SymbolTable t = map();
  EXPECT_EQ(t.resolve("sys_open"), Gva{kText + 0x100});
  EXPECT_EQ(t.resolve("sys_open+0x10"), Gva{kText + 0x110});
  EXPECT_EQ(t.resolve("sys_open+0X10"), Gva{kText + 0x110});
  EXPECT_EQ(t.resolve("sys_open+16"), Gva{kText + 0x110});
  EXPECT_EQ(t.resolve("sys_open+0x7f"), Gva{kText + 0x17f});  // last byte
  EXPECT_EQ(t.resolve("sys_open+0"), Gva{kText + 0x100});
  EXPECT_EQ(t.resolve("0xffffffff81000123"), Gva{kText + 0x123});
  EXPECT_EQ(t.resolve("0xFFFFFFFF81000100+0x10"), Gva{kText + 0x110});
  EXPECT_EQ(t.resolve("0x1000+8"), Gva{0x1008});  // addresses need no symbol
  EXPECT_EQ(t.resolve("data_var+4"), Gva{kText + 0x2004});
}

TEST(SymbolTable, ResolveErrors) {
  SymbolTable t = map();
  auto r = t.resolve("nosuch");
  EXPECT_EQ(code(r), Errc::NotFound);
  EXPECT_EQ(what(r), "no symbol 'nosuch' in test.map");

  for (const char* bad : {"", "sys_open+", "sys_open+0x", "sys_open+0xzz", "sys_open+-1", "sys_open+ 1", "sys_open+1+1",
                          "sys_open+99999999999999999999999", "sys_open+0x11112222333344445", "0x", "0xzz",
                          "0x11112222333344445", "+0x10", "sys open"}) {
    EXPECT_EQ(code(t.resolve(bad)), Errc::InvalidArgument) << bad;
  }

  auto past = t.resolve("sys_open+0x80");  // one past the end
  EXPECT_EQ(code(past), Errc::Range);
  EXPECT_NE(what(past).find("'sys_open' (size 0x80)"), std::string::npos) << what(past);
  EXPECT_EQ(code(t.resolve("0xffffffff81000100+0x80")), Errc::Range);
  EXPECT_EQ(code(t.resolve("0xffffffffffffffff+2")), Errc::Range);
  EXPECT_EQ(code(t.resolve("data_var+0x10")), Errc::Range);

  // The last symbol has no known size: no offset from it, but its start resolves.
  EXPECT_EQ(t.resolve("bss_var"), Gva{kText + 0x2010});
  auto unknown = t.resolve("bss_var+1");
  EXPECT_EQ(code(unknown), Errc::Range);
  EXPECT_NE(what(unknown).find("unknown size"), std::string::npos) << what(unknown);
}

TEST(SymbolTable, AmbiguousNameRefusedUnlessAddressGiven) {
  SymbolTable t = map();
  auto all = t.lookup("helper");
  ASSERT_TRUE(all.has_value());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].address, Gva{kText + 0x180});
  EXPECT_EQ((*all)[1].address, Gva{kText + 0x1c0});

  auto r = t.resolve("helper+0x4");
  EXPECT_EQ(code(r), Errc::InvalidArgument);
  EXPECT_NE(what(r).find("ambiguous"), std::string::npos) << what(r);
  EXPECT_NE(what(r).find("0xffffffff81000180"), std::string::npos) << what(r);
  EXPECT_NE(what(r).find("0xffffffff810001c0"), std::string::npos) << what(r);

  EXPECT_EQ(t.resolve("0xffffffff810001c0+0x4"), Gva{kText + 0x1c4});
  EXPECT_EQ(code(t.resolve("0xffffffff810001c0+0x40")), Errc::Range);

  // The same line twice is not ambiguous.
  auto dup = SymbolTable::parse(
      "ffffffff81000000 T _text\nffffffff81000010 T f\nffffffff81000010 T f\n"
      "ffffffff81000020 T _etext\n",
      "dup.map");
  ASSERT_TRUE(dup.has_value());
  EXPECT_EQ(dup->resolve("f+0xf"), Gva{kText + 0x1f});
}

TEST(SymbolTable, FunctionContainingBoundaries) {
  SymbolTable t = map();
  auto first = t.function_containing(Gva{kText + 0x100});
  ASSERT_TRUE(first.has_value()) << first.error().what;
  EXPECT_EQ(first->name, "sys_open");
  EXPECT_EQ(first->start, Gva{kText + 0x100});
  EXPECT_EQ(first->size, 0x80u);

  auto last = t.function_containing(Gva{kText + 0x17f});
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->name, "sys_open");

  auto next = t.function_containing(Gva{kText + 0x180});  // one past the end of sys_open
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->name, "helper");
  EXPECT_EQ(next->start, Gva{kText + 0x180});

  // The last function ends at _etext; _etext itself starts nothing.
  auto lf = t.function_containing(Gva{kText + 0x2ff});
  ASSERT_TRUE(lf.has_value());
  EXPECT_EQ(lf->name, "last_fn");
  EXPECT_EQ(lf->size, 0xc0u);
  EXPECT_EQ(code(t.function_containing(Gva{kText + 0x300})), Errc::NotFound);

  // Aliases: the function name wins over the linker markers.
  auto a = t.function_containing(Gva{kText});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->name, "startup_64");
  EXPECT_EQ(a->size, 0x100u);

  EXPECT_EQ(code(t.function_containing(Gva{kText - 1})), Errc::NotFound);
  EXPECT_EQ(code(t.function_containing(Gva{0})), Errc::NotFound);
  EXPECT_EQ(code(t.function_containing(Gva{kText + 0x1000})), Errc::NotFound);  // rodata
  EXPECT_EQ(code(t.function_containing(Gva{~0ull})), Errc::NotFound);           // last, size unknown
}

TEST(SymbolTable, LastTextSymbolWithoutEtextHasUnknownSize) {
  auto t = SymbolTable::parse("ffffffff81000000 T a\nffffffff81000010 T b\n", "noetext.map");
  ASSERT_TRUE(t.has_value());
  auto a = t->function_containing(Gva{kText + 0xf});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size, 0x10u);
  auto b = t->function_containing(Gva{kText + 0x10});
  EXPECT_EQ(code(b), Errc::NotFound);
  EXPECT_NE(what(b).find("size is unknown"), std::string::npos) << what(b);
  EXPECT_EQ(t->resolve("b"), Gva{kText + 0x10});
  EXPECT_EQ(code(t->resolve("b+1")), Errc::Range);

  auto with =
      SymbolTable::parse("ffffffff81000000 T a\nffffffff81000010 T b\nffffffff81000030 T _etext\n", "etext.map");
  ASSERT_TRUE(with.has_value());
  auto b2 = with->function_containing(Gva{kText + 0x2f});
  ASSERT_TRUE(b2.has_value());
  EXPECT_EQ(b2->name, "b");
  EXPECT_EQ(b2->size, 0x20u);
}

TEST(SymbolTable, Symbolize) {
  SymbolTable t = map();
  EXPECT_EQ(t.symbolize(Gva{kText + 0x110}), "sys_open+0x10");
  EXPECT_EQ(t.symbolize(Gva{kText + 0x100}), "sys_open+0x0");
  EXPECT_EQ(t.symbolize(Gva{kText + 0x2004}), "data_var+0x4");
  EXPECT_EQ(t.symbolize(Gva{kText + 0x2010}), "bss_var+0x0");
  EXPECT_EQ(t.symbolize(Gva{kText + 0x2011}), "0xffffffff81002011");  // size unknown
  EXPECT_EQ(t.symbolize(Gva{0x1234}), "0x1234");
}

TEST(SymbolTable, KaslrSlideUp) {
  SymbolTable t = map();
  constexpr std::int64_t kSlide = 0x1d000000;  // 464 MiB
  auto s = t.slide_from_text(Gva{kText + kSlide});
  ASSERT_TRUE(s.has_value()) << s.error().what;
  EXPECT_EQ(*s, kSlide);
  EXPECT_EQ(t.slide(), kSlide);
  EXPECT_EQ(t.resolve("sys_open+0x10"), Gva{kText + kSlide + 0x110});
  EXPECT_EQ(t.resolve("0xffffffff81000123"), Gva{kText + 0x123});  // addresses are taken as running
  EXPECT_EQ((*t.lookup("helper"))[1].address, Gva{kText + kSlide + 0x1c0});
  auto f = t.function_containing(Gva{kText + kSlide + 0x17f});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "sys_open");
  EXPECT_EQ(f->start, Gva{kText + kSlide + 0x100});
  EXPECT_EQ(t.symbolize(Gva{kText + kSlide + 0x110}), "sys_open+0x10");
  // The link-time address now lies below every symbol.
  EXPECT_EQ(code(t.function_containing(Gva{kText + 0x110})), Errc::NotFound);
  EXPECT_EQ(code(t.function_containing(Gva{0x10})), Errc::NotFound);
}

TEST(SymbolTable, KaslrSlideDown) {
  SymbolTable t = map();
  constexpr std::int64_t kSlide = -0x1000000;  // -16 MiB
  ASSERT_TRUE(t.set_slide(kSlide).has_value());
  const std::uint64_t base = kText - 0x1000000;
  EXPECT_EQ(t.resolve("sys_open"), Gva{base + 0x100});
  auto f = t.function_containing(Gva{base + 0x100});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "sys_open");
  EXPECT_EQ(t.symbolize(Gva{base + 0x2004}), "data_var+0x4");
  EXPECT_EQ(code(t.function_containing(Gva{~0ull})), Errc::NotFound);
  // And back.
  auto s = t.slide_from_text(Gva{kText});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, 0);
  EXPECT_EQ(t.resolve("sys_open"), Gva{kText + 0x100});
}

TEST(SymbolTable, HostileRunningText) {
  SymbolTable t = map();
  ASSERT_TRUE(t.set_slide(0x200000).has_value());
  for (std::uint64_t bad : std::initializer_list<std::uint64_t>{
           kText + 0x123, kText + 0x100000, 0x00007fff81000000ull, 0ull, 0xffff7fffffe00000ull,
           0xffffffffffe00000ull /* fixmap, not the image */, 0xffffffffc0000000ull}) {
    auto r = t.slide_from_text(Gva{bad});
    EXPECT_EQ(code(r), Errc::InvalidArgument) << std::hex << bad;
    EXPECT_EQ(t.slide(), 0x200000) << "a refused slide must leave the old one";
  }
  for (std::int64_t bad : {std::int64_t{1}, std::int64_t{0x100000}, std::int64_t{-0x1000},
                           std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                           std::int64_t{0x7f000000} /* wraps */, -(std::int64_t{1} << 47) /* below half */}) {
    auto r = t.set_slide(bad);
    EXPECT_EQ(code(r), Errc::InvalidArgument) << bad;
    EXPECT_EQ(t.slide(), 0x200000);
  }
  auto r = t.slide_from_text(Gva{kText + 0x123});
  EXPECT_NE(what(r).find("2 MiB"), std::string::npos) << what(r);

  auto no_text = SymbolTable::parse("ffffffff81000010 T f\n", "notext.map");
  ASSERT_TRUE(no_text.has_value());
  EXPECT_EQ(code(no_text->slide_from_text(Gva{kText})), Errc::NotFound);
}

TEST(SymbolTable, HostileLines) {
  std::string text = std::string(5000, 'a') + "\n";              // very long line
  text += "ffffffff81000000 T " + std::string(600, 'n') + "\n";  // name too long
  text += "1ffffffff81000000 T seventeen_digits\n";
  text += "ffffffff8100000g T bad_hex\n";
  text += "ffffffff81000000 TT two_letter_type\n";
  text += "ffffffff81000000 5 digit_type\n";
  text += "ffffffff81000000 T name extra columns\n";
  text += "ffffffff81000000 T name [unterminated\n";
  text += std::string("ffffffff81000000 T na\0me\n", 25);  // NUL inside
  text += "ffffffff81000000 T na\x01me\n";
  text += "                 U undefined_no_address\n";
  text += "ffffffff81000000 T _text\r\n";  // CRLF is fine
  text += "   \t  \n\n";                   // blank: not counted
  text += "ffffffff81000040 T good\n";
  text += "ffffffff81000080 A absolute\n";  // well-formed, not kept
  text += "ffffffff81000100 T _etext";      // no final newline
  auto t = SymbolTable::parse(text, "hostile.map");
  ASSERT_TRUE(t.has_value()) << t.error().what;
  EXPECT_EQ(t->stats().malformed, 11u);
  EXPECT_EQ(t->stats().first_malformed_line, 1u);
  EXPECT_EQ(t->stats().other_types, 1u);
  EXPECT_EQ(t->size(), 3u);
  EXPECT_EQ(t->resolve("good+0xbf"), Gva{kText + 0xff});
  EXPECT_EQ(t->resolve("_text"), Gva{kText});
}

TEST(SymbolTable, BinaryGarbageNeverCrashes) {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 200; ++round) {
    std::string junk(rng() % 8192, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (round % 2) junk += "\nffffffff81000000 T _text\nffffffff81000010 T f\n";
    auto t = SymbolTable::parse(junk, "junk");
    if (!t) {
      EXPECT_EQ(t.error().code, Errc::InvalidArgument) << t.error().what;
      continue;
    }
    (void)t->resolve("f+0x1");
    (void)t->function_containing(Gva{rng()});
    (void)t->symbolize(Gva{rng()});
    (void)t->slide_from_text(Gva{rng()});
  }
  auto none = SymbolTable::parse(std::string("\x7f"
                                             "ELF\x02\x01\x01\0\0\0",
                                             10),
                                 "vmlinux");
  EXPECT_EQ(code(none), Errc::InvalidArgument);
  EXPECT_NE(what(none).find("no usable symbol in vmlinux"), std::string::npos) << what(none);
  EXPECT_EQ(code(SymbolTable::parse("", "empty")), Errc::InvalidArgument);
}

TEST(SymbolTable, Kallsyms) {
  constexpr const char* kKallsyms =
      "0000000000000000 A fixed_percpu_data\n"
      "ffffffff9e000000 T startup_64\n"
      "ffffffff9e000000 T _stext\n"
      "ffffffff9e000000 T _text\n"
      "ffffffff9e2a1b40 T do_sys_open\n"
      "ffffffff9e2a1c00 t do_sys_openat2\n"
      "ffffffff9ee00000 T _etext\n"
      "ffffffffc0a01000 t ext4_fill_super\t[ext4]\n"
      "ffffffffc0a02000 t ext4_init_fs\t[ext4]\n"
      "ffffffffc0b00000 T nf_register\t[nf_tables]\n";
  auto t = SymbolTable::parse(kKallsyms, "/proc/kallsyms");
  ASSERT_TRUE(t.has_value()) << t.error().what;
  EXPECT_EQ(t->stats().module_symbols, 3u);
  EXPECT_EQ(t->stats().malformed, 0u);
  EXPECT_EQ(code(t->resolve("ext4_fill_super")), Errc::NotFound);
  // kallsyms addresses are already running ones: slide 0.
  auto s = t->slide_from_text(Gva{0xffffffff9e000000});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, 0);
  EXPECT_EQ(t->resolve("do_sys_open+0xbf"), Gva{0xffffffff9e2a1bff});
  EXPECT_EQ(code(t->resolve("do_sys_open+0xc0")), Errc::Range);
  auto f = t->function_containing(Gva{0xffffffff9e2a1c10});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "do_sys_openat2");

  // Read without privilege, kallsyms shows every address as 0.
  auto hidden = SymbolTable::parse(
      "0000000000000000 T _text\n0000000000000000 t f\t[m]\n"
      "0000000000000000 T g\n",
      "/proc/kallsyms");
  EXPECT_EQ(code(hidden), Errc::Permission);
}

TEST(SymbolTable, LoadFromFile) {
  EXPECT_EQ(code(SymbolTable::load("/nonexistent/System.map")), Errc::NotFound);
  const auto path = std::filesystem::temp_directory_path() / ("xp_symbols_test_" + std::to_string(::getpid()) + ".map");
  { std::ofstream(path) << kMap; }
  auto t = SymbolTable::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(t.has_value()) << t.error().what;
  EXPECT_EQ(t->source(), path.string());
  auto r = t->resolve("nosuch");
  EXPECT_EQ(what(r), "no symbol 'nosuch' in " + path.string());
}

TEST(SymbolTable, DemoGuestSystemMap) {
#ifndef XENPROBES_DEMO_SYSTEM_MAP
  GTEST_SKIP() << "demo guest not configured";
#else
  if (!std::filesystem::exists(XENPROBES_DEMO_SYSTEM_MAP)) GTEST_SKIP() << "no " XENPROBES_DEMO_SYSTEM_MAP;
  auto t = SymbolTable::load(XENPROBES_DEMO_SYSTEM_MAP);
  ASSERT_TRUE(t.has_value()) << t.error().what;
  EXPECT_EQ(t->stats().malformed, 0u);
  for (const char* name : {"sys_open", "sys_unlink", "demo_dispatch"}) {
    auto a = t->resolve(name);
    ASSERT_TRUE(a.has_value()) << name << ": " << a.error().what;
    EXPECT_GE(a->value, 0xffffffff81000000ull) << name;
    auto f = t->function_containing(*a);
    ASSERT_TRUE(f.has_value()) << name << ": " << f.error().what;
    EXPECT_EQ(f->name, name);
    EXPECT_EQ(f->start, *a);
    // A real function: more than the 5-byte ftrace nop, well under 64 KiB.
    EXPECT_GT(f->size, 5u) << name;
    EXPECT_LT(f->size, 0x10000u) << name;
    auto end = t->function_containing(*a + (f->size - 1));
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->name, name);
    auto past = t->function_containing(*a + f->size);
    EXPECT_TRUE(!past || past->name != name) << name;
    EXPECT_EQ(t->symbolize(*a + 5), std::string(name) + "+0x5");
  }
  // Slid by 32 MiB, as the guest module would report it.
  ASSERT_TRUE(t->slide_from_text(Gva{0xffffffff83000000}).has_value());
  auto a = t->resolve("sys_open");
  ASSERT_TRUE(a.has_value());
  auto f = t->function_containing(*a);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "sys_open");
#endif
}

// Linux 6.1's System.map puts the global marker `T __noinstr_text_end` at the address of the
// local static-call trampoline that follows the section (`t __SCT__preempt_schedule`): the
// function's own name must win, or the rules keyed on it never see it.
TEST(SymbolTable, SectionMarkerNeverHidesTheFunctionAtItsAddress) {
  auto t = SymbolTable::parse(
      "ffffffff81000000 T _stext\n"
      "ffffffff81000000 T startup_64\n"
      "ffffffff81000100 T __noinstr_text_start\n"
      "ffffffff81000100 t noinstr_fn\n"
      "ffffffff81000200 T __noinstr_text_end\n"
      "ffffffff81000200 t __SCT__preempt_schedule\n"
      "ffffffff81000208 T __start_probe_section\n"
      "ffffffff81000208 t after_start\n"
      "ffffffff81000210 T __stop_probe_section\n"
      "ffffffff81000210 t after_stop\n"
      "ffffffff81000218 T __real_end\n"  // a real function whose name merely ends in _end
      "ffffffff81000220 T _etext\n",
      "markers.map");
  ASSERT_TRUE(t.has_value());
  auto name_at = [&](std::uint64_t a) {
    auto f = t->function_containing(Gva{a});
    return f ? f->name : std::string("<") + f.error().what + ">";
  };
  EXPECT_EQ(name_at(0xffffffff81000000), "startup_64");
  EXPECT_EQ(name_at(0xffffffff81000100), "noinstr_fn");
  EXPECT_EQ(name_at(0xffffffff81000204), "__SCT__preempt_schedule");
  EXPECT_EQ(name_at(0xffffffff81000208), "after_start");
  EXPECT_EQ(name_at(0xffffffff81000210), "after_stop");
  EXPECT_EQ(name_at(0xffffffff81000218), "__real_end");  // alone at its address: still a function
  EXPECT_EQ(t->symbolize(Gva{0xffffffff81000201}), "__SCT__preempt_schedule+0x1");
}

// Loaded modules' functions (set_module_functions): running addresses, never slid; what is
// malformed or overlapping is refused as a whole, the core kernel's names still win.
TEST(SymbolTable, ModuleFunctionsAreCheckedAndNeverSlid) {
  auto t =
      SymbolTable::parse("ffffffff81000000 T _text\nffffffff81000100 T vfs_read\nffffffff81000200 T _etext\n", "m");
  ASSERT_TRUE(t) << t.error().what;
  constexpr std::uint64_t kMod = 0xffffffffc0001000ull;
  ASSERT_TRUE(t->set_module_functions({{"xfs", "xfs_read", kMod, 0x40, 't'},
                                       {"xfs", "xfs_read_alias", kMod, 0x40, 't'},
                                       {"xfs", "vfs_read", kMod + 0x40, 0x10, 'T'}}));
  EXPECT_EQ(t->module_function_count(), 3u);
  ASSERT_TRUE(t->set_slide(0x200000));
  EXPECT_EQ(t->resolve("vfs_read")->value, 0xffffffff81200100u);  // the core kernel's, slid
  EXPECT_EQ(t->resolve("xfs:vfs_read")->value, kMod + 0x40);      // the module's, not slid
  EXPECT_EQ(t->resolve("xfs_read_alias")->value, kMod);
  EXPECT_EQ(t->symbolize(Gva{kMod + 0x44}), "vfs_read+0x4 [xfs]");
  EXPECT_EQ(t->lookup("xfs_read")->front().module, "xfs");
  // Overlaps between functions, a bad module name, a name with ':' or no size: refused, and
  // the functions set before stay.
  auto overlap = t->set_module_functions({{"a", "f", kMod, 0x40, 't'}, {"b", "g", kMod + 0x20, 0x40, 't'}});
  ASSERT_FALSE(overlap);
  EXPECT_EQ(overlap.error().what, "module function b:g at 0xffffffffc0001020 overlaps a:f");
  for (const ModuleFunction& bad : {ModuleFunction{"a b", "f", kMod, 1, 't'}, ModuleFunction{"a", "x:y", kMod, 1, 't'},
                                    ModuleFunction{"a", "f", kMod, 0, 't'}, ModuleFunction{"a", "f", 0x1000, 1, 't'}})
    EXPECT_FALSE(t->set_module_functions({bad})) << bad.module << ":" << bad.name;
  EXPECT_EQ(t->module_function_count(), 3u);
  EXPECT_EQ(t->resolve("xfs_read")->value, kMod);
  // Cleared (the engine's answer to a refused set): the core kernel's names alone answer.
  t->clear_module_functions();
  EXPECT_EQ(t->module_function_count(), 0u);
  EXPECT_FALSE(t->resolve("xfs_read"));
  EXPECT_FALSE(t->resolve("xfs:vfs_read"));
  EXPECT_EQ(t->symbolize(Gva{kMod + 0x44}), "0xffffffffc0001044");
  EXPECT_EQ(t->resolve("vfs_read")->value, 0xffffffff81200100u);
}

}  // namespace
}  // namespace xenprobes::symbols
