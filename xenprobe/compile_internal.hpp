// The semantic pass (compile.hpp), internal: the Compiler class its files share. compile.cpp has
// the statements and printf, compile_maps.cpp the maps, compile_expr.cpp the expressions and calls,
// compile_values.cpp map reads, operators, casts and what BTF types give.
#pragma once

#include "compile.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

namespace xenprobe {

// "line:col" of a position, for messages that point back at an earlier place.
std::string where(const Pos& p);
// bpftrace builtins and functions we do not have: what to use instead (nullptr if `name` is not one).
const char* unsupported_hint(std::string_view name);
bool is_aggregation(std::string_view n);

struct VarInfo {
  int slot;
  Type type;
};

class Compiler {
 public:
  Compiler(Compiled& out, const TypeSource* types) : c_(out), types_(types) {}

  void run(bool lenient);

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

  [[noreturn]] void error(const Expr& e, const std::string& what, std::string hint = {});
  [[noreturn]] void no_types(const Expr& e, const std::string& what);
  void body(std::vector<Stmt>& stmts);
  void statement(Stmt& s);
  static bool same_kind(const Type& a, const Type& b);
  static std::string describe(const Type& t);
  MapDecl* find_map(const std::string& name);
  std::vector<bool> compile_keys(Expr& target);
  MapDecl& declare(Expr& target, MapKind kind, const std::vector<bool>& keys, const Expr& value);
  void check_keys(const MapDecl& m, const Expr& target, const std::vector<bool>& keys);
  void map_assign(Stmt& s);
  std::int64_t constant(Expr& e, const std::string& what);
  void want_int(Expr& e, const std::string& what);
  Type to_string(ExprPtr& e);
  void want_string(ExprPtr& e, const std::string& what);
  Type expression(Expr& e);
  Type compute(Expr& e);
  bool in_hit_block(const Expr& e, const char* what);
  Type builtin(Expr& e);
  Type call(Expr& e);
  Type kstack(Expr& e, std::int64_t frames);
  int map_slot(Expr& m);
  Type map_read(Expr& e);
  Type binary(Expr& e);
  Type cast(Expr& e);
  Type from_btf(const Expr& e, std::uint32_t id, Op& op, std::uint32_t& load_size, bool& load_signed, bool addr_op);
  Type field(Expr& e);
  Type index(Expr& e);
  int format(Expr& e);

  Compiled& c_;
  const TypeSource* types_;
  const Expr* stack_allowed_ = nullptr;  // the one expression where kstack may stand now
  std::vector<bool> key_stack_;          // compile_keys: which key parts are kstack
  bool lenient_ = false;
  ProbeBlock* block_ = nullptr;
  std::map<std::string, VarInfo> vars_;
  bool all_kprobe_ = false, all_kretprobe_ = false, any_hitless_ = false;
};

}  // namespace xenprobe
