// The semantic pass (compile.hpp): expressions, builtins and function calls.
#include "compile_internal.hpp"

namespace xenprobe {

// ---- expressions ----
Type Compiler::expression(Expr& e) {
  e.type = compute(e);
  return e.type;
}

Type Compiler::compute(Expr& e) {
  switch (e.kind) {
    case ExprKind::Int: e.op = Op::Const; return Type::integer();
    case ExprKind::Str: e.op = Op::ConstStr; return Type::string();
    case ExprKind::Builtin: return builtin(e);
    case ExprKind::Call: return call(e);
    case ExprKind::MapRead: return map_read(e);
    case ExprKind::VarRead: {
      auto it = vars_.find(e.name);
      if (it == vars_.end())
        error(e, e.name + " is used before it is assigned", "assign it first in this probe: " + e.name + " = ...;");
      e.op = Op::VarRead;
      e.slot = it->second.slot;
      return it->second.type;
    }
    case ExprKind::Binary: return binary(e);
    case ExprKind::Unary: {
      want_int(*e.kids[0], "the operand of '" + e.name + "'");
      e.op = e.name == "-" ? Op::Neg : e.name == "!" ? Op::Not : Op::BitNot;
      return Type::integer();
    }
    case ExprKind::Ternary: {
      want_int(*e.kids[0], "the condition");
      Type a = expression(*e.kids[1]);
      Type b = expression(*e.kids[2]);
      if (a.kind == Type::Kind::Array && a.char_like) a = to_string(e.kids[1]);
      if (b.kind == Type::Kind::Array && b.char_like) b = to_string(e.kids[2]);
      if (a.kind == Type::Kind::Str && b.kind == Type::Kind::Str) {
        e.op = Op::Ternary;
        return Type::string();
      }
      if (!a.is_int() || !b.is_int()) error(e, "both branches of '?:' must be integers or both strings");
      e.op = Op::Ternary;
      return a == b ? a : Type::integer();
    }
    case ExprKind::Cast: return cast(e);
    case ExprKind::Field: return field(e);
    case ExprKind::Index: return index(e);
  }
  error(e, "unknown expression");
}

bool Compiler::in_hit_block(const Expr& e, const char* what) {
  if (any_hitless_)
    error(e, std::string(what) + " is only known in kprobe and kretprobe probes",
          "BEGIN, END and interval run in Dom0, not on a guest vCPU");
  return true;
}

Type Compiler::builtin(Expr& e) {
  const std::string& n = e.name;
  if (n.size() == 4 && n.starts_with("arg") && n[3] >= '0' && n[3] <= '9') {
    in_hit_block(e, n.c_str());
    if (n[3] > '5') error(e, n + " is not available", "the first six arguments are arg0 ... arg5 (registers)");
    if (!all_kprobe_)
      error(e, n + " is only known in kprobe probes",
            "in a kretprobe the argument registers are gone: save the argument in a kprobe, e.g. @arg[tid] = arg0");
    e.op = Op::Arg;
    e.slot = n[3] - '0';
    return Type::integer();
  }
  if (n == "retval") {
    in_hit_block(e, "retval");
    if (!all_kretprobe_) error(e, "retval is only known in kretprobe probes", "probe the return: kretprobe:FUNC");
    e.op = Op::Retval;
    return Type::integer();
  }
  if (n == "func") {
    in_hit_block(e, "func");
    e.op = Op::Func;
    return Type::string();
  }
  if (n == "probe") {
    e.op = Op::Probe;
    return Type::string();
  }
  if (n == "cpu") {
    in_hit_block(e, "cpu");
    e.op = Op::Cpu;
    return Type::integer();
  }
  if (n == "nsecs") {
    e.op = Op::Nsecs;
    return Type::integer();
  }
  if (n == "domain") {
    e.op = Op::Domain;
    return Type::string();
  }
  if (n == "comm" || n == "pid" || n == "tid") {
    in_hit_block(e, n.c_str());
    if (!c_.task.available && !types_) no_types(e, n + " needs the guest kernel's types (its task_struct)");
    if (!c_.task.available) error(e, n + " needs the guest kernel's task_struct: " + c_.task.why_not);
    c_.uses_task = true;
    e.op = n == "comm" ? Op::Comm : n == "pid" ? Op::Pid : Op::Tid;
    return n == "comm" ? Type::string() : Type::integer();
  }
  if (n == "kstack") return kstack(e, kMaxStackFrames);
  if (const char* hint = unsupported_hint(n)) error(e, "'" + n + "' is not supported", hint);
  error(e, "unknown identifier '" + n + "'",
        "builtins: arg0-arg5, retval, func, probe, cpu, nsecs, domain, comm, pid, tid, kstack; maps are @name, "
        "variables $name");
}

Type Compiler::call(Expr& e) {
  const std::string& n = e.name;
  auto arity = [&](std::size_t lo, std::size_t hi, const char* usage) {
    if (e.kids.size() < lo || e.kids.size() > hi)
      error(e,
            n + "() takes " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + " or " + std::to_string(hi)) +
                " argument(s), not " + std::to_string(e.kids.size()),
            usage);
  };
  if (is_aggregation(n))
    error(e, n + "() is an aggregation: it can only be assigned to a map", "write @name = " + n + "(...);");
  if (n == "kstack") {
    arity(1, 1, "kstack or kstack(N), N the most frames (1 ... 127)");
    const Expr& a = *e.kids[0];
    if (a.kind == ExprKind::Builtin && (a.name == "bpftrace" || a.name == "perf" || a.name == "raw"))
      error(e, "kstack's output modes are not supported", "kstack or kstack(N): bpftrace's layout, func+0xOFF");
    const std::int64_t frames = constant(*e.kids[0], "kstack()'s frame count");
    if (frames < 1 || frames > kMaxStackFrames)
      error(*e.kids[0], "kstack()'s frame count must be 1 ... " + std::to_string(kMaxStackFrames));
    return kstack(e, frames);
  }
  if (n == "str") {
    arity(1, 2, "str(addr) or str(addr, length)");
    Type t = expression(*e.kids[0]);
    std::int64_t len = kDefaultStrLen;
    if (e.kids.size() == 2) {
      len = constant(*e.kids[1], "str()'s length");
      if (len < 1 || len > kMaxStrLen) error(*e.kids[1], "str()'s length must be 1 ... " + std::to_string(kMaxStrLen));
    }
    e.op = Op::Str;
    if (t.kind == Type::Kind::Str) {
      e.offset = -1;  // already a string
    } else if (t.kind == Type::Kind::Array) {
      e.offset = std::min<std::int64_t>(len, t.count);  // the array bounds the read
    } else if (t.is_int()) {
      e.offset = len - 1;  // the NUL does not count
    } else {
      error(*e.kids[0], "str() reads a string at an address, not " + describe(t));
    }
    return Type::string();
  }
  if (n == "printf") {
    if (e.kids.empty() || e.kids[0]->kind != ExprKind::Str)
      error(e, "printf() needs a format string first", "printf(\"%d\\n\", arg0)");
    e.slot = format(e);
    return Type{};
  }
  if (n == "print") {
    arity(1, 1, "print(@map)");
    Expr& m = *e.kids[0];
    if (m.kind != ExprKind::MapRead || !m.kids.empty())
      error(m, "print() prints a whole map", "print(@name); for a value use printf()");
    e.slot = map_slot(m);
    return Type{};
  }
  if (n == "clear") {
    arity(1, 1, "clear(@map)");
    Expr& m = *e.kids[0];
    if (m.kind != ExprKind::MapRead || !m.kids.empty()) error(m, "clear() empties a whole map", "clear(@name)");
    e.slot = map_slot(m);
    return Type{};
  }
  if (n == "delete") {
    arity(1, 1, "delete(@map[key])");
    Expr& m = *e.kids[0];
    if (m.kind != ExprKind::MapRead)
      error(m, "delete() removes one map entry", "delete(@name[key]); clear(@name) empties it");
    e.slot = map_slot(m);
    if (e.slot < 0) return Type{};
    check_keys(c_.maps[static_cast<std::size_t>(e.slot)], m, compile_keys(m));
    m.slot = e.slot;
    return Type{};
  }
  if (n == "exit") {
    arity(0, 0, "exit()");
    return Type{};
  }
  if (n == "kaddr") {
    arity(1, 1, "kaddr(\"symbol\")");
    if (e.kids[0]->kind != ExprKind::Str) error(*e.kids[0], "kaddr() takes a symbol name in quotes");
    const std::string& sym = e.kids[0]->text;
    auto it = std::find(c_.kaddrs.begin(), c_.kaddrs.end(), sym);
    e.slot = static_cast<int>(it - c_.kaddrs.begin());
    if (it == c_.kaddrs.end()) c_.kaddrs.push_back(sym);
    e.op = Op::Kaddr;
    return Type::integer();
  }
  if (const char* hint = unsupported_hint(n)) error(e, n + "() is not supported", hint);
  error(e, "unknown function " + n + "()",
        "functions: printf, print, clear, delete, exit, str, kaddr; aggregations: count, sum, avg, min, max, hist, "
        "lhist");
}

// kstack: a map key part or printf's %s argument, nothing else (it is text for people, one
// frame a line: comparing it, storing it or reading it as an address has no meaning here).
Type Compiler::kstack(Expr& e, std::int64_t frames) {
  in_hit_block(e, "kstack");
  if (&e != stack_allowed_)
    error(e, "kstack can only be a map key or printed", "@[kstack] = count(); or printf(\"%s\\n\", kstack);");
  e.op = Op::Kstack;
  e.offset = frames;
  c_.uses_kstack = true;
  return Type::string();
}

}  // namespace xenprobe
