// The semantic pass (compile.hpp): map reads, operators, casts, and the values BTF types give
// (fields, indexes).
#include "compile_internal.hpp"

namespace xenprobe {

// -1 in the first pass for a map no statement before has assigned (yet).
int Compiler::map_slot(Expr& m) {
  MapDecl* d = find_map(m.name);
  if (!d) {
    if (lenient_) return -1;
    error(m, m.name + " is never assigned", "assign it somewhere: " + m.name + " = count(); for example");
  }
  m.slot = static_cast<int>(d - c_.maps.data());
  m.op = Op::MapRead;
  return m.slot;
}

Type Compiler::map_read(Expr& e) {
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

Type Compiler::binary(Expr& e) {
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

Type Compiler::cast(Expr& e) {
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
Type Compiler::from_btf(const Expr& e, std::uint32_t id, Op& op, std::uint32_t& load_size, bool& load_signed,
                        bool addr_op) {
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

Type Compiler::field(Expr& e) {
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

Type Compiler::index(Expr& e) {
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

}  // namespace xenprobe
