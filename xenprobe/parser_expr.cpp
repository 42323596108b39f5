// The xenprobe language's parser: expressions, by precedence (parser_internal.hpp).
#include "parser_internal.hpp"

namespace xenprobe {

ExprPtr Parser::expr() {
  Nest n(*this);
  Pos start = peek().pos;
  ++expr_nesting_;
  ExprPtr e = ternary();
  --expr_nesting_;
  // Long operator or field chains build deep trees without nesting: the checker and the
  // evaluator recurse over them, so their depth is bounded too (counted without recursion).
  if (expr_nesting_ == 0 && tree_depth(*e) > kMaxTreeDepth)
    throw ProgramError(
        start, 1, "this expression is too deep (more than " + std::to_string(kMaxTreeDepth) + " operators in a chain)",
        "split it with variables: $a = ...; $b = $a + ...;");
  return e;
}

int Parser::tree_depth(const Expr& root) {
  int deepest = 0;
  std::vector<std::pair<const Expr*, int>> todo{{&root, 1}};
  while (!todo.empty()) {
    auto [e, d] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, d);
    for (const auto& k : e->kids) todo.emplace_back(k.get(), d + 1);
  }
  return deepest;
}

ExprPtr Parser::ternary() {
  ExprPtr c = logical_or();
  if (is("?")) {
    Token q = next();
    auto e = std::make_unique<Expr>(ExprKind::Ternary, q.pos, 1, "?");
    e->kids.push_back(std::move(c));
    e->kids.push_back(expr());
    expect(":", "in the conditional expression");
    e->kids.push_back(ternary());
    return e;
  }
  if (is("=")) {
    const Token& t = peek();
    throw ProgramError(t.pos, 1, "assignment inside an expression",
                       "assign in a statement of its own (@m = x; $v = x;); compare with ==");
  }
  return c;
}

bool Parser::is_int_type_name(std::string_view n) {
  static constexpr const char* kNames[] = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
}

ExprPtr Parser::unary() {
  const Token& t = peek();
  if (t.kind == Tok::Punct && (t.text == "-" || t.text == "!" || t.text == "~")) {
    Nest n(*this);
    Token o = next();
    auto e = std::make_unique<Expr>(ExprKind::Unary, o.pos, 1, o.text);
    e->kids.push_back(unary());
    return e;
  }
  if (t.kind == Tok::Punct && (t.text == "*" || t.text == "&"))
    throw ProgramError(t.pos, 1, std::string("unary '") + t.text + "' is not supported",
                       t.text == "*" ? "read through a typed pointer instead: ((struct foo *)arg0)->field, or str(ptr)"
                                     : "addresses of guest objects: kaddr(\"symbol\")");
  if (t.kind == Tok::Punct && (t.text == "++" || t.text == "--"))
    throw ProgramError(t.pos, t.len, "prefix '" + t.text + "' is not supported", "write @x++; or $x++; as a statement");
  return postfix(primary());
}

ExprPtr Parser::postfix(ExprPtr e) {
  for (;;) {
    if (is("->") || is(".")) {
      Token o = next();
      const Token& m = peek();
      if (m.kind != Tok::Ident) throw ProgramError(m.pos, m.len, "expected a field name after '" + o.text + "'");
      Token name = next();
      auto f = std::make_unique<Expr>(ExprKind::Field, name.pos, name.len, name.text);
      f->arrow = o.text == "->";
      f->kids.push_back(std::move(e));
      e = std::move(f);
    } else if (is("[")) {
      Token o = next();
      auto ix = std::make_unique<Expr>(ExprKind::Index, o.pos, 1, "[]");
      ix->kids.push_back(std::move(e));
      ++depth_;
      ix->kids.push_back(expr());
      --depth_;
      expect("]", "to close the index");
      e = std::move(ix);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::primary() {
  const Token& t = peek();
  switch (t.kind) {
    case Tok::Int: {
      Token n = next();
      auto e = std::make_unique<Expr>(ExprKind::Int, n.pos, n.len);
      e->ival = n.ival;
      return e;
    }
    case Tok::Str: {
      Token s = next();
      auto e = std::make_unique<Expr>(ExprKind::Str, s.pos, s.len);
      e->text = std::move(s.text);
      return e;
    }
    case Tok::Map: return map_ref();
    case Tok::Var: return var_ref();
    case Tok::Ident: {
      Token id = next();
      if (is("(")) {
        next();
        auto e = std::make_unique<Expr>(ExprKind::Call, id.pos, id.len, id.text);
        ++depth_;
        if (!is(")")) {
          do e->kids.push_back(expr());
          while (accept(","));
        }
        --depth_;
        expect(")", ("to close the call of " + id.text + "()").c_str());
        return e;
      }
      return std::make_unique<Expr>(ExprKind::Builtin, id.pos, id.len, id.text);
    }
    case Tok::Punct:
      if (t.text == "(") {
        Token open = next();
        ++depth_;
        // A cast: (struct NAME *), (union NAME *), (int8 ... uint64).
        if (peek().kind == Tok::Ident &&
            (peek().text == "struct" || peek().text == "union" || is_int_type_name(peek().text))) {
          std::string type = next().text;
          if (type == "struct" || type == "union") {
            if (peek().kind != Tok::Ident)
              throw ProgramError(peek().pos, peek().len, "expected a type name after '" + type + "'");
            type += " " + next().text;
            int stars = 0;
            while (accept("*")) ++stars;
            if (stars != 1)
              throw ProgramError(open.pos, type.size() + 2,
                                 "cast to '" + type + std::string(stars, '*') + "' is not supported",
                                 "cast an address to a pointer: (" + type + " *)arg0");
            type += " *";
          }
          expect(")", "to close the cast");
          --depth_;
          auto e = std::make_unique<Expr>(ExprKind::Cast, open.pos, type.size() + 2, type);
          e->kids.push_back(unary());
          return e;
        }
        ExprPtr inner = expr();
        expect(")", "to close the parenthesis");
        --depth_;
        return inner;
      }
      [[fallthrough]];
    default: {
      std::string got = t.kind == Tok::End ? "the end of the program" : "'" + t.text + "'";
      throw ProgramError(t.pos, t.len, "expected an expression, found " + got);
    }
  }
}

}  // namespace xenprobe
