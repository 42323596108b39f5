// Async probes (protocol.h "Async jump probes", docs/probes.md "Async probes"): a jump probe
// whose detour makes the guest module write a record into the hit vCPU's ring; Dom0 reads the
// rings between events and hands each record to its probe's handler.
#include "probe/engine_internal.hpp"

#include <cinttypes>
#include <cstring>

namespace xenprobes::probe {

namespace {

// How full a ring may get before the module notifies Dom0 (a quarter of it): the rest leaves
// room for the hits that come while Dom0 wakes up.
constexpr unsigned kWatermarkShift = 2;
// (What one drain reads of a ring at most: kMaxRecordsPerDrain, kMaxPassesPerDrain in engine.hpp.)

constexpr std::uint64_t round8(std::uint64_t n) { return (n + 7) & ~std::uint64_t{7}; }

// Whether a record's captures are what its probe's specs can give (the ring reader checked
// their framing only; the guest wrote them): one per spec, in order, no more bytes than the
// spec's max; bytes exactly max unless they faulted; a string ends with its NUL and is max bytes
// when truncated. A handler relies on it (a C string it can strlen, captures[k] for each k).
bool captures_fit(const guestmod::RingRecord& rec, const std::vector<xenprobes_capture_spec>& specs) {
  if (rec.captures.size() != specs.size()) return false;
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const guestmod::RingCapture& c = rec.captures[k];
    const xenprobes_capture_spec& s = specs[k];
    if (c.index != k || c.bytes.size() > s.max) return false;
    if (c.status == XENPROBES_CAP_FAULT) continue;  // no bytes (the reader checked)
    if ((s.kind & ~(XENPROBES_CAP_USER | XENPROBES_CAP_AUTO)) == XENPROBES_CAP_BYTES) {
      if (c.status != XENPROBES_CAP_OK || c.bytes.size() != s.max) return false;
    } else if (c.bytes.empty() || c.bytes.back() != std::byte{0} ||
               (c.status == XENPROBES_CAP_TRUNCATED && c.bytes.size() != s.max)) {
      return false;
    }
  }
  return true;
}

Regs regs_of(const xenprobes_regs& x) {
  Regs r;
  r.rax = x.rax, r.rbx = x.rbx, r.rcx = x.rcx, r.rdx = x.rdx, r.rsi = x.rsi, r.rdi = x.rdi, r.rbp = x.rbp;
  r.rsp = x.rsp, r.r8 = x.r8, r.r9 = x.r9, r.r10 = x.r10, r.r11 = x.r11, r.r12 = x.r12, r.r13 = x.r13;
  r.r14 = x.r14, r.r15 = x.r15, r.rip = x.rip, r.rflags = x.rflags;
  r.cs = static_cast<std::uint16_t>(x.cs);
  r.ss = static_cast<std::uint16_t>(x.ss);
  return r;
}

CaptureStatus status_of(unsigned s) {
  switch (s) {
    case XENPROBES_CAP_OK: return CaptureStatus::Ok;
    case XENPROBES_CAP_TRUNCATED: return CaptureStatus::Truncated;
    default: return CaptureStatus::Fault;
  }
}

}  // namespace

Result<ProbeId> Engine::add_async(DomId id, Gva addr, AsyncHandler handler, std::vector<Capture> captures) {
  if (!handler) return fail(Errc::InvalidArgument, "an async probe needs a handler");
  if (captures.size() > XENPROBES_RING_CAPS_MAX)
    return fail(Errc::InvalidArgument, std::to_string(captures.size()) + " captures: an async probe has at most " +
                                           std::to_string(XENPROBES_RING_CAPS_MAX));
  auto reg = std::make_unique<Registration>();
  std::uint64_t record = sizeof(xenprobes_rec);
  for (std::size_t k = 0; k < captures.size(); ++k) {
    const Capture& c = captures[k];
    const std::string which = "capture " + std::to_string(k) + ": ";
    if (c.max == 0 || c.max > XENPROBES_CAP_MAX_BYTES)
      return fail(Errc::InvalidArgument, which + "max " + std::to_string(c.max) + " bytes, must be 1.." +
                                             std::to_string(XENPROBES_CAP_MAX_BYTES));
    const auto base = static_cast<unsigned>(c.base);
    if (base > XENPROBES_CAP_REG_MAX) return fail(Errc::InvalidArgument, which + "no such base register");
    if (c.kind != Capture::Kind::Bytes && c.kind != Capture::Kind::String)
      return fail(Errc::InvalidArgument, which + "no such kind");
    xenprobes_capture_spec sp{};
    sp.kind = static_cast<std::uint8_t>((c.kind == Capture::Kind::Bytes ? XENPROBES_CAP_BYTES : XENPROBES_CAP_STRING) |
                                        (c.by_address ? XENPROBES_CAP_AUTO
                                         : c.user     ? XENPROBES_CAP_USER
                                                      : 0u));
    sp.reg = static_cast<std::uint8_t>(base);
    sp.max = c.max;
    sp.offset = static_cast<std::uint32_t>(c.offset);
    reg->specs.push_back(sp);
    record += sizeof(xenprobes_cap) + round8(c.max);
  }
  if (record > XENPROBES_RING_REC_MAX)
    return fail(Errc::InvalidArgument, "the captures make a record of up to " + std::to_string(record) +
                                           " bytes, more than the " + std::to_string(XENPROBES_RING_REC_MAX) +
                                           " a ring record holds: capture fewer bytes");
  reg->async = std::move(handler);
  reg->method = ProbeMethod::Jump;
  return add_registration(id, addr, std::move(reg));
}

std::optional<std::string> Engine::plan_async(Domain& d, const Registration& reg) {
  if (!d.rings_refused.empty()) return "the guest module's rings are refused: " + d.rings_refused;
  if (!d.rings_info)
    return std::string(
        "the guest module publishes no async rings (install the current xenprobesU in the guest, "
        "loaded with ring_order above 0)");
  for (const xenprobes_capture_spec& sp : reg.specs)
    if ((sp.kind & XENPROBES_CAP_AUTO) && !(d.rings_info->cap_flags & XENPROBES_CAP_AUTO))
      return std::string(
          "a capture reads user or kernel memory by its address (Capture::by_address, in C "
          "XENPROBE_CAPTURE_BY_ADDRESS), which this "
          "guest module cannot (it publishes no rings/cap-flags with it): install the current "
          "xenprobesU in the guest, or capture with user set or not");
  if (d.rings.empty())
    if (auto r = map_rings(d); !r) return "its rings cannot be mapped: " + r.error().what;
  return std::nullopt;
}

Result<void> Engine::map_rings(Domain& d) {
  if (d.pause_depth == 0) XP_TRY(refresh_context(d));
  auto rings = XP_TRY(guestmod::map_rings(hv_, d.id, *d.memory, *d.rings_info));
  // Records left from an earlier session (its probes' keys are not ours): skipped, not handed
  // to anyone. From here on every record is one of this session's.
  for (guestmod::MappedRing& r : rings) {
    r.reader.drain([](const guestmod::RingRecord&) {});
    r.reader.arm_wakeup(static_cast<std::uint32_t>(r.reader.data_size() >> kWatermarkShift));
  }
  d.rings = std::move(rings);
  XP_LOG(Info, "domain %u: %u async rings of %" PRIu64 " bytes mapped", d.id.value, unsigned(d.rings.size()),
         d.rings.front().reader.data_size());
  return {};
}

void Engine::async_key(const JumpState& j, Gva specs, channel::TrapEntry& te) {
  te.fallback = channel::TrapEntry::Fallback::AsyncJump;
  te.len = 0;
  std::memset(te.insn, 0, sizeof te.insn);
  const std::uint32_t key = j.async_key;
  const auto off = static_cast<std::uint32_t>(j.specs.empty() ? 0 : specs.value - te.addr.value);
  for (unsigned i = 0; i < 4; ++i) {
    te.insn[XENPROBES_ASYNC_KEY_PROBE + i] = static_cast<std::uint8_t>(key >> (8 * i));
    te.insn[XENPROBES_ASYNC_KEY_SPECS + i] = static_cast<std::uint8_t>(off >> (8 * i));
  }
  te.insn[XENPROBES_ASYNC_KEY_NCAPS] = static_cast<std::uint8_t>(j.specs.size());
}

void Engine::drain_rings(Domain& d) {
  if (d.draining) return;  // a handler asked for ring_stats(): the records keep their order
  d.draining = true;
  // A handler that unregisters a probe (its own too) is running it: the removal waits for
  // after_dispatch(), as it does for a hit's handler.
  const bool was_dispatching = std::exchange(dispatching_, true);
  std::array<CaptureValue, XENPROBES_RING_CAPS_MAX> values;
  AsyncHit hit;
  hit.domain = d.id;
  auto deliver = [&](const guestmod::RingRecord& rec, unsigned vcpu) {
    auto it = d.async_keys.find(rec.probe);
    if (it == d.async_keys.end() || !it->second->enabled) {
      ++d.ring_orphans;
      return;
    }
    Registration& reg = *it->second;
    if (!captures_fit(rec, reg.specs)) {
      ++d.ring_bad_records;
      return;
    }
    hit.vcpu = VcpuId{vcpu};
    hit.address = reg.point->addr;
    hit.time_ns = rec.time;
    hit.seq = rec.seq;
    hit.regs = regs_of(*rec.regs);
    const std::size_t n = std::min(rec.captures.size(), values.size());  // = the specs (captures_fit)
    for (std::size_t k = 0; k < n; ++k) {
      values[k].status = status_of(rec.captures[k].status);
      values[k].bytes = rec.captures[k].bytes;
    }
    hit.captures = std::span<const CaptureValue>(values.data(), n);
    ++d.ring_records;
    ++reg.stats.hits;
    reg.async(hit);
  };
  for (guestmod::MappedRing& r : d.rings) {
    const unsigned vcpu = r.reader.vcpu();
    const auto watermark = static_cast<std::uint32_t>(r.reader.data_size() >> kWatermarkShift);
    std::size_t n = r.reader.drain([&](const guestmod::RingRecord& rec) { deliver(rec, vcpu); }, kMaxRecordsPerDrain);
    // Records published between the drain and the arming would wait for the next wake-up.
    for (int pass = 1; pass < kMaxPassesPerDrain && n < kMaxRecordsPerDrain && r.reader.arm_wakeup(watermark); ++pass)
      n += r.reader.drain([&](const guestmod::RingRecord& rec) { deliver(rec, vcpu); }, kMaxRecordsPerDrain - n);
  }
  dispatching_ = was_dispatching;
  d.draining = false;
}

Result<RingStats> Engine::ring_stats(DomId id) {
  Domain* d = XP_TRY(domain(id));
  if (!d->rings.empty()) drain_rings(*d);
  RingStats s;
  s.rings = static_cast<unsigned>(d->rings.size());
  s.records = d->ring_records;
  s.orphans = d->ring_orphans;
  s.bad_records = d->ring_bad_records;
  for (const guestmod::MappedRing& r : d->rings) {
    const guestmod::RingCounters& c = r.reader.counters();
    s.missed += c.missed;
    s.resyncs += c.resyncs;
    s.corrupt_bytes += c.corrupt_bytes;
    const guestmod::RingGuestCounters g = r.reader.guest_counters();
    s.drops += g.drops;
    s.nested += g.nested;
  }
  return s;
}

}  // namespace xenprobes::probe
