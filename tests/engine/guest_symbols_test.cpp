// Symbols and BTF with no file, end to end on the simulated Xen: Session → the guest's memory
// (its own page tables) → the kallsyms search and decoder → the domain's SymbolTable → probes
// by name. The demo guest has no kallsyms of its own, so the test gives it some: tables in
// Linux 6.12's layout built here from the demo guest's System.map (with two compression
// tokens, so names really are expanded), and a small BTF blob, in one extra read-only PT_LOAD
// segment 2 MiB above the image, past unmapped pages the search has to step over. The format
// itself is checked on Debian's real kernels (tests/unit/kernel/guest_kernel_test.cpp).
#include <elf.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "demo_image.hpp"
#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kTablesVa = 0xffffffff81200000ull;  // 2 MiB above the demo's _text

struct Sym {
  char type;
  std::string name;
  std::uint64_t addr;
};

std::vector<Sym> demo_symbols() {
  std::vector<Sym> out;
  std::ifstream f(demo_map());
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string a, n;
    char t;
    if (is >> a >> t >> n && t != 'A' && t != 'a' && t != 'U' && t != 'N')
      out.push_back({t, n, std::stoull(a, nullptr, 16)});
  }
  return out;
}

void put(std::vector<std::uint8_t>& b, const void* p, std::size_t n) {
  b.insert(b.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
}
void align8(std::vector<std::uint8_t>& b) { b.resize((b.size() + 7) & ~std::size_t{7}); }

// A minimal valid BTF: one 4-byte signed int named "int".
std::vector<std::uint8_t> tiny_btf() {
  const char strs[] = "\0int";
  const std::uint32_t type[] = {1, 1u << 24, 4, (1u << 24) | 32};  // name_off, INT kind, size, encoding
  struct {
    std::uint16_t magic = 0xeb9f;
    std::uint8_t version = 1, flags = 0;
    std::uint32_t hdr_len = 24, type_off = 0, type_len = sizeof type, str_off = sizeof type, str_len = sizeof strs;
  } h;
  std::vector<std::uint8_t> b;
  put(b, &h, sizeof h);
  put(b, type, sizeof type);
  put(b, strs, sizeof strs);
  return b;
}

// Tables in the 6.12 order, at kTablesVa: num_syms, names, markers, token_table, token_index,
// offsets, relative_base; then the BTF blob, which __start_BTF / __stop_BTF bound.
std::vector<std::uint8_t> kallsyms_segment(std::vector<Sym>& syms, std::size_t* btf_at) {
  std::vector<std::string> tokens(256);
  for (int c = 1; c < 256; ++c) tokens[c] = std::string(1, static_cast<char>(c));
  tokens[1] = "demo_";  // bytes 1 and 2 occur in no name: free for substrings
  tokens[2] = "sys_";
  // __start_BTF/__stop_BTF are placed after the tables, whose size does not depend on their
  // addresses: lay out once with placeholders, then fill in.
  const std::vector<std::uint8_t> btf = tiny_btf();
  syms.push_back({'R', "__start_BTF", 0});
  syms.push_back({'R', "__stop_BTF", 0});
  auto build = [&]() {
    std::stable_sort(syms.begin(), syms.end(), [](const Sym& a, const Sym& b) { return a.addr < b.addr; });
    std::vector<std::uint8_t> b;
    const std::uint32_t n = static_cast<std::uint32_t>(syms.size());
    put(b, &n, 4);
    align8(b);
    const std::size_t names = b.size();
    std::vector<std::uint32_t> markers;
    for (std::size_t i = 0; i < syms.size(); ++i) {
      if (i % 256 == 0) markers.push_back(static_cast<std::uint32_t>(b.size() - names));
      std::string body = std::string(1, syms[i].type) + syms[i].name, packed;
      for (std::size_t k = 0; k < body.size();) {
        if (body.compare(k, 5, "demo_") == 0) packed += '\1', k += 5;
        else if (body.compare(k, 4, "sys_") == 0) packed += '\2', k += 4;
        else packed += body[k++];
      }
      b.push_back(static_cast<std::uint8_t>(packed.size()));
      put(b, packed.data(), packed.size());
    }
    align8(b);
    put(b, markers.data(), 4 * markers.size());
    align8(b);
    const std::size_t table = b.size();
    std::vector<std::uint16_t> index;
    for (const auto& t : tokens) {
      index.push_back(static_cast<std::uint16_t>(b.size() - table));
      put(b, t.c_str(), t.size() + 1);
    }
    align8(b);
    put(b, index.data(), 2 * index.size());
    align8(b);
    std::uint64_t base = ~0ull;
    for (const Sym& s : syms) base = std::min(base, s.addr);
    for (const Sym& s : syms) {
      const std::uint32_t off = static_cast<std::uint32_t>(s.addr - base);
      put(b, &off, 4);
    }
    align8(b);
    put(b, &base, 8);
    align8(b);
    *btf_at = b.size();
    put(b, btf.data(), btf.size());
    return b;
  };
  std::vector<std::uint8_t> first = build();
  for (Sym& s : syms) {
    if (s.name == "__start_BTF") s.addr = kTablesVa + *btf_at;
    if (s.name == "__stop_BTF") s.addr = kTablesVa + *btf_at + btf.size();
  }
  std::vector<std::uint8_t> out = build();
  EXPECT_EQ(out.size(), first.size());
  return out;
}

// The demo guest's ELF with `extra` as one more read-only PT_LOAD at kTablesVa.
std::string image_with(const std::vector<std::uint8_t>& extra) {
  const std::vector<char> f =
      demo_image_with_segment(hv::sim::default_guest_dir() + "/vmlinux", kTablesVa, extra, PF_R);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("xp-kallsyms-guest-" + std::to_string(::getpid()))).string();
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  return path;
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
