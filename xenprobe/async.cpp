// --method async (async.hpp): the check that every value a kprobe block needs can come from an
// async record, the captures that give them, and the HitContext that serves a record.
#include "async.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "xenprobes/protocol.h"

namespace xenprobe {

namespace {

using xenprobes::Capture;
using xenprobes::CaptureBase;

constexpr const char* kUseTrap =
    "use --method trap (or jump) for this program: its blocks then run while the vCPU waits";

// argN's register, in the x86-64 calling convention's order.
constexpr CaptureBase kArgRegs[6] = {CaptureBase::Rdi, CaptureBase::Rsi, CaptureBase::Rdx,
                                     CaptureBase::Rcx, CaptureBase::R8,  CaptureBase::R9};

struct RegOffset {
  CaptureBase base;
  std::int64_t offset = 0;
};

// The value of `e` as argN + constant, if it is one: argN, casts of it to a pointer or to 64
// bits, + or - a constant, a field's or a constant element's address.
std::optional<RegOffset> reg_plus_const(const Expr& e) {
  auto add = [](std::optional<RegOffset> r, std::int64_t k) {
    if (r) r->offset = static_cast<std::int64_t>(static_cast<std::uint64_t>(r->offset) + static_cast<std::uint64_t>(k));
    return r;
  };
  switch (e.op) {
    case Op::Arg: return RegOffset{kArgRegs[e.slot], 0};
    case Op::PtrCast: return reg_plus_const(*e.kids[0]);
    case Op::IntCast: return e.offset == 64 ? reg_plus_const(*e.kids[0]) : std::nullopt;
    case Op::AddrOffset: return add(reg_plus_const(*e.kids[0]), e.offset);
    case Op::IndexAddr:
      if (e.kids[1]->op != Op::Const) return std::nullopt;
      return add(reg_plus_const(*e.kids[0]), e.kids[1]->ival * e.offset);
    case Op::Add:
      if (e.kids[1]->op == Op::Const) return add(reg_plus_const(*e.kids[0]), e.kids[1]->ival);
      if (e.kids[0]->op == Op::Const) return add(reg_plus_const(*e.kids[1]), e.kids[0]->ival);
      return std::nullopt;
    case Op::Sub:
      if (e.kids[1]->op == Op::Const) return add(reg_plus_const(*e.kids[0]), 0 - e.kids[1]->ival);
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::uint64_t reg_value(const xenprobes::Regs& r, CaptureBase b) {
  switch (b) {
    case CaptureBase::Rax: return r.rax;
    case CaptureBase::Rbx: return r.rbx;
    case CaptureBase::Rcx: return r.rcx;
    case CaptureBase::Rdx: return r.rdx;
    case CaptureBase::Rsi: return r.rsi;
    case CaptureBase::Rdi: return r.rdi;
    case CaptureBase::Rbp: return r.rbp;
    case CaptureBase::Rsp: return r.rsp;
    case CaptureBase::R8: return r.r8;
    case CaptureBase::R9: return r.r9;
    case CaptureBase::R10: return r.r10;
    case CaptureBase::R11: return r.r11;
    case CaptureBase::R12: return r.r12;
    case CaptureBase::R13: return r.r13;
    case CaptureBase::R14: return r.r14;
    case CaptureBase::R15: return r.r15;
    case CaptureBase::Rip: return r.rip;
  }
  return 0;
}

class Planner {
 public:
  explicit Planner(AsyncPlan& p) : p_(p) {}

  void body(const std::vector<Stmt>& stmts) {
    for (const Stmt& s : stmts) {
      if (s.target) expr(*s.target);
      if (s.value) expr(*s.value);
      body(s.then_body);
      body(s.else_body);
    }
  }

  void expr(const Expr& e) {
    switch (e.op) {
      case Op::Comm:
      case Op::Pid:
      case Op::Tid:
        refuse(e, "'" + e.name +
                      "' cannot come from an async record (--method async): it reads the guest's current "
                      "task at the hit");
      case Op::Kstack:
        refuse(e,
               "'kstack' cannot come from an async record (--method async): the stack is walked in guest memory "
               "at the hit");
      case Op::Retval: refuse(e, "'retval' cannot come from an async record (--method async)");
      case Op::Str: {
        if (e.offset < 0) return expr(*e.kids[0]);  // already a string
        auto at = reg_plus_const(*e.kids[0]);
        if (!at)
          refuse(e,
                 "str() of this address cannot come from an async record (--method async): only str(argN) and "
                 "str(argN + constant) (or of a field's address, ((struct S *)argN)->name) are captured at the hit");
        const std::int64_t max = e.offset + 1;  // str()'s bytes and the NUL
        if (max > XENPROBES_CAP_MAX_BYTES)
          refuse(e,
                 "str() of more than " + std::to_string(XENPROBES_CAP_MAX_BYTES - 1) +
                     " bytes cannot come from an async record (--method async)",
                 "give str(addr, " + std::to_string(XENPROBES_CAP_MAX_BYTES - 1) + ") or less, or " + kUseTrap);
        Capture c = Capture::string(at->base, 0, static_cast<std::uint16_t>(max));
        c.by_address = true;  // a user or a kernel string, as its address says (bpftrace's str() reads either)
        return add(e, c, at->offset);
      }
      case Op::Load:
      case Op::IndexLoad: {
        std::optional<RegOffset> at;
        if (e.op == Op::Load) {
          at = reg_plus_const(*e.kids[0]);
          if (at)
            at->offset = static_cast<std::int64_t>(static_cast<std::uint64_t>(at->offset) +
                                                   static_cast<std::uint64_t>(e.offset));
        } else if (e.kids[1]->op == Op::Const) {
          at = reg_plus_const(*e.kids[0]);
          if (at) at->offset += e.kids[1]->ival * e.offset;
        }
        if (!at)
          refuse(e,
                 "this read of guest memory cannot come from an async record (--method async): only one read at "
                 "argN + constant (a field of a cast argument, ((struct S *)argN)->field) is captured at the hit, "
                 "not a read at an address read from memory, a variable, a map, kaddr() or a variable index");
        Capture c = Capture::bytes(at->base, 0, static_cast<std::uint16_t>(e.load_size));
        c.by_address = true;
        return add(e, c, at->offset);
      }
      default:
        for (const auto& k : e.kids) expr(*k);
        return;
    }
  }

 private:
  [[noreturn]] static void refuse(const Expr& e, const std::string& what, std::string hint = kUseTrap) {
    throw ProgramError(e.pos, e.len, what, std::move(hint));
  }

  void add(const Expr& e, Capture c, std::int64_t offset) {
    if (offset < INT32_MIN || offset > INT32_MAX)
      refuse(e, "this read is " + std::to_string(offset) +
                    " bytes from its register, more than an async capture reaches (2 GiB)");
    c.offset = static_cast<std::int32_t>(offset);
    for (const Capture& o : p_.captures)
      if (o.kind == c.kind && o.base == c.base && o.offset == c.offset && o.max == c.max) return;
    if (p_.captures.size() == kMaxAsyncCaptures)
      refuse(e,
             "this probe needs more than " + std::to_string(kMaxAsyncCaptures) +
                 " captures (each distinct str() and read is one), more than an async record holds",
             std::string("read fewer distinct values in this probe, or ") + kUseTrap);
    std::uint64_t record = sizeof(xenprobes_rec);
    for (const Capture& o : p_.captures) record += sizeof(xenprobes_cap) + ((o.max + 7u) & ~7u);
    record += sizeof(xenprobes_cap) + ((c.max + 7u) & ~7u);
    if (record > XENPROBES_RING_REC_MAX)
      refuse(e,
             "with this, the probe's captures make a record of up to " + std::to_string(record) +
                 " bytes, more than the " + std::to_string(XENPROBES_RING_REC_MAX) + " an async record holds",
             std::string("give shorter strings, str(addr, LEN), or ") + kUseTrap);
    p_.captures.push_back(c);
  }

  AsyncPlan& p_;
};

}  // namespace

std::vector<AsyncPlan> plan_async(Compiled& c) {
  std::vector<AsyncPlan> plans(c.program.blocks.size());
  for (std::size_t b = 0; b < c.program.blocks.size(); ++b) {
    const ProbeBlock& block = c.program.blocks[b];
    plans[b].async = std::any_of(block.specs.begin(), block.specs.end(),
                                 [](const ProbeSpec& s) { return s.kind == ProbeKind::Kprobe; });
    if (!plans[b].async) continue;
    Planner p(plans[b]);
    if (block.predicate) p.expr(*block.predicate);
    p.body(block.body);
  }
  return plans;
}

// ---- RecordContext ----

RecordContext::RecordContext(const xenprobes::AsyncHit& hit, std::span<const Capture> caps)
    : hit_(hit), caps_(caps), regs_(hit.regs) {}

const xenprobes::CaptureValue* RecordContext::find(Capture::Kind k, std::uint64_t va, std::size_t max) const {
  for (std::size_t i = 0; i < caps_.size() && i < hit_.captures.size(); ++i) {
    const Capture& c = caps_[i];
    if (c.kind != k || c.max != max) continue;
    const std::uint64_t at = reg_value(hit_.regs, c.base) + static_cast<std::uint64_t>(std::int64_t{c.offset});
    if (at == va) return &hit_.captures[i];
  }
  return nullptr;
}

xenprobes::Result<void> RecordContext::read(xenprobes::Gva va, std::span<std::byte> out) {
  const xenprobes::CaptureValue* v = find(Capture::Kind::Bytes, va.value, out.size());
  if (!v || v->status != xenprobes::CaptureStatus::Ok || v->bytes.size() != out.size())
    return std::unexpected(xenprobes::Error{xenprobes::Errc::Fault, "not captured, or unreadable at the hit"});
  std::memcpy(out.data(), v->bytes.data(), out.size());
  return {};
}

xenprobes::Result<void> RecordContext::write(xenprobes::Gva, std::span<const std::byte>) {
  return std::unexpected(xenprobes::Error{xenprobes::Errc::NotSupported, "an async record cannot write the guest"});
}

xenprobes::Result<std::uint64_t> RecordContext::read_u64(xenprobes::Gva va) {
  std::uint64_t v = 0;
  if (auto r = read(va, std::as_writable_bytes(std::span(&v, 1))); !r) return std::unexpected(r.error());
  return v;
}

xenprobes::Result<std::string> RecordContext::read_string(xenprobes::Gva va, std::size_t max_len) {
  // str()'s max_len bytes without the NUL: the capture holds max_len + 1 with it, and a longer
  // string comes truncated to max_len bytes, as the synchronous read gives it.
  const xenprobes::CaptureValue* v = find(Capture::Kind::String, va.value, max_len + 1);
  if (!v || v->status == xenprobes::CaptureStatus::Fault)
    return std::unexpected(xenprobes::Error{xenprobes::Errc::Fault, "not captured, or unreadable at the hit"});
  return std::string(v->text());
}

xenprobes::Result<std::uint64_t> RecordContext::kernel_gs_base() {
  return std::unexpected(xenprobes::Error{xenprobes::Errc::NotSupported, "an async record has no gs base"});
}

}  // namespace xenprobe
