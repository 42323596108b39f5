// The async ring end to end in one process: the guest module's producer (guest-module/xp_ring.c,
// the file the module compiles) writing, Dom0's reader (libxenprobes/guestmod/ring.cpp) reading,
// over the same bytes. Then the reader against rings a hostile guest wrote.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "guestmod/ring.hpp"
#include "xp_ring.h"

using xenprobes::guestmod::RingReader;
using xenprobes::guestmod::RingRecord;

namespace {

// A ring's memory: the header page and 2^order bytes of data, page aligned, zeroed.
struct RingMem {
  explicit RingMem(unsigned order) : bytes(XENPROBES_RING_DATA_OFFSET + (std::size_t{1} << order)) {
    mem = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
    std::memset(mem, 0, bytes);
  }
  ~RingMem() { std::free(mem); }
  RingMem(const RingMem&) = delete;
  RingMem& operator=(const RingMem&) = delete;
  std::span<std::byte> span() { return {mem, bytes}; }
  xenprobes_ring_header* hdr() { return reinterpret_cast<xenprobes_ring_header*>(mem); }
  std::byte* data() { return mem + XENPROBES_RING_DATA_OFFSET; }
  std::size_t bytes;
  std::byte* mem;
};

// Guest memory for captures: a few ranges; anything else faults.
struct FakeMemory {
  std::map<std::uint64_t, std::string> ranges;  // start -> bytes
  int reads = 0;
  std::function<void()> during_read;  // runs inside the first read, as an NMI would
  bool interrupted = false;

  const char* find(std::uint64_t addr, std::uint32_t len) const {
    for (const auto& [start, b] : ranges)
      if (addr >= start && addr - start <= b.size() && len <= b.size() - (addr - start))
        return b.data() + (addr - start);
    return nullptr;
  }
  static int read(void* ctx, void* dst, std::uint64_t addr, std::uint32_t len, bool) {
    auto* m = static_cast<FakeMemory*>(ctx);
    ++m->reads;
    if (m->during_read && !m->interrupted) {
      m->interrupted = true;
      m->during_read();
    }
    const char* p = m->find(addr, len);
    if (p == nullptr) return -14;
    std::memcpy(dst, p, len);
    return 0;
  }
  static long read_str(void* ctx, void* dst, std::uint64_t addr, std::uint32_t max, bool) {
    auto* m = static_cast<FakeMemory*>(ctx);
    ++m->reads;
    auto* out = static_cast<char*>(dst);
    for (std::uint32_t i = 0; i < max; ++i) {
      const char* p = m->find(addr + i, 1);
      if (p == nullptr) return -14;
      out[i] = *p;
      if (*p == 0) return i + 1;
    }
    return max;
  }
  xp_read_ops ops() { return xp_read_ops{&FakeMemory::read, &FakeMemory::read_str, this}; }
};

xenprobes_regs regs_for(std::uint64_t n) {
  xenprobes_regs r{};
  std::uint64_t* v = &r.rax;
  // The 20 u64 fields in order: each register a page of its own, distinct per record.
  for (int i = 0; i < 20; ++i) v[i] = (n << 20) + (std::uint64_t(i) << 12);  // NOLINT
  return r;
}

void expect_regs(const xenprobes_regs& r, std::uint64_t n) {
  const xenprobes_regs want = regs_for(n);
  EXPECT_EQ(0, std::memcmp(&r, &want, sizeof r)) << "registers of record " << n;
}

std::string as_string(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

struct Fixture {
  explicit Fixture(unsigned order = 12, unsigned vcpu = 0) : m(order) {
    EXPECT_EQ(0, xp_ring_init(&ring, m.mem, order, vcpu));
    auto r = RingReader::open(m.span(), vcpu);
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().what);
    reader.emplace(std::move(*r));
  }
  xp_ring_result hit(std::uint64_t n, const std::vector<xenprobes_capture_spec>& specs = {},
                     FakeMemory* mem = nullptr) {
    xenprobes_regs r = regs_for(n);
    xp_read_ops ops{};
    if (mem) ops = mem->ops();
    return xp_ring_write_hit(&ring, static_cast<std::uint32_t>(n % 1000), n * 7, &r, specs.data(),
                             static_cast<unsigned>(specs.size()), mem ? &ops : nullptr);
  }
  RingMem m;
  xp_ring ring{};
  std::optional<RingReader> reader;
};

constexpr std::uint32_t kBareRecord = sizeof(xenprobes_rec);

// Record 1 with one capture: the 8 bytes "abcdefgh" at [rdi].
xp_ring_result hit_with_capture(Fixture& f, FakeMemory& mem) {
  mem.ranges[regs_for(1).rdi] = "abcdefgh";
  const std::vector<xenprobes_capture_spec> specs{{XENPROBES_CAP_BYTES, 5, 8, 0}};
  return f.hit(1, specs, &mem);
}

}  // namespace

TEST(Ring, ARecordArrivesWithItsRegistersProbeSeqAndTime) {
  Fixture f;
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(5));
  const RingRecord* r = f.reader->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(5u, r->probe);
  EXPECT_EQ(0u, r->seq);
  EXPECT_EQ(35u, r->time);
  expect_regs(*r->regs, 5);
  EXPECT_TRUE(r->captures.empty());
  EXPECT_EQ(nullptr, f.reader->next());
  EXPECT_EQ(1u, f.reader->counters().records);
  EXPECT_EQ(0u, f.reader->counters().resyncs);
}

TEST(Ring, CapturesBytesStringsTruncationAndFaultsInOrder) {
  Fixture f;
  FakeMemory mem;
  xenprobes_regs r = regs_for(1);
  mem.ranges[r.rdi] = "0123456789abcdef";
  mem.ranges[r.rsi] = std::string("/etc/passwd\0", 12);
  mem.ranges[r.rdx] = std::string("a long path name\0", 17);
  mem.ranges[r.rsp + 8] = std::string("\x11\x22\x33\x44\x55\x66\x77\x88", 8);
  std::vector<xenprobes_capture_spec> specs{
      {XENPROBES_CAP_BYTES, 5, 10, 0},                                // 10 bytes at [rdi]
      {XENPROBES_CAP_STRING | XENPROBES_CAP_USER, 4, 64, 0},          // a user string at rsi
      {XENPROBES_CAP_STRING, 3, 7, 0},                                // a string at rdx, longer than 7
      {XENPROBES_CAP_BYTES, 7, 8, 8},                                 // the u64 at [rsp+8]
      {XENPROBES_CAP_BYTES, 1, 4, 0},                                 // [rbx]: not mapped
      {XENPROBES_CAP_STRING, 5, 16, static_cast<std::uint32_t>(-4)},  // rdi - 4: not mapped
  };
  ASSERT_EQ(0, xp_ring_specs_check(specs.data(), static_cast<unsigned>(specs.size())));
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(1, specs, &mem));
  const RingRecord* rec = f.reader->next();
  ASSERT_NE(nullptr, rec);
  ASSERT_EQ(6u, rec->captures.size());
  for (unsigned i = 0; i < 6; ++i) EXPECT_EQ(i, rec->captures[i].index);
  EXPECT_EQ(XENPROBES_CAP_OK, rec->captures[0].status);
  EXPECT_EQ("0123456789", as_string(rec->captures[0].bytes));
  EXPECT_EQ(XENPROBES_CAP_OK, rec->captures[1].status);
  EXPECT_EQ(std::string("/etc/passwd\0", 12), as_string(rec->captures[1].bytes));
  EXPECT_EQ(XENPROBES_CAP_TRUNCATED, rec->captures[2].status);
  EXPECT_EQ(std::string("a long\0", 7), as_string(rec->captures[2].bytes));
  EXPECT_EQ(XENPROBES_CAP_OK, rec->captures[3].status);
  EXPECT_EQ(std::string("\x11\x22\x33\x44\x55\x66\x77\x88", 8), as_string(rec->captures[3].bytes));
  EXPECT_EQ(XENPROBES_CAP_FAULT, rec->captures[4].status);
  EXPECT_TRUE(rec->captures[4].bytes.empty());
  EXPECT_EQ(XENPROBES_CAP_FAULT, rec->captures[5].status);
  EXPECT_EQ(0u, f.reader->counters().resyncs);
}

// XENPROBES_CAP_AUTO: the module, not Dom0, picks the space by the address at the hit: below
// 2^63 a user read, else a kernel one, whatever XENPROBES_CAP_USER says.
TEST(Ring, AutoCapturesReadTheLowerHalfAsUserAndTheUpperAsKernel) {
  struct Spaces {
    std::vector<std::pair<std::uint64_t, bool>> reads;  // address, user
    static int read(void* ctx, void* dst, std::uint64_t addr, std::uint32_t len, bool user) {
      static_cast<Spaces*>(ctx)->reads.emplace_back(addr, user);
      std::memset(dst, 'x', len);
      return 0;
    }
    static long read_str(void* ctx, void* dst, std::uint64_t addr, std::uint32_t max, bool user) {
      static_cast<Spaces*>(ctx)->reads.emplace_back(addr, user);
      std::memset(dst, 0, max);
      return 1;
    }
  } spaces;
  Fixture f;
  xenprobes_regs r = regs_for(1);
  r.rdi = 0x00007fffdeadb000ull;  // a user pointer
  r.rsi = 0xffff888012345000ull;  // a kernel pointer
  r.rdx = 0x7ffffffffffffff0ull;  // the last 16 bytes of the lower half
  const std::vector<xenprobes_capture_spec> specs{
      {XENPROBES_CAP_STRING | XENPROBES_CAP_AUTO, 5, 64, 0},
      {XENPROBES_CAP_STRING | XENPROBES_CAP_AUTO | XENPROBES_CAP_USER, 4, 64, 0},  // USER ignored
      {XENPROBES_CAP_BYTES | XENPROBES_CAP_AUTO, 3, 8, 8},                         // rdx + 8: still user
      {XENPROBES_CAP_BYTES | XENPROBES_CAP_AUTO, 3, 8, 16},                        // rdx + 16 = 2^63: kernel
  };
  ASSERT_EQ(0, xp_ring_specs_check(specs.data(), static_cast<unsigned>(specs.size())));
  const xp_read_ops ops{&Spaces::read, &Spaces::read_str, &spaces};
  ASSERT_EQ(XP_RING_WRITTEN, xp_ring_write_hit(&f.ring, 1, 7, &r, specs.data(), 4, &ops));
  const std::vector<std::pair<std::uint64_t, bool>> want{
      {r.rdi, true}, {r.rsi, false}, {r.rdx + 8, true}, {r.rdx + 16, false}};
  EXPECT_EQ(want, spaces.reads);
  const RingRecord* rec = f.reader->next();
  ASSERT_NE(nullptr, rec);
  ASSERT_EQ(4u, rec->captures.size());
  for (const auto& c : rec->captures) EXPECT_EQ(XENPROBES_CAP_OK, c.status);
}

TEST(Ring, SpecsOutsideTheProtocolAreRefusedAtRegistration) {
  const xenprobes_capture_spec ok{XENPROBES_CAP_BYTES, 0, 8, 0};
  EXPECT_EQ(0, xp_ring_specs_check(&ok, 1));
  EXPECT_EQ(0, xp_ring_specs_check(nullptr, 0));
  EXPECT_NE(0, xp_ring_specs_check(nullptr, 1));
  const xenprobes_capture_spec bad[] = {
      {0, 0, 8, 0},                                            // no kind
      {7, 0, 8, 0},                                            // unknown kind
      {XENPROBES_CAP_BYTES, XENPROBES_CAP_REG_MAX + 1, 8, 0},  // past rip
      {XENPROBES_CAP_BYTES, 0, 0, 0},                          // nothing to read
      {XENPROBES_CAP_STRING, 0, XENPROBES_CAP_MAX_BYTES + 1, 0},
  };
  for (const auto& s : bad)
    EXPECT_NE(0, xp_ring_specs_check(&s, 1)) << int(s.kind) << " " << int(s.reg) << " " << s.max;
  std::vector<xenprobes_capture_spec> many(XENPROBES_RING_CAPS_MAX + 1, ok);
  EXPECT_NE(0, xp_ring_specs_check(many.data(), static_cast<unsigned>(many.size())));
  // Four of 1024 bytes: the record could pass XENPROBES_RING_REC_MAX.
  std::vector<xenprobes_capture_spec> big(4,
                                          xenprobes_capture_spec{XENPROBES_CAP_BYTES, 0, XENPROBES_CAP_MAX_BYTES, 0});
  EXPECT_GT(xp_ring_record_max(big.data(), 4), XENPROBES_RING_REC_MAX);
  EXPECT_NE(0, xp_ring_specs_check(big.data(), 4));
  EXPECT_EQ(0, xp_ring_specs_check(big.data(), 3));
}

TEST(Ring, InitRefusesAnOrderOutsideTheProtocol) {
  RingMem m(12);
  xp_ring r{};
  EXPECT_NE(0, xp_ring_init(&r, m.mem, XENPROBES_RING_MIN_ORDER - 1, 0));
  EXPECT_NE(0, xp_ring_init(&r, m.mem, XENPROBES_RING_MAX_ORDER + 1, 0));
}

// Thousands of records through a 4 KiB ring, drained as they come: every wrap leaves a pad,
// every record arrives intact and in order.
TEST(Ring, RecordsWrapThroughPadsInOrder) {
  Fixture f;
  std::uint64_t next = 0;
  for (std::uint64_t n = 0; n < 5000; ++n) {
    ASSERT_EQ(XP_RING_WRITTEN, f.hit(n)) << n;
    if (n % 7 == 6) {
      f.reader->drain([&](const RingRecord& r) {
        EXPECT_EQ(next, r.seq);
        expect_regs(*r.regs, next);
        ++next;
      });
    }
  }
  f.reader->drain([&](const RingRecord& r) {
    EXPECT_EQ(next, r.seq);
    ++next;
  });
  EXPECT_EQ(5000u, next);
  EXPECT_EQ(5000u, f.reader->counters().records);
  EXPECT_GT(f.reader->counters().pads, 100u);  // 184-byte records in 4096 bytes: a pad every 22
  EXPECT_EQ(0u, f.reader->counters().missed);
  EXPECT_EQ(0u, f.reader->counters().resyncs);
  EXPECT_EQ(0u, f.reader->guest_counters().drops);
}

// With nobody draining, the ring takes exactly as many records as fit and counts every hit
// after that; those already written all arrive; once drained, it takes records again.
TEST(Ring, AFullRingDropsAndCountsExactly) {
  Fixture f;
  const std::uint64_t fit = 4096 / kBareRecord;  // 22: the first record starts at 0, no pad
  for (std::uint64_t n = 0; n < fit; ++n) ASSERT_EQ(XP_RING_WRITTEN, f.hit(n)) << n;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(XP_RING_DROPPED, f.hit(1000 + i));
  EXPECT_EQ(50u, f.ring.drops);
  EXPECT_EQ(50u, f.reader->guest_counters().drops);
  std::uint64_t got = 0;
  f.reader->drain([&](const RingRecord& r) {
    EXPECT_EQ(got, r.seq);
    expect_regs(*r.regs, got);
    ++got;
  });
  EXPECT_EQ(fit, got);
  // Dropped hits take no sequence number: the next record follows the last one written.
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(fit));
  const RingRecord* r = f.reader->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(fit, r->seq);
  EXPECT_EQ(0u, f.reader->counters().missed);
}

// A hit that interrupts a record being written on the same vCPU (a probed NMI handler, here a
// hit from inside the first one's capture read) is counted, and the first record is intact.
TEST(Ring, AHitInsideARecordBeingWrittenIsCountedAsNested) {
  Fixture f;
  FakeMemory mem;
  int inner = -1;
  mem.during_read = [&] { inner = f.hit(2); };
  ASSERT_EQ(XP_RING_WRITTEN, hit_with_capture(f, mem));
  EXPECT_EQ(XP_RING_NESTED, inner);
  EXPECT_EQ(1u, f.reader->guest_counters().nested);
  const RingRecord* rec = f.reader->next();
  ASSERT_NE(nullptr, rec);
  expect_regs(*rec->regs, 1);
  EXPECT_EQ("abcdefgh", as_string(rec->captures[0].bytes));
  EXPECT_EQ(nullptr, f.reader->next());
  // The ring is not left busy.
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(3));
}

// Dom0 arms a wakeup: the producer asks for one notification when the fill reaches the
// watermark, and none until Dom0 arms it again.
TEST(Ring, TheWakeupIsSentOncePerArming) {
  Fixture f;
  EXPECT_FALSE(f.reader->arm_wakeup(3 * kBareRecord));
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(0));
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(1));
  EXPECT_EQ(XP_RING_NOTIFY, f.hit(2));
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(3));
  EXPECT_EQ(1u, f.reader->guest_counters().notifies);
  // Armed again with records waiting: the reader is told to drain rather than sleep.
  EXPECT_TRUE(f.reader->arm_wakeup(kBareRecord));
  EXPECT_EQ(4u, f.reader->drain([](const RingRecord&) {}));
  EXPECT_EQ(XP_RING_NOTIFY, f.hit(4));
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(5));
}

// Four vCPUs, each its own producer thread with a small ring, one Dom0 thread draining all of
// them: every hit is either delivered (in order, intact) or counted as dropped by its producer.
TEST(Ring, FourVcpusOneReaderNothingLostUncounted) {
  constexpr unsigned kVcpus = 4;
  constexpr std::uint64_t kHits = 100000;
  std::vector<std::unique_ptr<Fixture>> rings;
  for (unsigned v = 0; v < kVcpus; ++v) rings.push_back(std::make_unique<Fixture>(12, v));
  std::atomic<unsigned> done{0};
  std::vector<std::uint64_t> written(kVcpus), delivered(kVcpus);
  std::vector<std::thread> producers;
  for (unsigned v = 0; v < kVcpus; ++v) {
    producers.emplace_back([&, v] {
      for (std::uint64_t n = 0; n < kHits; ++n) {
        xenprobes_regs r = regs_for(n);
        if (xp_ring_write_hit(&rings[v]->ring, v, n, &r, nullptr, 0, nullptr) <= XP_RING_NOTIFY) ++written[v];
      }
      done.fetch_add(1);
    });
  }
  std::vector<std::uint64_t> last_n(kVcpus, 0);
  bool ordered = true, intact = true;
  auto drain_all = [&] {
    for (unsigned v = 0; v < kVcpus; ++v) {
      rings[v]->reader->drain([&](const RingRecord& r) {
        const std::uint64_t n = r.time;  // the hit's number
        if (delivered[v] > 0 && n <= last_n[v]) ordered = false;
        if (r.probe != v || r.seq != delivered[v]) ordered = false;
        const xenprobes_regs want = regs_for(n);
        if (std::memcmp(r.regs, &want, sizeof want) != 0) intact = false;
        last_n[v] = n;
        ++delivered[v];
      });
    }
  };
  while (done.load() < kVcpus) drain_all();
  for (auto& t : producers) t.join();
  drain_all();
  EXPECT_TRUE(ordered);
  EXPECT_TRUE(intact);
  for (unsigned v = 0; v < kVcpus; ++v) {
    EXPECT_EQ(written[v], delivered[v]) << "vCPU " << v;
    EXPECT_EQ(kHits, delivered[v] + rings[v]->reader->guest_counters().drops) << "vCPU " << v;
    EXPECT_EQ(0u, rings[v]->reader->counters().resyncs);
    EXPECT_EQ(0u, rings[v]->reader->counters().missed);
  }
}

// ---- a hostile guest ---------------------------------------------------------------------

TEST(RingHostile, AHeaderOutsideTheProtocolIsRefusedByName) {
  RingMem m(12);
  xp_ring r{};
  ASSERT_EQ(0, xp_ring_init(&r, m.mem, 12, 3));
  auto expect_refused = [&](const char* what) {
    auto rr = RingReader::open(m.span(), 3);
    ASSERT_FALSE(rr.has_value()) << what;
    EXPECT_EQ(xenprobes::Errc::InvalidArgument, rr.error().code);
    EXPECT_NE(std::string::npos, rr.error().what.find(what)) << rr.error().what;
  };
  EXPECT_TRUE(RingReader::open(m.span(), 3).has_value());
  EXPECT_FALSE(RingReader::open(m.span(), 2).has_value());
  m.hdr()->magic = 0x1234;
  expect_refused("magic");
  m.hdr()->magic = XENPROBES_RING_MAGIC;
  m.hdr()->version = 9;
  expect_refused("protocol version 9");
  m.hdr()->version = XENPROBES_PROTOCOL_VERSION;
  m.hdr()->data_order = 40;
  expect_refused("data order 40");
  m.hdr()->data_order = 13;  // 8 KiB of data in a 4 KiB mapping
  expect_refused("does not fit");
  m.hdr()->data_order = 12;
  auto small = RingReader::open(m.span().first(100), 3);
  EXPECT_FALSE(small.has_value());
}

// The geometry is read once at open: a guest that changes data_order later reads no further.
TEST(RingHostile, ChangingTheGeometryAfterOpenChangesNothing) {
  Fixture f;
  for (int n = 0; n < 10; ++n) ASSERT_EQ(XP_RING_WRITTEN, f.hit(n));
  f.m.hdr()->data_order = XENPROBES_RING_MAX_ORDER;
  f.m.hdr()->magic = 0;
  EXPECT_EQ(10u, f.reader->drain([](const RingRecord&) {}));
  EXPECT_EQ(4096u, f.reader->data_size());
  EXPECT_EQ(0u, f.reader->counters().resyncs);
}

namespace {

// Writes raw bytes at a data offset, as a hostile guest would.
void poke32(Fixture& f, std::uint64_t off, std::uint32_t v) { std::memcpy(f.m.data() + off, &v, 4); }
void poke16(Fixture& f, std::uint64_t off, std::uint16_t v) { std::memcpy(f.m.data() + off, &v, 2); }

// Three records, the second corrupted by `corrupt`: the first arrives, the ring is
// resynchronised (one resync, the bytes from there to head counted), and records written
// afterwards arrive again.
void expect_resync(const std::function<void(Fixture&)>& corrupt) {
  Fixture f;
  for (int n = 0; n < 3; ++n) ASSERT_EQ(XP_RING_WRITTEN, f.hit(n));
  corrupt(f);
  std::vector<std::uint32_t> seqs;
  f.reader->drain([&](const RingRecord& r) { seqs.push_back(r.seq); });
  ASSERT_EQ(1u, seqs.size());
  EXPECT_EQ(0u, seqs[0]);
  EXPECT_EQ(1u, f.reader->counters().resyncs);
  EXPECT_EQ(2u * kBareRecord, f.reader->counters().corrupt_bytes);
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(3));
  const RingRecord* r = f.reader->next();
  ASSERT_NE(nullptr, r);
  EXPECT_EQ(3u, r->seq);
  expect_regs(*r->regs, 3);
}

}  // namespace

TEST(RingHostile, ABadRecordLengthResyncs) {
  for (std::uint32_t len : {0u, 4u, 13u, kBareRecord - 8, 3 * kBareRecord, 8192u, 0xffffffffu})
    expect_resync([len](Fixture& f) { poke32(f, kBareRecord, len); });
}

TEST(RingHostile, AnUnknownTypeResyncs) {
  for (std::uint16_t t : {std::uint16_t{0}, std::uint16_t{3}, std::uint16_t{0xffff}})
    expect_resync([t](Fixture& f) { poke16(f, kBareRecord + 4, t); });
}

TEST(RingHostile, APadThatDoesNotReachTheEndResyncs) {
  expect_resync([](Fixture& f) { poke16(f, kBareRecord + 4, XENPROBES_REC_PAD); });
}

TEST(RingHostile, TooManyCaptureItemsResync) {
  expect_resync([](Fixture& f) { poke16(f, kBareRecord + 6, XENPROBES_RING_CAPS_MAX + 1); });
  // One item claimed, none there: the item header would pass the record's end.
  expect_resync([](Fixture& f) { poke16(f, kBareRecord + 6, 1); });
}

TEST(RingHostile, ACaptureItemPastItsRecordResyncs) {
  Fixture f;
  FakeMemory mem;
  ASSERT_EQ(XP_RING_WRITTEN, hit_with_capture(f, mem));
  poke16(f, kBareRecord, 9);  // the item's len: 9 bytes, 16 with padding, past the record
  EXPECT_EQ(nullptr, f.reader->next());
  EXPECT_EQ(1u, f.reader->counters().resyncs);
  poke16(f, kBareRecord, 0);  // fixing it later does not bring the record back
  EXPECT_EQ(nullptr, f.reader->next());
  EXPECT_EQ(0u, f.reader->counters().records);
}

TEST(RingHostile, AFaultItemWithBytesResyncs) {
  Fixture f;
  FakeMemory mem;
  ASSERT_EQ(XP_RING_WRITTEN, hit_with_capture(f, mem));
  // The item: len 8, status OK. A fault carries no bytes: make it claim both.
  std::memset(f.m.data() + kBareRecord + 3, XENPROBES_CAP_FAULT, 1);
  EXPECT_EQ(nullptr, f.reader->next());
  EXPECT_EQ(1u, f.reader->counters().resyncs);
  EXPECT_EQ(0u, f.reader->counters().records);
}

TEST(RingHostile, AHeadFarAheadOrBehindTailResyncsWithoutReading) {
  for (std::uint64_t head : {std::uint64_t{4097}, std::uint64_t{1} << 63, ~std::uint64_t{0}}) {
    Fixture f;
    f.m.hdr()->head = head;
    EXPECT_EQ(nullptr, f.reader->next());
    EXPECT_EQ(1u, f.reader->counters().resyncs) << head;
    EXPECT_EQ(0u, f.reader->pending());
  }
}

// A tail the guest left unaligned, 3 bytes before the data area's end, with bytes published
// past it: the reader resynchronises without reading past the ring (ASan watches).
TEST(RingHostile, AnUnalignedTailNearTheEndReadsNothingPastTheRing) {
  RingMem m(12);
  xp_ring ring{};
  ASSERT_EQ(0, xp_ring_init(&ring, m.mem, 12, 0));
  m.hdr()->tail = 4096 - 3;
  m.hdr()->head = 4096 - 3 + 100;
  // The ring's memory is exactly the mapping: its last byte is the data area's last byte.
  auto r = RingReader::open(m.span(), 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(nullptr, r->next());
  EXPECT_EQ(1u, r->counters().resyncs);
  EXPECT_EQ(0u, r->counters().records);
}

// A spec that skipped the registration check reads nothing rather than past the registers.
TEST(Ring, AnUncheckedSpecReadsNothing) {
  Fixture f;
  FakeMemory mem;
  std::vector<xenprobes_capture_spec> specs{{XENPROBES_CAP_BYTES, 200, 8, 0}, {9, 5, 8, 0}};
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(1, specs, &mem));
  EXPECT_EQ(0, mem.reads);
  const RingRecord* r = f.reader->next();
  ASSERT_NE(nullptr, r);
  ASSERT_EQ(2u, r->captures.size());
  EXPECT_EQ(XENPROBES_CAP_FAULT, r->captures[0].status);
  EXPECT_EQ(XENPROBES_CAP_FAULT, r->captures[1].status);
}

TEST(RingHostile, ASequenceGapIsCountedAsMissed) {
  Fixture f;
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(0));
  f.ring.seq += 5;  // as if five records had vanished
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(1));
  EXPECT_EQ(2u, f.reader->drain([](const RingRecord&) {}));
  EXPECT_EQ(5u, f.reader->counters().missed);
}

// A Dom0 (or a bug) writing a tail past head or too far back never makes the producer write
// over unread records: it drops until the tail is sane again.
TEST(Ring, ATailOutOfBoundsMakesTheProducerDropNotOverwrite) {
  Fixture f;
  ASSERT_EQ(XP_RING_WRITTEN, f.hit(0));
  f.m.hdr()->tail = 1000000;
  EXPECT_EQ(XP_RING_DROPPED, f.hit(1));
  f.m.hdr()->tail = 0;
  EXPECT_EQ(XP_RING_WRITTEN, f.hit(2));
}

// A guest scribbling over the whole ring while Dom0 drains it: Dom0 never reads outside the
// ring (ASan watches), every record it delivers passes its checks, and it keeps going.
TEST(RingHostile, ScribblingWhileDrainingIsSurvived) {
  Fixture f;
  std::atomic<bool> stop{false};
  std::thread guest([&] {
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    while (!stop.load(std::memory_order_relaxed)) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const std::uint64_t off = x % (4096 - 8);
      std::uint64_t v = x * 0x2545f4914f6cdd1dull;
      if ((x >> 60) == 0) {
        f.m.hdr()->head = f.m.hdr()->tail + (v % 8192);
      } else if ((x >> 60) < 8) {
        xenprobes_regs r = regs_for(x & 0xff);
        (void)xp_ring_write_hit(&f.ring, 1, 2, &r, nullptr, 0, nullptr);
      } else {
        // Racy on purpose: a hostile guest writes while Dom0 copies.
        std::memcpy(f.m.data() + (off & ~std::uint64_t{7}), &v, 8);
      }
    }
  });
  std::uint64_t delivered = 0;
  // At least 20000 drains, and on until the scribbles broke the ring at least once (the guest
  // thread may be scheduled late on a loaded machine); a bound of 60 s against a hang.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int round = 0;
       round < 20000 || (f.reader->counters().resyncs == 0 && std::chrono::steady_clock::now() < give_up); ++round) {
    f.reader->drain([&](const RingRecord& r) {
      ASSERT_LE(r.captures.size(), XENPROBES_RING_CAPS_MAX);
      ++delivered;
    });
  }
  stop = true;
  guest.join();
  EXPECT_EQ(delivered, f.reader->counters().records);
  EXPECT_GT(f.reader->counters().resyncs, 0u);
}
