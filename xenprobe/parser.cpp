// The lexer and recursive-descent parser of the xenprobe language (grammar: docs/xenprobe.md).
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>

#include "lang.hpp"

namespace xenprobe {

std::string format_error(const ProgramError& e, std::string_view source, std::string_view file) {
  std::string out = std::string(file) + ":" + std::to_string(e.pos.line) + ":" + std::to_string(e.pos.col) +
                    ": error: " + e.what() + "\n";
  std::size_t start = std::min(e.pos.offset, source.size());
  while (start > 0 && source[start - 1] != '\n') --start;
  std::size_t end = source.find('\n', start);
  if (end == std::string_view::npos) end = source.size();
  std::string_view line = source.substr(start, end - start);
  if (!line.empty()) {
    out += std::string(line) + "\n";
    // Tabs stay tabs under the caret, so it lines up in a terminal.
    std::string pad;
    for (std::size_t i = start; i < e.pos.offset && i < end; ++i) pad += source[i] == '\t' ? '\t' : ' ';
    std::size_t n = std::min(e.length, std::max<std::size_t>(1, end - std::min(e.pos.offset, end)));
    out += pad + "^" + std::string(n > 1 ? n - 1 : 0, '~') + "\n";
  }
  if (!e.hint.empty()) out += e.hint + "\n";
  return out;
}

namespace {

enum class Tok : std::uint8_t { End, Ident, Int, Str, Map, Var, Punct };

struct Token {
  Tok kind = Tok::End;
  Pos pos;
  std::string text;  // identifier, punctuation, map/var name (with its sigil), decoded string
  std::int64_t ival = 0;
  std::size_t len = 1;
};

// What bpftrace has and we do not, with what to use instead.
struct Unsupported {
  const char* name;
  const char* hint;
};
constexpr Unsupported kUnsupportedProbes[] = {
    {"uprobe", "xenprobe probes guest kernels only: user-space probes are not supported"},
    {"uretprobe", "xenprobe probes guest kernels only: user-space probes are not supported"},
    {"usdt", "xenprobe probes guest kernels only: user-space probes are not supported"},
    {"tracepoint",
     "tracepoints are not supported: probe the kernel function behind it, e.g. "
     "kprobe:do_sys_openat2 instead of tracepoint:syscalls:sys_enter_openat"},
    {"t", "tracepoints are not supported: probe the kernel function behind it with kprobe:FUNC"},
    {"rawtracepoint", "raw tracepoints are not supported: use kprobe:FUNC on the function that fires it"},
    {"kfunc", "BPF trampolines do not exist from Dom0: use kprobe:FUNC (and kretprobe:FUNC for the return)"},
    {"kretfunc", "BPF trampolines do not exist from Dom0: use kretprobe:FUNC"},
    {"fentry", "BPF trampolines do not exist from Dom0: use kprobe:FUNC"},
    {"fexit", "BPF trampolines do not exist from Dom0: use kretprobe:FUNC"},
    {"profile", "sampling profiles are not supported: use interval:ms:N for a periodic action in Dom0"},
    {"software", "perf events are not supported from Dom0"},
    {"hardware", "perf events are not supported from Dom0"},
    {"watchpoint", "watchpoints are not supported"},
    {"iter", "BPF iterators are not supported"},
};

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Program program() {
    Program p;
    skip_space();
    while (pos_.offset < src_.size()) {
      p.blocks.push_back(block());
      skip_space();
    }
    if (p.blocks.empty())
      throw ProgramError(pos_, 1, "the program has no probe",
                         "write at least one, e.g. kprobe:vfs_read { @[func] = count(); }");
    return p;
  }

 private:
  // ---- characters ----
  char at(std::size_t k = 0) const { return pos_.offset + k < src_.size() ? src_[pos_.offset + k] : '\0'; }
  void advance() {
    if (at() == '\n') {
      ++pos_.line;
      pos_.col = 1;
    } else {
      ++pos_.col;
    }
    ++pos_.offset;
  }
  void skip_space() {
    for (;;) {
      char c = at();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '/' && at(1) == '/') {
        while (at() && at() != '\n') advance();
      } else if (c == '/' && at(1) == '*') {
        Pos start = pos_;
        advance();
        advance();
        while (at() && !(at() == '*' && at(1) == '/')) advance();
        if (!at()) throw ProgramError(start, 2, "unterminated comment", "close it with */");
        advance();
        advance();
      } else {
        return;
      }
    }
  }

  // ---- tokens ----
  Token lex() {
    skip_space();
    Token t;
    t.pos = pos_;
    char c = at();
    if (!c) return t;
    auto ident_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      t.kind = Tok::Ident;
      while (ident_char(at())) t.text += at(), advance();
    } else if (c == '@' || c == '$') {
      t.kind = c == '@' ? Tok::Map : Tok::Var;
      t.text += c;
      advance();
      while (ident_char(at())) t.text += at(), advance();
      if (t.kind == Tok::Var && t.text.size() == 1)
        throw ProgramError(t.pos, 1, "'$' without a variable name", "scratch variables are written $name");
      if (t.kind == Tok::Var && std::isdigit(static_cast<unsigned char>(t.text[1])))
        throw ProgramError(t.pos, t.text.size(), "positional parameters (" + t.text + ") are not supported",
                           "write the value into the program");
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      t.kind = Tok::Int;
      std::string digits;
      while (ident_char(at())) digits += at(), advance();
      int base = 10;
      std::string_view d = digits;
      if (d.size() > 2 && d[0] == '0' && (d[1] == 'x' || d[1] == 'X')) base = 16, d.remove_prefix(2);
      std::uint64_t v = 0;
      auto r = std::from_chars(d.data(), d.data() + d.size(), v, base);
      if (r.ec != std::errc{} || r.ptr != d.data() + d.size())
        throw ProgramError(t.pos, digits.size(), "bad number '" + digits + "'",
                           "integers are decimal (42) or hexadecimal (0x2a)");
      t.ival = static_cast<std::int64_t>(v);
      t.text = digits;
    } else if (c == '"') {
      t.kind = Tok::Str;
      advance();
      while (at() != '"') {
        if (!at() || at() == '\n')
          throw ProgramError(t.pos, 1, "unterminated string", "close it with \" on the same line");
        if (at() == '\\') {
          advance();
          char e = at();
          switch (e) {
            case 'n': t.text += '\n'; break;
            case 't': t.text += '\t'; break;
            case 'r': t.text += '\r'; break;
            case '\\': t.text += '\\'; break;
            case '"': t.text += '"'; break;
            case '0': t.text += '\0'; break;
            default:
              throw ProgramError(pos_, 1, std::string("unknown escape '\\") + e + "'",
                                 "use \\n, \\t, \\r, \\\\, \\\" or \\0");
          }
          advance();
        } else {
          t.text += at();
          advance();
        }
      }
      advance();
    } else {
      static constexpr std::array<const char*, 22> kMulti = {
          "<<=", ">>=", "->", "==", "!=", "<=", ">=", "&&", "||", "<<", ">>",
          "++",  "--",  "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "::"};
      for (const char* m : kMulti) {
        std::size_t n = std::strlen(m);
        if (src_.substr(pos_.offset, n) == m) {
          t.kind = Tok::Punct;
          t.text = m;
          for (std::size_t i = 0; i < n; ++i) advance();
          t.len = n;
          return t;
        }
      }
      if (!std::strchr("+-*/%&|^!~<>=(){}[],;?:.", c))
        throw ProgramError(pos_, 1, std::string("unexpected character '") + c + "'");
      t.kind = Tok::Punct;
      t.text = c;
      advance();
    }
    t.len = pos_.offset - t.pos.offset;
    return t;
  }

  const Token& peek() {
    if (!have_) {
      tok_ = lex();
      have_ = true;
    }
    return tok_;
  }
  Token next() {
    peek();
    have_ = false;
    return std::move(tok_);
  }
  bool is(const char* punct) { return peek().kind == Tok::Punct && peek().text == punct; }
  bool accept(const char* punct) {
    if (!is(punct)) return false;
    next();
    return true;
  }
  Token expect(const char* punct, const char* where) {
    if (!is(punct)) {
      const Token& t = peek();
      std::string got = t.kind == Tok::End ? "the end of the program" : "'" + t.text + "'";
      throw ProgramError(t.pos, t.len, std::string("expected '") + punct + "' " + where + ", found " + got);
    }
    return next();
  }

  // ---- probes ----
  ProbeBlock block() {
    ProbeBlock b;
    for (;;) {
      b.specs.push_back(probe_spec());
      skip_space();
      if (at() == ',') {
        advance();
        skip_space();
        continue;
      }
      break;
    }
    if (at() == '/' && at(1) != '/' && at(1) != '*') {
      advance();
      in_predicate_ = true;
      b.predicate = expr();
      in_predicate_ = false;
      expect("/", "to end the predicate (a division inside a predicate needs parentheses)");
    }
    if (!is("{")) {
      const Token& t = peek();
      throw ProgramError(t.pos, t.len, "expected '{' to start the probe's actions, found '" + t.text + "'",
                         "a probe is written PROBE[, PROBE...] [/predicate/] { actions }");
    }
    b.body = braced_body();
    return b;
  }

  ProbeSpec probe_spec() {
    ProbeSpec s;
    s.pos = pos_;
    auto probe_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_:*?+.[]-", c); };
    while (at() && probe_char(at())) s.text += at(), advance();
    if (s.text.empty())
      throw ProgramError(
          pos_, 1, std::string("expected a probe, found '") + (at() ? std::string(1, at()) : "end") + "'",
          "probes: kprobe:FUNC, kprobe:FUNC+OFFSET, kretprobe:FUNC, BEGIN, END, interval:s:N, interval:ms:N");
    const std::size_t len = s.text.size();
    std::string_view text = s.text;
    auto colon = text.find(':');
    std::string_view type = text.substr(0, colon);
    std::string_view rest = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
    if ((type == "BEGIN" || type == "begin") && colon == std::string_view::npos) {
      s.kind = ProbeKind::Begin;
    } else if ((type == "END" || type == "end") && colon == std::string_view::npos) {
      s.kind = ProbeKind::End;
    } else if (type == "kprobe" || type == "k" || type == "kretprobe" || type == "kr") {
      s.kind = type.size() > 1 && type[1] == 'r' ? ProbeKind::Kretprobe : ProbeKind::Kprobe;
      // kprobe:MODULE:FUNC: a loaded module's function (bpftrace's syntax), as "MODULE:FUNC".
      std::string_view module;
      if (auto mc = rest.find(':'); mc != std::string_view::npos) {
        module = rest.substr(0, mc);
        rest = rest.substr(mc + 1);
        if (module.empty() || rest.find(':') != std::string_view::npos ||
            !std::all_of(module.begin(), module.end(),
                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.-", c); }))
          throw ProgramError(s.pos, len, "bad module qualifier in '" + s.text + "'",
                             "write kprobe:MODULE:FUNC (a loaded module's function) or kprobe:FUNC");
      }
      auto plus = rest.find('+');
      std::string_view func = rest.substr(0, plus);
      if (func.empty())
        throw ProgramError(s.pos, len, "'" + s.text + "' names no function", "write kprobe:FUNC, e.g. kprobe:vfs_read");
      for (char c : func)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.*?[]", c)))
          throw ProgramError(s.pos, len, "bad function name in '" + s.text + "'");
      s.function = module.empty() ? std::string(func) : std::string(module) + ":" + std::string(func);
      s.wildcard = s.function.find_first_of("*?[") != std::string_view::npos;
      if (plus != std::string_view::npos) {
        std::string_view off = rest.substr(plus + 1);
        if (s.kind == ProbeKind::Kretprobe)
          throw ProgramError(s.pos, len, "a kretprobe cannot have an offset",
                             "kretprobe:FUNC fires when FUNC returns; use kprobe:FUNC+OFFSET for an instruction");
        if (s.wildcard)
          throw ProgramError(s.pos, len, "a wildcard probe cannot have an offset",
                             "name one function: kprobe:FUNC+OFFSET");
        int base = 10;
        if (off.size() > 2 && off[0] == '0' && (off[1] == 'x' || off[1] == 'X')) base = 16, off.remove_prefix(2);
        auto r = std::from_chars(off.data(), off.data() + off.size(), s.offset, base);
        if (off.empty() || r.ec != std::errc{} || r.ptr != off.data() + off.size())
          throw ProgramError(s.pos, len, "bad offset in '" + s.text + "'", "write kprobe:FUNC+0x1a or kprobe:FUNC+26");
      }
    } else if (type == "interval" || type == "i") {
      auto c2 = rest.find(':');
      std::string_view unit = rest.substr(0, c2);
      std::string_view num = c2 == std::string_view::npos ? std::string_view{} : rest.substr(c2 + 1);
      std::uint64_t scale = unit == "s" ? 1'000'000'000ull : unit == "ms" ? 1'000'000ull : unit == "us" ? 1'000ull : 0;
      std::uint64_t n = 0;
      auto r = std::from_chars(num.data(), num.data() + num.size(), n);
      if (!scale || num.empty() || r.ec != std::errc{} || r.ptr != num.data() + num.size() || n == 0)
        throw ProgramError(s.pos, len, "bad interval '" + s.text + "'", "write interval:s:N or interval:ms:N (N > 0)");
      if (n > 1'000'000'000ull * 1000 / scale)
        throw ProgramError(s.pos, len, "interval '" + s.text + "' is too long", "use at most 1000 seconds");
      s.kind = ProbeKind::Interval;
      s.interval_ns = n * scale;
    } else {
      for (const Unsupported& u : kUnsupportedProbes)
        if (type == u.name)
          throw ProgramError(s.pos, len, "'" + std::string(type) + "' probes are not supported", u.hint);
      throw ProgramError(
          s.pos, len, "unknown probe type '" + std::string(type) + "'",
          "probes: kprobe:FUNC, kprobe:FUNC+OFFSET, kretprobe:FUNC, BEGIN, END, interval:s:N, interval:ms:N");
    }
    return s;
  }

  // ---- statements ----
  std::vector<Stmt> braced_body() {
    Nest n(*this);
    Token open = expect("{", "to start a block");
    std::vector<Stmt> body;
    while (!is("}")) {
      if (peek().kind == Tok::End)
        throw ProgramError(open.pos, 1, "this block is not closed by the end of the program", "add '}'");
      if (accept(";")) continue;
      body.push_back(statement());
      if (body.back().kind == StmtKind::If) continue;
      if (!is("}")) expect(";", "after the statement");
    }
    next();
    return body;
  }

  Stmt statement() {
    const Token& t = peek();
    Stmt s;
    s.pos = t.pos;
    if (t.kind == Tok::Ident && t.text == "if") {
      next();
      s.kind = StmtKind::If;
      expect("(", "after 'if'");
      s.value = expr();
      expect(")", "to close the condition");
      s.then_body = braced_body();
      if (peek().kind == Tok::Ident && peek().text == "else") {
        next();
        if (peek().kind == Tok::Ident && peek().text == "if") s.else_body.push_back(statement());
        else s.else_body = braced_body();
      }
      return s;
    }
    if (t.kind == Tok::Ident && (t.text == "while" || t.text == "for" || t.text == "unroll"))
      throw ProgramError(t.pos, t.len, "loops ('" + t.text + "') are not supported",
                         "handlers run while the guest vCPU waits: keep them straight-line (if/else is fine)");
    if (t.kind == Tok::Ident && t.text == "return")
      throw ProgramError(t.pos, t.len, "'return' is not supported", "use if/else, or a predicate /cond/ on the probe");
    if (t.kind == Tok::Map || t.kind == Tok::Var) {
      ExprPtr target = t.kind == Tok::Map ? map_ref() : var_ref();
      static constexpr const char* kCompound[] = {"+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="};
      if (is("=")) {
        next();
        s.kind = target->kind == ExprKind::MapRead ? StmtKind::MapAssign : StmtKind::VarAssign;
        s.value = expr();
        s.target = std::move(target);
        return s;
      }
      for (const char* op : kCompound) {
        if (is(op)) {
          Token o = next();
          std::string bin(op, std::strlen(op) - 1);
          s.kind = target->kind == ExprKind::MapRead ? StmtKind::MapAssign : StmtKind::VarAssign;
          s.value = binary(bin, o.pos, clone(*target), expr());
          s.target = std::move(target);
          return s;
        }
      }
      if (is("++") || is("--")) {
        Token o = next();
        s.kind = target->kind == ExprKind::MapRead ? StmtKind::MapAssign : StmtKind::VarAssign;
        auto one = std::make_unique<Expr>(ExprKind::Int, o.pos);
        one->ival = 1;
        s.value = binary(o.text == "++" ? "+" : "-", o.pos, clone(*target), std::move(one));
        s.target = std::move(target);
        return s;
      }
      // A bare map or variable read: an expression statement (unusual, but valid).
      s.kind = StmtKind::Expr;
      s.value = std::move(target);
      return s;
    }
    s.kind = StmtKind::Expr;
    s.value = expr();
    return s;
  }

  static ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>(e.kind, e.pos, e.len, e.name);
    c->text = e.text;
    c->ival = e.ival;
    c->arrow = e.arrow;
    for (const auto& k : e.kids) c->kids.push_back(clone(*k));
    return c;
  }

  static ExprPtr binary(std::string op, Pos pos, ExprPtr a, ExprPtr b) {
    auto e = std::make_unique<Expr>(ExprKind::Binary, pos, op.size(), std::move(op));
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr map_ref() {
    Token t = next();
    auto e = std::make_unique<Expr>(ExprKind::MapRead, t.pos, t.len, t.text);
    if (accept("[")) {
      if (is("]"))
        throw ProgramError(peek().pos, 1, "empty map key", "write @" + t.text.substr(1) + " for a map without keys");
      do e->kids.push_back(expr());
      while (accept(","));
      expect("]", "to close the map key");
    }
    return e;
  }

  ExprPtr var_ref() {
    Token t = next();
    return std::make_unique<Expr>(ExprKind::VarRead, t.pos, t.len, t.text);
  }

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

  ExprPtr expr() {
    Nest n(*this);
    Pos start = peek().pos;
    ++expr_nesting_;
    ExprPtr e = ternary();
    --expr_nesting_;
    // Long operator or field chains build deep trees without nesting: the checker and the
    // evaluator recurse over them, so their depth is bounded too (counted without recursion).
    if (expr_nesting_ == 0 && tree_depth(*e) > kMaxTreeDepth)
      throw ProgramError(
          start, 1,
          "this expression is too deep (more than " + std::to_string(kMaxTreeDepth) + " operators in a chain)",
          "split it with variables: $a = ...; $b = $a + ...;");
    return e;
  }

  static constexpr int kMaxTreeDepth = 1000;
  static int tree_depth(const Expr& root) {
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

  ExprPtr ternary() {
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

  static bool is_int_type_name(std::string_view n) {
    static constexpr const char* kNames[] = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"};
    return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
  }

  ExprPtr unary() {
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
                         t.text == "*"
                             ? "read through a typed pointer instead: ((struct foo *)arg0)->field, or str(ptr)"
                             : "addresses of guest objects: kaddr(\"symbol\")");
    if (t.kind == Tok::Punct && (t.text == "++" || t.text == "--"))
      throw ProgramError(t.pos, t.len, "prefix '" + t.text + "' is not supported",
                         "write @x++; or $x++; as a statement");
    return postfix(primary());
  }

  ExprPtr postfix(ExprPtr e) {
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

  ExprPtr primary() {
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

  std::string_view src_;
  Pos pos_;
  Token tok_;
  bool have_ = false;
  bool in_predicate_ = false;
  int nesting_ = 0;
  int expr_nesting_ = 0;  // expr() calls in progress: 0 again at a statement's whole expression
  int depth_ = 0;         // parentheses/brackets: a '/' inside them divides even in a predicate
};

}  // namespace

Program parse(std::string_view source) { return Parser(source).program(); }

}  // namespace xenprobe
