// Symbols and BTF with no file, end to end on the simulated Xen: Session → the guest's memory
// (its own page tables) → the kallsyms search and decoder → the domain's SymbolTable → probes
// by name. The demo guest has no kallsyms of its own, so the test gives it some
// (tests/kallsyms_image.hpp): tables in Linux 6.12's layout built from the demo guest's
// System.map (with two compression tokens, so names really are expanded), and a small BTF
// blob, in one extra read-only PT_LOAD segment 2 MiB above the image, past unmapped pages the
// search has to step over. The format
// itself is checked on Debian's real kernels (tests/unit/kernel/guest_kernel_test.cpp).
#include <elf.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kallsyms_image.hpp"
#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

std::vector<Sym> demo_symbols() { return symbols_of_map(demo_map()); }
std::string image_with(const std::vector<std::uint8_t>& extra) {
  return image_with_segment(hv::sim::default_guest_dir() + "/vmlinux", extra);
}

TEST(GuestSymbols, KallsymsAndBtfFromTheGuestsMemory) {
  std::vector<Sym> syms = demo_symbols();
  ASSERT_GT(syms.size(), 20u);
  std::size_t btf_at = 0;
  const std::vector<std::uint8_t> seg = kallsyms_segment(syms, &btf_at);
  const std::string image = image_with(seg);

  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config();
  c.image = image;
  c.start_paused = true;
  auto dom = host->create_domain(c);
  std::filesystem::remove(image);
  ASSERT_TRUE(dom) << dom.error().what;
  auto s = Session::open(host->open(), SessionOptions{test_channel()});
  ASSERT_TRUE(s) << s.error().what;

  auto loaded = (*s)->load_symbols_from_guest(*dom);
  ASSERT_TRUE(loaded) << loaded.error().what;
  // Every symbol, at its address.
  for (const Sym& sym : syms) {
    auto found = (*s)->find_symbols(*dom, sym.name);
    ASSERT_TRUE(found) << found.error().what;
    bool at = false;
    for (const SymbolInfo& i : *found) at |= i.address.value == sym.addr && i.type == sym.type;
    EXPECT_TRUE(at) << sym.name << " not at 0x" << std::hex << sym.addr;
  }
  auto read = (*s)->resolve(*dom, "sys_read");
  ASSERT_TRUE(read) << read.error().what;
  EXPECT_EQ(read->value, *host->symbol(*dom, "sys_read"));

  // BTF through the decoded __start_BTF/__stop_BTF, byte for byte.
  auto btf = (*s)->kernel_btf(*dom);
  ASSERT_TRUE(btf) << btf.error().what;
  const std::vector<std::uint8_t> want(seg.begin() + static_cast<std::ptrdiff_t>(btf_at), seg.end());
  ASSERT_EQ(btf->size(), want.size());
  EXPECT_EQ(std::memcmp(btf->data(), want.data(), want.size()), 0);

  // And a probe goes on a name that came from the guest's memory (past the ftrace nop).
  auto p = (*s)->probe(*dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(p) << p.error().what;
  std::uint8_t b = 0;
  ASSERT_TRUE(host->peek(*dom, *host->symbol(*dom, "sys_read") + 5, std::as_writable_bytes(std::span(&b, 1))));
  EXPECT_EQ(b, trap_byte());
}

// Agentless (no guest module publishes _text): a System.map's KASLR slide comes from the
// guest's own kallsyms. The file here is the demo guest's System.map linked 2 MiB lower, as a
// kernel that KASLR moved up by 2 MiB would look.
TEST(GuestSymbols, AgentlessSlideOfASystemMapFromTheGuestsKallsyms) {
  XP_ONLY_ON_CHANNEL(ChannelKind::VmEvent);  // the channel that probes without a module
  std::vector<Sym> syms = demo_symbols();
  std::size_t btf_at = 0;
  const std::string image = image_with(kallsyms_segment(syms, &btf_at));
  const std::string map = image + ".map";
  {
    std::ofstream out(map);
    for (const Sym& sym : demo_symbols()) {
      char line[600];
      std::snprintf(line, sizeof line, "%016llx %c %s\n", static_cast<unsigned long long>(sym.addr - 0x200000),
                    sym.type, sym.name.c_str());
      out << line;
    }
  }
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config();
  c.image = image;
  c.start_paused = true;
  c.publish_module = false;
  auto dom = host->create_domain(c);
  std::filesystem::remove(image);
  ASSERT_TRUE(dom) << dom.error().what;
  auto s = Session::open(host->open(), SessionOptions{ChannelKind::VmEvent});
  ASSERT_TRUE(s) << s.error().what;
  auto loaded = (*s)->load_symbols(*dom, map);
  std::filesystem::remove(map);
  ASSERT_TRUE(loaded) << loaded.error().what;
  auto read = (*s)->resolve(*dom, "sys_read");
  ASSERT_TRUE(read) << read.error().what;
  EXPECT_EQ(read->value, *host->symbol(*dom, "sys_read"));
}

TEST(GuestSymbols, AGuestWithoutKallsymsIsToldApart) {
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config();
  c.start_paused = true;
  auto dom = host->create_domain(c);
  ASSERT_TRUE(dom) << dom.error().what;
  auto s = Session::open(host->open(), SessionOptions{test_channel()});
  ASSERT_TRUE(s) << s.error().what;
  auto r = (*s)->load_symbols_from_guest(*dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NotFound) << r.error().what;
  EXPECT_NE(r.error().what.find("System.map"), std::string::npos) << r.error().what;
  // No BTF without symbols that bound it.
  EXPECT_FALSE((*s)->kernel_btf(*dom));
}

}  // namespace
}  // namespace xenprobes::testing
