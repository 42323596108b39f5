// The lexer and recursive-descent parser of the xenprobe language (grammar: docs/xenprobe.md),
// internal: the Parser class its files share. parser.cpp has the probes and statements,
// parser_lex.cpp the characters and tokens, parser_expr.cpp the expressions.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>

#include "lang.hpp"

namespace xenprobe {

enum class Tok : std::uint8_t { End, Ident, Int, Str, Map, Var, Punct };

struct Token {
  Tok kind = Tok::End;
  Pos pos;
  std::string text;  // identifier, punctuation, map/var name (with its sigil), decoded string
  std::int64_t ival = 0;
  std::size_t len = 1;
};

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Program program();

 private:
  // ---- characters ----
  char at(std::size_t k = 0) const { return pos_.offset + k < src_.size() ? src_[pos_.offset + k] : '\0'; }
  void advance();
  void skip_space();
  Token lex();
  const Token& peek();
  Token next();
  bool is(const char* punct) { return peek().kind == Tok::Punct && peek().text == punct; }
  bool accept(const char* punct);
  Token expect(const char* punct, const char* where);
  ProbeBlock block();
  ProbeSpec probe_spec();
  std::vector<Stmt> braced_body();
  Stmt statement();
  static ExprPtr clone(const Expr& e);
  static ExprPtr binary(std::string op, Pos pos, ExprPtr a, ExprPtr b);
  ExprPtr map_ref();
  ExprPtr var_ref();

  // ---- expressions, by precedence (C's) ----
  // A bound on nesting, so that no program can exhaust the stack.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting)
        throw ProgramError(p.peek().pos, 1,
                           "the program nests too deeply (more than " + std::to_string(kMaxNesting) + " levels)",
                           "use variables for intermediate values");
    }
    ~Nest() { --p.nesting_; }
  };
  static constexpr int kMaxNesting = 200;

  ExprPtr expr();

  static constexpr int kMaxTreeDepth = 1000;
  static int tree_depth(const Expr& root);
  ExprPtr ternary();

  template <typename Next>
  ExprPtr left_assoc(std::initializer_list<const char*> ops, Next next_level) {
    ExprPtr a = (this->*next_level)();
    for (;;) {
      const char* found = nullptr;
      for (const char* op : ops)
        if (is(op) && !(in_predicate_ && depth_ == 0 && std::strcmp(op, "/") == 0)) found = op;
      if (!found) return a;
      Token o = next();
      a = binary(o.text, o.pos, std::move(a), (this->*next_level)());
    }
  }
  ExprPtr logical_or() { return left_assoc({"||"}, &Parser::logical_and); }
  ExprPtr logical_and() { return left_assoc({"&&"}, &Parser::bit_or); }
  ExprPtr bit_or() { return left_assoc({"|"}, &Parser::bit_xor); }
  ExprPtr bit_xor() { return left_assoc({"^"}, &Parser::bit_and); }
  ExprPtr bit_and() { return left_assoc({"&"}, &Parser::equality); }
  ExprPtr equality() { return left_assoc({"==", "!="}, &Parser::relational); }
  ExprPtr relational() { return left_assoc({"<", "<=", ">", ">="}, &Parser::shift); }
  ExprPtr shift() { return left_assoc({"<<", ">>"}, &Parser::additive); }
  ExprPtr additive() { return left_assoc({"+", "-"}, &Parser::multiplicative); }
  ExprPtr multiplicative() { return left_assoc({"*", "/", "%"}, &Parser::unary); }

  static bool is_int_type_name(std::string_view n);
  ExprPtr unary();
  ExprPtr postfix(ExprPtr e);
  ExprPtr primary();

  std::string_view src_;
  Pos pos_;
  Token tok_;
  bool have_ = false;
  bool in_predicate_ = false;
  int nesting_ = 0;
  int expr_nesting_ = 0;  // expr() calls in progress: 0 again at a statement's whole expression
  int depth_ = 0;         // parentheses/brackets: a '/' inside them divides even in a predicate
};

}  // namespace xenprobe
