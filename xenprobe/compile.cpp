// The semantic pass (compile.hpp): the statements and printf; compile_internal.hpp says where the rest is.
#include "compile_internal.hpp"

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

constexpr const char* kAggregations[] = {"count", "sum", "avg", "min", "max", "hist", "lhist"};

}  // namespace

std::string where(const Pos& p) { return std::to_string(p.line) + ":" + std::to_string(p.col); }

const char* unsupported_hint(std::string_view name) {
  for (const auto& u : kUnsupported)
    if (name == u.name) return u.hint;
  return nullptr;
}

bool is_aggregation(std::string_view n) {
  return std::any_of(std::begin(kAggregations), std::end(kAggregations), [&](const char* a) { return n == a; });
}

void Compiler::run(bool lenient) {
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
    all_kretprobe_ =
        std::all_of(b.specs.begin(), b.specs.end(), [](const ProbeSpec& s) { return s.kind == ProbeKind::Kretprobe; });
    any_hitless_ = std::any_of(b.specs.begin(), b.specs.end(), [](const ProbeSpec& s) {
      return s.kind != ProbeKind::Kprobe && s.kind != ProbeKind::Kretprobe;
    });
    if (b.predicate) guarded([&] { want_int(*b.predicate, "the predicate"); });
    body(b.body);
    b.vars = static_cast<int>(vars_.size());
    c_.max_vars = std::max(c_.max_vars, b.vars);
  }
}

[[noreturn]] void Compiler::error(const Expr& e, const std::string& what, std::string hint) {
  throw ProgramError(e.pos, e.len, what, std::move(hint));
}

// The program needs types and has none (checked without the guest, e.g. with --check).
[[noreturn]] void Compiler::no_types(const Expr& e, const std::string& what) {
  throw ProgramError(e.pos, e.len, what,
                     "xenprobe reads them from the guest's memory when it runs; with --check, give them with "
                     "--btf FILE (the guest kernel's /sys/kernel/btf/vmlinux, or a vmlinux with .BTF)",
                     true);
}

void Compiler::body(std::vector<Stmt>& stmts) {
  for (Stmt& s : stmts) guarded([&] { statement(s); });
}

void Compiler::statement(Stmt& s) {
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

bool Compiler::same_kind(const Type& a, const Type& b) {
  if (a.is_int() && b.is_int()) return true;
  return a.kind == b.kind;
}

std::string Compiler::describe(const Type& t) {
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

// ---- printf ----
int Compiler::format(Expr& e) {
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

namespace {

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
