// The xenprobe language: a subset of bpftrace's (docs/xenprobe.md has the grammar). This file
// holds the syntax tree and the parser's interface; compile.hpp checks and annotates the tree,
// runtime.hpp runs it.
//
// The parser is hand-written recursive descent: every error carries the line and column of
// the offending text and, where we know it, what to write instead, which a generated parser
// makes hard to do well.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xenprobe {

struct Pos {
  int line = 1;
  int col = 1;
  std::size_t offset = 0;
};

// A program error found before anything is attached: where, what, and what to use instead.
struct ProgramError : std::runtime_error {
  Pos pos;
  std::size_t length;  // of the offending text (at least 1)
  std::string hint;    // "" if none
  // The program needs the guest kernel's types and was checked without any: given them (the
  // guest's own BTF, read from its memory) it may be valid.
  bool needs_types = false;
  ProgramError(Pos p, std::size_t len, const std::string& what, std::string h = {}, bool types = false)
      : std::runtime_error(what), pos(p), length(len ? len : 1), hint(std::move(h)), needs_types(types) {}
};

// "FILE:LINE:COL: error: WHAT", the source line, a caret under the offending text, the hint.
std::string format_error(const ProgramError&, std::string_view source, std::string_view file);

// ---- types (filled in by the compiler) ----

// What an expression yields. Int: a 64-bit integer (`bits`/`is_signed` say how it was read).
// Str: a string. Ptr: an address whose pointee is BTF type `btf` (0: unknown/void). Record: a
// struct/union in guest memory (the value is its address). Array: an array in guest memory
// (the value is its address; `btf` is the element type, `count` its length).
struct Type {
  enum class Kind : std::uint8_t { None, Int, Str, Ptr, Record, Array };
  Kind kind = Kind::None;
  std::uint32_t btf = 0;
  std::uint32_t size = 8;   // bytes of the object (Int: how many are read)
  std::uint32_t count = 0;  // Array: elements
  bool is_signed = true;
  bool char_like = false;  // Ptr/Array of a 1-byte integer: a C string

  static Type integer() { return {Kind::Int}; }
  static Type string() { return {Kind::Str}; }
  bool is_int() const { return kind == Kind::Int || kind == Kind::Ptr; }
  bool operator==(const Type&) const = default;
};

// ---- expressions ----

enum class ExprKind : std::uint8_t {
  Int,      // ival
  Str,      // text
  Builtin,  // name (arg0, retval, func, ...); `op` says which after compilation
  Call,     // name(kids...)
  MapRead,  // @name[kids...]
  VarRead,  // $name
  Binary,   // kids[0] name kids[1]
  Unary,    // name kids[0]   (- ~ !)
  Ternary,  // kids[0] ? kids[1] : kids[2]
  Cast,     // (name) kids[0]; name is "struct file *", "uint32", ...
  Field,    // kids[0]->name or kids[0].name (arrow)
  Index,    // kids[0][kids[1]]
};

// What the compiler decided an expression does at run time (the evaluator switches on it).
enum class Op : std::uint8_t {
  None,
  Const,
  ConstStr,
  Arg,
  Retval,
  Func,
  Probe,
  Cpu,
  Nsecs,
  Comm,
  Pid,
  Tid,
  Domain,
  Kaddr,
  Kstack,
  Str,
  MapRead,
  VarRead,
  Add,
  Sub,
  Mul,
  Div,
  Mod,
  And,
  Or,
  Xor,
  Shl,
  Shr,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogAnd,
  LogOr,
  StrEq,
  StrNe,
  Neg,
  Not,
  BitNot,
  Ternary,
  IntCast,
  PtrCast,
  Load,
  AddrOffset,
  IndexLoad,
  IndexAddr,
};

struct Expr {
  Expr(ExprKind k, Pos p, std::size_t l = 1, std::string n = {}) : kind(k), pos(p), len(l), name(std::move(n)) {}

  ExprKind kind;
  Pos pos;
  std::size_t len = 1;
  std::string name;  // builtin, function, map, variable, member, operator, cast type
  std::string text;  // string literal
  std::int64_t ival = 0;
  bool arrow = false;  // Field: `->` rather than `.`
  std::vector<std::unique_ptr<Expr>> kids;

  // Compiler annotations.
  Type type;
  Op op = Op::None;
  int slot = -1;            // map, variable, argument or kaddr index
  std::int64_t offset = 0;  // field offset, index element size, cast width...
  std::uint32_t load_size = 0;
  bool load_signed = false;
  // Load of a bitfield: bits [bit_shift, bit_shift + bit_width) of the load_size bytes loaded
  // (little-endian), sign-extended when load_signed. 0: the whole load.
  std::uint8_t bit_shift = 0, bit_width = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

// ---- statements ----

enum class StmtKind : std::uint8_t { Expr, MapAssign, VarAssign, If };

struct Stmt {
  StmtKind kind;
  Pos pos;
  ExprPtr target;  // MapAssign / VarAssign: the MapRead / VarRead assigned to
  ExprPtr value;   // the expression (If: the condition)
  std::vector<Stmt> then_body, else_body;
  int agg = -1;  // MapAssign: set by the compiler when `value` is an aggregation
};

// ---- probes ----

enum class ProbeKind : std::uint8_t { Kprobe, Kretprobe, Begin, End, Interval };

struct ProbeSpec {
  Pos pos;
  std::string text;  // as written: "kprobe:vfs_*"
  ProbeKind kind = ProbeKind::Kprobe;
  std::string function;      // kprobe/kretprobe: name or glob
  std::uint64_t offset = 0;  // kprobe: +offset
  bool wildcard = false;
  std::uint64_t interval_ns = 0;
};

struct ProbeBlock {
  std::vector<ProbeSpec> specs;
  ExprPtr predicate;  // may be null
  std::vector<Stmt> body;
  int vars = 0;  // scratch variables of this block (set by the compiler)
};

struct Program {
  std::vector<ProbeBlock> blocks;
};

// Parses a whole program. Throws ProgramError.
Program parse(std::string_view source);

}  // namespace xenprobe
