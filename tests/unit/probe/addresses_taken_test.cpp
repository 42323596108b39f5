// The tail-call proof's reading of a kernel image (kernel::addresses_taken()) over the demo
// guest and, when tools/fetch-debian-kernels.sh cached them, Debian's 6.1 and 6.12 (skipped
// otherwise), as the engine reads a vmlinux given to load_symbols:
//   - x86::formed_addresses() against decode_function() + materialized_addresses(), function by
//     function of the core and init text: the same functions fail, the others form the same
//     addresses, instruction by instruction;
//   - the whole list on 1 and on 4 threads is the one addresses_taken() made before, with
//     decode_function() on one thread: the same entries in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "addresses_taken_reference.hpp"
#include "jump_index_kernel.hpp"
#include "kernel/tables.hpp"

namespace xenprobes::probe {
namespace {

struct Image {
  symbols::KernelImage img;
  kernel::Range core, init;
};

std::optional<Image> load(const std::filesystem::path& vmlinux, const std::filesystem::path& map, std::string& why) {
  auto elf = elf::load(vmlinux);
  auto syms = symbols::SymbolTable::load(map);
  if (!elf || !syms) {
    why = !elf ? elf.error().what : syms.error().what;
    return std::nullopt;
  }
  Image k{symbols::KernelImage::with_symbols(std::move(*elf), std::move(*syms), vmlinux.string()), {}, {}};
  const kernel::KernelTables t =
      kernel::KernelTables::read(k.img.symbols(), [&](Gva a, std::span<std::byte> out) { return k.img.read(a, out); });
  k.core = t.core_text();
  k.init = t.init_text();
  if (k.core.empty()) {
    why = "no _stext/_etext";
    return std::nullopt;
  }
  return k;
}

// The old list, and formed_addresses() compared with decode_function() +
// materialized_addresses() for every function it decoded.
std::vector<kernel::TakenAddress> reference(const Image& k, std::size_t& compared, std::size_t& failing) {
  std::vector<x86::FormedAddress> formed;
  std::size_t mismatches = 0;
  auto out = testing::old_addresses_taken(
      k.img, k.core, k.init,
      [&](const symbols::Function& f, std::span<const std::uint8_t> bytes,
          const Result<std::vector<x86::Insn>>& insns) {
        ++compared;
        failing += !insns;
        const bool lean_ok = x86::formed_addresses(bytes, f.start, formed).has_value();
        bool same = lean_ok == insns.has_value();
        if (same && lean_ok) {
          std::vector<x86::FormedAddress> want;
          for (const x86::Insn& i : *insns)
            for (std::uint64_t a : x86::materialized_addresses(i)) want.push_back({i.address, a});
          same = std::equal(formed.begin(), formed.end(), want.begin(), want.end(),
                            [](const auto& a, const auto& b) { return a.by == b.by && a.value == b.value; });
        }
        if (!same && ++mismatches <= 5)
          ADD_FAILURE() << f.name << " (" << x86::hex_addr(f.start.value) << ", " << f.size
                        << " bytes): formed_addresses() " << (lean_ok ? "decodes" : "fails") << ", decode_function() "
                        << (insns ? "decodes" : "fails: " + insns.error().what);
      });
  EXPECT_EQ(mismatches, 0u) << "functions where formed_addresses() and decode_function() differ";
  return out;
}

void expect_same(const std::vector<kernel::TakenAddress>& got, const std::vector<kernel::TakenAddress>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const auto &a = got[k], &b = want[k];
    ASSERT_TRUE(a.to == b.to && a.by == b.by && a.data == b.data)
        << what << ": entry " << k << " is " << x86::hex_addr(a.to) << " by " << x86::hex_addr(a.by)
        << (a.data ? " (data)" : "") << ", was " << x86::hex_addr(b.to) << " by " << x86::hex_addr(b.by)
        << (b.data ? " (data)" : "");
  }
}

// The whole check over one image; returns the reference list.
std::vector<kernel::TakenAddress> check(const Image& k, const std::string& name, std::vector<unsigned> threads) {
  std::size_t compared = 0, failing = 0;
  const auto want = reference(k, compared, failing);
  const auto code = std::count_if(want.begin(), want.end(), [](const auto& t) { return !t.data; });
  std::printf("[ %s ] %zu functions decoded both ways (%zu fail both ways), %zu addresses taken (%td by code)\n",
              name.c_str(), compared, failing, want.size(), code);
  for (unsigned n : threads)
    expect_same(kernel::addresses_taken(k.img, k.core, k.init, {}, n), want,
                name + " on " + std::to_string(n) + " thread(s)");
  return want;
}

TEST(AddressesTaken, TheDemoGuestsAreTheSameLeanAndOnFourThreads) {
  std::string why;
  auto k = load(XENPROBES_DEMO_GUEST_VMLINUX, XENPROBES_DEMO_GUEST_SYSTEM_MAP, why);
  ASSERT_TRUE(k) << why;
  const std::size_t fns = testing::taken_functions(k->img.symbols(), k->core, k->init).size();
  ASSERT_GE(fns, 8u);
  // Also on a thread per function, and more: any merge out of order shows.
  const auto want = check(*k, "demo guest", {1, 4, static_cast<unsigned>(fns), static_cast<unsigned>(fns) + 5});
  EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](const auto& t) { return !t.data; }));
  // The default thread count gives the same list.
  expect_same(kernel::addresses_taken(k->img, k->core, k->init), want, "demo guest, default threads");
}

// Functions the caller decoded already (the coverage bench's) are not decoded again: their
// addresses come first, and the list holds the same entries.
TEST(AddressesTaken, FunctionsDecodedAlreadyGiveTheSameAddresses) {
  std::string why;
  auto k = load(XENPROBES_DEMO_GUEST_VMLINUX, XENPROBES_DEMO_GUEST_SYSTEM_MAP, why);
  ASSERT_TRUE(k) << why;
  std::vector<std::vector<x86::Insn>> some;
  for (const symbols::Function& f : testing::taken_functions(k->img.symbols(), k->core, k->init)) {
    std::vector<std::uint8_t> bytes(f.size);
    if (f.size == 0 || !k->img.read(f.start, std::as_writable_bytes(std::span(bytes)))) continue;
    if (auto in = x86::decode_function(bytes, f.start); in && !in->empty() && some.size() < 5)
      some.push_back(std::move(*in));
  }
  ASSERT_EQ(some.size(), 5u);
  std::vector<const std::vector<x86::Insn>*> decoded;
  for (const auto& s : some) decoded.push_back(&s);
  auto key = [](const kernel::TakenAddress& t) { return std::tuple(t.to, t.by, t.data); };
  auto sorted = [&](std::vector<kernel::TakenAddress> v) {
    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
    return v;
  };
  expect_same(sorted(kernel::addresses_taken(k->img, k->core, k->init, decoded, 2)),
              sorted(kernel::addresses_taken(k->img, k->core, k->init, {}, 1)), "with 5 functions decoded already");
}

TEST(AddressesTaken, TakenThreads) {
  EXPECT_EQ(kernel::taken_threads(0), 1u);
  EXPECT_EQ(kernel::taken_threads(kernel::kMinTakenFunctionsPerThread * 2 - 1), 1u);
  EXPECT_LE(kernel::taken_threads(kernel::kMinTakenFunctionsPerThread * 2), 2u);
  EXPECT_LE(kernel::taken_threads(50000), kMaxWorkerThreads);
  EXPECT_GE(kernel::taken_threads(50000), 1u);
}

// The data scan at its edges, against the old one over made-up images: segments whose size is
// no multiple of 4 or 8, a chunk's worth and a few bytes more, segments at the top of the
// address space (whose addresses wrap), and the unaligned ranges (_einittext + 64 KiB,
// [__alt_instructions_end, __init_end)) straddling segment and chunk ends, overlapping,
// reversed (empty) or wrapping; the words' values often inside the core text and on its
// functions' starts. Functions whose code forms addresses too.
TEST(AddressesTaken, TheDataScanIsTheOldOneAtItsEdges) {
  constexpr std::uint64_t kText = 0xffffffff81000000, kChunk = std::uint64_t{1} << 20;
  std::mt19937_64 rng(0x5363616e45646765ull);  // fixed seed: failures reproduce
  std::size_t found = 0, by_code = 0;
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    elf::Image elf;
    // The core text: functions of 64 bytes, each a lea of the next function's middle.
    elf::Segment text{kText, 0x1000, std::vector<std::uint8_t>(0x1000, 0xcc), false, true};
    std::string map = x86::hex_addr(kText).substr(2) + " T _stext\n";
    for (std::uint64_t f = 0; f < 0x1000; f += 64) {
      const std::uint8_t lea[] = {0x48, 0x8d, 0x05, 0x59, 0x00, 0x00, 0x00};  // f + 7 + 0x59: f + 0x60
      std::copy(std::begin(lea), std::end(lea), text.bytes.begin() + static_cast<std::ptrdiff_t>(f));
      map += x86::hex_addr(kText + f).substr(2) + " T fn" + std::to_string(f) + "\n";
    }
    map += x86::hex_addr(kText + 0x1000).substr(2) + " T _etext\n";
    elf.segments.push_back(text);
    // Data segments.
    const std::uint64_t tops[] = {0xffffffff82000000, 0xffffffffc1000000, 0xfffffffffff00000 - (rng() % 64)};
    std::vector<std::uint64_t> ends;
    for (int k = 0; k < 3; ++k) {
      const std::uint64_t size = rng() % 2 == 0 ? kChunk + rng() % 9 : 1 + rng() % 0x3000;
      const std::uint64_t at = k == 2 && rng() % 2 ? 0 - (size / 2) : tops[k] + rng() % 16;  // wraps, or not
      elf::Segment seg{at, size, std::vector<std::uint8_t>(size), true, false};
      // Half of them all 0x81: each 4-byte word, at every offset, is 0xffffffff81818181, inside
      // the core text, so that every offset the scan reads or skips shows.
      const bool dense = rng() % 2 == 0;
      for (std::uint64_t o = 0; o < size; ++o) seg.bytes[o] = dense ? 0x81 : static_cast<std::uint8_t>(rng());
      // Addresses in the core text (a third of them functions' starts) every few bytes,
      // of 4 or 8 bytes, to the segment's last byte.
      for (std::uint64_t off = rng() % 4; off < size && !dense; off += 1 + rng() % 6) {
        const std::uint64_t v = rng() % 3 == 0 ? kText + (rng() % 64) * 64 : kText + rng() % 0x1000;
        std::memcpy(seg.bytes.data() + off, &v, std::min<std::uint64_t>(rng() % 2 ? 8 : 4, size - off));
      }
      ends.push_back(at + size);
      elf.segments.push_back(std::move(seg));
    }
    // The unaligned ranges: each end just before a segment, inside it, or around its end.
    auto near = [&] {
      const elf::Segment& s = elf.segments[1 + rng() % 3];
      const std::uint64_t n = s.bytes.size();
      switch (rng() % 3) {
        case 0: return s.vaddr - 1 - rng() % 64;
        case 1: return s.vaddr + rng() % n;
        default: return s.vaddr + n - 8 + rng() % 16;
      }
    };
    const std::uint64_t einit = near(), alt = near(), init_end = rng() % 4 == 0 ? alt - 1 : near();
    for (auto [v, name] : {std::pair{einit, "_einittext"}, {alt, "__alt_instructions_end"}, {init_end, "__init_end"}})
      if (v >= symbols::kKernelImageStart) map += x86::hex_addr(v).substr(2) + " D " + name + "\n";
    auto syms = symbols::SymbolTable::parse(map, "made up");
    ASSERT_TRUE(syms) << syms.error().what;
    const symbols::KernelImage img = symbols::KernelImage::with_symbols(std::move(elf), std::move(*syms), "made up");
    const kernel::Range core{kText, kText + 0x1000000}, init{};  // 0xffffffff81818181 in it
    const auto want = testing::old_addresses_taken(img, core, init);
    for (unsigned n : {1u, 3u})
      expect_same(kernel::addresses_taken(img, core, init, {}, n), want, "on " + std::to_string(n) + " thread(s)");
    found += want.size();
    by_code += static_cast<std::size_t>(std::count_if(want.begin(), want.end(), [](const auto& t) { return !t.data; }));
  }
  EXPECT_GT(found, 10000u);
  EXPECT_EQ(by_code, 60u * 64);  // every function's lea
}

class DebianImage : public ::testing::TestWithParam<std::string> {};

TEST_P(DebianImage, TheAddressesTakenAreTheSameLeanAndOnFourThreads) {
  const auto dir = testing::cached_debian_kernel(GetParam());
  if (!dir) GTEST_SKIP() << "no Debian " << GetParam() << "x kernel cached: run sh tools/fetch-debian-kernels.sh";
  std::string why;
  auto k = load(*dir / "vmlinux", *dir / "System.map", why);
  ASSERT_TRUE(k) << *dir << ": " << why;
  ASSERT_FALSE(k->init.empty());
  const auto want = check(*k, dir->filename().string(), {1, 4});
  // Few instructions form an address inside a function (6.1: 219, 6.12: 146); data words many.
  EXPECT_GT(std::count_if(want.begin(), want.end(), [](const auto& t) { return !t.data; }), 100);
  EXPECT_GT(std::count_if(want.begin(), want.end(), [](const auto& t) { return t.data; }), 10000);
}

INSTANTIATE_TEST_SUITE_P(Debian, DebianImage, ::testing::Values("6.1.", "6.12."), [](const auto& info) {
  std::string n = "v" + info.param;
  n.pop_back();
  std::replace(n.begin(), n.end(), '.', '_');
  return n;
});

}  // namespace
}  // namespace xenprobes::probe
