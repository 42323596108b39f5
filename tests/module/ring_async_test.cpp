// The guest module's async jump hit (guest-module/xp_ring.c, protocol.h "Async jump probes"):
// from an async JUMP entry's key and the capture specs it points at in the OEA to a record in
// the ring of the vCPU the hit runs on, read back with Dom0's reader (libxenprobes/guestmod/
// ring.cpp). Also the string read the module builds on its byte reads (the kernel exports no
// no-fault string copy to modules) and the size of the rings' allocation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "guestmod/ring.hpp"
#include "xp_ring.h"

using xenprobes::guestmod::RingReader;
using xenprobes::guestmod::RingRecord;

namespace {

constexpr std::uint64_t kPage = 4096;

// Guest memory for reads: a few ranges, anything else faults. Records every read.
struct Memory {
  std::map<std::uint64_t, std::string> ranges;  // start -> bytes
  std::vector<std::pair<std::uint64_t, std::uint32_t>> reads;

  static int read(void* ctx, void* dst, std::uint64_t addr, std::uint32_t len, bool) {
    auto* m = static_cast<Memory*>(ctx);
    m->reads.emplace_back(addr, len);
    for (const auto& [start, b] : m->ranges) {
      if (addr >= start && addr - start <= b.size() && len <= b.size() - (addr - start)) {
        std::memcpy(dst, b.data() + (addr - start), len);
        return 0;
      }
    }
    return -14;
  }
  // As the module does it: read_str on top of read.
  static long read_str(void* ctx, void* dst, std::uint64_t addr, std::uint32_t max, bool user) {
    const xp_read_ops ops{&Memory::read, nullptr, ctx};
    return xp_read_str_pieces(&ops, dst, addr, max, user);
  }
  xp_read_ops ops() { return xp_read_ops{&Memory::read, &Memory::read_str, this}; }
};

long read_str(Memory& m, std::string& out, std::uint64_t addr, std::uint32_t max) {
  out.assign(max, '\xee');
  const xp_read_ops ops = m.ops();
  const long n = xp_read_str_pieces(&ops, out.data(), addr, max, false);
  if (n >= 0) out.resize(static_cast<std::size_t>(n));
  return n;
}

}  // namespace

// ---- strings read in pieces ----

TEST(RingStr, AShortStringIsOnePieceWithItsNul) {
  Memory m;
  const std::uint64_t at = 0xffff888000001000ull;
  m.ranges[at] = std::string("/etc/passwd\0garbage", 19) + std::string(200, '#');
  std::string s;
  EXPECT_EQ(12, read_str(m, s, at, 100));
  EXPECT_EQ(std::string("/etc/passwd\0", 12), s);
  ASSERT_EQ(1u, m.reads.size());
  EXPECT_EQ(at, m.reads[0].first);
  EXPECT_EQ(64u, m.reads[0].second);  // a whole piece, past the NUL inside the page
}

TEST(RingStr, PiecesNeverCrossAPageSoAStringEndingBeforeAnUnmappedPageIsRead) {
  Memory m;
  const std::uint64_t page_end = 0xffff888000003000ull;
  // 100 bytes before a page nothing maps, the NUL the last of them.
  std::string bytes(99, 'x');
  bytes.push_back('\0');
  m.ranges[page_end - 100] = bytes;
  std::string s;
  EXPECT_EQ(100, read_str(m, s, page_end - 100, 1024));
  EXPECT_EQ(bytes, s);
  for (const auto& [addr, len] : m.reads) {
    EXPECT_EQ(addr / kPage, (addr + len - 1) / kPage) << std::hex << addr << " " << len;
  }
  ASSERT_EQ(2u, m.reads.size());
  EXPECT_EQ(64u, m.reads[0].second);
  EXPECT_EQ(36u, m.reads[1].second);
}

TEST(RingStr, AStringRunningIntoAnUnmappedPageFaults) {
  Memory m;
  const std::uint64_t page_end = 0xffff888000003000ull;
  m.ranges[page_end - 10] = std::string(10, 'y');  // no NUL before the unmapped page
  std::string s;
  EXPECT_EQ(-XP_EFAULT, read_str(m, s, page_end - 10, 64));
  EXPECT_EQ(-XP_EFAULT, read_str(m, s, 0xffff888000100000ull, 8));  // nothing mapped at all
}

TEST(RingStr, NoNulWithinMaxGivesMaxBytesUnterminated) {
  Memory m;
  const std::uint64_t at = 0xffff888000001000ull;
  m.ranges[at] = std::string(300, 'z');
  std::string s;
  EXPECT_EQ(200, read_str(m, s, at, 200));
  EXPECT_EQ(std::string(200, 'z'), s);
  std::uint64_t total = 0;
  for (const auto& r : m.reads) total += r.second;
  EXPECT_EQ(200u, total);  // never past max
  // Exactly max bytes with the NUL last: a whole string, not a truncated one.
  m.ranges[at] = std::string(7, 'q') + '\0';
  EXPECT_EQ(8, read_str(m, s, at, 8));
}

TEST(RingStr, AStringAtTheTopOfTheAddressSpaceDoesNotWrap) {
  Memory m;
  const std::uint64_t top = ~std::uint64_t{0} - 7;  // the last 8 bytes
  m.ranges[top] = std::string(8, 'w');
  m.ranges[0] = std::string(64, '\0');  // what a wrapped read would find
  std::string s;
  EXPECT_EQ(-XP_EFAULT, read_str(m, s, top, 16));
  EXPECT_EQ(8, read_str(m, s, top, 8));  // max reached exactly at the top: no wrap
}

TEST(RingStr, ThroughTheRingAStringLongerThanMaxIsTruncated) {
  alignas(4096) static std::uint8_t mem[XENPROBES_RING_DATA_OFFSET + 4096];
  std::memset(mem, 0, sizeof mem);
  xp_ring ring{};
  ASSERT_EQ(0, xp_ring_init(&ring, mem, 12, 0));
  Memory m;
  xenprobes_regs regs{};
  regs.rsi = 0xffff888000001000ull;
  m.ranges[regs.rsi] = std::string("a long path name\0", 17) + std::string(64, '#');
  regs.rdi = 0xffff888000002000ull;
  m.ranges[regs.rdi] = std::string("short\0", 6) + std::string(64, '#');
  const xenprobes_capture_spec specs[] = {{XENPROBES_CAP_STRING, 4, 7, 0}, {XENPROBES_CAP_STRING, 5, 6, 0}};
  const xp_read_ops ops = m.ops();
  ASSERT_EQ(XP_RING_WRITTEN, xp_ring_write_hit(&ring, 1, 2, &regs, specs, 2, &ops));
  auto reader = RingReader::open(std::span<std::byte>(reinterpret_cast<std::byte*>(mem), sizeof mem), 0);
  ASSERT_TRUE(reader.has_value());
  const RingRecord* r = reader->next();
  ASSERT_NE(nullptr, r);
  ASSERT_EQ(2u, r->captures.size());
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, r->captures[0].status);
  EXPECT_EQ(std::string("a long\0", 7),
            std::string(reinterpret_cast<const char*>(r->captures[0].bytes.data()), r->captures[0].bytes.size()));
  EXPECT_EQ(XENPROBES_CAP_OK, r->captures[1].status);
  EXPECT_EQ(6u, r->captures[1].bytes.size());
}

// A string capture as the synchronous str() of max - 1 characters reads it: its max - 1
// characters up to the NUL, then only the one byte after them, which tells Ok from Truncated.
// Here every string ends at a page nothing maps after. `reads` gets every read made past
// page_end (there must be none, but for that one byte).
struct EdgeCapture {
  std::uint8_t status;
  std::string bytes;  // as captured, its NUL included
  std::size_t reads_past = 0;
};

EdgeCapture capture_at_page_end(const std::string& tail, std::uint64_t from_end, std::uint16_t max) {
  alignas(4096) static std::uint8_t mem[XENPROBES_RING_DATA_OFFSET + 4096];
  std::memset(mem, 0, sizeof mem);
  xp_ring ring{};
  EXPECT_EQ(0, xp_ring_init(&ring, mem, 12, 0));
  const std::uint64_t page_end = 0xffff888000003000ull;
  Memory m;
  m.ranges[page_end - tail.size()] = tail;
  xenprobes_regs regs{};
  regs.rdi = page_end - from_end;
  const xenprobes_capture_spec spec{XENPROBES_CAP_STRING, 5, max, 0};
  const xp_read_ops ops = m.ops();
  EXPECT_EQ(XP_RING_WRITTEN, xp_ring_write_hit(&ring, 1, 2, &regs, &spec, 1, &ops));
  auto reader = RingReader::open(std::span<std::byte>(reinterpret_cast<std::byte*>(mem), sizeof mem), 0);
  EdgeCapture out{0xff, {}};
  if (!reader) return out;
  const RingRecord* r = reader->next();
  if (!r || r->captures.size() != 1) return out;
  out.status = static_cast<std::uint8_t>(r->captures[0].status);
  out.bytes.assign(reinterpret_cast<const char*>(r->captures[0].bytes.data()), r->captures[0].bytes.size());
  for (const auto& [addr, len] : m.reads) out.reads_past += addr + len > page_end;
  return out;
}

TEST(RingStr, AStringWhoseNulIsTheLastByteBeforeAnUnmappedPageIsCapturedWhole) {
  const std::string tail("0123456789abcde\0", 16);
  for (std::uint16_t max : {16, 17, 64, 1024}) {
    const EdgeCapture c = capture_at_page_end(tail, 16, max);
    EXPECT_EQ(XENPROBES_CAP_OK, c.status) << max;
    EXPECT_EQ(tail, c.bytes) << max;
    EXPECT_EQ(0u, c.reads_past) << max << ": nothing read past the NUL's page";
  }
  const EdgeCapture shorter = capture_at_page_end(tail, 16, 11);
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, shorter.status);
  EXPECT_EQ(std::string("0123456789\0", 11), shorter.bytes);
}

TEST(RingStr, MaxMinusOneCharactersBeforeAnUnmappedPageAreTruncatedNotAFault) {
  const std::string tail("0123456789abcde");  // no NUL before the unmapped page
  EdgeCapture c = capture_at_page_end(tail, 15, 16);
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, c.status);
  EXPECT_EQ(std::string("0123456789abcde\0", 16), c.bytes) << "the 15 characters str(p, 16) gives";
  EXPECT_EQ(1u, c.reads_past) << "one read past them: the byte that would have been the NUL";
  // One character more than the page holds: a fault, as the synchronous read faults.
  c = capture_at_page_end(tail, 15, 17);
  EXPECT_EQ(XENPROBES_CAP_FAULT, c.status);
  EXPECT_TRUE(c.bytes.empty());
  // max 1: the string can only be empty; an unreadable byte is a fault.
  c = capture_at_page_end(tail, 15, 1);
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, c.status);
  EXPECT_EQ(std::string("\0", 1), c.bytes);
  c = capture_at_page_end(tail, 0, 1);
  EXPECT_EQ(XENPROBES_CAP_FAULT, c.status);
}

TEST(RingStr, TheByteAfterMaxMinusOneCharactersIsNotReadAcrossTheTopOfTheAddressSpace) {
  alignas(4096) static std::uint8_t mem[XENPROBES_RING_DATA_OFFSET + 4096];
  std::memset(mem, 0, sizeof mem);
  xp_ring ring{};
  ASSERT_EQ(0, xp_ring_init(&ring, mem, 12, 0));
  Memory m;
  const std::uint64_t top = ~std::uint64_t{0} - 6;  // the last 7 bytes
  m.ranges[top] = std::string(7, 'w');
  m.ranges[0] = std::string("\0", 1);  // what a wrapped read would find: a NUL
  xenprobes_regs regs{};
  regs.rdi = top;
  const xenprobes_capture_spec spec{XENPROBES_CAP_STRING, 5, 8, 0};
  const xp_read_ops ops = m.ops();
  ASSERT_EQ(XP_RING_WRITTEN, xp_ring_write_hit(&ring, 1, 2, &regs, &spec, 1, &ops));
  auto reader = RingReader::open(std::span<std::byte>(reinterpret_cast<std::byte*>(mem), sizeof mem), 0);
  ASSERT_TRUE(reader.has_value());
  const RingRecord* r = reader->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, r->captures[0].status) << "not Ok through address 0's NUL";
  for (const auto& [addr, len] : m.reads) EXPECT_GE(addr, top) << "nothing read at " << addr;
}

// ---- the rings' allocation ----

TEST(RingAsync, SizeOfTheRingsIsCountTimesHeaderPageAndData) {
  std::uint64_t stride = 0, total = 0;
  ASSERT_EQ(0, xp_rings_size(4, 16, &stride, &total));
  EXPECT_EQ(4096u + 65536u, stride);
  EXPECT_EQ(4u * (4096u + 65536u), total);
  ASSERT_EQ(0, xp_rings_size(1, XENPROBES_RING_MIN_ORDER, &stride, &total));
  EXPECT_EQ(8192u, total);
  ASSERT_EQ(0, xp_rings_size(0xffffffffu, XENPROBES_RING_MAX_ORDER, &stride, &total));
  EXPECT_EQ(0xffffffffull * ((1ull << 24) + 4096u), total);  // no overflow
  EXPECT_EQ(0u, stride % kPage);
  EXPECT_EQ(-XP_EINVAL, xp_rings_size(0, 16, &stride, &total));
  EXPECT_EQ(-XP_EINVAL, xp_rings_size(1, 0, &stride, &total));
  EXPECT_EQ(-XP_EINVAL, xp_rings_size(1, XENPROBES_RING_MIN_ORDER - 1, &stride, &total));
  EXPECT_EQ(-XP_EINVAL, xp_rings_size(1, XENPROBES_RING_MAX_ORDER + 1, &stride, &total));
}

// ---- the async hit ----

namespace {

// The OEA: host memory standing in for the module's pool, with a detour's call and its specs.
struct RingAsyncHit : ::testing::Test {
  static constexpr unsigned kRings = 2;
  static constexpr std::uint64_t kCallOff = 0x100;
  static constexpr std::uint64_t kSpecsOff = 0x200;

  void SetUp() override {
    oea = static_cast<std::uint8_t*>(std::aligned_alloc(kPage, kPage));
    std::memset(oea, 0xcc, kPage);
    b.oea = {base(), base() + kPage};
    stride = XENPROBES_RING_DATA_OFFSET + 4096;
    mem = static_cast<std::uint8_t*>(std::aligned_alloc(kPage, kRings * stride));
    std::memset(mem, 0, kRings * stride);
    for (unsigned v = 0; v < kRings; ++v) {
      ASSERT_EQ(0, xp_ring_init(&rings[v], mem + v * stride, 12, v));
      auto r = RingReader::open(std::span<std::byte>(reinterpret_cast<std::byte*>(mem + v * stride), stride), v);
      ASSERT_TRUE(r.has_value());
      readers[v].emplace(std::move(*r));
    }
  }
  void TearDown() override {
    std::free(oea);
    std::free(mem);
  }
  std::uint64_t base() const { return reinterpret_cast<std::uint64_t>(oea); }
  std::uint64_t call() const { return base() + kCallOff; }

  void put_specs(const std::vector<xenprobes_capture_spec>& specs, std::uint64_t off = kSpecsOff) {
    std::memcpy(oea + off, specs.data(), specs.size() * sizeof(xenprobes_capture_spec));
  }
  // The async JUMP entry of the detour's call, its specs at `specs`.
  xenprobes_trap entry(std::uint32_t probe, std::uint8_t ncaps, std::uint64_t specs) const {
    xenprobes_trap t{};
    t.addr = call();
    t.fallback = 0xffffffff81234567ull;
    t.flags = XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC;
    const auto off = static_cast<std::uint32_t>(specs - call());
    for (unsigned i = 0; i < 4; ++i) {
      t.insn[XENPROBES_ASYNC_KEY_PROBE + i] = static_cast<std::uint8_t>(probe >> (8 * i));
      t.insn[XENPROBES_ASYNC_KEY_SPECS + i] = static_cast<std::uint8_t>(off >> (8 * i));
    }
    t.insn[XENPROBES_ASYNC_KEY_NCAPS] = ncaps;
    return t;
  }
  xp_async_result hit(const xenprobes_trap& e, unsigned vcpu, std::uint64_t time = 1234, xp_ring* rs = nullptr,
                      unsigned n = kRings) {
    return xp_async_hit(&b, &e, rs ? rs : rings, n, vcpu, time, &regs, &ops_);
  }
  bool nothing_written() {
    for (auto& r : readers)
      if (r->next() != nullptr) return false;
    return true;
  }

  xp_bounds b{};
  std::uint8_t* oea = nullptr;
  std::uint8_t* mem = nullptr;
  std::uint64_t stride = 0;
  xp_ring rings[kRings]{};
  std::optional<RingReader> readers[kRings];
  Memory memory;
  xp_read_ops ops_ = memory.ops();
  xenprobes_regs regs = [] {
    xenprobes_regs r{};
    r.rdi = 0xffff888000010000ull;
    r.rsi = 0x00007ffd00001000ull;
    r.rsp = 0xffffc90000013f00ull;
    r.rip = 0xffffffff81234567ull;
    r.rflags = 0x246;
    return r;
  }();
};

}  // namespace

TEST_F(RingAsyncHit, ARecordGoesToTheRingOfTheVcpuWithProbeTimeAndRegisters) {
  ASSERT_EQ(XP_ASYNC_WRITTEN, hit(entry(0xdeadbeef, 0, 0), 1, 777));
  EXPECT_EQ(nullptr, readers[0]->next());
  const RingRecord* r = readers[1]->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(0xdeadbeefu, r->probe);
  EXPECT_EQ(0u, r->seq);
  EXPECT_EQ(777u, r->time);
  EXPECT_EQ(0, std::memcmp(r->regs, &regs, sizeof regs));
  EXPECT_TRUE(r->captures.empty());
}

TEST_F(RingAsyncHit, CapturesFollowTheSpecsInTheOea) {
  memory.ranges[regs.rdi + 8] = "ABCDEFGH";
  memory.ranges[regs.rsi] = std::string("user\0", 5) + std::string(64, '#');
  put_specs({{XENPROBES_CAP_BYTES, 5, 8, 8}, {XENPROBES_CAP_STRING | XENPROBES_CAP_USER, 4, 32, 0}});
  ASSERT_EQ(XP_ASYNC_WRITTEN, hit(entry(9, 2, base() + kSpecsOff), 0));
  const RingRecord* r = readers[0]->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(9u, r->probe);
  ASSERT_EQ(2u, r->captures.size());
  EXPECT_EQ(XENPROBES_CAP_OK, r->captures[0].status);
  EXPECT_EQ("ABCDEFGH", std::string(reinterpret_cast<const char*>(r->captures[0].bytes.data()), 8));
  EXPECT_EQ(XENPROBES_CAP_OK, r->captures[1].status);
  EXPECT_EQ(5u, r->captures[1].bytes.size());
  // Specs before the call (a negative offset) work the same.
  put_specs({{XENPROBES_CAP_BYTES, 5, 8, 8}}, 0x10);
  ASSERT_EQ(XP_ASYNC_WRITTEN, hit(entry(10, 1, base() + 0x10), 0));
  r = readers[0]->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(10u, r->probe);
  EXPECT_EQ(1u, r->captures.size());
}

TEST_F(RingAsyncHit, NoRingsOrAVcpuWithoutARingIsBad) {
  const auto e = entry(1, 0, 0);
  EXPECT_EQ(XP_ASYNC_BAD, xp_async_hit(&b, &e, nullptr, 0, 0, 1, &regs, &ops_));
  EXPECT_EQ(XP_ASYNC_BAD, hit(e, kRings));
  EXPECT_EQ(XP_ASYNC_BAD, hit(e, 0xffffffffu));
  EXPECT_TRUE(nothing_written());
}

TEST_F(RingAsyncHit, AKeyOrSpecThatBreaksARuleWritesNoRecord) {
  auto dirty = entry(1, 0, 0);
  dirty.insn[6] = 1;
  EXPECT_EQ(XP_ASYNC_BAD, hit(dirty, 0));
  EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, XENPROBES_RING_CAPS_MAX + 1, base() + kSpecsOff), 0));
  EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, 1, base() + kSpecsOff + 4), 0));  // unaligned
  EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, 1, base() - 8), 0));              // below the OEA
  EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, 2, base() + kPage - 8), 0));      // past its end
  const std::vector<std::vector<xenprobes_capture_spec>> bad{
      {{0, 0, 8, 0}},                                                    // no kind
      {{XENPROBES_CAP_BYTES | 0x20, 0, 8, 0}},                           // unknown bits
      {{XENPROBES_CAP_BYTES, XENPROBES_CAP_REG_MAX + 1, 8, 0}},          // no such register
      {{XENPROBES_CAP_BYTES, 0, 0, 0}},                                  // nothing to read
      {{XENPROBES_CAP_STRING, 0, XENPROBES_CAP_MAX_BYTES + 1, 0}},       // too long
      {{XENPROBES_CAP_BYTES, 5, 8, 0}, {XENPROBES_CAP_BYTES, 0, 0, 0}},  // the second one
  };
  for (const auto& specs : bad) {
    put_specs(specs);
    EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, static_cast<std::uint8_t>(specs.size()), base() + kSpecsOff), 0));
  }
  // Four of 1024 bytes could outgrow a record.
  put_specs(std::vector<xenprobes_capture_spec>(4, {XENPROBES_CAP_BYTES, 0, XENPROBES_CAP_MAX_BYTES, 0}));
  EXPECT_EQ(XP_ASYNC_BAD, hit(entry(1, 4, base() + kSpecsOff), 0));
  EXPECT_TRUE(nothing_written());
  EXPECT_EQ(0u, memory.reads.size());  // nothing read for a refused hit
  EXPECT_EQ(0u, rings[0].seq);
}

TEST_F(RingAsyncHit, NotifyDropAndNestedComeFromTheRing) {
  const auto e = entry(3, 0, 0);
  EXPECT_FALSE(readers[0]->arm_wakeup(2 * sizeof(xenprobes_rec)));
  EXPECT_EQ(XP_ASYNC_WRITTEN, hit(e, 0));
  EXPECT_EQ(XP_ASYNC_NOTIFY, hit(e, 0));
  const unsigned fit = 4096 / sizeof(xenprobes_rec);
  for (unsigned i = 2; i < fit; ++i) ASSERT_EQ(XP_ASYNC_WRITTEN, hit(e, 0)) << i;
  EXPECT_EQ(XP_ASYNC_DROPPED, hit(e, 0));
  EXPECT_EQ(1u, rings[0].drops);
  rings[1].busy = 1;  // a record being written on vCPU 1 when the hit came
  EXPECT_EQ(XP_ASYNC_NESTED, hit(e, 1));
  EXPECT_EQ(1u, rings[1].nested);
}
