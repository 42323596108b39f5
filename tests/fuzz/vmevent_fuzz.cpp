// Fuzz target: vm_event ring requests (channel/vmevent.cpp), through the real consumer of the
// ring page (VmEventBackRing, hv/xen/xc_shim_vm_event.cpp) when the Xen backend is built. Xen
// fills the ring, but from guest state: rip, registers, the gfn and the instruction length of a
// trap are the guest's, and a version or reason Xen never sends must not take Dom0 down either.
//
// Input: a header (channel mode, guest type, vCPUs, a journal or not), then operations: Xen
// pushing a request (well-formed with fuzzed fields, or raw bytes), Xen re-trapping a vCPU
// with the registers of the last SET_REGISTERS answer (the second half of an agentless
// emulation), the guest rewriting the byte at a trap, the engine owning/disowning traps and
// removing them, process(), flush(), detach and attach. The sink's handlers decline, edit
// registers, or ask for an emulation with fuzzed bytes.
//
// Invariants: every request the ring accepts gets exactly one answer, in order, for its own
// vCPU and reason, echoing VCPU_PAUSED; EMULATE only in int3 mode, after a software
// breakpoint, with bytes a handler asked for; never SET_REGISTERS with instruction data; a
// stop is handed to the engine only for a paused vCPU on a trap it owns, with the request's
// registers; after detach nothing is left unanswered, no pause is held (the journal agrees).
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>

#include "channel/vmevent.hpp"
#include "fuzz/fuzz_common.hpp"
#include "guardian/journal.hpp"

#if XP_FUZZ_XEN_RING
#ifndef __XEN_TOOLS__
#define __XEN_TOOLS__ 1
#endif
extern "C" {
#include <xen/xen.h>
#include <xen/vm_event.h>
}
#include "hv/xen/xen_internal.hpp"
#endif

using namespace xenprobes;
using channel::VmEventChannel;
using fuzz::FakeHv;
using fuzz::Input;

namespace {

constexpr DomId kDom{5};
constexpr std::uint64_t kText = 0xffffffff81000000ull;
constexpr std::uint64_t kGfn = 0x4000;

#if XP_FUZZ_XEN_RING
using Request = vm_event_request_t;
#else
using Request = hv::VmEventRequest;
#endif

// What the ring answered, in answer order.
struct Answer {
  std::uint32_t vcpu, reason, flags;
  hv::VcpuRegs regs;
  std::array<std::uint8_t, 16> insn;
};

class Ring final : public hv::VmEventRing {
 public:
  Ring() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
#if XP_FUZZ_XEN_RING
    page_ = static_cast<std::uint8_t*>(std::aligned_alloc(kPageSize, kPageSize));
    std::memset(page_, 0xa5, kPageSize);  // garbage: the back ring initialises it
    back_ = std::make_unique<hv::xen::VmEventBackRing>(page_, kDom);
#endif
  }
  ~Ring() override {
#if XP_FUZZ_XEN_RING
    back_.reset();
    std::free(page_);
#endif
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const override { return fd_; }

#if XP_FUZZ_XEN_RING
  vm_event_sring_t* sring() { return reinterpret_cast<vm_event_sring_t*>(page_); }
  unsigned in_flight() { return sring()->req_prod - sring()->rsp_prod; }
  void push(const Request& q) {
    auto* s = sring();
    std::memcpy(&s->ring[s->req_prod % 8].req, &q, sizeof q);
    s->req_prod = s->req_prod + 1;
  }
  void set_req_prod(std::uint32_t v) { sring()->req_prod = v; }
  Result<std::optional<hv::VmEventRequest>> get_request() override {
    bool answered = false;
    auto r = back_->take_request(answered);
    if (answered) ++notifies;
    return r;
  }
  Result<void> put_response(const hv::VmEventResponse& r) override {
    if (full) return fail(Errc::NoSpace, "ring full (fuzz)");
    return back_->push_response(r);
  }
  // The answers Xen would read, from `from` on.
  std::vector<Answer> answers_from(std::uint32_t from) {
    std::vector<Answer> out;
    for (std::uint32_t i = from; i != sring()->rsp_prod; ++i) {
      vm_event_response_t rsp;
      std::memcpy(&rsp, &sring()->ring[i % 8].rsp, sizeof rsp);
      Answer a{rsp.vcpu_id, rsp.reason, rsp.flags, {}, {}};
      a.regs.rip = rsp.data.regs.x86.rip;
      a.regs.rax = rsp.data.regs.x86.rax;
      a.regs.rbx = rsp.data.regs.x86.rbx;
      a.regs.rflags = rsp.data.regs.x86.rflags;
      std::memcpy(a.insn.data(), rsp.data.emul.insn.data, 16);
      out.push_back(a);
    }
    return out;
  }
  std::uint32_t answered() { return sring()->rsp_prod; }
#else
  std::deque<Request> queue;
  std::vector<Answer> given;
  unsigned in_flight() { return static_cast<unsigned>(queue.size() + taken - given.size()); }
  void push(const Request& q) { queue.push_back(q); }
  Result<std::optional<hv::VmEventRequest>> get_request() override {
    if (queue.empty()) return std::optional<hv::VmEventRequest>{};
    auto q = queue.front();
    queue.pop_front();
    ++taken;
    return std::optional<hv::VmEventRequest>{q};
  }
  Result<void> put_response(const hv::VmEventResponse& r) override {
    if (full || given.size() >= taken) return fail(Errc::NoSpace, "ring full (fuzz)");
    if ((r.flags & hv::kVmEventFlagSetRegisters) && (r.flags & hv::kVmEventFlagSetEmulInsnData))
      return fail(Errc::InvalidArgument, "registers and instruction bytes share a union");
    Answer a{r.vcpu, static_cast<std::uint32_t>(r.reason), r.flags, r.regs, {}};
    std::memcpy(a.insn.data(), r.emul_insn, 16);
    given.push_back(a);
    return {};
  }
  std::vector<Answer> answers_from(std::uint32_t from) {
    return std::vector<Answer>(given.begin() + from, given.end());
  }
  std::uint32_t answered() { return static_cast<std::uint32_t>(given.size()); }
  std::size_t taken = 0;
#endif
  Result<void> notify() override {
    ++notifies;
    return {};
  }

  bool full = false;
  unsigned notifies = 0;

 private:
  int fd_;
#if XP_FUZZ_XEN_RING
  std::uint8_t* page_ = nullptr;
  std::unique_ptr<hv::xen::VmEventBackRing> back_;
#endif
};

// What the channel owns: a handle on a Ring the harness keeps, so that the answers can be
// read after detach destroyed the channel's handle.
class RingHandle final : public hv::VmEventRing {
 public:
  explicit RingHandle(std::shared_ptr<Ring> r) : r_(std::move(r)) {}
  int fd() const override { return r_->fd(); }
  Result<std::optional<hv::VmEventRequest>> get_request() override { return r_->get_request(); }
  Result<void> put_response(const hv::VmEventResponse& x) override { return r_->put_response(x); }
  Result<void> notify() override { return r_->notify(); }

 private:
  std::shared_ptr<Ring> r_;
};

// A request as the test wants to check its answer: the vCPU, the reason, the flags (Xen's
// encoding with the Xen ring), and whether the ring accepts it at all.
struct Pushed {
  std::uint32_t vcpu, reason, flags;
  bool valid;  // the back ring hands it to the channel (or answers it itself)
  bool paused;
  std::uint64_t rip;
  hv::VcpuRegs regs;
};

struct Harness;

struct Sink final : channel::StopSink {
  Harness* h = nullptr;
  std::set<std::uint64_t> owned;
  bool owns_trap(DomId, Gva a) const override { return owned.contains(a.value); }
  channel::Verdict on_stop(channel::Stop& s) override;
  void on_channel_failure(DomId, const Error& e) override {
    FUZZ_CHECK(fuzz::printable(e.what));
    ++failures;
  }
  unsigned stops = 0, failures = 0;
};

struct Harness {
  Input in;
  FakeHv hv;
  std::unique_ptr<VmEventChannel> ch;
  std::shared_ptr<Ring> ring;
  VmEventChannel::Mode mode = VmEventChannel::Mode::Icebp;
  Sink sink;
  std::unique_ptr<guardian::Journal> journal;
  bool attached = false;
  unsigned vcpus = 1;
  std::vector<Pushed> pushed;   // on the current ring, in order
  std::uint32_t checked = 0;    // answers already checked
  std::size_t next_answer = 0;  // index into pushed of the next request to be answered
  bool ring_broken = false;     // a bad producer index: nothing is consumed any more
  std::vector<std::pair<std::uint64_t, std::array<std::uint8_t, 16>>> emulations;  // asked by handlers
  std::optional<hv::VcpuRegs> last_set_regs;
  unsigned last_set_vcpu = 0;
  std::optional<Pushed> current;  // the request being handed to the sink

  explicit Harness(const std::uint8_t* d, std::size_t n) : in(d, n) { sink.h = this; }

  std::uint8_t trap_byte() const { return mode == VmEventChannel::Mode::Int3 ? 0xcc : 0xf1; }
  std::uint64_t pick_rip() {
    switch (in.u8() % 4) {
      case 0: return in.u64();
      case 1:
        if (!sink.owned.empty()) return *sink.owned.begin();
        [[fallthrough]];
      default: return kText + (in.u8() % 16) * 0x10;
    }
  }

  void push_request() {
    Pushed p{};
    p.vcpu = static_cast<std::uint32_t>(in.range(0, vcpus));
    const std::uint8_t kind = in.u8();
    p.paused = kind % 8 != 0;
    p.rip = pick_rip();
    p.regs.rip = p.rip;
    p.regs.rax = in.u64();
    p.regs.rflags = 0x246;
#if XP_FUZZ_XEN_RING
    vm_event_request_t q{};
    if (kind == 0xff) {
      auto raw = in.bytes(sizeof q);
      std::memcpy(&q, raw.data(), raw.size());
    } else {
      q.version = kind == 0xfe ? in.u32() : VM_EVENT_INTERFACE_VERSION;
      q.vcpu_id = p.vcpu;
      q.flags = (p.paused ? VM_EVENT_FLAG_VCPU_PAUSED : 0) | (kind & 0x40 ? in.u32() & ~1u : 0);
      const std::uint32_t reasons[] = {
          VM_EVENT_REASON_SOFTWARE_BREAKPOINT, VM_EVENT_REASON_DEBUG_EXCEPTION, VM_EVENT_REASON_DEBUG_EXCEPTION,
          VM_EVENT_REASON_SINGLESTEP,          VM_EVENT_REASON_CPUID,           VM_EVENT_REASON_MEM_ACCESS};
      q.reason = kind & 0x20 ? in.u32() : in.pick(reasons);
      auto& dbg = q.reason == VM_EVENT_REASON_DEBUG_EXCEPTION ? q.u.debug_exception : q.u.software_breakpoint;
      const std::uint64_t gfns[] = {kGfn, ~0ull, 0x123456};
      dbg.gfn = in.pick(gfns);
      const std::uint8_t types[] = {6, 5, 3, 4};
      dbg.type = in.pick(types);
      dbg.insn_length = static_cast<std::uint32_t>(in.range(0, 16));
      q.data.regs.x86.rip = p.rip;
      q.data.regs.x86.rax = p.regs.rax;
      q.data.regs.x86.rflags = p.regs.rflags;
    }
    p.vcpu = q.vcpu_id;
    p.reason = q.reason;
    p.flags = q.flags;
    p.paused = q.flags & VM_EVENT_FLAG_VCPU_PAUSED;
    p.rip = q.data.regs.x86.rip;
    const bool dbg = q.reason == VM_EVENT_REASON_SOFTWARE_BREAKPOINT || q.reason == VM_EVENT_REASON_DEBUG_EXCEPTION;
    const std::uint32_t len = q.reason == VM_EVENT_REASON_DEBUG_EXCEPTION ? q.u.debug_exception.insn_length
                                                                          : q.u.software_breakpoint.insn_length;
    p.valid = q.version == VM_EVENT_INTERFACE_VERSION && !(dbg && len > 15);
    if (ring->in_flight() >= 8 && !(kind & 0x10)) return;  // Xen waits for room
    ring->push(q);
    if (ring->in_flight() > 8) ring_broken = true;
#else
    hv::VmEventRequest q;
    q.vcpu = p.vcpu;
    q.flags = p.paused ? hv::kVmEventFlagVcpuPaused : 0;
    const hv::VmEventReason reasons[] = {hv::VmEventReason::SoftwareBreakpoint, hv::VmEventReason::DebugException,
                                         hv::VmEventReason::Singlestep, static_cast<hv::VmEventReason>(in.u8())};
    q.reason = in.pick(reasons);
    q.regs = p.regs;
    const std::uint64_t gfns[] = {kGfn, ~0ull, 0x123456};
    q.gfn = in.pick(gfns);
    const std::uint8_t types[] = {6, 5, 3, 4};
    q.type = in.pick(types);
    q.insn_length = static_cast<std::uint8_t>(in.range(0, 15));
    p.reason = static_cast<std::uint32_t>(q.reason);
    p.flags = q.flags;
    p.valid = true;
    ring->push(q);
#endif
    pushed.push_back(p);
  }

  // The answers since the last look pair up with the valid requests, in order.
  void check_answers() {
    if (!ring) return;
    const auto answers = ring->answers_from(checked);
    if (ring_broken) {  // Xen wrote a producer index of its own: the slots hold anything
      checked += static_cast<std::uint32_t>(answers.size());
      return;
    }
    for (const Answer& a : answers) {
      while (next_answer < pushed.size() && !pushed[next_answer].valid) ++next_answer;
      FUZZ_CHECK(next_answer < pushed.size(), "an answer without a request");
      const Pushed& p = pushed[next_answer++];
      FUZZ_TRACE("answer vcpu %u reason %u flags %x for pushed #%zu vcpu %u reason %u", a.vcpu, a.reason, a.flags,
                 next_answer - 1, p.vcpu, p.reason);
      FUZZ_CHECK(a.vcpu == p.vcpu,
                 "answer for vCPU " + std::to_string(a.vcpu) + ", request of " + std::to_string(p.vcpu));
      FUZZ_CHECK(a.reason == p.reason, "an answer with another reason");
#if XP_FUZZ_XEN_RING
      const std::uint32_t kPaused = VM_EVENT_FLAG_VCPU_PAUSED, kEmulate = VM_EVENT_FLAG_EMULATE,
                          kSetRegs = VM_EVENT_FLAG_SET_REGISTERS, kInsn = VM_EVENT_FLAG_SET_EMUL_INSN_DATA;
      const bool sw_bp = p.reason == VM_EVENT_REASON_SOFTWARE_BREAKPOINT;
#else
      const std::uint32_t kPaused = hv::kVmEventFlagVcpuPaused, kEmulate = hv::kVmEventFlagEmulate,
                          kSetRegs = hv::kVmEventFlagSetRegisters, kInsn = hv::kVmEventFlagSetEmulInsnData;
      const bool sw_bp = p.reason == static_cast<std::uint32_t>(hv::VmEventReason::SoftwareBreakpoint);
#endif
      FUZZ_CHECK((a.flags & kPaused) == (p.flags & kPaused), "VCPU_PAUSED not echoed");
      FUZZ_CHECK(!((a.flags & kSetRegs) && (a.flags & kInsn)), "registers and instruction bytes in one answer");
      if (!p.paused) FUZZ_CHECK((a.flags & ~kPaused) == 0, "an answer that changes a vCPU not paused");
      if (a.flags & kEmulate) {
        FUZZ_CHECK(mode == VmEventChannel::Mode::Int3 && sw_bp && (a.flags & kInsn), "EMULATE where Xen cannot");
        const bool asked = std::any_of(emulations.begin(), emulations.end(),
                                       [&](const auto& e) { return e.first == p.rip && e.second == a.insn; });
        FUZZ_CHECK(asked, "emulated bytes no handler asked for at " + fuzz::hexs(p.rip));
      }
      if (a.flags & kSetRegs) {
        last_set_regs = a.regs;
        last_set_vcpu = a.vcpu;
      }
    }
    checked += static_cast<std::uint32_t>(answers.size());
  }

  void run_stops(bool flush) {
    const unsigned before = sink.stops;
    auto r = flush ? ch->flush(kDom, sink) : ch->process(sink);
    FUZZ_TRACE("%s: %s, %u stops", flush ? "flush" : "process", r ? "ok" : r.error().what.c_str(), sink.stops - before);
    if (!r) FUZZ_CHECK(r.error().code == Errc::Io || r.error().code == Errc::InvalidArgument, r.error().what);
    FUZZ_CHECK(ch->counters().stops == sink.stops);
    check_answers();
  }

  void detach() {
    if (ring) ring->full = false;  // else detach retries for 200 ms, then keeps the domain
    auto r = ch->detach(kDom);
    FUZZ_TRACE("detach: %s", r ? "ok" : r.error().what.c_str());
    check_answers();
    if (!r) {
      FUZZ_CHECK(ring_broken || r.error().code == Errc::Io, r.error().what);
      return;
    }
    FUZZ_CHECK(hv.pause_count[kDom.value] == 0, "detach left the domain paused");
    if (journal) {
      auto snap = guardian::read_journal(journal->bytes());
      FUZZ_CHECK(snap.has_value());
      for (const auto& d : snap->domains) FUZZ_CHECK(d.held_pauses == 0, "the journal still holds a pause");
    }
    if (!ring_broken) {
      const auto valid = static_cast<std::size_t>(
          std::count_if(pushed.begin(), pushed.end(), [](const Pushed& p) { return p.valid; }));
      FUZZ_CHECK(
          ring->answered() == valid || ring->full,
          "detach left a request unanswered: " + std::to_string(ring->answered()) + " of " + std::to_string(valid));
    }
    attached = false;
    ring = nullptr;
  }

  void attach() {
    auto r = ch->attach(kDom);
    FUZZ_TRACE("attach: %s", r ? "ok" : r.error().what.c_str());
    if (!r) {
      FUZZ_CHECK(r.error().code == Errc::NotSupported || r.error().code == Errc::Busy, r.error().what);
      return;
    }
    if (!attached) {
      pushed.clear();
      checked = 0;
      next_answer = 0;
      ring_broken = false;
    }
    attached = true;
  }

  void run() {
    const std::uint8_t b0 = in.u8();
    mode = (b0 & 1) ? VmEventChannel::Mode::Int3 : VmEventChannel::Mode::Icebp;
    vcpus = 1 + (b0 >> 1) % 4;
    hv::DomainInfo& info = hv.add_domain(kDom, (b0 & 0x30) == 0x30 ? hv::GuestType::Pv : hv::GuestType::Hvm, vcpus);
    info.debugged = (b0 & 0xc0) == 0xc0;
    hv.caps.vm_event = true;
    hv.add_region(kGfn, 1, 0xcc);
    if (b0 & 0x08) hv.inject_fails = Errc::Busy;
    hv.ring_factory = [this](DomId) -> Result<std::unique_ptr<hv::VmEventRing>> {
      ring = std::make_shared<Ring>();
      return std::unique_ptr<hv::VmEventRing>(std::make_unique<RingHandle>(ring));
    };
    auto c = VmEventChannel::open(hv, mode);
    FUZZ_CHECK(c.has_value());
    ch = std::move(*c);
    if (b0 & 0x04) {
      journal = std::move(*guardian::Journal::create({.domains = 2, .patches = 2, .returns = 2}));
      FUZZ_CHECK(journal->add_domain(kDom, hv::DomainHandle{}, guardian::JournalChannel::VmEvent, trap_byte(),
                                     guardian::JournalMonitor::None, vcpus));
      ch->set_journal(journal.get());
    }
    attach();

    for (unsigned ops = 0; ops < 128 && !in.empty(); ++ops) {
      const std::uint8_t op = in.u8() % 12;
      if (!attached && op != 10) continue;
      switch (op) {
        case 0:
        case 1:
        case 2: push_request(); break;
        case 3:
        case 4: run_stops(false); break;
        case 5: run_stops(true); break;
        case 6: {  // the vCPU sent back onto its int3 with the registers it was given traps again
          if (!last_set_regs) break;
#if XP_FUZZ_XEN_RING
          vm_event_request_t q{};
          q.version = VM_EVENT_INTERFACE_VERSION;
          q.vcpu_id = last_set_vcpu;
          q.flags = VM_EVENT_FLAG_VCPU_PAUSED;
          q.reason = VM_EVENT_REASON_SOFTWARE_BREAKPOINT;
          q.u.software_breakpoint.gfn = kGfn;
          q.u.software_breakpoint.type = 6;
          q.u.software_breakpoint.insn_length = 1;
          q.data.regs.x86.rip = last_set_regs->rip;
          q.data.regs.x86.rax = last_set_regs->rax;
          q.data.regs.x86.rbx = last_set_regs->rbx;
          q.data.regs.x86.rflags = last_set_regs->rflags;
          if (ring->in_flight() >= 8) break;
          ring->push(q);
          pushed.push_back(Pushed{q.vcpu_id, q.reason, q.flags, true, true, q.data.regs.x86.rip, *last_set_regs});
#endif
          break;
        }
        case 7: {  // the guest (or the engine restoring a probe) changes the byte at a trap
          const std::uint8_t vals[] = {0xcc, 0xf1, 0x55, in.u8()};
          hv.frame_ptr(kGfn)[(kText + (in.u8() % 16) * 0x10) & (kPageSize - 1)] = std::byte{in.pick(vals)};
          break;
        }
        case 8:
          if (in.flag()) sink.owned.insert(pick_rip());
          else if (!sink.owned.empty()) sink.owned.erase(sink.owned.begin());
          break;
        case 9: {
          const std::uint64_t a = pick_rip();
          ch->trap_forgotten(kDom, Gva{a});
          sink.owned.erase(a);
          break;
        }
        case 10:
          if (attached) detach();
          else attach();
          break;
        case 11:
          if (ring) ring->full = in.flag();
#if XP_FUZZ_XEN_RING
          if (ring && in.u8() == 0xff) {  // a hostile producer index
            ring->set_req_prod(in.u32());
            ring_broken = true;
          }
#endif
          (void)ch->poll_interval_ms();
          break;
      }
    }
    if (attached && ring) ring->full = false;
    if (attached) detach();
    ch.reset();
    FUZZ_CHECK(hv.pause_count[kDom.value] == 0, "a pause outlived the channel");
  }
};

channel::Verdict Sink::on_stop(channel::Stop& s) {
  ++stops;
  FUZZ_CHECK(s.domain == kDom && owned.contains(s.trap.value), "a stop on a trap the engine does not own");
  FUZZ_CHECK(s.regs.rip == s.trap.value, "a stop whose rip is not the trap");
  Input& in = h->in;
  switch (in.u8() % 6) {
    case 0: return channel::Verdict::NotOurs;
    case 1: s.regs.rip = s.trap.value + 1 + in.u8() % 15; return channel::Verdict::Resume;
    default: {  // an agentless resume: emulate the original instruction, maybe with edited registers
      channel::Stop::Emulate e;
      e.len = static_cast<std::uint8_t>(in.range(0, 16));
      auto b = in.bytes(std::min<std::size_t>(e.len, 16));
      std::memcpy(e.bytes.data(), b.data(), b.size());
      s.emulate = e;
      if (in.flag()) s.regs.rbx = in.u64();
      if (in.u8() % 8 == 0) s.regs.rip = in.u64();
      std::array<std::uint8_t, 16> padded;
      padded.fill(0x90);
      std::copy_n(e.bytes.begin(), std::min<std::size_t>(e.len, 16), padded.begin());
      h->emulations.emplace_back(s.trap.value, padded);
      return channel::Verdict::Resume;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 4096) return 0;
  Harness h(data, size);
  h.run();
  return 0;
}
