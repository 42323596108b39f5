// Dom0's side of an async ring (include/xenprobes/protocol.h, "Async rings"): reads the records
// one vCPU's hits left in guest memory, with no trap and no hypercall per hit.
//
// The ring is guest memory: the guest can write any byte of it at any time. Every record is
// copied out of the ring once and checked in the copy; a handler sees only that copy (a
// read-only snapshot that stays valid until the next record is read). A ring that breaks a
// rule is resynchronised (its tail jumps to its head, the bytes skipped are counted) and never
// makes the reader touch memory outside it. Reading allocates nothing: the reader owns one
// record-sized buffer from open() on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/result.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::guestmod {

// One capture item of a record: which of the probe's specs, its status (XENPROBES_CAP_OK,
// _FAULT, _TRUNCATED) and its bytes (a string's NUL included).
struct RingCapture {
  unsigned index = 0;
  unsigned status = 0;
  std::span<const std::byte> bytes;
};

// One hit, as checked. regs and captures point into the reader's copy.
struct RingRecord {
  std::uint32_t probe = 0;
  std::uint32_t seq = 0;
  std::uint64_t time = 0;  // the guest's clock, ns
  const xenprobes_regs* regs = nullptr;
  std::span<const RingCapture> captures;
};

struct RingCounters {
  std::uint64_t records = 0;        // records delivered
  std::uint64_t pads = 0;           // pad records passed over
  std::uint64_t missed = 0;         // records missing by their sequence numbers (never written,
                                    // or skipped by a resynchronisation)
  std::uint64_t resyncs = 0;        // times the ring broke a rule and tail jumped to head
  std::uint64_t corrupt_bytes = 0;  // bytes skipped by those jumps
};

// What the producer says it dropped (its header's counters: the guest's word, reported only).
struct RingGuestCounters {
  std::uint64_t drops = 0;     // hits with no room left
  std::uint64_t nested = 0;    // hits that found the ring busy on their vCPU
  std::uint64_t notifies = 0;  // notifications sent
};

class RingReader {
 public:
  // `ring`: the whole ring as Dom0 maps it, header first (XENPROBES_RING_DATA_OFFSET plus the
  // data area). Checks the header (magic, version, vCPU, order within the protocol's bounds,
  // the data area inside `ring`) and reads its geometry once: a guest changing it later changes
  // nothing here. Starts at the ring's current tail. EINVAL naming the field that is wrong.
  [[nodiscard]] static Result<RingReader> open(std::span<std::byte> ring, unsigned vcpu);

  // The next record, or nullptr when none is left up to the head read last (then the next call
  // reads head again). A record stays valid until the next call. Consumed bytes go back to the
  // producer only at release().
  const RingRecord* next();

  // Publishes the bytes consumed so far (store-release of tail): the producer may reuse them.
  void release();

  // Calls fn(const RingRecord&) for up to max records, then release(); returns how many.
  template <typename F>
  std::size_t drain(F&& fn, std::size_t max = SIZE_MAX) {
    std::size_t n = 0;
    while (n < max) {
      const RingRecord* r = next();
      if (r == nullptr) break;
      fn(*r);
      ++n;
    }
    release();
    return n;
  }

  // Asks the producer for one notification once head - tail reaches `watermark` bytes (stores
  // wakeup = 1 and the watermark, then a full barrier). Returns whether records are already
  // waiting: then drain instead of sleeping (they may have been published before the arming).
  bool arm_wakeup(std::uint32_t watermark);

  // Bytes published and not yet read (0 when the ring's head is out of bounds).
  std::uint64_t pending() const;

  unsigned vcpu() const { return vcpu_; }
  std::uint64_t data_size() const { return size_; }
  const RingCounters& counters() const { return counters_; }
  RingGuestCounters guest_counters() const;

  RingReader(RingReader&&) noexcept = default;
  RingReader& operator=(RingReader&&) noexcept = default;
  ~RingReader() = default;

 private:
  struct Copy {
    alignas(8) std::array<std::byte, XENPROBES_RING_REC_MAX> bytes;
    std::array<RingCapture, XENPROBES_RING_CAPS_MAX> caps;
    RingRecord record;
  };

  RingReader(xenprobes_ring_header* hdr, std::byte* data, std::uint64_t size, unsigned vcpu);
  std::uint64_t load_head() const;
  void resync(std::uint64_t head);
  bool parse(std::uint32_t len);

  xenprobes_ring_header* hdr_;
  std::byte* data_;
  std::uint64_t size_;
  unsigned vcpu_;
  std::uint64_t tail_;      // bytes consumed (ours; the shared tail is written from it)
  std::uint64_t head_ = 0;  // the head read last, checked
  bool have_seq_ = false;
  std::uint32_t next_seq_ = 0;
  RingCounters counters_;
  std::unique_ptr<Copy> copy_;
};

}  // namespace xenprobes::guestmod
