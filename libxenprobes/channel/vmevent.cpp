#include "common/hex.hpp"
#include "channel/vmevent.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "channel/eligibility.hpp"
#include "common/log.hpp"

namespace xenprobes::channel {
namespace {

// X86_EVENTTYPE_* as Xen reports them in a request and takes them in inject_event
// (xen/include/public/hvm/dm_op.h: XEN_DMOP_EVENT_*).
constexpr std::uint8_t kHwException = 3;      // #DB from a single step or a hardware breakpoint
constexpr std::uint8_t kPrivSwException = 5;  // ICEBP (0xF1)
constexpr std::uint8_t kSwException = 6;      // INT3 (0xCC)
constexpr std::uint32_t kNoErrorCode = ~0u;   // X86_EVENT_NO_EC
constexpr std::uint8_t kVectorDebug = 1, kVectorBreakpoint = 3;
constexpr std::uint64_t kRflagsRf = 1ull << 16;
// detach: rounds of "answer everything, try to disable" while vCPUs wait for ring room.
constexpr int kDetachAttempts = 200;
// Pending second halves of two-step emulations kept per vCPU (see Continuation): one, plus
// room for stops taken in interrupt context before the vCPU got back to its int3.
constexpr std::size_t kContinuationsPerVcpu = 4;

std::string dom_str(DomId d) { return "domain " + std::to_string(d.value); }

// What SET_REGISTERS writes (xen/arch/x86/hvm/vm_event.c:29-60): the GPRs, rflags, rip.
// RF is left out: it says nothing about where the vCPU is.
bool same_gprs(const hv::VcpuRegs& a, const hv::VcpuRegs& b) {
  return a.rax == b.rax && a.rbx == b.rbx && a.rcx == b.rcx && a.rdx == b.rdx && a.rsi == b.rsi && a.rdi == b.rdi &&
         a.rbp == b.rbp && a.rsp == b.rsp && a.r8 == b.r8 && a.r9 == b.r9 && a.r10 == b.r10 && a.r11 == b.r11 &&
         a.r12 == b.r12 && a.r13 == b.r13 && a.r14 == b.r14 && a.r15 == b.r15 && a.rip == b.rip &&
         ((a.rflags ^ b.rflags) & ~kRflagsRf) == 0;
}

bool gone(const Result<void>& r) { return !r && r.error().code == Errc::NoSuchDomain; }

}  // namespace

Result<std::unique_ptr<VmEventChannel>> VmEventChannel::open(hv::Hypervisor& hv, Mode mode) {
  XP_TRY(vmevent_host_eligible(XP_TRY(hv.capabilities())));
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return fail_errno(errno, "epoll_create1");
  return std::unique_ptr<VmEventChannel>(new VmEventChannel(hv, mode, ep));
}

VmEventChannel::~VmEventChannel() {
  while (!domains_.empty()) {
    DomId dom = domains_.begin()->first;
    if (auto r = detach(dom); !r) {
      XP_LOG(Error, "%s: vm_event detach failed: %s", dom_str(dom).c_str(), r.error().what.c_str());
      unwatch_fd(domains_.begin()->second.fd);
      domains_.erase(domains_.begin());
    }
  }
  ::close(epoll_fd_);
}

Result<void> VmEventChannel::watch_fd(int fd) {
  if (fd < 0) return fail(Errc::Io, "the vm_event ring has no file descriptor to poll");
  if (fd_refs_[fd]++ > 0) return {};
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) < 0) {
    int e = errno;
    fd_refs_.erase(fd);
    return fail_errno(e, "epoll_ctl(ADD) for a vm_event ring");
  }
  return {};
}

void VmEventChannel::unwatch_fd(int fd) {
  auto it = fd_refs_.find(fd);
  if (it == fd_refs_.end() || --it->second > 0) return;
  fd_refs_.erase(it);
  (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

Result<void> VmEventChannel::set_monitoring(DomId dom, bool on) {
  if (mode_ == Mode::Int3) return hv_.monitor_software_breakpoint(dom, on);
  // Synchronous: an asynchronous debug-exception event is sent after Xen has already given
  // the #DB to the guest (monitor_traps returns 0, vmx.c:4296-4297 propagates it).
  return hv_.monitor_debug_exceptions(dom, on, /*sync=*/true);
}

Result<void> VmEventChannel::attach(DomId dom) {
  if (domains_.contains(dom)) return {};
  hv::DomainInfo info = XP_TRY(hv_.domain_info(dom));
  XP_TRY(vmevent_domain_eligible(info));
  auto ring = hv_.monitor_enable(dom);
  if (!ring) {
    if (ring.error().code == Errc::Busy)
      return fail(Errc::Busy, dom_str(dom) +
                                  " already has a vm_event monitor (Xen allows one per domain: "
                                  "xen-access, DRAKVUF, LibVMI or another xenprobes program): "
                                  "stop that one, or use the guest channel");
    return std::unexpected(ring.error());
  }
  Attached a;
  a.ring = std::move(*ring);
  a.fd = a.ring->fd();
  if (auto w = watch_fd(a.fd); !w) {
    best_effort(hv_.monitor_disable(dom), "vmevent channel: undoing monitor_enable", log::Level::Warn);
    return w;
  }
  if (auto m = set_monitoring(dom, true); !m) {
    unwatch_fd(a.fd);
    best_effort(hv_.monitor_disable(dom), "vmevent channel: undoing monitor_enable", log::Level::Warn);
    return m;
  }
  domains_.emplace(dom, std::move(a));
  return {};
}

Result<void> VmEventChannel::detach(DomId dom) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return {};
  Attached& a = it->second;
  // No new stops from here on: a guest int3 or ICEBP now goes to the guest directly, so the
  // requests answered below can simply re-execute what is at their address (the engine has
  // restored our bytes before detaching).
  if (auto off = set_monitoring(dom, false); !off && !gone(off))
    XP_LOG(Warn, "%s: cannot stop vm_event monitoring: %s", dom_str(dom).c_str(), off.error().what.c_str());
  // Xen's vm_event_disable leaves every vCPU paused by an unanswered request paused for good
  // (it unblocks only vCPUs it paused for ring room, xen/common/vm_event.c:203-211), and fails
  // with EBUSY while a vCPU waits for room (:194-198). So: with the domain paused (nothing
  // else can post), answer everything, then disable; on EBUSY let the waiting vCPUs post
  // their requests and go again.
  Result<void> result;
  bool done = false;
  for (int attempt = 0; attempt < kDetachAttempts && !done; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (journal_) journal_->add_held_pause(dom);  // before: a kill right after leaves it to the guardian
    auto paused = hv_.pause(dom);
    if (!paused && journal_) journal_->drop_held_pause(dom);
    if (gone(paused)) {
      done = true;
      break;
    }
    auto n = drain(dom, a, nullptr, /*until_quiet=*/true);
    Result<void> dis;
    if (!n) dis = std::unexpected(n.error());
    else if (!a.outbox.empty())
      dis = fail(Errc::Busy,
                 dom_str(dom) + ": " + std::to_string(a.outbox.size()) + " vm_event answers found no room in the ring");
    else dis = hv_.monitor_disable(dom);
    if (paused && hv_.unpause(dom) && journal_) journal_->drop_held_pause(dom);
    if (dis || gone(dis)) {
      done = true;
    } else if (dis.error().code != Errc::Busy) {
      result = dis;
      break;
    } else {
      result = dis;
    }
  }
  if (!done) {
    // Keep the domain: its paused vCPUs are still answered by process() and a later detach.
    XP_LOG(Error, "%s: vm_event monitor not detached: %s", dom_str(dom).c_str(), result.error().what.c_str());
    return result;
  }
  unwatch_fd(a.fd);
  domains_.erase(it);
  return {};
}

void VmEventChannel::abandon() {
  for (auto& [dom, a] : domains_) unwatch_fd(a.fd);
  domains_.clear();  // the rings go unanswered and stay enabled, as after a kill
}

int VmEventChannel::poll_interval_ms() const {
  for (const auto& [dom, a] : domains_)
    if (!a.outbox.empty() || a.notify_owed) return 1;
  return 0;
}

Result<unsigned> VmEventChannel::process(StopSink& sink) {
  unsigned handled = 0;
  Result<void> status;  // the first failure; the other domains are still served
  for (auto it = domains_.begin(); it != domains_.end();) {
    const DomId dom = it->first;
    auto n = process_domain(dom, sink);
    if (n) handled += *n;
    else if (status) status = std::unexpected(n.error());
    it = domains_.upper_bound(dom);
  }
  if (!status) return std::unexpected(status.error());
  return handled;
}

Result<unsigned> VmEventChannel::process_domain(DomId dom, StopSink& sink) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return 0u;
  auto n = drain(dom, it->second, &sink, /*until_quiet=*/false);
  if (!n && n.error().code == Errc::NoSuchDomain) {  // died under us: nothing left to resume
    if (auto gone = domains_.find(dom); gone != domains_.end()) {
      unwatch_fd(gone->second.fd);
      domains_.erase(gone);
    }
    return 0u;
  }
  return n;
}

Result<unsigned> VmEventChannel::flush(DomId dom, StopSink& sink) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return 0u;
  auto n = drain(dom, it->second, &sink, /*until_quiet=*/true);
  if (!n && n.error().code == Errc::NoSuchDomain) {
    unwatch_fd(it->second.fd);
    domains_.erase(it);
    return 0u;
  }
  return n;
}

void VmEventChannel::trap_forgotten(DomId dom, Gva addr) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return;
  // A vCPU sent back onto that trap with edited registers now runs the original instruction
  // on its own: its pending emulation must not be applied to a later, unrelated stop.
  for (auto c = it->second.continuations.begin(); c != it->second.continuations.end();) {
    std::erase_if(c->second, [&](const Continuation& k) { return k.trap == addr; });
    c = c->second.empty() ? it->second.continuations.erase(c) : std::next(c);
  }
}

Result<unsigned> VmEventChannel::drain(DomId dom, Attached& a, StopSink* sink, bool until_quiet) {
  unsigned n = 0;
  bool rechecked = false;
  Result<void> r = send_outbox(a);
  while (r && a.outbox.empty()) {
    auto req = a.ring->get_request();
    if (!req) {
      r = std::unexpected(req.error());
      break;
    }
    if (!*req) {
      if (!a.notify_owed || (rechecked && !until_quiet)) break;
      // Xen consumes the answers on the notify; vCPUs that waited for room in the ring post
      // their requests then. One more look (or, paused, until nothing more comes).
      r = notify(a);
      rechecked = true;
      continue;
    }
    hv::VmEventResponse rsp = answer(dom, a, **req, sink);
    ++n;
    r = post(a, rsp);
  }
  // Whatever went wrong, the answers already in the ring are delivered.
  auto sent = notify(a);
  if (!r) return std::unexpected(r.error());
  if (!sent) return std::unexpected(sent.error());
  return n;
}

// Where the trap is (Xen source lines: tag RELEASE-4.17.7). Xen reports RIP at the trapping
// instruction itself for both kinds of stop this channel uses, and leaves it there (both
// exits are taken before the instruction completes; Xen injects nothing when a synchronous
// monitor took the event):
//  - int3 (software breakpoint): VMX `case TRAP_int3` passes regs->rip to hvm_monitor_debug
//    without update_guest_eip (xen/arch/x86/hvm/vmx/vmx.c:4302-4318); SVM
//    VMEXIT_EXCEPTION_BP likewise ("INT3 ... intercepts do not update RIP",
//    xen/arch/x86/hvm/svm/svm.c:2801-2827), only the debugger path advances it;
//  - ICEBP (debug exception of type 5, privileged software exception): VMX `case
//    TRAP_debug` (vmx.c:4235-4297, insn_len read for type >= SW_INTERRUPT) and SVM
//    VMEXIT_ICEBP (svm.c:2768-2799) pass regs->rip of the ICEBP itself;
//  - monitor_traps returns 1 for a synchronous event (xen/common/monitor.c:86-125), so neither
//    vmx_propagate_intr nor hvm_inject_exception runs: the trap does not happen in the guest.
// A hardware #DB (type 3: the guest's own single step, hardware breakpoint) is trap-like: RIP
// is already past the instruction, and it is never ours.
hv::VmEventResponse VmEventChannel::answer(DomId dom, Attached& a, const hv::VmEventRequest& req, StopSink* sink) {
  hv::VmEventResponse rsp;
  rsp.vcpu = req.vcpu;
  rsp.reason = req.reason;
  // Echoing VCPU_PAUSED unpauses the vCPU (xen/common/vm_event.c:446-447); every request gets an
  // answer, or its ring slot is never given back.
  rsp.flags = req.flags & hv::kVmEventFlagVcpuPaused;
  if (!(req.flags & hv::kVmEventFlagVcpuPaused)) {
    XP_LOG_RATELIMITED(Warn, "%s vcpu %u: vm_event request without a paused vCPU (reason %u): nothing to resume",
                       dom_str(dom).c_str(), req.vcpu, static_cast<unsigned>(req.reason));
    return rsp;
  }
  std::uint8_t opcode = 0;
  if (req.reason == hv::VmEventReason::SoftwareBreakpoint) {
    opcode = kInt3;
  } else if (req.reason == hv::VmEventReason::DebugException && req.type == kPrivSwException) {
    opcode = kIcebp;
  } else if (req.reason == hv::VmEventReason::DebugException) {
    // The guest's own #DB: hand it back as it would have seen it (no instruction length).
    if (auto r = hv_.inject_event(dom, VcpuId{req.vcpu}, kVectorDebug, kHwException, kNoErrorCode, 0); r)
      ++counters_.injected;
    else
      XP_LOG_RATELIMITED(Error, "%s vcpu %u: cannot hand its #DB back: %s", dom_str(dom).c_str(), req.vcpu,
                         r.error().what.c_str());
    return rsp;
  } else {
    XP_LOG_RATELIMITED(Warn, "%s vcpu %u: unexpected vm_event reason %u: resumed unchanged", dom_str(dom).c_str(),
                       req.vcpu, static_cast<unsigned>(req.reason));
    return rsp;
  }
  const Gva trap{req.regs.rip};
  if (opcode != traits().trap_byte) {  // e.g. a guest int3 while our traps are ICEBPs: never ours
    hand_back(dom, req, opcode);
    return rsp;
  }
  if (!sink) return rsp;  // detaching: monitoring is off, whatever is at `trap` runs

  // The second half of an agentless resume whose registers were set first: the same vCPU
  // back on the same int3 with exactly the registers it was sent there with.
  if (auto c = a.continuations.find(req.vcpu); c != a.continuations.end()) {
    auto& pending = c->second;
    auto m = std::find_if(pending.begin(), pending.end(),
                          [&](const Continuation& k) { return k.trap == trap && same_gprs(k.regs, req.regs); });
    if (m != pending.end()) {
      std::array<std::uint8_t, 16> bytes = m->bytes;
      pending.erase(m);
      if (pending.empty()) a.continuations.erase(c);
      if (sink->owns_trap(dom, trap)) {
        rsp.flags |= hv::kVmEventFlagEmulate | hv::kVmEventFlagSetEmulInsnData;
        std::copy(bytes.begin(), bytes.end(), rsp.emul_insn);
        ++counters_.emulated;
        return rsp;
      }
    }
  }
  if (!sink->owns_trap(dom, trap)) {
    hand_back(dom, req, opcode);
    return rsp;
  }
  Stop s{dom, VcpuId{req.vcpu}, trap, req.regs};
  ++counters_.stops;
  if (sink->on_stop(s) == Verdict::NotOurs) return rsp;  // the original byte is back: re-execute it
  if (s.emulate && s.regs.rip == trap.value) {
    const Stop::Emulate& e = *s.emulate;
    if (mode_ != Mode::Int3 || e.len == 0 || e.len > 15) {
      // Xen emulates supplied bytes only in answer to a software breakpoint
      // (xen/arch/x86/vm_event.c:285-291); after an ICEBP the vCPU would just trap again.
      Error err{Errc::NotSupported,
                dom_str(dom) + ": the vmevent channel cannot emulate the instruction at " + hex(trap.value) +
                    (mode_ != Mode::Int3 ? " (Xen emulates only in answer to an int3: open the channel in int3 mode)"
                                         : " (instruction length " + std::to_string(e.len) + ")")};
      XP_LOG(Error, "%s", err.what.c_str());
      sink->on_channel_failure(dom, err);  // every byte restored: the vCPU re-executes the original
      return rsp;
    }
    std::array<std::uint8_t, 16> bytes;
    bytes.fill(0x90);  // never fetched: Xen decodes exactly one instruction from the buffer
    std::copy_n(e.bytes.begin(), e.len, bytes.begin());
    if (same_gprs(s.regs, req.regs)) {
      rsp.flags |= hv::kVmEventFlagEmulate | hv::kVmEventFlagSetEmulInsnData;
      std::copy(bytes.begin(), bytes.end(), rsp.emul_insn);
      ++counters_.emulated;
      return rsp;
    }
    // The handler changed registers, and the response holds either registers or instruction
    // bytes (a union, xen/include/public/vm_event.h:417-427). Set the registers now with rip
    // on the int3; the vCPU traps there again at once and is answered with EMULATE then.
    rsp.flags |= hv::kVmEventFlagSetRegisters;
    rsp.regs = s.regs;
    auto& pending = a.continuations[req.vcpu];
    if (pending.size() >= kContinuationsPerVcpu) pending.erase(pending.begin());  // the oldest
    pending.push_back(Continuation{trap, s.regs, bytes});
    ++counters_.two_step;
    return rsp;
  }
  if (s.emulate)
    XP_LOG_RATELIMITED(Warn, "%s vcpu %u: emulation asked with rip moved from %s to %s: resumed at the new rip",
                       dom_str(dom).c_str(), req.vcpu, hex(trap.value).c_str(), hex(s.regs.rip).c_str());
  rsp.flags |= hv::kVmEventFlagSetRegisters;
  rsp.regs = s.regs;
  return rsp;
}

void VmEventChannel::hand_back(DomId dom, const hv::VmEventRequest& req, std::uint8_t opcode) {
  if (!byte_still_there(dom, req, opcode)) {
    // The trap byte was removed after the vCPU hit it (a probe disarmed while its stop waited
    // for room in the ring): re-executing is right, injecting would hand the guest a
    // breakpoint that is not its own (Linux kprobes does the same in kprobe_int3_handler).
    ++counters_.retried;
    return;
  }
  // As the guest would have taken it: #BP (type 6) or ICEBP's #DB (type 5), both delivered
  // with the instruction length so that the guest sees RIP after the instruction
  // (xendevicemodel_inject_event, as xen-access does for foreign int3s).
  const bool int3 = opcode == kInt3;
  std::uint8_t len = req.insn_length ? req.insn_length : 1;
  auto r = hv_.inject_event(dom, VcpuId{req.vcpu}, int3 ? kVectorBreakpoint : kVectorDebug,
                            int3 ? kSwException : kPrivSwException, kNoErrorCode, len);
  if (!r) {
    // Not injected (EBUSY: another event is pending on that vCPU): RIP still points at the
    // trap, so the vCPU executes it again and comes back.
    XP_LOG_RATELIMITED(Warn, "%s vcpu %u: cannot hand the guest its own %s at %s back (%s): it will retry",
                       dom_str(dom).c_str(), req.vcpu, int3 ? "int3" : "ICEBP", hex(req.regs.rip).c_str(),
                       r.error().what.c_str());
    return;
  }
  ++counters_.injected;
}

bool VmEventChannel::byte_still_there(DomId dom, const hv::VmEventRequest& req, std::uint8_t opcode) {
  // The request names the frame of RIP (gfn_of_rip, xen/arch/x86/hvm/monitor.c:174,200).
  if (req.gfn == ~0ull) return true;  // unknown: assume the guest's own
  const Frame f{req.gfn};
  auto m = hv_.map_frames(dom, std::span(&f, 1), hv::MapAccess::Read);
  if (!m) {
    XP_LOG_RATELIMITED(Warn, "%s: cannot read the trap at %s (%s): taken for the guest's own", dom_str(dom).c_str(),
                       hex(req.regs.rip).c_str(), m.error().what.c_str());
    return true;
  }
  return std::to_integer<std::uint8_t>(m->data()[req.regs.rip & (kPageSize - 1)]) == opcode;
}

Result<void> VmEventChannel::notify(Attached& a) {
  if (!a.notify_owed) return {};
  XP_TRY(a.ring->notify());
  a.notify_owed = false;
  return {};
}

Result<void> VmEventChannel::post(Attached& a, const hv::VmEventResponse& rsp) {
  if (!a.outbox.empty()) {  // keep the order: earlier answers go first
    a.outbox.push_back(rsp);
    ++counters_.deferred;
    return {};
  }
  auto p = a.ring->put_response(rsp);
  if (!p && p.error().code == Errc::NoSpace && a.notify_owed) {
    // No room: Xen takes the answers already in the ring on the notify, then one more try.
    if (auto n = notify(a); n) p = a.ring->put_response(rsp);
  }
  if (p) {
    a.notify_owed = true;
    return {};
  }
  // Kept, never dropped: the vCPU stays paused until the answer gets in (next round).
  a.outbox.push_back(rsp);
  ++counters_.deferred;
  if (p.error().code == Errc::NoSpace) return {};
  return std::unexpected(p.error());
}

Result<void> VmEventChannel::send_outbox(Attached& a) {
  while (!a.outbox.empty()) {
    auto p = a.ring->put_response(a.outbox.front());
    if (!p && p.error().code == Errc::NoSpace && a.notify_owed) {
      XP_TRY(notify(a));
      p = a.ring->put_response(a.outbox.front());
    }
    if (!p) return p.error().code == Errc::NoSpace ? Result<void>{} : std::unexpected(p.error());
    a.outbox.pop_front();
    a.notify_owed = true;
  }
  return {};
}

}  // namespace xenprobes::channel
