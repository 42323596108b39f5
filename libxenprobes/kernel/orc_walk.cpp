// The stack walk over ORC tables (orc.hpp): one frame at a time, every stack word read through
// the caller's read function and checked before it is used.
#include <algorithm>
#include <array>
#include <optional>

#include "kernel/orc.hpp"

namespace xenprobes::kernel::orc {

const char* to_string(Stop s) {
  switch (s) {
    case Stop::EndOfStack: return "end of stack";
    case Stop::Depth: return "depth limit";
    case Stop::Undefined: return "undefined unwind entry";
    case Stop::NoText: return "address outside kernel text";
    case Stop::BadEntry: return "unusable unwind entry";
    case Stop::ReadFailed: return "stack unreadable";
    case Stop::BadStack: return "stack pointer outside the kernel's stacks";
    case Stop::Loop: return "stack pointer loop";
  }
  return "?";
}

void Unwinder::set_modules(std::vector<Table> mods, std::vector<Range> untabled) {
  mods_ = std::move(mods);
  std::erase_if(mods_, [](const Table& t) { return t.size() == 0; });
  untabled_ = std::move(untabled);
}

const Entry* Unwinder::find(std::uint64_t ip) const {
  if (const Entry* e = core_.find(ip)) return e;
  if (core_.covers(ip)) return nullptr;
  for (const Table& t : mods_)
    if (t.covers(ip)) return t.find(ip);
  return nullptr;
}

bool Unwinder::is_text(std::uint64_t ip) const {
  return core_.covers(ip) || std::any_of(mods_.begin(), mods_.end(), [&](const Table& t) { return t.covers(ip); }) ||
         std::any_of(untabled_.begin(), untabled_.end(), [&](const Range& r) { return r.contains(ip); });
}

namespace {

// struct pt_regs on x86-64 (arch/x86/include/asm/ptrace.h): byte offsets of what a walk reads.
constexpr std::uint64_t kPtR13 = 16, kPtBp = 32, kPtR10 = 56, kPtDx = 96, kPtDi = 112, kPtIp = 128, kPtCs = 136,
                        kPtSp = 152;
constexpr std::uint64_t kPtRegsSize = 168;

// Linux's own fallback for code with no entry: a frame-pointer frame.
constexpr Entry kFramePointer{16, -16, kRegBp, kRegPrevSp, Type::Call, false};

class Walker {
 public:
  Walker(const Unwinder& u, const ReadFn& read) : u_(u), read_(read) {}

  Walk run(const StartRegs& s, std::size_t max_frames) {
    max_frames = std::clamp<std::size_t>(max_frames, 1, kMaxFrames);
    if (s.user_mode || !u_.is_text(s.rip)) {
      w_.stop = s.user_mode ? Stop::EndOfStack : Stop::NoText;
      return std::move(w_);
    }
    start_ = s;
    ip_ = s.rip, sp_ = s.rsp, bp_ = s.rbp;
    regs_ = RegsAt::Start;
    w_.ips.push_back(ip_);
    for (;;) {
      if (w_.ips.size() >= max_frames) {
        w_.stop = Stop::Depth;
        break;
      }
      if (auto stop = step()) {
        w_.stop = *stop;
        break;
      }
      w_.ips.push_back(ip_);
    }
    return std::move(w_);
  }

 private:
  enum class RegsAt { None, Start, Memory };

  static bool stack_ok(std::uint64_t addr, std::uint64_t len) {
    return addr >= symbols::kKernelHalfStart && addr % 8 == 0 && addr <= UINT64_MAX - len;
  }

  // One stack word; nullopt sets why_.
  std::optional<std::uint64_t> word(std::uint64_t addr) {
    if (!stack_ok(addr, 8)) {
      why_ = Stop::BadStack;
      return std::nullopt;
    }
    std::array<std::byte, 8> b{};
    if (!read_(Gva{addr}, b)) {
      why_ = Stop::ReadFailed;
      return std::nullopt;
    }
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | std::to_integer<std::uint64_t>(b[static_cast<std::size_t>(i)]);
    return v;
  }

  // A register a pt_regs frame holds: the start registers, the last full pt_regs, or (after an
  // iret frame) the full one before it.
  std::optional<std::uint64_t> reg(std::uint64_t off) {
    auto from_start = [&]() -> std::optional<std::uint64_t> {
      switch (off) {
        case kPtR13: return start_.r13;
        case kPtBp: return start_.rbp;
        case kPtR10: return start_.r10;
        case kPtDx: return start_.rdx;
        case kPtDi: return start_.rdi;
        default: return std::nullopt;
      }
    };
    if (regs_ == RegsAt::Start) return from_start();
    if (regs_ == RegsAt::Memory) {
      if (full_) return word(regs_addr_ + off);
      if (prev_ == RegsAt::Start) return from_start();
      if (prev_ == RegsAt::Memory) return word(prev_addr_ + off);
    }
    return std::nullopt;
  }

  // One frame outwards; nullopt when it went (ip_ is the caller's address), else why not.
  std::optional<Stop> step() {
    const Entry* e = u_.find(signal_ ? ip_ : ip_ - 1);
    if (!e) {
      e = &kFramePointer;
      w_.fallback = true;
    } else if (e->type == Type::Undefined) {
      return Stop::Undefined;
    } else if (e->type == Type::EndOfStack) {
      return Stop::EndOfStack;
    }
    why_ = Stop::BadEntry;
    // The caller's stack pointer.
    std::optional<std::uint64_t> cfa;
    bool switched = false;  // a stack pointer taken from memory or a register: another stack may follow
    switch (e->sp_reg) {
      case kRegSp: cfa = sp_ + static_cast<std::uint64_t>(std::int64_t{e->sp_offset}); break;
      case kRegBp: cfa = bp_ + static_cast<std::uint64_t>(std::int64_t{e->sp_offset}); break;
      case kRegSpIndirect:
        cfa = word(sp_);
        if (cfa) *cfa += static_cast<std::uint64_t>(std::int64_t{e->sp_offset});
        switched = true;
        break;
      case kRegBpIndirect:
        cfa = word(bp_ + static_cast<std::uint64_t>(std::int64_t{e->sp_offset}));
        switched = true;
        break;
      case kRegR10: cfa = reg(kPtR10), switched = true; break;
      case kRegR13: cfa = reg(kPtR13), switched = true; break;
      case kRegDi: cfa = reg(kPtDi), switched = true; break;
      case kRegDx: cfa = reg(kPtDx), switched = true; break;
      default: return Stop::BadEntry;
    }
    if (!cfa) return why_;
    std::uint64_t ip = 0, sp = 0;
    switch (e->type) {
      case Type::Call: {
        if (*cfa < 8) return Stop::BadStack;
        auto ret = word(*cfa - 8);
        if (!ret) return why_;
        ip = *ret, sp = *cfa;
        regs_ = RegsAt::None, full_ = false;
        prev_ = RegsAt::None;
        break;
      }
      case Type::Regs: {
        if (!stack_ok(*cfa, kPtRegsSize)) return Stop::BadStack;
        auto rip = word(*cfa + kPtIp), cs = word(*cfa + kPtCs), rsp = word(*cfa + kPtSp);
        if (!rip || !cs || !rsp) return why_;
        if (*cs & 3) return Stop::EndOfStack;  // interrupted user mode: the kernel's stack ends here
        ip = *rip, sp = *rsp;
        regs_ = RegsAt::Memory, regs_addr_ = *cfa, full_ = true;
        prev_ = RegsAt::None;
        switched = true;
        break;
      }
      case Type::RegsPartial: {
        // The iret frame: ip, cs, flags, sp, ss, at the tail of a pt_regs.
        if (*cfa < kPtIp || !stack_ok(*cfa, kPtRegsSize - kPtIp)) return Stop::BadStack;
        auto rip = word(*cfa), cs = word(*cfa + (kPtCs - kPtIp)), rsp = word(*cfa + (kPtSp - kPtIp));
        if (!rip || !cs || !rsp) return why_;
        if (*cs & 3) return Stop::EndOfStack;
        ip = *rip, sp = *rsp;
        if (full_ || regs_ == RegsAt::Start) {
          prev_ = regs_;
          prev_addr_ = regs_addr_;
        } else {
          prev_ = RegsAt::None;
        }
        regs_ = RegsAt::Memory, regs_addr_ = *cfa - kPtIp, full_ = false;
        switched = true;
        break;
      }
      default: return Stop::BadEntry;
    }
    // The caller's frame pointer.
    switch (e->bp_reg) {
      case kRegUndefined:
        if (regs_ != RegsAt::None)
          if (auto v = reg(kPtBp)) bp_ = *v;
        break;
      case kRegPrevSp: {
        auto v = word(*cfa + static_cast<std::uint64_t>(std::int64_t{e->bp_offset}));
        if (!v) return why_;
        bp_ = *v;
        break;
      }
      case kRegBp: {
        auto v = word(bp_ + static_cast<std::uint64_t>(std::int64_t{e->bp_offset}));
        if (!v) return why_;
        bp_ = *v;
        break;
      }
      default: return Stop::BadEntry;
    }
    signal_ = e->signal;
    // A stack pointer that comes back, or goes down within one stack, is bad data: a loop.
    if (sp == sp_ || std::find(seen_.begin(), seen_.end(), sp) != seen_.end()) return Stop::Loop;
    if (sp < sp_ && (!switched || ++switches_ > kMaxStackSwitches)) return Stop::Loop;
    seen_.push_back(sp_);
    if (!u_.is_text(ip)) return Stop::NoText;
    ip_ = ip, sp_ = sp;
    return std::nullopt;
  }

  const Unwinder& u_;
  const ReadFn& read_;
  Walk w_;
  StartRegs start_;
  std::uint64_t ip_ = 0, sp_ = 0, bp_ = 0;
  bool signal_ = true;  // the first address is exact (a stopped vCPU), not a return address
  RegsAt regs_ = RegsAt::None, prev_ = RegsAt::None;
  std::uint64_t regs_addr_ = 0, prev_addr_ = 0;
  bool full_ = false;
  unsigned switches_ = 0;
  std::vector<std::uint64_t> seen_;  // at most kMaxFrames
  Stop why_ = Stop::BadEntry;
};

}  // namespace

Walk Unwinder::walk(const StartRegs& start, const ReadFn& read, std::size_t max_frames) const {
  return Walker(*this, read).run(start, max_frames);
}

}  // namespace xenprobes::kernel::orc
