// The semantic pass (compile.hpp): map assignments, their keys and aggregations.
#include "compile_internal.hpp"

namespace xenprobe {

// ---- maps ----
MapDecl* Compiler::find_map(const std::string& name) {
  for (MapDecl& m : c_.maps)
    if (m.name == name) return &m;
  return nullptr;
}

std::vector<bool> Compiler::compile_keys(Expr& target) {
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

MapDecl& Compiler::declare(Expr& target, MapKind kind, const std::vector<bool>& keys, const Expr& value) {
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

void Compiler::check_keys(const MapDecl& m, const Expr& target, const std::vector<bool>& keys) {
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

void Compiler::map_assign(Stmt& s) {
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

std::int64_t Compiler::constant(Expr& e, const std::string& what) {
  Type t = expression(e);
  bool neg = e.kind == ExprKind::Unary && e.name == "-" && e.kids[0]->kind == ExprKind::Int;
  if (!t.is_int() || (e.kind != ExprKind::Int && !neg)) error(e, what + " must be an integer constant");
  return neg ? -e.kids[0]->ival : e.ival;
}

void Compiler::want_int(Expr& e, const std::string& what) {
  Type t = expression(e);
  if (!t.is_int()) error(e, what + " must be an integer, not " + describe(t));
}

// Wraps an expression in str(): char arrays read as strings.
Type Compiler::to_string(ExprPtr& e) {
  auto w = std::make_unique<Expr>(ExprKind::Call, e->pos, e->len, "str");
  w->kids.push_back(std::move(e));
  e = std::move(w);
  return expression(*e);
}

void Compiler::want_string(ExprPtr& e, const std::string& what) {
  Type t = expression(*e);
  if (t.kind == Type::Kind::Array && t.char_like) t = to_string(e);
  if (t.kind != Type::Kind::Str)
    error(*e, what + " must be a string, not " + describe(t),
          t.is_int() ? "read a string from guest memory with str(" + std::string("addr") + ")" : std::string{});
}

}  // namespace xenprobe
