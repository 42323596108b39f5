// Running a compiled program (runtime.hpp). A hit walks the annotated tree: no parsing, no
// lookup by name, and no allocation unless a string is built or a map gains an entry.
#include "runtime.hpp"

#include <time.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <nlohmann/json.hpp>

namespace xenprobe {

namespace {

// Strings come from guest memory: in JSON, bytes that are not UTF-8 become U+FFFD instead of
// an exception; in text, control bytes are written as \xNN so that a guest cannot drive the
// operator's terminal.
std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      out += b;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---- Output ----

void Output::text(const std::string& domain, std::string_view s) {
  if (!prefix_) {
    std::fwrite(s.data(), 1, s.size(), out_);
    std::fflush(out_);
    return;
  }
  std::string& part = partial_[domain];
  for (char c : s) {
    part += c;
    if (c == '\n') {
      std::fprintf(out_, "[%s] %s", domain.c_str(), part.c_str());
      part.clear();
    }
  }
  std::fflush(out_);
}

void Output::record(const std::string& domain, const char* type, const std::string& data_json) {
  std::string line =
      std::string("{\"type\": \"") + type + "\", \"domain\": " + json_text(domain) + ", \"data\": " + data_json + "}\n";
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

void Output::warning(const std::string& domain, const std::string& msg) {
  std::fprintf(stderr, "xenprobe: %s: %s\n", domain.c_str(), msg.c_str());
}

void Output::flush() {
  for (auto& [domain, part] : partial_)
    if (!part.empty()) {
      std::fprintf(out_, "[%s] %s\n", domain.c_str(), part.c_str());
      part.clear();
    }
  std::fflush(out_);
}

// ---- Instance ----

namespace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int hist_index(std::int64_t x) {
  if (x < 0) return 0;
  if (x == 0) return 1;
  return 2 + (63 - std::countl_zero(static_cast<std::uint64_t>(x)));
}

// 1024 -> "1K", 3 -> "3": hist's labels, powers of two in binary units as bpftrace prints them.
std::string hist_label_value(std::uint64_t v) {
  static const char* kUnits[] = {"", "K", "M", "G", "T", "P", "E"};
  int unit = 0;
  while (v >= 1024 && v % 1024 == 0 && unit < 6) v /= 1024, ++unit;
  return std::to_string(v) + kUnits[unit];
}

bool key_less(const std::vector<Value>& a, const std::vector<Value>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].s != b[i].s) return a[i].s < b[i].s;
    if (a[i].i != b[i].i) return a[i].i < b[i].i;
  }
  return a.size() < b.size();
}

}  // namespace

Instance::Instance(const Compiled& c, Output& out, std::string domain, std::vector<std::int64_t> kaddrs, Limits l)
    : c_(c),
      out_(out),
      domain_(std::move(domain)),
      kaddrs_(std::move(kaddrs)),
      maps_(c.maps.size()),
      limits_(l),
      dropped_(c.maps.size(), 0),
      vars_(static_cast<std::size_t>(c.max_vars)) {}

void Instance::run(int b, const ProbeSite& site, xenprobes::HitContext* ctx, std::optional<std::int64_t> nsecs) {
  ctx_ = ctx;
  site_ = &site;
  nsecs_ = nsecs;
  leave_ = false;
  const ProbeBlock& block = c_.program.blocks[static_cast<std::size_t>(b)];
  if (!block.predicate || eval_int(*block.predicate) != 0) exec(block.body);
  ctx_ = nullptr;
}

void Instance::exec(const std::vector<Stmt>& body) {
  for (const Stmt& s : body) {
    if (leave_) return;
    statement(s);
  }
}

void Instance::statement(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::Expr: {
      const Expr& e = *s.value;
      if (e.kind == ExprKind::Call) {
        if (e.name == "printf") return do_printf(e);
        if (e.name == "print") return print_map(e.slot);
        if (e.name == "clear") return maps_[static_cast<std::size_t>(e.slot)].clear();
        if (e.name == "exit") {
          exit_ = leave_ = true;  // the rest of this action is skipped; END still runs
          if (ctx_) ctx_->stop();
          return;
        }
        if (e.name == "delete") {
          entry(*e.kids[0], false);  // encodes the key into key_
          maps_[static_cast<std::size_t>(e.slot)].erase(key_);
          return;
        }
      }
      Value v;
      eval(e, v);
      return;
    }
    case StmtKind::VarAssign: eval(*s.value, vars_[static_cast<std::size_t>(s.target->slot)]); return;
    case StmtKind::MapAssign: {
      if (s.agg >= 0) return aggregate(s);
      Value v;
      eval(*s.value, v);
      Entry* en = entry(*s.target, true);
      if (!en) return;  // the map is full: counted
      if (c_.maps[static_cast<std::size_t>(s.target->slot)].kind == MapKind::Str) en->s = std::move(v.s);
      else en->v = v.i;
      return;
    }
    case StmtKind::If:
      if (eval_int(*s.value) != 0) exec(s.then_body);
      else exec(s.else_body);
      return;
  }
}

Instance::Entry* Instance::entry(const Expr& target, bool create) {
  Value keys[kMaxKeys];
  const std::size_t n = target.kids.size();
  for (std::size_t i = 0; i < n; ++i) eval(*target.kids[i], keys[i]);
  const MapDecl& d = c_.maps[static_cast<std::size_t>(target.slot)];
  key_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (d.key_is_str[i]) {
      key_.append(keys[i].s);
      key_.push_back('\0');
    } else {
      key_.append(reinterpret_cast<const char*>(&keys[i].i), sizeof keys[i].i);
    }
  }
  Table& t = maps_[static_cast<std::size_t>(target.slot)];
  auto it = t.find(std::string_view(key_));
  if (it != t.end()) return &it->second;
  if (!create) return nullptr;
  if (t.size() >= limits_.max_map_keys) {
    if (dropped_[static_cast<std::size_t>(target.slot)]++ == 0)
      out_.warning(domain_, "map " + d.name + " is full (" + std::to_string(limits_.max_map_keys) +
                                " keys): updates with new keys are dropped and counted; raise the limit "
                                "(xenprobe --max-map-keys, xenprobesd max_map_keys) or clear() or delete() the map");
    return nullptr;
  }
  Entry e;
  e.keys.assign(std::make_move_iterator(keys), std::make_move_iterator(keys + n));
  if (d.kind == MapKind::Hist) e.buckets.assign(kHistBuckets, 0);
  if (d.kind == MapKind::Lhist) e.buckets.assign(static_cast<std::size_t>((d.hi - d.lo) / d.step + 2), 0);
  return &t.emplace(key_, std::move(e)).first->second;
}

void Instance::aggregate(const Stmt& s) {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(s.target->slot)];
  const Expr& call = *s.value;
  const std::int64_t x = call.kids.empty() ? 0 : eval_int(*call.kids[0]);
  Entry* e = entry(*s.target, true);
  if (!e) return;  // the map is full: counted
  switch (d.kind) {
    case MapKind::Count: ++e->v; break;
    case MapKind::Sum: e->v += x; break;
    case MapKind::Avg:
      e->v += x;
      ++e->n;
      break;
    case MapKind::Min:
      if (!e->n || x < e->v) e->v = x;
      e->n = 1;
      break;
    case MapKind::Max:
      if (!e->n || x > e->v) e->v = x;
      e->n = 1;
      break;
    case MapKind::Hist: ++e->buckets[static_cast<std::size_t>(hist_index(x))]; break;
    case MapKind::Lhist: {
      std::size_t last = e->buckets.size() - 1;
      std::size_t i = x < d.lo ? 0 : x >= d.hi ? last : static_cast<std::size_t>(1 + (x - d.lo) / d.step);
      ++e->buckets[i];
      break;
    }
    case MapKind::Int:
    case MapKind::Str: break;
  }
}

std::int64_t Instance::eval_int(const Expr& e) {
  Value v;
  eval(e, v);
  return v.i;
}

std::int64_t Instance::load(std::uint64_t addr, std::uint32_t size, bool is_signed) {
  if (!ctx_) {
    ++read_errors_;
    return 0;
  }
  std::uint64_t raw = 0;
  auto r = ctx_->read(xenprobes::Gva{addr}, std::as_writable_bytes(std::span(&raw, 1)).first(size));
  if (!r) {
    ++read_errors_;
    return 0;
  }
  if (size < 8 && is_signed) {
    const unsigned shift = 64 - size * 8;
    return static_cast<std::int64_t>(raw << shift) >> shift;
  }
  return static_cast<std::int64_t>(raw);
}

std::optional<std::uint64_t> Instance::current_task() {
  // x86-64 Linux keeps the per-CPU base in the kernel's gs base (the guest channel's mailbox
  // has none: the library asks Xen for it).
  auto base = ctx_->kernel_gs_base();
  if (!base) {
    ++read_errors_;
    return std::nullopt;
  }
  auto task = ctx_->read_u64(xenprobes::Gva{*base + c_.task.current_percpu});
  if (!task || *task == 0) {
    ++read_errors_;
    return std::nullopt;
  }
  return *task;
}

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

// ---- printing maps ----

std::vector<const Instance::Entry*> Instance::sorted(int slot) const {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  std::vector<const Entry*> es;
  for (const auto& [k, e] : maps_[static_cast<std::size_t>(slot)]) es.push_back(&e);
  auto value = [&](const Entry* e) { return d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v; };
  std::sort(es.begin(), es.end(), [&](const Entry* a, const Entry* b) {
    if (d.kind != MapKind::Str && d.kind != MapKind::Hist && d.kind != MapKind::Lhist && value(a) != value(b))
      return value(a) < value(b);
    return key_less(a->keys, b->keys);
  });
  return es;
}

namespace {

std::string key_text(const MapDecl& d, const std::vector<Value>& keys, const char* sep, bool text) {
  std::string s;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i) s += sep;
    const bool stack = i < d.key_is_stack.size() && d.key_is_stack[i];
    s += d.key_is_str[i] ? (text && !stack ? printable(keys[i].s) : keys[i].s) : std::to_string(keys[i].i);
  }
  return s;
}

struct Bucket {
  std::string label;
  bool has_min = false, has_max = false;
  std::int64_t min = 0, max = 0;
  std::uint64_t count = 0;
};

// The buckets from the first to the last non-empty one, with their text labels and the
// inclusive bounds JSON gives.
std::vector<Bucket> buckets_of(const MapDecl& d, const std::vector<std::uint64_t>& b) {
  std::vector<Bucket> out;
  std::size_t first = 0, last = b.size();
  while (first < b.size() && b[first] == 0) ++first;
  while (last > first && b[last - 1] == 0) --last;
  for (std::size_t i = first; i < last; ++i) {
    Bucket k;
    k.count = b[i];
    if (d.kind == MapKind::Hist) {
      if (i == 0) {
        k.label = "(..., 0)";
        k.has_max = true, k.max = -1;
      } else if (i == 1 || i == 2) {
        k.label = "[" + std::to_string(i - 1) + "]";
        k.has_min = k.has_max = true, k.min = k.max = static_cast<std::int64_t>(i - 1);
      } else {
        const std::uint64_t lo = 1ull << (i - 2);
        const std::uint64_t hi = lo << 1;  // 2^63 for the last bucket: still fits unsigned
        k.label = "[" + hist_label_value(lo) + ", " + hist_label_value(hi) + ")";
        k.has_min = k.has_max = true, k.min = static_cast<std::int64_t>(lo), k.max = static_cast<std::int64_t>(hi - 1);
      }
    } else {
      const std::size_t lastb = b.size() - 1;
      if (i == 0) {
        k.label = "(..., " + std::to_string(d.lo) + ")";
        k.has_max = true, k.max = d.lo - 1;
      } else if (i == lastb) {
        k.label = "[" + std::to_string(d.hi) + ", ...)";
        k.has_min = true, k.min = d.hi;
      } else {
        const std::int64_t lo = d.lo + static_cast<std::int64_t>(i - 1) * d.step;
        k.label = d.step == 1 ? "[" + std::to_string(lo) + "]"
                              : "[" + std::to_string(lo) + ", " + std::to_string(lo + d.step) + ")";
        k.has_min = k.has_max = true, k.min = lo, k.max = lo + d.step - 1;
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace

std::string Instance::map_text(int slot) const {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  std::string s;
  for (const Entry* e : sorted(slot)) {
    std::string name = d.name + (e->keys.empty() ? "" : "[" + key_text(d, e->keys, ", ", true) + "]");
    if (d.kind == MapKind::Hist || d.kind == MapKind::Lhist) {
      s += name + ":\n";
      std::vector<Bucket> bs = buckets_of(d, e->buckets);
      std::uint64_t top = 0;
      for (const Bucket& b : bs) top = std::max(top, b.count);
      char line[160];
      for (const Bucket& b : bs) {
        const int bar = top ? static_cast<int>(static_cast<double>(b.count) / static_cast<double>(top) * 52) : 0;
        std::snprintf(line, sizeof line, "%-16s%8llu |%-52s|\n", b.label.c_str(),
                      static_cast<unsigned long long>(b.count),
                      std::string(static_cast<std::size_t>(bar), '@').c_str());
        s += line;
      }
      s += "\n";
    } else if (d.kind == MapKind::Str) {
      s += name + ": " + printable(e->s) + "\n";
    } else {
      const std::int64_t v = d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v;
      s += name + ": " + std::to_string(v) + "\n";
    }
  }
  if (d.kind != MapKind::Hist && d.kind != MapKind::Lhist) s += "\n";
  return s;
}

std::string Instance::map_json(int slot, const char** type) const {
  using nlohmann::ordered_json;
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  const bool hist = d.kind == MapKind::Hist || d.kind == MapKind::Lhist;
  *type = hist ? "hist" : "map";
  auto value = [&](const Entry* e) -> ordered_json {
    if (hist) {
      ordered_json arr = ordered_json::array();
      for (const Bucket& b : buckets_of(d, e->buckets)) {
        ordered_json o;
        if (b.has_min) o["min"] = b.min;
        if (b.has_max) o["max"] = b.max;
        o["count"] = b.count;
        arr.push_back(std::move(o));
      }
      return arr;
    }
    if (d.kind == MapKind::Str) return e->s;
    return d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v;
  };
  ordered_json data;
  if (d.key_is_str.empty()) {
    auto es = sorted(slot);
    data[d.name] = es.empty() ? ordered_json() : value(es.front());
  } else {
    ordered_json m = ordered_json::object();
    for (const Entry* e : sorted(slot)) m[key_text(d, e->keys, ",", false)] = value(e);
    data[d.name] = std::move(m);
  }
  return json_text(data);
}

void Instance::print_map(int slot) {
  if (maps_[static_cast<std::size_t>(slot)].empty()) return;
  if (out_.format() == OutputFormat::Json) {
    const char* type = "map";
    std::string data = map_json(slot, &type);
    out_.record(domain_, type, data);
  } else {
    out_.text(domain_, map_text(slot));
  }
}

void Instance::print_all_maps() {
  std::vector<int> order(c_.maps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return c_.maps[static_cast<std::size_t>(a)].name < c_.maps[static_cast<std::size_t>(b)].name;
  });
  for (int m : order) print_map(m);
}

std::map<std::string, std::int64_t> Instance::snapshot(const std::string& map) const {
  std::map<std::string, std::int64_t> out;
  for (std::size_t slot = 0; slot < c_.maps.size(); ++slot) {
    const MapDecl& d = c_.maps[slot];
    if (d.name != map) continue;
    for (const auto& [k, e] : maps_[slot]) {
      std::int64_t v = d.kind == MapKind::Avg ? (e.n ? e.v / e.n : 0) : e.v;
      if (d.kind == MapKind::Hist || d.kind == MapKind::Lhist) {
        v = 0;
        for (auto b : e.buckets) v += static_cast<std::int64_t>(b);
      }
      out[key_text(d, e.keys, ",", false)] = v;
    }
  }
  return out;
}

}  // namespace xenprobe
