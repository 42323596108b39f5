// Fuzz target: an async ring (protocol.h "Async rings") as Dom0 reads it
// (libxenprobes/guestmod/ring.cpp), written by the guest module's own producer
// (guest-module/xp_ring.c) and by a hostile guest.
//
// Input: a header (ring order, honest or hostile, edits of the guest page captures read), then
// operations: the producer writing a hit
// (fuzzed registers and capture specs over fuzzed guest memory), the guest writing raw bytes
// into the data area or the header (head, tail, the geometry), Dom0 draining up to k records,
// arming the wakeup, the guest moving tail, and opening a second reader on the same ring.
//
// Invariants, always: the reader never reads outside the ring (ASan); every record it delivers
// has at most XENPROBES_RING_CAPS_MAX captures of known status, each inside the record, a FAULT
// with no bytes; records counted == records delivered; pending() <= the data size. Honest
// inputs (no raw writes): no resync, nothing missed, every record written is delivered exactly
// once in order with the registers and captures it was written with, and hits written plus hits
// dropped equals hits attempted.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "guestmod/ring.hpp"
#include "xp_ring.h"

using namespace xenprobes;
using guestmod::RingReader;
using guestmod::RingRecord;

namespace {

// Guest memory for captures: one fuzzed page at kBase, everything else faults.
constexpr std::uint64_t kBase = 0xffff888000001000ull;
struct Page {
  std::uint8_t bytes[4096];
};

int read_mem(void* ctx, void* dst, std::uint64_t addr, std::uint32_t len, bool) {
  auto* p = static_cast<Page*>(ctx);
  if (addr < kBase || addr - kBase > sizeof p->bytes || len > sizeof p->bytes - (addr - kBase)) return -14;
  std::memcpy(dst, p->bytes + (addr - kBase), len);
  return 0;
}

long read_str(void* ctx, void* dst, std::uint64_t addr, std::uint32_t max, bool) {
  auto* p = static_cast<Page*>(ctx);
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::uint32_t i = 0; i < max; ++i) {
    if (addr + i < kBase || addr + i - kBase >= sizeof p->bytes) return -14;
    out[i] = p->bytes[addr + i - kBase];
    if (out[i] == 0) return i + 1;
  }
  return max;
}

struct Expected {
  std::uint32_t seq;
  std::uint32_t probe;
  xenprobes_regs regs;
  std::vector<std::vector<std::uint8_t>> caps;
  std::vector<unsigned> status;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  fuzz::Input in(data, size);
  const unsigned order = static_cast<unsigned>(in.range(XENPROBES_RING_MIN_ORDER, XENPROBES_RING_MIN_ORDER + 2));
  const bool honest = in.flag();
  const std::size_t bytes = XENPROBES_RING_DATA_OFFSET + (std::size_t{1} << order);
  auto* mem = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  std::memset(mem, 0, bytes);
  struct Free {
    void* p;
    ~Free() { std::free(p); }
  } guard{mem};
  auto* hdr = reinterpret_cast<xenprobes_ring_header*>(mem);
  std::byte* ring_data = mem + XENPROBES_RING_DATA_OFFSET;
  xp_ring ring{};
  FUZZ_CHECK(xp_ring_init(&ring, mem, order, 0) == 0);
  auto reader = RingReader::open(std::span<std::byte>(mem, bytes), 0);
  FUZZ_CHECK(reader.has_value());

  // The page captures read: a fixed pattern (a NUL every 37 bytes ends its strings), then up
  // to 8 edits of up to 255 bytes each (offset, length, bytes): inputs stay small.
  Page page{};
  for (std::size_t i = 0; i < sizeof page.bytes; ++i)
    page.bytes[i] = i % 37 == 36 ? 0 : static_cast<std::uint8_t>('a' + i % 26);
  for (auto edits = in.range(0, 8); edits > 0; --edits) {
    const std::size_t at = in.range(0, sizeof page.bytes - 1);
    auto b = in.bytes(std::min<std::size_t>(in.u8(), sizeof page.bytes - at));
    std::memcpy(page.bytes + at, b.data(), b.size());
  }
  const xp_read_ops ops{&read_mem, &read_str, &page};

  std::deque<Expected> expected;  // honest mode: written, not yet delivered
  std::uint64_t attempted = 0, written = 0, delivered = 0;

  for (int step = 0; step < 256 && !in.empty(); ++step) {
    const std::uint8_t op = in.u8() % (honest ? 3 : 8);
    switch (op) {
      case 0: {  // the producer writes a hit
        xenprobes_regs regs;
        std::uint64_t* v = &regs.rax;
        for (int i = 0; i < 20; ++i) v[i] = in.flag() ? kBase + in.range(0, 4200) : in.u64();  // NOLINT
        const unsigned n = static_cast<unsigned>(in.range(0, XENPROBES_RING_CAPS_MAX + 1));
        std::vector<xenprobes_capture_spec> specs(n);
        for (auto& s : specs) {
          s.kind = static_cast<std::uint8_t>(in.pick({1u, 2u, 0x81u, 0x82u, 0u, 3u}));
          s.reg = static_cast<std::uint8_t>(in.range(0, XENPROBES_CAP_REG_MAX + 1));
          s.max = static_cast<std::uint16_t>(in.range(0, 300));
          s.offset = static_cast<std::uint32_t>(static_cast<std::int32_t>(in.range(0, 64)) - 32);
        }
        if (xp_ring_specs_check(specs.data(), n) != 0) {
          FUZZ_TRACE("specs refused");
          break;
        }
        const std::uint32_t probe = in.u32();
        ++attempted;
        const std::uint32_t seq = ring.seq;
        const auto res = xp_ring_write_hit(&ring, probe, step, &regs, specs.data(), n, &ops);
        FUZZ_CHECK(res != XP_RING_NESTED);
        if (res == XP_RING_WRITTEN || res == XP_RING_NOTIFY) {
          ++written;
          if (honest) {
            Expected e{seq, probe, regs, {}, {}};
            for (const auto& s : specs) {
              std::vector<std::uint8_t> b(s.max);
              std::uint64_t base;
              std::memcpy(&base, reinterpret_cast<const std::uint8_t*>(&regs) + 8 * s.reg, 8);
              const std::uint64_t addr =
                  base + static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(s.offset)));
              if ((s.kind & 0x7f) == XENPROBES_CAP_BYTES) {
                const bool ok = read_mem(&page, b.data(), addr, s.max, false) == 0;
                if (!ok) b.clear();
                e.status.push_back(ok ? XENPROBES_CAP_OK : XENPROBES_CAP_FAULT);
              } else {
                // Byte by byte: max - 1 characters up to the NUL (a fault among them: FAULT), then
                // the byte after them tells OK from TRUNCATED; unreadable, it is TRUNCATED (FAULT
                // when it is the only byte).
                std::uint8_t status = XENPROBES_CAP_FAULT;
                std::size_t len = 0;
                for (std::uint32_t i = 0; i < s.max; ++i) {
                  const bool last = i + 1 == s.max;
                  if (addr + i < addr || read_mem(&page, &b[i], addr + i, 1, false) != 0) {
                    if (last && i > 0) status = XENPROBES_CAP_TRUNCATED, len = s.max;
                    break;
                  }
                  if (b[i] == 0 || last) {
                    status = b[i] == 0 ? XENPROBES_CAP_OK : XENPROBES_CAP_TRUNCATED;
                    len = i + 1;
                    break;
                  }
                }
                b.resize(len);
                if (len) b.back() = 0;
                e.status.push_back(status);
              }
              e.caps.push_back(std::move(b));
            }
            expected.push_back(std::move(e));
          }
        } else {
          FUZZ_CHECK(res == XP_RING_DROPPED);
        }
        break;
      }
      case 1: {  // Dom0 drains
        const std::size_t k = in.range(0, 40);
        reader->drain(
            [&](const RingRecord& r) {
              ++delivered;
              FUZZ_CHECK(r.regs != nullptr);
              FUZZ_CHECK(r.captures.size() <= XENPROBES_RING_CAPS_MAX);
              for (const auto& c : r.captures) {
                FUZZ_CHECK(c.status <= XENPROBES_CAP_TRUNCATED);
                FUZZ_CHECK(c.status != XENPROBES_CAP_FAULT || c.bytes.empty());
                FUZZ_CHECK(c.bytes.size() <= XENPROBES_RING_REC_MAX);
              }
              if (!honest) return;
              FUZZ_CHECK(!expected.empty(), "a record nobody wrote");
              const Expected& e = expected.front();
              FUZZ_CHECK(r.seq == e.seq, "seq " + std::to_string(r.seq) + " for " + std::to_string(e.seq));
              FUZZ_CHECK(r.probe == e.probe);
              FUZZ_CHECK(std::memcmp(r.regs, &e.regs, sizeof e.regs) == 0);
              FUZZ_CHECK(r.captures.size() == e.caps.size());
              for (std::size_t i = 0; i < e.caps.size(); ++i) {
                FUZZ_CHECK(r.captures[i].index == i);
                FUZZ_CHECK(r.captures[i].status == e.status[i]);
                FUZZ_CHECK(r.captures[i].bytes.size() == e.caps[i].size());
                FUZZ_CHECK(std::memcmp(r.captures[i].bytes.data(), e.caps[i].data(), e.caps[i].size()) == 0);
              }
              expected.pop_front();
            },
            k);
        break;
      }
      case 2: {  // Dom0 arms the wakeup
        (void)reader->arm_wakeup(in.u32());
        break;
      }
      case 3: {  // the guest writes 8 raw bytes into the data area
        const std::uint64_t off = in.range(0, (std::uint64_t{1} << order) - 8);
        const std::uint64_t v = in.u64();
        std::memcpy(ring_data + off, &v, 8);
        break;
      }
      case 4:  // the guest moves head
        hdr->head = in.flag() ? hdr->tail + in.range(0, 3u << order) : in.u64();
        break;
      case 5:  // the guest rewrites the geometry it published (read once at open)
        hdr->data_order = in.u32();
        hdr->magic = in.u32();
        break;
      case 7:  // the guest moves tail, where the next reader opened starts (any alignment)
        hdr->tail = in.flag() ? in.u64() : hdr->head - in.range(0, 64);
        break;
      case 6: {  // a second reader opened on the ring as it is now
        auto again = RingReader::open(std::span<std::byte>(mem, bytes), 0);
        if (again) (void)again->next();
        break;
      }
    }
    FUZZ_CHECK(reader->pending() <= reader->data_size());
  }
  FUZZ_CHECK(reader->counters().records == delivered);
  FUZZ_TRACE("order %u %s: %llu hits, %llu written, %llu delivered, %llu pads, %llu resyncs", order,
             honest ? "honest" : "hostile", (unsigned long long)attempted, (unsigned long long)written,
             (unsigned long long)delivered, (unsigned long long)reader->counters().pads,
             (unsigned long long)reader->counters().resyncs);
  if (honest) {
    reader->drain([&](const RingRecord& r) {
      FUZZ_CHECK(!expected.empty() && r.seq == expected.front().seq);
      expected.pop_front();
      ++delivered;
    });
    FUZZ_CHECK(expected.empty(), std::to_string(expected.size()) + " records written never arrived");
    FUZZ_CHECK(delivered == written);
    FUZZ_CHECK(reader->counters().resyncs == 0);
    FUZZ_CHECK(reader->counters().missed == 0);
    FUZZ_CHECK(attempted == written + reader->guest_counters().drops);
  }
  return 0;
}
