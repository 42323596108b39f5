// The semantic pass (compile.hpp).
#include "compile.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

namespace xenprobe {

const char* map_kind_name(MapKind k) {
  switch (k) {
    case MapKind::Int: return "an integer";
    case MapKind::Str: return "a string";
    case MapKind::Count: return "count()";
    case MapKind::Sum: return "sum()";
    case MapKind::Avg: return "avg()";
    case MapKind::Min: return "min()";
    case MapKind::Max: return "max()";
    case MapKind::Hist: return "hist()";
    case MapKind::Lhist: return "lhist()";
  }
  return "?";
}

namespace {

std::string where(const Pos& p) { return std::to_string(p.line) + ":" + std::to_string(p.col); }

struct UnsupportedName {
  const char* name;
  const char* hint;
};
// bpftrace builtins and functions we do not have, with what to use instead.
constexpr UnsupportedName kUnsupported[] = {
    {"ustack", "user stacks are not supported: xenprobe probes guest kernels"},
    {"uid", "not supported: read it through BTF, e.g. ((struct task_struct *)ADDR)->cred->uid.val"},
    {"gid", "not supported: read it through BTF, e.g. ((struct task_struct *)ADDR)->cred->gid.val"},
    {"username", "not supported: Dom0 cannot see the guest's user names"},
    {"elapsed", "not supported: use nsecs and keep the start in a map (@start = nsecs in BEGIN)"},
    {"cgroup", "not supported: filter by comm, pid or tid, or read the task's cgroups through BTF fields"},
    {"curtask", "not supported: comm, pid and tid read the current task through the guest kernel's BTF"},
    {"rand",
     "not supported: to sample every Nth hit, count and test the count: @n = count(); if (@n % 10 == 0) { ... }"},
    {"args", "use arg0 ... arg5"},
    {"ctx", "use arg0 ... arg5 and retval"},
    {"jiffies", "not supported: use nsecs (Dom0's monotonic clock)"},
    {"numaid", "not supported: use cpu (the hit vCPU)"},
    {"sarg0", "stack arguments are not supported: use arg0 ... arg5"},
    {"system", "not supported: xenprobe never runs commands"},
    {"cat", "not supported: xenprobe never reads Dom0 files from a program"},
    {"join", "not supported: print the strings with printf"},
    {"time", "not supported: print nsecs with printf"},
    {"strftime", "not supported: print nsecs with printf"},
    {"ksym", "not supported yet: print the address with printf(\"%lx\")"},
    {"usym", "not supported: xenprobe probes guest kernels"},
    {"ntop", "not supported: read the address's bytes through BTF fields and print them with printf"},
    {"buf", "not supported: use str(addr, n)"},
    {"reg", "use arg0 ... arg5 and retval"},
    {"signal", "not supported: xenprobe never changes the guest"},
    {"override", "not supported: xenprobe never changes the guest"},
    {"strncmp", "compare whole strings: str(arg0) == \"name\""},
    {"sizeof", "not supported: casts and field access take sizes and offsets from BTF; write a constant otherwise"},
    {"offsetof", "not supported: casts and field access take sizes and offsets from BTF; write a constant otherwise"},
    {"zero", "use clear(@map)"},
    {"stats", "use count(), sum() and avg() in three maps"},
    {"tseries", "not supported: use interval:s:N { print(@m); clear(@m); }"},
    {"kptr", "not needed: casts read guest kernel memory"},
    {"uptr", "not needed: str() and casts read through the hit vCPU's page tables, user pointers included"},
    {"macaddr", "not supported: read the six bytes through BTF fields and print them with printf(\"%02x:...\")"},
    {"cgroup_path", "not supported: follow the cgroup's kernfs node through BTF fields and print its name with str()"},
    {"path", "not supported: follow the dentry through BTF fields"},
    {"percpu_kaddr", "not supported: comm, pid and tid read the current task through the guest kernel's BTF"},
};

const char* unsupported_hint(std::string_view name) {
  for (const auto& u : kUnsupported)
    if (name == u.name) return u.hint;
  return nullptr;
}

constexpr const char* kAggregations[] = {"count", "sum", "avg", "min", "max", "hist", "lhist"};
bool is_aggregation(std::string_view n) {
  return std::any_of(std::begin(kAggregations), std::end(kAggregations), [&](const char* a) { return n == a; });
}

struct VarInfo {
  int slot;
  Type type;
};

class Compiler {
 public:
  Compiler(Compiled& out, const TypeSource* types) : c_(out), types_(types) {}

  void run(bool lenient) {
    lenient_ = lenient;
    c_.formats.clear();
    c_.kaddrs.clear();
    c_.max_vars = 0;
    c_.uses_task = false;
    c_.uses_kstack = false;
    for (ProbeBlock& b : c_.program.blocks) {
      block_ = &b;
      vars_.clear();
      all_kprobe_ =
          std::all_of(b.specs.begin(), b.specs.end(), [](const ProbeSpec& s) { return s.kind == ProbeKind::Kprobe; });
      all_kretprobe_ = std::all_of(b.specs.begin(), b.specs.end(),
                                   [](const ProbeSpec& s) { return s.kind == ProbeKind::Kretprobe; });
      any_hitless_ = std::any_of(b.specs.begin(), b.specs.end(), [](const ProbeSpec& s) {
        return s.kind != ProbeKind::Kprobe && s.kind != ProbeKind::Kretprobe;
      });
      if (b.predicate) guarded([&] { want_int(*b.predicate, "the predicate"); });
      body(b.body);
      b.vars = static_cast<int>(vars_.size());
      c_.max_vars = std::max(c_.max_vars, b.vars);
    }
  }

 private:
  template <typename F>
  void guarded(F f) {
    if (!lenient_) return f();
    try {
      f();
    } catch (const ProgramError&) {
      // First pass: only the maps' declarations matter; the second pass reports errors.
    }
  }

  [[noreturn]] void error(const Expr& e, const std::string& what, std::string hint = {}) {
    throw ProgramError(e.pos, e.len, what, std::move(hint));
  }
  // The program needs types and has none (checked without the guest, e.g. with --check).
  [[noreturn]] void no_types(const Expr& e, const std::string& what) {
    throw ProgramError(e.pos, e.len, what,
                       "xenprobe reads them from the guest's memory when it runs; with --check, give them with "
                       "--btf FILE (the guest kernel's /sys/kernel/btf/vmlinux, or a vmlinux with .BTF)",
                       true);
  }

  void body(std::vector<Stmt>& stmts) {
    for (Stmt& s : stmts) guarded([&] { statement(s); });
  }

  void statement(Stmt& s) {
    switch (s.kind) {
      case StmtKind::Expr: {
        Expr& e = *s.value;
        if (e.kind == ExprKind::Call && is_aggregation(e.name))
          error(e, e.name + "() is an aggregation: assign it to a map", "write @name = " + e.name + "(...);");
        expression(e);
        return;
      }
      case StmtKind::VarAssign: {
        Type t = expression(*s.value);
        if (t.kind == Type::Kind::None) error(*s.value, "this expression has no value to assign");
        if (t.kind == Type::Kind::Array && t.char_like) t = to_string(s.value);
        auto it = vars_.find(s.target->name);
        if (it == vars_.end()) {
          it = vars_.emplace(s.target->name, VarInfo{static_cast<int>(vars_.size()), t}).first;
        } else if (!same_kind(it->second.type, t)) {
          error(*s.value,
                s.target->name + " holds " + describe(it->second.type) + "; it cannot be assigned " + describe(t),
                "use another variable");
        }
        s.target->slot = it->second.slot;
        s.target->type = it->second.type;
        s.target->op = Op::VarRead;
        return;
      }
      case StmtKind::MapAssign: map_assign(s); return;
      case StmtKind::If:
        want_int(*s.value, "the condition");
        body(s.then_body);
        body(s.else_body);
        return;
    }
  }

  static bool same_kind(const Type& a, const Type& b) {
    if (a.is_int() && b.is_int()) return true;
    return a.kind == b.kind;
  }

  static std::string describe(const Type& t) {
    switch (t.kind) {
      case Type::Kind::Int: return "an integer";
      case Type::Kind::Ptr: return "a pointer";
      case Type::Kind::Str: return "a string";
      case Type::Kind::Record: return "a struct";
      case Type::Kind::Array: return "an array";
      case Type::Kind::None: return "nothing";
    }
    return "?";
  }

  // ---- maps ----
  MapDecl* find_map(const std::string& name) {
    for (MapDecl& m : c_.maps)
      if (m.name == name) return &m;
    return nullptr;
  }

  std::vector<bool> compile_keys(Expr& target) {
    if (target.kids.size() > kMaxKeys) error(*target.kids[kMaxKeys], "a map key has at most 8 parts");
    std::vector<bool> is_str;
    key_stack_.clear();
    for (ExprPtr& k : target.kids) {
      stack_allowed_ = k.get();
      Type t = expression(*k);
      stack_allowed_ = nullptr;
      key_stack_.push_back(k->op == Op::Kstack);
      if (t.kind == Type::Kind::Array && t.char_like) t = to_string(k);
      if (t.kind != Type::Kind::Str && !t.is_int())
        error(*k, "a map key must be an integer or a string, not " + describe(t), "read a field, or use str()");
      is_str.push_back(t.kind == Type::Kind::Str);
    }
    return is_str;
  }

  MapDecl& declare(Expr& target, MapKind kind, const std::vector<bool>& keys, const Expr& value) {
    MapDecl* m = find_map(target.name);
    if (!m) {
      c_.maps.push_back(MapDecl{target.name, kind, keys, target.pos});
      m = &c_.maps.back();
      m->key_is_stack = key_stack_;
    } else {
      if (m->kind != kind)
        error(value,
              target.name + " is " + map_kind_name(m->kind) + " (from " + where(m->pos) + "); it cannot also be " +
                  map_kind_name(kind),
              "use another map for this value");
      check_keys(*m, target, keys);
    }
    target.slot = static_cast<int>(m - c_.maps.data());
    return *m;
  }

  void check_keys(const MapDecl& m, const Expr& target, const std::vector<bool>& keys) {
    if (m.key_is_str.size() != keys.size())
      error(target, target.name + " has " + std::to_string(m.key_is_str.size()) + " key part(s) (from " + where(m.pos) +
                        "), here " + std::to_string(keys.size()));
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (m.key_is_str[i] != keys[i])
        error(*target.kids[i], "key part " + std::to_string(i + 1) + " of " + target.name + " is " +
                                   (m.key_is_str[i] ? "a string" : "an integer") + " (from " + where(m.pos) + ")");
    // A stack prints as lines of its own; no other string may take its place (or share its layout).
    for (std::size_t i = 0; i < keys.size() && i < key_stack_.size(); ++i)
      if (m.key_is_stack.size() == keys.size() && m.key_is_stack[i] != key_stack_[i])
        error(*target.kids[i], "key part " + std::to_string(i + 1) + " of " + target.name +
                                   (m.key_is_stack[i] ? " is" : " is not") + " a kstack (from " + where(m.pos) + ")");
  }

  void map_assign(Stmt& s) {
    Expr& target = *s.target;
    target.op = Op::MapRead;
    std::vector<bool> keys = compile_keys(target);
    Expr& v = *s.value;
    if (v.kind == ExprKind::Call && is_aggregation(v.name)) {
      static const std::map<std::string, std::pair<MapKind, std::size_t>> kArity = {
          {"count", {MapKind::Count, 0}}, {"sum", {MapKind::Sum, 1}}, {"avg", {MapKind::Avg, 1}},
          {"min", {MapKind::Min, 1}},     {"max", {MapKind::Max, 1}}, {"hist", {MapKind::Hist, 1}},
          {"lhist", {MapKind::Lhist, 4}}};
      auto [kind, arity] = kArity.at(v.name);
      if (v.kids.size() != arity)
        error(v, v.name + "() takes " + std::to_string(arity) + " argument(s), not " + std::to_string(v.kids.size()),
              v.name == "lhist"   ? "lhist(value, min, max, step)"
              : v.name == "count" ? "count()"
                                  : v.name + "(value)");
      if (arity > 0) want_int(*v.kids[0], v.name + "()'s value");
      std::int64_t lo = 0, hi = 0, step = 0;
      if (kind == MapKind::Lhist) {
        lo = constant(*v.kids[1], "lhist()'s min");
        hi = constant(*v.kids[2], "lhist()'s max");
        step = constant(*v.kids[3], "lhist()'s step");
        if (step <= 0) error(*v.kids[3], "lhist()'s step must be positive");
        if (hi <= lo) error(*v.kids[2], "lhist()'s max must be above its min");
        if ((hi - lo) % step != 0) error(*v.kids[3], "lhist()'s step must divide max - min");
        if ((hi - lo) / step > kMaxLhistBuckets)
          error(*v.kids[3], "lhist() would have more than " + std::to_string(kMaxLhistBuckets) + " buckets",
                "use a larger step");
      }
      MapDecl& m = declare(target, kind, keys, v);
      if (kind == MapKind::Lhist) {
        if (m.step == 0) {
          m.lo = lo, m.hi = hi, m.step = step;
        } else if (m.lo != lo || m.hi != hi || m.step != step) {
          error(v, target.name + " was declared lhist(x, " + std::to_string(m.lo) + ", " + std::to_string(m.hi) + ", " +
                       std::to_string(m.step) + ") at " + where(m.pos) + "; the bounds must not change");
        }
      }
      s.agg = static_cast<int>(kind);
      v.op = Op::None;
      return;
    }
    Type t = expression(v);
    if (t.kind == Type::Kind::Array && t.char_like) t = to_string(s.value);
    if (t.kind != Type::Kind::Str && !t.is_int())
      error(*s.value, "a map value must be an integer, a string or an aggregation, not " + describe(t),
            "store one of its fields (.FIELD) or elements ([N])");
    MapDecl* m = find_map(target.name);
    if (m && m->kind != MapKind::Int && m->kind != MapKind::Str && t.is_int() &&
        (m->kind == MapKind::Count || m->kind == MapKind::Sum)) {
      // `@m = @m + 1` style updates of a count()/sum() map would change its kind: refuse clearly.
      error(*s.value, target.name + " is " + map_kind_name(m->kind) + " (from " + where(m->pos) + "); assign it with " +
                          map_kind_name(m->kind) + " only");
    }
    declare(target, t.kind == Type::Kind::Str ? MapKind::Str : MapKind::Int, keys, *s.value);
  }

  std::int64_t constant(Expr& e, const std::string& what) {
    Type t = expression(e);
    bool neg = e.kind == ExprKind::Unary && e.name == "-" && e.kids[0]->kind == ExprKind::Int;
    if (!t.is_int() || (e.kind != ExprKind::Int && !neg)) error(e, what + " must be an integer constant");
    return neg ? -e.kids[0]->ival : e.ival;
  }

  void want_int(Expr& e, const std::string& what) {
    Type t = expression(e);
    if (!t.is_int()) error(e, what + " must be an integer, not " + describe(t));
  }

  // Wraps an expression in str(): char arrays read as strings.
  Type to_string(ExprPtr& e) {
    auto w = std::make_unique<Expr>(ExprKind::Call, e->pos, e->len, "str");
    w->kids.push_back(std::move(e));
    e = std::move(w);
    return expression(*e);
  }

  void want_string(ExprPtr& e, const std::string& what) {
    Type t = expression(*e);
    if (t.kind == Type::Kind::Array && t.char_like) t = to_string(e);
    if (t.kind != Type::Kind::Str)
      error(*e, what + " must be a string, not " + describe(t),
            t.is_int() ? "read a string from guest memory with str(" + std::string("addr") + ")" : std::string{});
  }

  // ---- expressions ----
  Type expression(Expr& e) {
    e.type = compute(e);
    return e.type;
  }

  Type compute(Expr& e) {
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

  bool in_hit_block(const Expr& e, const char* what) {
    if (any_hitless_)
      error(e, std::string(what) + " is only known in kprobe and kretprobe probes",
            "BEGIN, END and interval run in Dom0, not on a guest vCPU");
    return true;
  }

  Type builtin(Expr& e) {
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

  Type call(Expr& e) {
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
        if (len < 1 || len > kMaxStrLen)
          error(*e.kids[1], "str()'s length must be 1 ... " + std::to_string(kMaxStrLen));
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
  Type kstack(Expr& e, std::int64_t frames) {
    in_hit_block(e, "kstack");
    if (&e != stack_allowed_)
      error(e, "kstack can only be a map key or printed", "@[kstack] = count(); or printf(\"%s\\n\", kstack);");
    e.op = Op::Kstack;
    e.offset = frames;
    c_.uses_kstack = true;
    return Type::string();
  }

  // -1 in the first pass for a map no statement before has assigned (yet).
  int map_slot(Expr& m) {
    MapDecl* d = find_map(m.name);
    if (!d) {
      if (lenient_) return -1;
      error(m, m.name + " is never assigned", "assign it somewhere: " + m.name + " = count(); for example");
    }
    m.slot = static_cast<int>(d - c_.maps.data());
    m.op = Op::MapRead;
    return m.slot;
  }

  Type map_read(Expr& e) {
    int slot = map_slot(e);
    if (slot < 0) return Type::integer();  // first pass: assigned further down
    MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
    check_keys(d, e, compile_keys(e));
    e.slot = slot;
    e.op = Op::MapRead;
    if (d.kind == MapKind::Hist || d.kind == MapKind::Lhist)
      error(e, e.name + " is " + map_kind_name(d.kind) + ": it has no single value", "print(" + e.name + ")");
    return d.kind == MapKind::Str ? Type::string() : Type::integer();
  }

  Type binary(Expr& e) {
    const std::string& o = e.name;
    Type a = expression(*e.kids[0]);
    Type b = expression(*e.kids[1]);
    if (o == "==" || o == "!=") {
      if (a.kind == Type::Kind::Array && a.char_like) a = to_string(e.kids[0]);
      if (b.kind == Type::Kind::Array && b.char_like) b = to_string(e.kids[1]);
      if (a.kind == Type::Kind::Str && b.kind == Type::Kind::Str) {
        e.op = o == "==" ? Op::StrEq : Op::StrNe;
        return Type::integer();
      }
    }
    if (!a.is_int() || !b.is_int()) {
      const Expr& bad = a.is_int() ? *e.kids[1] : *e.kids[0];
      error(bad, "'" + o + "' needs integers, not " + describe(a.is_int() ? b : a),
            (a.kind == Type::Kind::Str || b.kind == Type::Kind::Str) && (o == "==" || o == "!=")
                ? "compare a string with a string: str(arg0) == \"name\""
                : std::string{});
    }
    static const std::map<std::string, Op> kOps = {
        {"+", Op::Add}, {"-", Op::Sub}, {"*", Op::Mul},  {"/", Op::Div},  {"%", Op::Mod},     {"&", Op::And},
        {"|", Op::Or},  {"^", Op::Xor}, {"<<", Op::Shl}, {">>", Op::Shr}, {"==", Op::Eq},     {"!=", Op::Ne},
        {"<", Op::Lt},  {"<=", Op::Le}, {">", Op::Gt},   {">=", Op::Ge},  {"&&", Op::LogAnd}, {"||", Op::LogOr}};
    e.op = kOps.at(o);
    return Type::integer();
  }

  Type cast(Expr& e) {
    Type inner = expression(*e.kids[0]);
    if (!inner.is_int()) error(*e.kids[0], "only integers and pointers can be cast, not " + describe(inner));
    if (!e.name.starts_with("struct ") && !e.name.starts_with("union ")) {
      e.op = Op::IntCast;
      const bool is_signed = e.name[0] == 'i';
      const int bits = std::stoi(e.name.substr(is_signed ? 3 : 4));
      e.offset = bits;
      e.load_signed = is_signed;
      return Type::integer();
    }
    const bool is_union = e.name.starts_with("union ");
    std::string rec = e.name.substr(is_union ? 6 : 7);
    rec.resize(rec.size() - 2);  // " *"
    if (!types_) no_types(e, "casting to '" + e.name + "' needs the guest kernel's types");
    auto id = types_->find_record(rec, is_union);
    if (!id)
      error(e, "no " + std::string(is_union ? "union " : "struct ") + rec + " in " + types_->description(),
            types_->missing_type_hint());
    e.op = Op::PtrCast;
    Type t{Type::Kind::Ptr, *id};
    return t;
  }

  // The type an object of BTF type `id` has once read (or addressed) at run time.
  Type from_btf(const Expr& e, std::uint32_t id, Op& op, std::uint32_t& load_size, bool& load_signed, bool addr_op) {
    TypeDesc d = types_->describe(id);
    switch (d.kind) {
      case TypeDesc::Kind::Int:
        if (d.size != 1 && d.size != 2 && d.size != 4 && d.size != 8)
          error(e, "'" + e.name + "' is a " + std::to_string(d.size) + "-byte integer, which xenprobe cannot read");
        op = addr_op ? Op::Load : Op::IndexLoad;
        load_size = d.size;
        load_signed = d.is_signed;
        return Type{Type::Kind::Int, 0, d.size, 0, d.is_signed};
      case TypeDesc::Kind::Ptr: {
        op = addr_op ? Op::Load : Op::IndexLoad;
        load_size = 8;
        load_signed = false;
        Type t{Type::Kind::Ptr, d.target};
        TypeDesc p = types_->describe(d.target);
        t.char_like = p.kind == TypeDesc::Kind::Int && p.size == 1;
        return t;
      }
      case TypeDesc::Kind::Record:
        op = addr_op ? Op::AddrOffset : Op::IndexAddr;
        return Type{Type::Kind::Record, d.id, d.size};
      case TypeDesc::Kind::Array: {
        op = addr_op ? Op::AddrOffset : Op::IndexAddr;
        Type t{Type::Kind::Array, d.target, d.size, d.count};
        TypeDesc el = types_->describe(d.target);
        t.char_like = el.kind == TypeDesc::Kind::Int && el.size == 1;
        return t;
      }
      case TypeDesc::Kind::Other: break;
    }
    error(e, "'" + e.name + "' has a type xenprobe cannot read (" + d.name + ")");
  }

  Type field(Expr& e) {
    Type base = expression(*e.kids[0]);
    if (!types_) no_types(e, "field access needs the guest kernel's types");
    std::uint32_t record = 0;
    if (base.kind == Type::Kind::Ptr) {
      TypeDesc p = types_->describe(base.btf);
      if (p.kind != TypeDesc::Kind::Record)
        error(e,
              "'" + std::string(e.arrow ? "->" : ".") + e.name + "' needs a pointer to a struct, not to " +
                  (p.name.empty() ? "void" : p.name),
              "cast the pointer to the struct it points to: ((struct NAME *)PTR)->" + e.name);
      if (!e.arrow) error(e, "'." + e.name + "' on a pointer", "use '->" + e.name + "'");
      record = p.id;
    } else if (base.kind == Type::Kind::Record) {
      if (e.arrow) error(e, "'->" + e.name + "' on a struct", "use '." + e.name + "'");
      record = base.btf;
    } else {
      error(e,
            "'" + std::string(e.arrow ? "->" : ".") + e.name + "' needs a " + (e.arrow ? "struct pointer" : "struct") +
                ", not " + describe(base),
            "cast the address first: ((struct NAME *)arg0)->" + e.name);
    }
    auto m = types_->member(record, e.name);
    if (!m) {
      std::vector<std::string> names = types_->member_names(record);
      std::string hint = "its fields: ";
      for (std::size_t i = 0; i < names.size() && i < 12; ++i) hint += (i ? ", " : "") + names[i];
      if (names.size() > 12) hint += ", ... (" + std::to_string(names.size()) + " in all)";
      error(e, types_->describe(record).name + " has no field '" + e.name + "'", names.empty() ? "" : hint);
    }
    if (m->misaligned) error(e, "'" + e.name + "' starts inside a byte and is no bitfield, which xenprobe cannot read");
    e.offset = m->offset;
    Type t = from_btf(e, m->type, e.op, e.load_size, e.load_signed, true);
    if (m->bitfield) {
      // The bytes that hold its bits, loaded whole (1, 2, 4 or 8), then shifted and masked.
      const std::uint32_t bits = m->bit_shift + m->bitfield;
      if (t.kind != Type::Kind::Int) error(e, "'" + e.name + "' is a bitfield of a type xenprobe cannot read");
      if (m->bitfield > 64 || bits > 64)
        error(e, "'" + e.name + "' is a bitfield over more than 8 bytes, which xenprobe cannot read");
      e.bit_shift = static_cast<std::uint8_t>(m->bit_shift);
      e.bit_width = static_cast<std::uint8_t>(m->bitfield);
      e.load_size = bits <= 8 ? 1 : bits <= 16 ? 2 : bits <= 32 ? 4 : 8;
    }
    return t;
  }

  Type index(Expr& e) {
    Type base = expression(*e.kids[0]);
    want_int(*e.kids[1], "the index");
    std::uint32_t elem = 0;
    if ((base.kind == Type::Kind::Ptr && base.btf && types_) || base.kind == Type::Kind::Array) {
      elem = base.btf;
    } else {
      error(e, "indexing needs a typed pointer or an array, not " + describe(base),
            "cast the address first: ((struct NAME *)addr)[i]");
    }
    TypeDesc d = types_->describe(elem);
    if (d.size == 0) error(e, "the element type has no size");
    e.offset = d.size;
    e.name = "[]";
    return from_btf(e, elem, e.op, e.load_size, e.load_signed, false);
  }

  // ---- printf ----
  int format(Expr& e) {
    const Expr& fe = *e.kids[0];
    const std::string& f = fe.text;
    Format out;
    FormatPiece cur;
    std::size_t arg = 1;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i] != '%') {
        cur.literal += f[i];
        continue;
      }
      if (i + 1 < f.size() && f[i + 1] == '%') {
        cur.literal += '%';
        ++i;
        continue;
      }
      const std::size_t start = i++;
      std::string flags;
      while (i < f.size() && std::strchr("-+ #0", f[i])) flags += f[i++];
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) flags += f[i++];
      if (i < f.size() && f[i] == '.') {
        flags += f[i++];
        while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) flags += f[i++];
      }
      while (i < f.size() && std::strchr("hlzj", f[i])) ++i;  // length modifiers: every integer is 64-bit
      if (i >= f.size() || !std::strchr("diuxXocsp", f[i])) {
        Pos p = fe.pos;
        p.col += static_cast<int>(start) + 1;
        p.offset += start + 1;
        throw ProgramError(p, i - start + 1, "unknown printf conversion '" + f.substr(start, i - start + 1) + "'",
                           "conversions: %d %i %u %x %X %o %c %s %p and %%; flags, width and precision as in C");
      }
      char conv = f[i];
      if (arg >= e.kids.size())
        error(fe, "the format has more conversions than arguments (" + std::to_string(e.kids.size() - 1) + ")");
      if (conv == 's') {
        stack_allowed_ = e.kids[arg].get();
        want_string(e.kids[arg], "the argument of %s");
        stack_allowed_ = nullptr;
        cur.spec = "%" + flags + "s";
      } else {
        want_int(*e.kids[arg], std::string("the argument of %") + conv);
        cur.spec = "%" + flags + (conv == 'c' ? "c" : conv == 'p' ? "#llx" : std::string("ll") + conv);
      }
      cur.conv = conv;
      out.pieces.push_back(std::move(cur));
      cur = FormatPiece{};
      ++arg;
    }
    if (arg != e.kids.size()) error(*e.kids[arg], "printf() has more arguments than the format has conversions");
    if (!cur.literal.empty()) out.pieces.push_back(std::move(cur));
    c_.formats.push_back(std::move(out));
    return static_cast<int>(c_.formats.size() - 1);
  }

  Compiled& c_;
  const TypeSource* types_;
  const Expr* stack_allowed_ = nullptr;  // the one expression where kstack may stand now
  std::vector<bool> key_stack_;          // compile_keys: which key parts are kstack
  bool lenient_ = false;
  ProbeBlock* block_ = nullptr;
  std::map<std::string, VarInfo> vars_;
  bool all_kprobe_ = false, all_kretprobe_ = false, any_hitless_ = false;
};

TaskLayout task_layout(const TypeSource* types) {
  TaskLayout t;
  if (!types) {
    t.why_not = "give the guest kernel's BTF with --btf FILE";
    return t;
  }
  auto task = types->find_record("task_struct", false);
  if (!task) {
    t.why_not = "no struct task_struct in " + types->description();
    return t;
  }
  auto comm = types->member(*task, "comm");
  auto pid = types->member(*task, "pid");
  auto tgid = types->member(*task, "tgid");
  if (!comm || !pid || !tgid) {
    t.why_not = "struct task_struct in " + types->description() + " lacks comm, pid or tgid";
    return t;
  }
  // Linux 6.2 moved the task pointer into pcpu_hot; before, it is the per-CPU current_task.
  if (auto hot = types->percpu_offset("pcpu_hot")) {
    auto rec = types->find_record("pcpu_hot", false);
    auto cur = rec ? types->member(*rec, "current_task") : std::nullopt;
    if (!cur) {
      t.why_not = "pcpu_hot in " + types->description() + " has no current_task";
      return t;
    }
    t.current_percpu = *hot + cur->offset;
  } else if (auto ct = types->percpu_offset("current_task")) {
    t.current_percpu = *ct;
  } else {
    t.why_not = types->description() +
                " has neither of the per-CPU variables pcpu_hot and current_task "
                "(a BTF without per-CPU variables: pahole older than 1.18?)";
    return t;
  }
  TypeDesc c = types->describe(comm->type);
  t.comm_offset = comm->offset;
  t.comm_size = c.kind == TypeDesc::Kind::Array ? std::min<std::uint32_t>(c.size, 64) : 16;
  t.pid_offset = pid->offset;
  t.tgid_offset = tgid->offset;
  t.available = true;
  return t;
}

}  // namespace

Compiled compile(Program p, const TypeSource* types) {
  Compiled c;
  c.program = std::move(p);
  c.task = task_layout(types);
  Compiler comp(c, types);
  comp.run(true);   // the maps' kinds, whatever order the probes use them in
  comp.run(false);  // everything checked, in program order
  return c;
}

}  // namespace xenprobe
