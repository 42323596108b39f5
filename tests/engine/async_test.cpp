// Async probes on the simulated Xen (protocol.h "Async jump probes"): a jump probe whose hits
// the guest module writes into the vCPUs' rings; Dom0 reads them between events. Every call
// arrives as exactly one record, with its registers and captures, in order per vCPU; a ring
// Dom0 does not read fills up and the module counts exactly the hits it had no room for; a
// guest that keeps its ring non-empty gets no more than the bound read in one drain; the
// guest's results and text are untouched; every refusal says why.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "engine/engine_fixture.hpp"
#include "probe/engine.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kIterations = 40;

const std::set<std::string> kPaths = {"/etc/hostname", "/proc/version", "/tmp",          "/nonexistent",
                                      "/etc/passwd",   "/tmp/demo.log", "relative/path", "/etc"};

struct Seen {
  std::uint64_t records = 0;
  std::map<unsigned, std::uint32_t> next_seq;  // per vCPU
  std::map<unsigned, std::uint64_t> last_time;
  std::map<std::string, std::uint64_t> paths;
  std::uint64_t bad = 0;  // records that broke an expectation (details in the failure output)
};

TEST(AsyncProbe, EveryCallIsOneRecordWithItsRegistersAndCapturesInOrder) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  auto cfg = demo_config(2, kIterations);
  // 64 KiB per vCPU holds every record of the run (80 of at most 288 bytes): no drop however
  // late Dom0 gets to read (a loaded host).
  cfg.module_ring_order = 16;
  ProbedGuest g(cfg);
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  const std::uint64_t at = g.entry("sys_open");
  Seen seen;
  {
    AsyncOptions o;
    o.captures = {Capture::string(CaptureBase::Rdi, 0, 64), Capture::bytes(CaptureBase::Rsp, 0, 8),
                  Capture::bytes(CaptureBase::Rip, -0x40000000, 8)};  // 1 GiB below the kernel: not mapped
    auto p = g.session->probe_async(
        g.dom, "sys_open",
        [&](const AsyncHit& h) {
          ++seen.records;
          const unsigned v = h.vcpu.value;
          if (h.address.value != at || h.regs.rip != at || h.captures.size() != 3) ++seen.bad;
          if (seen.next_seq.contains(v) && h.seq != seen.next_seq[v]) ++seen.bad;
          seen.next_seq[v] = h.seq + 1;
          if (seen.last_time.contains(v) && h.time_ns < seen.last_time[v]) ++seen.bad;
          seen.last_time[v] = h.time_ns;
          if (h.captures.size() == 3) {
            EXPECT_EQ(h.captures[0].status, CaptureStatus::Ok);
            ++seen.paths[std::string(h.captures[0].text())];
            // The return address the call pushed: into the demo guest's text.
            std::uint64_t ret = 0;
            if (h.captures[1].bytes.size() == 8) std::memcpy(&ret, h.captures[1].bytes.data(), 8);
            if (ret < layout->text_start || ret >= layout->text_end) ++seen.bad;
            EXPECT_EQ(h.captures[2].status, CaptureStatus::Fault);
            EXPECT_TRUE(h.captures[2].bytes.empty());
          }
        },
        o);
    ASSERT_TRUE(p) << p.error().what;
    auto info = p->info();
    ASSERT_TRUE(info);
    EXPECT_TRUE(info->async);
    EXPECT_EQ(info->method, ProbeMethod::Jump);
    EXPECT_EQ(info->mode, ExecMode::Detour);
    g.start();
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    auto rs = g.session->ring_stats(g.dom);  // reads what is left
    ASSERT_TRUE(rs) << rs.error().what;
    const std::uint64_t calls = expected_calls(DEMO_FN_OPEN, kIterations) * 2;
    EXPECT_EQ(seen.records, calls);
    EXPECT_EQ(p->stats().hits, calls);
    EXPECT_EQ(seen.bad, 0u);
    EXPECT_EQ(seen.next_seq.size(), 2u) << "records from both vCPUs";
    EXPECT_EQ(rs->rings, 2u);
    EXPECT_EQ(rs->records, calls);
    EXPECT_EQ(rs->drops, 0u);
    EXPECT_EQ(rs->missed, 0u);
    EXPECT_EQ(rs->resyncs, 0u);
    EXPECT_EQ(rs->orphans, 0u);
    EXPECT_EQ(rs->bad_keys, 0u);
    for (const auto& [path, n] : seen.paths) EXPECT_TRUE(kPaths.contains(path)) << "captured '" << path << "'";
    const demo_stats ref = reference_stats(0, kIterations);
    EXPECT_EQ(g.stats(0).checksum, ref.checksum) << "the guest computed what it computes unprobed";
  }
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "unregistered: the text is the guest's again";
}

TEST(AsyncProbe, AFullRingDropsAndTheModuleCountsEveryDrop) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  auto cfg = demo_config(1, kIterations);
  cfg.module_ring_order = 12;  // 4 KiB: 22 records of 184 bytes
  ProbedGuest g(cfg);
  std::uint64_t records = 0;
  auto p = g.session->probe_async(g.dom, "sys_getppid", [&](const AsyncHit&) { ++records; });
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  // The jump goes in (Dom0 runs for the quiescence); from then on nobody reads the rings.
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; })) << "the jump was never written";
  const std::uint64_t before = records;
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  auto rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  const std::uint64_t calls = expected_calls(DEMO_FN_GETPPID, kIterations);
  EXPECT_GT(rs->drops, 0u) << "the workload makes more calls than a 4 KiB ring holds";
  EXPECT_LE(records - before, 4096u / sizeof(xenprobes_rec)) << "no more than the ring holds came after";
  EXPECT_EQ(records + rs->drops, calls) << "every call is a record or a counted drop";
  EXPECT_EQ(rs->missed, 0u);
  EXPECT_EQ(rs->resyncs, 0u);
  EXPECT_EQ(g.stats(0).iterations, kIterations);
}

// A handler may unregister its own probe: the removal waits until the records read in that
// round are handed out; the probe's later records are orphans, and the text is restored.
TEST(AsyncProbe, AHandlerUnregistersItsOwnProbe) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, kIterations));
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  std::optional<Probe> p;
  std::uint64_t records = 0;
  std::string failed;
  auto r = g.session->probe_async(g.dom, "sys_getppid", [&](const AsyncHit&) {
    if (++records == 3)
      if (auto u = p->unregister(); !u) failed = u.error().what;
  });
  ASSERT_TRUE(r) << r.error().what;
  p = std::move(*r);
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_TRUE(failed.empty()) << failed;
  EXPECT_GE(records, 3u) << "the records of the round that unregistered it still arrive";
  EXPECT_LT(records, expected_calls(DEMO_FN_GETPPID, kIterations)) << "none after the round it went in";
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "its jump is gone";
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, kIterations));
}

// A hostile producer: writes well-formed records into a ring the way a guest that ignores
// Dom0's tail could (the module's producer would find no room and drop), through a writable
// mapping of the ring's frames of its own, and publishes each with a store-release of head.
class HostileRingWriter {
 public:
  HostileRingWriter(hv::Hypervisor& hv, DomId dom, std::uint64_t ring_va, unsigned order)
      : size_(std::uint64_t{1} << order) {
    auto gv = GuestView::open(hv, dom);
    if (!gv) throw std::runtime_error(gv.error().what);
    std::vector<Frame> frames;
    for (std::uint64_t off = 0; off < XENPROBES_RING_DATA_OFFSET + size_; off += kPageSize) {
      auto pa = (*gv)->translate(Gva{ring_va + off});
      if (!pa) throw std::runtime_error(pa.error().what);
      frames.push_back(Frame{pa->value >> kPageShift});
    }
    auto m = hv.map_frames(dom, frames, hv::MapAccess::ReadWrite);
    if (!m) throw std::runtime_error(m.error().what);
    map_ = std::move(*m);
    hdr_ = reinterpret_cast<xenprobes_ring_header*>(map_.data());
    data_ = map_.data() + XENPROBES_RING_DATA_OFFSET;
  }

  xenprobes_rec record_at(std::uint64_t pos) const {
    xenprobes_rec r;
    std::memcpy(&r, data_ + (pos & (size_ - 1)), sizeof r);
    return r;
  }

  // Appends `r` (a record without captures) at head: a pad first when it would not fit
  // before the data area's end, as protocol.h "Async rings" says.
  void append(const xenprobes_rec& r) { append(std::as_bytes(std::span(&r, 1))); }

  // Appends the bytes of a whole record (a multiple of 8 bytes, its len theirs), the same way.
  void append(std::span<const std::byte> rec) {
    std::uint64_t head = std::atomic_ref(hdr_->head).load(std::memory_order_relaxed);
    if (const std::uint64_t left = size_ - (head & (size_ - 1)); left < rec.size()) {
      xenprobes_rec pad{};
      pad.len = static_cast<std::uint32_t>(left);
      pad.type = XENPROBES_REC_PAD;
      std::memcpy(data_ + (head & (size_ - 1)), &pad, 8);
      head += left;
    }
    std::memcpy(data_ + (head & (size_ - 1)), rec.data(), rec.size());
    std::atomic_ref(hdr_->head).store(head + rec.size(), std::memory_order_release);
  }

 private:
  std::uint64_t size_;
  hv::ForeignMapping map_;
  xenprobes_ring_header* hdr_ = nullptr;
  std::byte* data_ = nullptr;
};

// A guest that keeps its ring non-empty cannot hold Dom0 in one drain. Once the workload has
// ended, a hostile producer (the test) appends a valid record of the probe for every record
// Dom0 hands to the handler, from inside the handler: the ring is never empty when Dom0 looks
// again. One drain, whether Session::ring_stats() or a round of the event loop, hands out
// exactly probe::kMaxRecordsPerDrain records and returns; the records left come with the next
// drains, every one of them, in order. (Without the bound the first drain would hand out all
// of them: the producer stops after 2 bounds and a bit, so the test fails rather than hangs.)
TEST(AsyncProbe, ADrainIsBoundedWhileTheGuestKeepsItsRingNonEmpty) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  constexpr std::uint64_t kBound = probe::kMaxRecordsPerDrain;
  constexpr std::uint64_t kHostile = 2 * kBound + 1000;  // records the producer writes in all
  constexpr unsigned kOrder = 14;                        // 16 KiB: the producer wraps many times
  auto cfg = demo_config(1, 2);
  cfg.module_ring_order = kOrder;
  ProbedGuest g(cfg);
  auto hv = g.host->open();  // the producer's own handle on the guest's memory
  std::optional<HostileRingWriter> producer;
  xenprobes_rec next{};  // the producer's next record
  std::uint64_t records = 0, written = 0, out_of_order = 0, wrong_time = 0;
  std::uint32_t next_seq = 0;
  auto p = g.session->probe_async(g.dom, "sys_getppid", [&](const AsyncHit& h) {
    if (h.seq != next_seq) ++out_of_order;
    next_seq = h.seq + 1;
    ++records;
    if (!producer) return;
    if (h.time_ns != h.seq) ++wrong_time;  // the producer's records carry their seq as the time
    if (written == kHostile) return;
    producer->append(next);
    ++written;
    ++next.seq;
    next.time = next.seq;
  });
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  auto rs = g.session->ring_stats(g.dom);  // the guest's own records, all of them
  ASSERT_TRUE(rs) << rs.error().what;
  const std::uint64_t guest_records = expected_calls(DEMO_FN_GETPPID, 2);
  ASSERT_EQ(records, guest_records);
  ASSERT_EQ(rs->drops, 0u);

  auto layout = g.host->layout(g.dom);
  ASSERT_TRUE(layout);
  producer.emplace(*hv, g.dom, layout->rings, kOrder);
  next = producer->record_at(0);  // the guest's first record: the probe's key, its registers
  ASSERT_EQ(next.type, XENPROBES_REC_HIT);
  ASSERT_EQ(next.len, sizeof(xenprobes_rec));
  next.seq = next_seq;
  next.time = next.seq;
  producer->append(next);  // the ring is non-empty from here on, until the producer stops
  ++written;
  ++next.seq;
  next.time = next.seq;

  // One drain through ring_stats(): the bound, and ring_stats() returns.
  std::uint64_t before = records;
  rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  EXPECT_EQ(records - before, kBound) << "one drain hands out the bound, however long the guest keeps writing";
  EXPECT_EQ(written, records - guest_records + 1) << "the ring is still non-empty: one record waits";
  // One round of the event loop: the same.
  before = records;
  auto r = g.session->run_once(0);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(records - before, kBound) << "one round of the event loop drains the bound and returns";
  // The rest (the producer stops at kHostile): the next drain, and then the ring is empty.
  before = records;
  r = g.session->run_once(0);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(records - before, kHostile - 2 * kBound);
  before = records;
  r = g.session->run_once(0);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(records, before) << "nothing left";
  EXPECT_EQ(written, kHostile);
  EXPECT_EQ(out_of_order, 0u) << "every record in order, none twice, none lost";
  EXPECT_EQ(wrong_time, 0u);
  rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  EXPECT_EQ(rs->records, guest_records + kHostile);
  EXPECT_EQ(p->stats().hits, guest_records + kHostile);
  EXPECT_EQ(rs->missed, 0u);
  EXPECT_EQ(rs->resyncs, 0u);
  EXPECT_EQ(rs->corrupt_bytes, 0u);
  EXPECT_EQ(rs->orphans, 0u);
}

// A record the ring's framing accepts but whose captures its probe's specs cannot give (the
// guest wrote it): no handler sees it, and ring_stats() counts it in bad_records. The probe
// has one string capture of at most 16 bytes; a hostile producer (the test) appends, after
// the workload, one record that fits and one of each way not to: a string without its NUL,
// more bytes than max, a truncated string shorter than max, no capture, two captures, a
// capture numbered 1. Only the one that fits reaches the handler, with its string.
TEST(AsyncProbe, RecordsWhoseCapturesBreakTheirProbesSpecsAreCountedNotHandedOut) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  auto cfg = demo_config(1, 2);
  ProbedGuest g(cfg);
  auto hv = g.host->open();
  std::uint64_t records = 0;
  std::vector<std::string> texts;
  std::uint32_t next_seq = 0;
  auto p = g.session->probe_async(
      g.dom, "sys_getppid",
      [&](const AsyncHit& h) {
        ++records;
        next_seq = h.seq + 1;
        if (h.captures.size() == 1) texts.emplace_back(h.captures[0].text());
      },
      AsyncOptions{{Capture::string(CaptureBase::Rsp, 0, 16)}});
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  auto rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  const std::uint64_t guest_records = expected_calls(DEMO_FN_GETPPID, 2);
  ASSERT_EQ(records, guest_records);
  EXPECT_EQ(rs->bad_records, 0u) << "the module's own records fit their specs";

  auto layout = g.host->layout(g.dom);
  ASSERT_TRUE(layout);
  HostileRingWriter producer(*hv, g.dom, layout->rings, cfg.module_ring_order);
  const xenprobes_rec first = producer.record_at(0);  // the guest's: the probe's key
  ASSERT_EQ(first.type, XENPROBES_REC_HIT);
  struct Cap {
    std::uint8_t index, status;
    std::string bytes;
  };
  auto record = [&](const std::vector<Cap>& caps) {
    std::vector<std::byte> b(sizeof(xenprobes_rec));
    for (const Cap& c : caps) {
      const xenprobes_cap h{static_cast<std::uint16_t>(c.bytes.size()), c.index, c.status, 0};
      const std::size_t at = b.size();
      b.resize(at + sizeof h + ((c.bytes.size() + 7) & ~std::size_t{7}));
      std::memcpy(b.data() + at, &h, sizeof h);
      std::memcpy(b.data() + at + sizeof h, c.bytes.data(), c.bytes.size());
    }
    xenprobes_rec r = first;
    r.len = static_cast<std::uint32_t>(b.size());
    r.ncap = static_cast<std::uint16_t>(caps.size());
    r.seq = next_seq++;
    std::memcpy(b.data(), &r, sizeof r);
    producer.append(b);
  };
  const std::string sixteen("fifteen chars..\0", 16), seventeen("sixteen chars...\0", 17);
  record({{0, XENPROBES_CAP_OK, std::string("fits\0", 5)}});
  record({{0, XENPROBES_CAP_OK, "no nul"}});
  record({{0, XENPROBES_CAP_TRUNCATED, seventeen}});                       // more than max
  record({{0, XENPROBES_CAP_TRUNCATED, std::string("short\0", 6)}});       // truncated below max
  record({});                                                              // no capture
  record({{0, XENPROBES_CAP_OK, sixteen}, {1, XENPROBES_CAP_FAULT, ""}});  // one too many
  record({{1, XENPROBES_CAP_OK, sixteen}});                                // numbered 1
  rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  EXPECT_EQ(records, guest_records + 1) << "only the record that fits reaches the handler";
  ASSERT_FALSE(texts.empty());
  EXPECT_EQ(texts.back(), "fits");
  EXPECT_EQ(rs->bad_records, 6u);
  EXPECT_EQ(rs->records, guest_records + 1);
  EXPECT_EQ(p->stats().hits, guest_records + 1);
  EXPECT_EQ(rs->missed, 0u);
  EXPECT_EQ(rs->resyncs, 0u) << "their framing is sound: no resynchronisation";
  EXPECT_EQ(rs->orphans, 0u);
}

// String captures read as the synchronous str() reads (protocol.h "Captures"): a capture of
// max bytes is at most max - 1 characters and its NUL, read up to the NUL; the byte after
// max - 1 characters is read only to tell Ok from Truncated, and when it cannot be read the
// characters stay (Truncated), where the synchronous read of max - 1 characters succeeds too.
// The strings are written at the very end of the guest image's mapping (the padding after
// .bss, which nothing uses), right before a page nothing maps; each capture is compared with
// what Dom0's synchronous read of max - 1 characters (GuestView::read_string) gives there.
struct StringCase {
  std::uint64_t from_end;  // the capture reads at image_end - from_end
  std::uint16_t max;
  CaptureStatus status;
  std::string text;  // what it captures (without the NUL); "" for a fault
};

void string_captures_at_the_image_end(const std::string& tail, const std::vector<StringCase>& cases) {
  ProbedGuest g(demo_config(1, 2));
  auto layout = g.host->layout(g.dom);
  ASSERT_TRUE(layout);
  const std::uint64_t end = layout->image_end;
  ASSERT_EQ(end % kPageSize, 0u);
  ASSERT_LE(g.sym("demo_ibt_stack") + 4096, end - 64) << "the bytes written are the image's padding: nobody's";
  std::byte probe_byte{};
  ASSERT_FALSE(g.host->peek(g.dom, end, std::span(&probe_byte, 1))) << "nothing is mapped after the image";
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  ASSERT_TRUE(gv) << gv.error().what;
  ASSERT_TRUE((*gv)->write(Gva{end - tail.size()}, std::as_bytes(std::span(tail.data(), tail.size()))));
  const std::uint64_t at = g.entry("sys_getppid");
  AsyncOptions o;
  for (const StringCase& c : cases)
    o.captures.push_back(Capture::string(CaptureBase::Rip, static_cast<std::int32_t>(end - c.from_end - at), c.max));
  std::uint64_t records = 0, wrong = 0;
  std::string first_wrong;
  auto p = g.session->probe_async(
      g.dom, "sys_getppid",
      [&](const AsyncHit& h) {
        ++records;
        for (std::size_t k = 0; k < cases.size() && k < h.captures.size(); ++k) {
          const CaptureValue& v = h.captures[k];
          const bool ok = h.captures.size() == cases.size() && v.status == cases[k].status &&
                          v.text() == cases[k].text &&
                          v.bytes.size() == (v.status == CaptureStatus::Fault ? 0 : cases[k].text.size() + 1);
          if (!ok && wrong++ == 0)
            first_wrong = "capture " + std::to_string(k) + ": status " + std::to_string(int(v.status)) + ", " +
                          std::to_string(v.bytes.size()) + " bytes, '" + std::string(v.text()) + "'";
        }
      },
      o);
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  auto rs = g.session->ring_stats(g.dom);
  ASSERT_TRUE(rs) << rs.error().what;
  EXPECT_EQ(records, expected_calls(DEMO_FN_GETPPID, 2));
  EXPECT_EQ(wrong, 0u) << first_wrong;
  EXPECT_EQ(rs->bad_records, 0u);
  // The synchronous read of str()'s max - 1 characters, from Dom0, at the same bytes.
  for (const StringCase& c : cases) {
    auto sync = (*gv)->read_string(Gva{end - c.from_end}, c.max - 1u);
    if (c.status == CaptureStatus::Fault) {
      EXPECT_FALSE(sync) << "max " << c.max << " at end - " << c.from_end;
    } else {
      ASSERT_TRUE(sync) << sync.error().what;
      EXPECT_EQ(*sync, c.text) << "max " << c.max << " at end - " << c.from_end;
    }
  }
}

TEST(AsyncProbe, AStringEndingRightBeforeAnUnmappedPageIsCapturedWholeAndALongerOneTruncated) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  // 15 characters and their NUL, the NUL the last byte before the unmapped page.
  string_captures_at_the_image_end(std::string("0123456789abcde\0", 16),
                                   {{16, 64, CaptureStatus::Ok, "0123456789abcde"},
                                    {16, 16, CaptureStatus::Ok, "0123456789abcde"},  // exactly max - 1
                                    {16, 11, CaptureStatus::Truncated, "0123456789"},
                                    {16, 1, CaptureStatus::Truncated, ""},
                                    {1, 1, CaptureStatus::Ok, ""}});  // the NUL alone
}

TEST(AsyncProbe, MaxMinusOneCharactersRightBeforeAnUnmappedPageAreTruncatedNotAFault) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  // 15 characters and no NUL before the unmapped page: str() of 15 characters (max 16) reads
  // them; the byte that would say whether the string ends there is not mapped.
  string_captures_at_the_image_end("0123456789abcde", {{15, 16, CaptureStatus::Truncated, "0123456789abcde"},
                                                       {15, 17, CaptureStatus::Fault, ""},  // the 16th character
                                                       {15, 8, CaptureStatus::Truncated, "0123456"},
                                                       {0, 8, CaptureStatus::Fault, ""}});  // the unmapped page
}

TEST(AsyncProbe, RefusalsSayWhy) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  {
    auto cfg = demo_config(1, 1);
    cfg.module_ring_order = 0;
    ProbedGuest g(cfg);
    auto p = g.session->probe_async(g.dom, "sys_getppid", [](const AsyncHit&) {});
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, Errc::NotSupported);
    EXPECT_NE(p.error().what.find("publishes no async rings"), std::string::npos) << p.error().what;
  }
  ProbedGuest g(demo_config(1, 1));
  auto nothing = g.session->probe_async(g.dom, "sys_getppid", AsyncHandler{});
  ASSERT_FALSE(nothing);
  EXPECT_EQ(nothing.error().code, Errc::InvalidArgument);

  AsyncOptions many;
  many.captures.assign(9, Capture::bytes(CaptureBase::Rdi, 0, 8));
  auto nine = g.session->probe_async(
      g.dom, "sys_getppid", [](const AsyncHit&) {}, many);
  ASSERT_FALSE(nine);
  EXPECT_NE(nine.error().what.find("at most 8"), std::string::npos) << nine.error().what;

  AsyncOptions big;
  big.captures.assign(4, Capture::bytes(CaptureBase::Rdi, 0, 1024));
  auto huge = g.session->probe_async(
      g.dom, "sys_getppid", [](const AsyncHit&) {}, big);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().what.find("capture fewer bytes"), std::string::npos) << huge.error().what;

  AsyncOptions zero;
  zero.captures = {Capture::bytes(CaptureBase::Rdi, 0, 0)};
  auto none = g.session->probe_async(
      g.dom, "sys_getppid", [](const AsyncHit&) {}, zero);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().what.find("capture 0: max 0 bytes"), std::string::npos) << none.error().what;

  // An async probe has its point to itself, both ways round.
  auto a = g.session->probe_async(g.dom, "sys_getppid", [](const AsyncHit&) {});
  ASSERT_TRUE(a) << a.error().what;
  auto b = g.session->probe(g.dom, "sys_getppid", [](HitContext&) { return 0; });
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, Errc::Busy);
  EXPECT_NE(b.error().what.find("an async probe"), std::string::npos) << b.error().what;
  auto t = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(t) << t.error().what;
  auto c = g.session->probe_async(g.dom, "sys_read", [](const AsyncHit&) {});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Errc::Busy);
}

// Capture::by_address (XENPROBES_CAP_AUTO): the module picks user or kernel memory by the
// address; only on a module that publishes it in rings/cap-flags, else refused saying why.
TEST(AsyncProbe, ByAddressCapturesNeedAModuleThatPublishesThem) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  Capture path = Capture::string(CaptureBase::Rdi, 0, 64);
  path.by_address = true;
  {
    auto cfg = demo_config(1, 1);
    cfg.module_cap_auto = false;
    ProbedGuest g(cfg);
    auto p = g.session->probe_async(
        g.dom, "sys_open", [](const AsyncHit&) {}, AsyncOptions{{path}});
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, Errc::NotSupported);
    EXPECT_NE(p.error().what.find("rings/cap-flags"), std::string::npos) << p.error().what;
    auto plain = g.session->probe_async(
        g.dom, "sys_open", [](const AsyncHit&) {}, AsyncOptions{{Capture::string(CaptureBase::Rdi, 0, 64)}});
    EXPECT_TRUE(plain) << plain.error().what;
  }
  constexpr std::uint64_t K = 4;
  ProbedGuest g(demo_config(1, K));
  std::vector<std::string> paths;
  auto p = g.session->probe_async(
      g.dom, "sys_open", [&](const AsyncHit& h) { paths.emplace_back(h.captures[0].text()); }, AsyncOptions{{path}});
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  ASSERT_TRUE(g.session->ring_stats(g.dom));
  ASSERT_EQ(paths.size(), expected_calls(DEMO_FN_OPEN, K));
  for (const std::string& s : paths) EXPECT_FALSE(s.empty()) << "a kernel address read as kernel memory";
}

TEST(AsyncProbe, OtherChannelsRefuseAsyncProbesSayingWhy) {
  if (test_channel() == ChannelKind::Guest) GTEST_SKIP() << "the guest channel makes async probes";
  ProbedGuest g(demo_config(1, 1));
  auto p = g.session->probe_async(g.dom, "sys_getppid", [](const AsyncHit&) {});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("guest channel"), std::string::npos) << p.error().what;
}

// rings/* are the guest's words: each malformed value refuses async probes (naming the key),
// and nothing else.
TEST(AsyncProbe, MalformedRingKeysRefuseAsyncProbesOnly) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  struct Case {
    const char* key;
    const char* value;
    const char* says;
  };
  for (const Case& c :
       {Case{XENPROBES_XS_RINGS_ORDER, "11", "rings/order"}, Case{XENPROBES_XS_RINGS_ORDER, "25", "rings/order"},
        Case{XENPROBES_XS_RINGS_COUNT, "0", "rings/count"}, Case{XENPROBES_XS_RINGS_COUNT, "99", "rings/count"},
        Case{XENPROBES_XS_RINGS_ADDR, "0xffffc90001000800", "page-aligned"},
        Case{XENPROBES_XS_RINGS_ADDR, "0x1000", "upper-half"},
        Case{XENPROBES_XS_RINGS_ADDR, "banana", "hex address"}}) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value);
    auto cfg = demo_config(1, 1);
    cfg.start_paused = true;
    auto host = hv::sim::SimHost::create({});
    auto id = host->create_domain(cfg);
    ASSERT_TRUE(id) << id.error().what;
    auto hv = host->open();
    const std::string key = "/local/domain/" + std::to_string(id->value) + "/" XENPROBES_XS_DIR "/" + c.key;
    ASSERT_TRUE(hv->xs_write(key, c.value));
    SessionOptions so{ChannelKind::Guest};
    so.guardian = GuardianMode::Off;
    auto s = Session::open(std::move(hv), so);
    ASSERT_TRUE(s) << s.error().what;
    ASSERT_TRUE((*s)->load_symbols(*id, demo_map()));
    auto p = (*s)->probe_async(*id, "sys_getppid", [](const AsyncHit&) {});
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().what.find(c.says), std::string::npos) << p.error().what;
    auto t = (*s)->probe(
        *id, "sys_getppid", [](HitContext&) { return 0; }, {}, ProbeOptions{ProbeMethod::Jump});
    EXPECT_TRUE(t) << "a synchronous jump probe is not the rings' business: " << t.error().what;
  }
}

}  // namespace
}  // namespace xenprobes::testing
