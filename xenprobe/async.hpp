// --method async (docs/xenprobe.md "Async probes"): a kprobe block runs in Dom0 from the record
// the guest module wrote at the hit (registers, the guest's clock, captures) instead of while the
// vCPU waits. Which blocks can, and what they capture, is decided here before anything is
// attached; RecordContext then serves a block's values from a record through the same
// xenprobes::HitContext interface the synchronous path uses, so one evaluator runs both.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compile.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobe {

// A record holds at most this many captures (protocol.h XENPROBES_RING_CAPS_MAX).
inline constexpr std::size_t kMaxAsyncCaptures = 8;

// What one block's async probes capture at every hit: str(argN + c) is a String capture of
// str()'s size (NUL included) at that register + c; a single load from argN + c (a field or an
// element through a cast of argN) is a Bytes capture of the load's size.
struct AsyncPlan {
  bool async = false;  // a block with a kprobe
  std::vector<xenprobes::Capture> captures;
};

// One plan per block of `c` (the kprobe blocks' async, the others not). Throws ProgramError at
// the first expression of a kprobe block that a record cannot give (comm, pid, tid, kstack, a
// read through an address that is not argN + constant, too many captures), saying what to use
// instead.
std::vector<AsyncPlan> plan_async(Compiled& c);

// One record as a hit: regs() are the record's, vcpu() its vCPU, read() and read_string() give
// exactly the captured bytes at the captured addresses (anything else fails: a read error, as an
// unreadable address is on the synchronous path); write() and kernel_gs_base() fail, stop()
// only takes note (the guest is long gone).
class RecordContext final : public xenprobes::HitContext {
 public:
  RecordContext(const xenprobes::AsyncHit& hit, std::span<const xenprobes::Capture> caps);

  xenprobes::DomId domain() const override { return hit_.domain; }
  xenprobes::VcpuId vcpu() const override { return hit_.vcpu; }
  xenprobes::Gva address() const override { return hit_.address; }
  xenprobes::Regs& regs() override { return regs_; }
  xenprobes::Result<void> read(xenprobes::Gva va, std::span<std::byte> out) override;
  xenprobes::Result<void> write(xenprobes::Gva va, std::span<const std::byte> data) override;
  xenprobes::Result<std::uint64_t> read_u64(xenprobes::Gva va) override;
  xenprobes::Result<std::string> read_string(xenprobes::Gva va, std::size_t max_len) override;
  xenprobes::Result<std::uint64_t> kernel_gs_base() override;
  void stop() override { stopped_ = true; }
  bool stopped() const { return stopped_; }

 private:
  // The captured value of kind `k` with `max` at `va`, or null.
  const xenprobes::CaptureValue* find(xenprobes::Capture::Kind k, std::uint64_t va, std::size_t max) const;

  const xenprobes::AsyncHit& hit_;
  std::span<const xenprobes::Capture> caps_;
  xenprobes::Regs regs_;
  bool stopped_ = false;
};

}  // namespace xenprobe
