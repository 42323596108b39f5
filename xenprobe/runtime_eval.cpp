// Running a compiled program (runtime.hpp): expressions and printf.
#include "runtime_internal.hpp"

namespace xenprobe {

namespace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

void Instance::eval(const Expr& e, Value& out) {
  switch (e.op) {
    case Op::Const: out.i = e.ival; return;
    case Op::ConstStr: out.s = e.text; return;
    case Op::Arg: {
      const xenprobes::Regs& r = ctx_->regs();
      const std::uint64_t args[6] = {r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9};
      out.i = static_cast<std::int64_t>(args[e.slot]);
      return;
    }
    case Op::Retval: out.i = static_cast<std::int64_t>(ctx_->regs().rax); return;
    case Op::Func: out.s = site_->function; return;
    case Op::Probe: out.s = site_->probe; return;
    case Op::Cpu: out.i = ctx_->vcpu().value; return;
    case Op::Nsecs: out.i = nsecs_ ? *nsecs_ : now_ns(); return;
    case Op::Domain: out.s = domain_; return;
    case Op::Kaddr: out.i = kaddrs_[static_cast<std::size_t>(e.slot)]; return;
    case Op::Kstack:
      out.s.clear();
      if (!ctx_ || !stacks_ || !stacks_(*ctx_, static_cast<unsigned>(e.offset), out.s)) ++read_errors_;
      return;
    case Op::Comm: {
      out.s.clear();
      auto task = current_task();
      if (!task) return;
      auto s = ctx_->read_string(xenprobes::Gva{*task + c_.task.comm_offset}, c_.task.comm_size);
      if (!s) ++read_errors_;
      if (s) out.s = std::move(*s);
      return;
    }
    case Op::Pid:
    case Op::Tid: {
      auto task = current_task();
      // bpftrace's pid is the thread group (the process), tid the task's own pid.
      out.i = task ? load(*task + (e.op == Op::Pid ? c_.task.tgid_offset : c_.task.pid_offset), 4, true) : 0;
      return;
    }
    case Op::Str: {
      if (e.offset < 0) return eval(*e.kids[0], out);
      Value a;
      eval(*e.kids[0], a);
      if (!ctx_) {
        ++read_errors_;
        out.s.clear();
        return;
      }
      auto s = ctx_->read_string(xenprobes::Gva{static_cast<std::uint64_t>(a.i)}, static_cast<std::size_t>(e.offset));
      if (!s) {
        ++read_errors_;
        out.s.clear();
      } else {
        out.s = std::move(*s);
      }
      return;
    }
    case Op::MapRead: {
      Entry* en = entry(e, false);
      const MapKind k = c_.maps[static_cast<std::size_t>(e.slot)].kind;
      if (k == MapKind::Str) {
        out.s = en ? en->s : std::string{};
      } else if (k == MapKind::Avg) {
        out.i = en && en->n ? en->v / en->n : 0;
      } else {
        out.i = en ? en->v : 0;
      }
      return;
    }
    case Op::VarRead: {
      const Value& v = vars_[static_cast<std::size_t>(e.slot)];
      if (e.type.kind == Type::Kind::Str) out.s = v.s;
      else out.i = v.i;
      return;
    }
    case Op::LogAnd: out.i = eval_int(*e.kids[0]) != 0 && eval_int(*e.kids[1]) != 0; return;
    case Op::LogOr: out.i = eval_int(*e.kids[0]) != 0 || eval_int(*e.kids[1]) != 0; return;
    case Op::StrEq:
    case Op::StrNe: {
      Value a, b;
      eval(*e.kids[0], a);
      eval(*e.kids[1], b);
      out.i = (a.s == b.s) == (e.op == Op::StrEq);
      return;
    }
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Mod:
    case Op::And:
    case Op::Or:
    case Op::Xor:
    case Op::Shl:
    case Op::Shr:
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge: {
      const std::int64_t a = eval_int(*e.kids[0]);
      const std::int64_t b = eval_int(*e.kids[1]);
      // Unsigned arithmetic: wraps instead of overflowing; division by zero gives 0 and a
      // remainder by zero leaves the dividend, as in BPF.
      const auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
      switch (e.op) {
        case Op::Add: out.i = static_cast<std::int64_t>(ua + ub); break;
        case Op::Sub: out.i = static_cast<std::int64_t>(ua - ub); break;
        case Op::Mul: out.i = static_cast<std::int64_t>(ua * ub); break;
        case Op::Div: out.i = b == 0 ? 0 : (a == INT64_MIN && b == -1) ? a : a / b; break;
        case Op::Mod: out.i = b == 0 ? a : (a == INT64_MIN && b == -1) ? 0 : a % b; break;
        case Op::And: out.i = a & b; break;
        case Op::Or: out.i = a | b; break;
        case Op::Xor: out.i = a ^ b; break;
        case Op::Shl: out.i = static_cast<std::int64_t>(ua << (ub & 63)); break;
        case Op::Shr: out.i = static_cast<std::int64_t>(ua >> (ub & 63)); break;
        case Op::Eq: out.i = a == b; break;
        case Op::Ne: out.i = a != b; break;
        case Op::Lt: out.i = a < b; break;
        case Op::Le: out.i = a <= b; break;
        case Op::Gt: out.i = a > b; break;
        case Op::Ge: out.i = a >= b; break;
        default: break;
      }
      return;
    }
    case Op::Neg: out.i = static_cast<std::int64_t>(0 - static_cast<std::uint64_t>(eval_int(*e.kids[0]))); return;
    case Op::Not: out.i = eval_int(*e.kids[0]) == 0; return;
    case Op::BitNot: out.i = ~eval_int(*e.kids[0]); return;
    case Op::Ternary:
      if (eval_int(*e.kids[0]) != 0) eval(*e.kids[1], out);
      else eval(*e.kids[2], out);
      return;
    case Op::IntCast: {
      const std::int64_t v = eval_int(*e.kids[0]);
      const unsigned shift = 64 - static_cast<unsigned>(e.offset);
      if (shift == 0) out.i = v;
      else if (e.load_signed) out.i = static_cast<std::int64_t>(static_cast<std::uint64_t>(v) << shift) >> shift;
      else out.i = static_cast<std::int64_t>((static_cast<std::uint64_t>(v) << shift) >> shift);
      return;
    }
    case Op::PtrCast: out.i = eval_int(*e.kids[0]); return;
    case Op::Load:
      if (e.bit_width) {  // a bitfield: its bits of the bytes that hold them
        const auto raw = static_cast<std::uint64_t>(
            load(static_cast<std::uint64_t>(eval_int(*e.kids[0]) + e.offset), e.load_size, false));
        std::uint64_t v = raw >> e.bit_shift;
        if (e.bit_width < 64) {
          const std::uint64_t mask = (std::uint64_t{1} << e.bit_width) - 1;
          v &= mask;
          if (e.load_signed && (v >> (e.bit_width - 1)) & 1) v |= ~mask;
        }
        out.i = static_cast<std::int64_t>(v);
      } else {
        out.i = load(static_cast<std::uint64_t>(eval_int(*e.kids[0]) + e.offset), e.load_size, e.load_signed);
      }
      return;
    case Op::AddrOffset: out.i = eval_int(*e.kids[0]) + e.offset; return;
    case Op::IndexLoad:
    case Op::IndexAddr: {
      const std::int64_t base = eval_int(*e.kids[0]);
      const std::int64_t addr = base + eval_int(*e.kids[1]) * e.offset;
      out.i = e.op == Op::IndexAddr ? addr : load(static_cast<std::uint64_t>(addr), e.load_size, e.load_signed);
      return;
    }
    case Op::None: return;
  }
}

void Instance::do_printf(const Expr& e) {
  const Format& f = c_.formats[static_cast<std::size_t>(e.slot)];
  printf_.clear();
  std::size_t arg = 1;
  Value v;
  char buf[256];
  for (const FormatPiece& p : f.pieces) {
    printf_ += p.literal;
    if (!p.conv) continue;
    const Expr& a = *e.kids[arg++];
    eval(a, v);
    int n = 0;
    if (p.conv == 's') {
      // A stack's lines are the tool's own text (symbol names are checked when loaded).
      if (out_.format() == OutputFormat::Text && a.op != Op::Kstack) v.s = printable(v.s);
      n = std::snprintf(buf, sizeof buf, p.spec.c_str(), v.s.c_str());
      if (n >= static_cast<int>(sizeof buf)) {
        std::string big(static_cast<std::size_t>(n) + 1, '\0');
        std::snprintf(big.data(), big.size(), p.spec.c_str(), v.s.c_str());
        big.resize(static_cast<std::size_t>(n));
        printf_ += big;
        continue;
      }
    } else if (p.conv == 'c') {
      n = std::snprintf(buf, sizeof buf, p.spec.c_str(), static_cast<int>(static_cast<unsigned char>(v.i)));
    } else {
      n = std::snprintf(buf, sizeof buf, p.spec.c_str(), static_cast<long long>(v.i));
    }
    if (n > 0) printf_.append(buf, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1));
  }
  if (out_.format() == OutputFormat::Json) out_.record(domain_, "printf", json_text(printf_));
  else out_.text(domain_, printf_);
}

}  // namespace xenprobe
