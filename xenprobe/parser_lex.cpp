// The xenprobe language's lexer: characters and tokens (parser_internal.hpp).
#include "parser_internal.hpp"

namespace xenprobe {

void Parser::advance() {
  if (at() == '\n') {
    ++pos_.line;
    pos_.col = 1;
  } else {
    ++pos_.col;
  }
  ++pos_.offset;
}

void Parser::skip_space() {
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
Token Parser::lex() {
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

const Token& Parser::peek() {
  if (!have_) {
    tok_ = lex();
    have_ = true;
  }
  return tok_;
}

Token Parser::next() {
  peek();
  have_ = false;
  return std::move(tok_);
}

bool Parser::accept(const char* punct) {
  if (!is(punct)) return false;
  next();
  return true;
}

Token Parser::expect(const char* punct, const char* where) {
  if (!is(punct)) {
    const Token& t = peek();
    std::string got = t.kind == Tok::End ? "the end of the program" : "'" + t.text + "'";
    throw ProgramError(t.pos, t.len, std::string("expected '") + punct + "' " + where + ", found " + got);
  }
  return next();
}

}  // namespace xenprobe
