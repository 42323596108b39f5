#include "guestmod/ring.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>

#include "common/bytes.hpp"
#include "common/hex.hpp"

namespace xenprobes::guestmod {

namespace {

constexpr std::uint32_t kPadHeader = 8;  // len, type, ncap: all a pad has

constexpr std::uint64_t round8(std::uint64_t n) { return (n + 7) & ~std::uint64_t{7}; }

template <typename T>
T shared_load(T& field, std::memory_order order) {
  return std::atomic_ref<T>(field).load(order);
}

template <typename T>
void shared_store(T& field, T value, std::memory_order order) {
  std::atomic_ref<T>(field).store(value, order);
}

}  // namespace

Result<RingReader> RingReader::open(std::span<std::byte> ring, unsigned vcpu) {
  if (ring.size() < XENPROBES_RING_DATA_OFFSET)
    return fail(Errc::InvalidArgument, "async ring of vCPU " + std::to_string(vcpu) + ": " +
                                           std::to_string(ring.size()) + " bytes mapped, less than its header page");
  if (reinterpret_cast<std::uintptr_t>(ring.data()) % alignof(std::uint64_t) != 0)
    return fail(Errc::InvalidArgument, "async ring of vCPU " + std::to_string(vcpu) + ": mapping not 8-byte aligned");
  auto* hdr = reinterpret_cast<xenprobes_ring_header*>(ring.data());
  const std::string what = "async ring of vCPU " + std::to_string(vcpu) + ": ";
  // Each field read once into a local: the guest may be rewriting them.
  const std::uint32_t magic = shared_load(hdr->magic, std::memory_order_relaxed);
  const std::uint32_t version = shared_load(hdr->version, std::memory_order_relaxed);
  const std::uint32_t hvcpu = shared_load(hdr->vcpu, std::memory_order_relaxed);
  const std::uint32_t order = shared_load(hdr->data_order, std::memory_order_relaxed);
  if (magic != XENPROBES_RING_MAGIC)
    return fail(Errc::InvalidArgument,
                what + "magic " + hex(magic) + " is not a ring's (" + hex(XENPROBES_RING_MAGIC) + ")");
  if (version != XENPROBES_PROTOCOL_VERSION)
    return fail(Errc::InvalidArgument, what + "protocol version " + std::to_string(version) + ", this library speaks " +
                                           std::to_string(XENPROBES_PROTOCOL_VERSION));
  if (hvcpu != vcpu) return fail(Errc::InvalidArgument, what + "its header says vCPU " + std::to_string(hvcpu));
  if (order < XENPROBES_RING_MIN_ORDER || order > XENPROBES_RING_MAX_ORDER)
    return fail(Errc::InvalidArgument, what + "data order " + std::to_string(order) + " outside [" +
                                           std::to_string(XENPROBES_RING_MIN_ORDER) + ", " +
                                           std::to_string(XENPROBES_RING_MAX_ORDER) + "]");
  const std::uint64_t size = std::uint64_t{1} << order;
  if (ring.size() - XENPROBES_RING_DATA_OFFSET < size)
    return fail(Errc::InvalidArgument, what + "a data area of " + std::to_string(size) + " bytes does not fit the " +
                                           std::to_string(ring.size()) + " bytes mapped");
  return RingReader(hdr, ring.data() + XENPROBES_RING_DATA_OFFSET, size, vcpu);
}

RingReader::RingReader(xenprobes_ring_header* hdr, std::byte* data, std::uint64_t size, unsigned vcpu)
    : hdr_(hdr), data_(data), size_(size), vcpu_(vcpu), copy_(std::make_unique<Copy>()) {
  tail_ = shared_load(hdr_->tail, std::memory_order_relaxed);
  head_ = tail_;
}

std::uint64_t RingReader::load_head() const { return shared_load(hdr_->head, std::memory_order_acquire); }

std::uint64_t RingReader::pending() const {
  const std::uint64_t used = load_head() - tail_;
  return used <= size_ ? used : 0;
}

void RingReader::resync(std::uint64_t head) {
  const std::uint64_t skipped = head - tail_;
  ++counters_.resyncs;
  counters_.corrupt_bytes += std::min(skipped, size_);
  tail_ = head;
  head_ = head;
  have_seq_ = false;  // what follows cannot be compared with what came before
}

void RingReader::release() { shared_store(hdr_->tail, tail_, std::memory_order_release); }

bool RingReader::arm_wakeup(std::uint32_t watermark) {
  const auto wm = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::max<std::uint32_t>(watermark, 1), size_));
  shared_store(hdr_->watermark, wm, std::memory_order_relaxed);
  shared_store(hdr_->wakeup, std::uint32_t{1}, std::memory_order_relaxed);
  // The producer stores head, then reads wakeup; we store wakeup, then read head.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return pending() != 0;
}

RingGuestCounters RingReader::guest_counters() const {
  return RingGuestCounters{shared_load(hdr_->drops, std::memory_order_relaxed),
                           shared_load(hdr_->nested, std::memory_order_relaxed),
                           shared_load(hdr_->notifies, std::memory_order_relaxed)};
}

// Checks the record copied into copy_ (len bytes) and fills copy_->record.
bool RingReader::parse(std::uint32_t len) {
  const std::byte* b = copy_->bytes.data();
  xenprobes_rec rec;
  std::memcpy(&rec, b, sizeof rec);
  if (rec.len != len || rec.type != XENPROBES_REC_HIT || rec.ncap > XENPROBES_RING_CAPS_MAX) return false;
  std::uint64_t off = sizeof(xenprobes_rec);
  for (unsigned i = 0; i < rec.ncap; ++i) {
    if (off + sizeof(xenprobes_cap) > len) return false;
    const auto cap = load<xenprobes_cap>(b + off);
    off += sizeof(xenprobes_cap);
    if (cap.index >= XENPROBES_RING_CAPS_MAX || cap.status > XENPROBES_CAP_TRUNCATED) return false;
    if (cap.status == XENPROBES_CAP_FAULT && cap.len != 0) return false;
    if (round8(cap.len) > len - off) return false;
    copy_->caps[i] = RingCapture{cap.index, cap.status, std::span<const std::byte>(b + off, cap.len)};
    off += round8(cap.len);
  }
  if (off != len) return false;
  if (have_seq_ && rec.seq != next_seq_) counters_.missed += static_cast<std::uint32_t>(rec.seq - next_seq_);
  have_seq_ = true;
  next_seq_ = rec.seq + 1;
  RingRecord& r = copy_->record;
  r.probe = rec.probe;
  r.seq = rec.seq;
  r.time = rec.time;
  r.regs = reinterpret_cast<const xenprobes_regs*>(b + offsetof(xenprobes_rec, regs));
  r.captures = std::span<const RingCapture>(copy_->caps.data(), rec.ncap);
  ++counters_.records;
  return true;
}

const RingRecord* RingReader::next() {
  if (tail_ == head_) {
    const std::uint64_t h = load_head();
    if (h == tail_) return nullptr;
    if (h - tail_ > size_) {
      resync(h);
      return nullptr;
    }
    head_ = h;
  }
  // Bounded: every pass consumes at least 8 bytes of the (at most size_) published ones.
  while (tail_ != head_) {
    const std::uint64_t avail = head_ - tail_;
    const std::uint64_t off = tail_ & (size_ - 1);
    const std::uint64_t contiguous = size_ - off;
    // Records start 8-aligned; a tail the guest put elsewhere (at open, or a head it wrote that
    // a resync took over) could leave fewer than 8 bytes before the data area's end.
    if (avail < kPadHeader || off % 8 != 0 || contiguous < kPadHeader) break;
    std::byte head8[kPadHeader];
    std::memcpy(head8, data_ + off, sizeof head8);
    const auto len = load<std::uint32_t>(head8);
    const auto type = load<std::uint16_t>(head8 + 4);
    if (len < kPadHeader || len % 8 != 0 || len > avail || len > contiguous) break;
    if (type == XENPROBES_REC_PAD) {
      // A pad fills the data area to its end, and only that.
      if (len != contiguous) break;
      tail_ += len;
      ++counters_.pads;
      continue;
    }
    if (type != XENPROBES_REC_HIT || len < sizeof(xenprobes_rec) || len > XENPROBES_RING_REC_MAX) break;
    std::memcpy(copy_->bytes.data(), data_ + off, len);
    if (!parse(len)) break;
    tail_ += len;
    return &copy_->record;
  }
  if (tail_ != head_) resync(head_);
  return nullptr;
}

}  // namespace xenprobes::guestmod
