// The lexer and recursive-descent parser of the xenprobe language (grammar: docs/xenprobe.md):
// the probes and statements; parser_internal.hpp says where the rest is.
#include "parser_internal.hpp"

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

}  // namespace

Program Parser::program() {
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

// ---- probes ----
ProbeBlock Parser::block() {
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

ProbeSpec Parser::probe_spec() {
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
std::vector<Stmt> Parser::braced_body() {
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

Stmt Parser::statement() {
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

ExprPtr Parser::clone(const Expr& e) {
  auto c = std::make_unique<Expr>(e.kind, e.pos, e.len, e.name);
  c->text = e.text;
  c->ival = e.ival;
  c->arrow = e.arrow;
  for (const auto& k : e.kids) c->kids.push_back(clone(*k));
  return c;
}

ExprPtr Parser::binary(std::string op, Pos pos, ExprPtr a, ExprPtr b) {
  auto e = std::make_unique<Expr>(ExprKind::Binary, pos, op.size(), std::move(op));
  e->kids.push_back(std::move(a));
  e->kids.push_back(std::move(b));
  return e;
}

ExprPtr Parser::map_ref() {
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

ExprPtr Parser::var_ref() {
  Token t = next();
  return std::make_unique<Expr>(ExprKind::VarRead, t.pos, t.len, t.text);
}

Program parse(std::string_view source) { return Parser(source).program(); }

}  // namespace xenprobe
