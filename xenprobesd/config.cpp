// Reading and checking xenprobesd's TOML configuration (config.hpp, docs/xenprobesd.md).
#include "config.hpp"

#include <fnmatch.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "lang.hpp"
#include "runtime.hpp"

namespace xenprobesd {

namespace {

constexpr std::size_t kMaxConfigBytes = 4 << 20;  // the file, and each program file
constexpr std::size_t kMaxPrograms = 256;
constexpr std::size_t kMaxSelectors = 256;
constexpr const char* kCannotRunAsync = "cannot run with method = \"async\"";

// Formats every error like the xenprobe checker's: "FILE:LINE:COL: error: WHAT", the line,
// a caret, the hint.
class Reporter {
 public:
  Reporter(const std::string& text, const std::string& path) : text_(text), path_(path) {
    starts_.push_back(0);
    for (std::size_t i = 0; i < text_.size(); ++i)
      if (text_[i] == '\n') starts_.push_back(i + 1);
  }

  std::size_t offset(int line, int col) const {
    if (line < 1 || static_cast<std::size_t>(line) > starts_.size()) return text_.size();
    return std::min(text_.size(), starts_[line - 1] + static_cast<std::size_t>(std::max(col, 1) - 1));
  }

  xenprobe::Pos pos_at(std::size_t off) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), off);
    const std::size_t line = static_cast<std::size_t>(it - starts_.begin());
    return xenprobe::Pos{static_cast<int>(line), static_cast<int>(off - starts_[line - 1] + 1), off};
  }

  [[noreturn]] void fail(const toml::source_region& where, const std::string& what, const std::string& hint = {},
                         std::size_t len = 1) const {
    const int line = static_cast<int>(where.begin.line), col = static_cast<int>(where.begin.column);
    xenprobe::Pos p{line, col, offset(line, col)};
    throw ConfigError(xenprobe::format_error(xenprobe::ProgramError(p, len, what, hint), text_, path_));
  }

  const std::string& text() const { return text_; }
  const std::string& path() const { return path_; }

 private:
  const std::string& text_;
  const std::string& path_;
  std::vector<std::size_t> starts_;
};

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date or time";
  }
}

std::string q(std::string_view s) { return "\"" + std::string(s) + "\""; }

// Checks that every key of `t` is one of `allowed`, naming the first that is not.
void known_keys(const Reporter& r, const toml::table& t, std::initializer_list<std::string_view> allowed,
                const std::string& where) {
  for (auto&& [k, v] : t) {
    if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    r.fail(k.source(), "unknown key " + q(k.str()) + " in " + where, "the keys of " + where + " are: " + list,
           k.str().size());
  }
}

std::string get_string(const Reporter& r, const toml::node& n, const std::string& what) {
  auto s = n.value<std::string>();
  if (!n.is_string() || !s) r.fail(n.source(), what + " must be a string, not " + type_name(n));
  if (s->find('\0') != std::string::npos) r.fail(n.source(), what + " must not contain a NUL byte");
  return *s;
}

std::int64_t get_int(const Reporter& r, const toml::node& n, const std::string& what, std::int64_t lo,
                     std::int64_t hi) {
  if (!n.is_integer()) r.fail(n.source(), what + " must be an integer, not " + type_name(n));
  const std::int64_t v = *n.value<std::int64_t>();
  if (v < lo || v > hi)
    r.fail(n.source(),
           what + " is " + std::to_string(v) + "; give " + std::to_string(lo) + " ... " + std::to_string(hi));
  return v;
}

double get_number(const Reporter& r, const toml::node& n, const std::string& what, double lo, double hi) {
  if (!n.is_integer() && !n.is_floating_point()) r.fail(n.source(), what + " must be a number, not " + type_name(n));
  const double v = *n.value<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    std::ostringstream os;
    os << what << " is " << v << "; give a number from " << lo << " to " << hi;
    r.fail(n.source(), os.str());
  }
  return v;
}

bool is_program_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  if (!std::isalpha(static_cast<unsigned char>(s[0])) && s[0] != '_') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// A xenstore key below /local/domain/<id>/: path components of [A-Za-z0-9_.-], no "." or "..".
bool is_xenstore_key(std::string_view s) {
  if (s.empty() || s.size() > 256 || s.front() == '/' || s.back() == '/') return false;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find('/', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view part = s.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
    start = end + 1;
  }
  return true;
}

std::string read_limited(const std::string& path, std::string* why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = std::strerror(errno);
    return {};
  }
  std::string out;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<std::size_t>(in.gcount()));
    if (out.size() > kMaxConfigBytes) {
      *why = "larger than " + std::to_string(kMaxConfigBytes) + " bytes";
      return {};
    }
  }
  if (in.bad()) *why = std::strerror(errno);
  return out;
}

// "(from L:C)" in a checker message: where it is, and the program position it names.
struct PositionRef {
  std::size_t begin, end, line, col;
};
std::optional<PositionRef> find_position_ref(const std::string& s) {
  const std::size_t b = s.find("(from ");
  if (b == std::string::npos) return std::nullopt;
  std::size_t i = b + 6;
  auto number = [&](std::size_t& out) {
    const std::size_t from = i;
    out = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i - from < 9)
      out = out * 10 + (s[i++] - '0');
    return i > from;
  };
  PositionRef r{b, 0, 0, 0};
  if (!number(r.line) || i >= s.size() || s[i] != ':') return std::nullopt;
  ++i;
  if (!number(r.col) || i >= s.size() || s[i] != ')' || r.line == 0 || r.col == 0) return std::nullopt;
  r.end = i + 1;
  return r;
}

// Thrown by check_program for a program that compiles but cannot run from async records
// (method = "async"): the planner's refusal, in the daemon's words.
struct AsyncRefused {
  xenprobe::ProgramError error;
};

// Parses and checks a program without types, and plans its async probes. One that needs the
// guest kernel's types is kept parsed: each domain's attachment checks (and plans) it again
// with that domain's BTF (Daemon::attach). Throws ProgramError or AsyncRefused.
void check_program(ProgramConfig& p) {
  xenprobe::Compiled c;
  try {
    c = xenprobe::compile(xenprobe::parse(p.source), nullptr);
  } catch (const xenprobe::ProgramError& e) {
    if (!e.needs_types) throw;
    p.compiled = nullptr;
    p.parsed = std::make_shared<const xenprobe::Program>(xenprobe::parse(p.source));
    return;
  }
  if (p.method == Method::Async) {
    try {
      p.plans = std::make_shared<AsyncPlans::element_type>(plan_async_program(c));
    } catch (const xenprobe::ProgramError& e) { throw AsyncRefused{e}; }
  }
  p.compiled = std::make_shared<const xenprobe::Compiled>(std::move(c));
}

// The checker's hint, minus what speaks of xenprobe's --btf option (the daemon reads each
// guest's BTF from its memory; it has no such option).
std::string no_btf_hint(const xenprobe::ProgramError& e) {
  if (std::string_view(e.hint).find("--btf") == std::string_view::npos) return e.hint;
  return "";
}

Selector parse_selector(const Reporter& r, const toml::node& n, const std::string& prog) {
  const std::string where = "a domain selector of program " + q(prog);
  const toml::table* t = n.as_table();
  if (!t)
    r.fail(n.source(), where + " must be a table, not " + type_name(n),
           "write { name = \"web1\" }, { domid = 3 }, { glob = \"web*\" } or { xenstore = \"KEY\", value = \"GLOB\" }");
  known_keys(r, *t, {"name", "domid", "glob", "xenstore", "value"}, where);
  int kinds = (t->contains("name") ? 1 : 0) + (t->contains("domid") ? 1 : 0) + (t->contains("glob") ? 1 : 0) +
              (t->contains("xenstore") ? 1 : 0);
  if (kinds != 1)
    r.fail(n.source(),
           where + " must have exactly one of name, domid, glob and xenstore (it has " + std::to_string(kinds) + ")",
           "write one selector per table: domains = [{ name = \"web1\" }, { glob = \"db*\" }]");
  Selector s;
  if (auto* v = t->get("name")) {
    s.kind = Selector::Kind::Name;
    s.text = get_string(r, *v, "name");
    if (s.text.empty() || s.text.size() > 256) r.fail(v->source(), "a domain name has 1 to 256 bytes");
  } else if (auto* v = t->get("domid")) {
    s.kind = Selector::Kind::Domid;
    s.domid = static_cast<std::uint32_t>(get_int(r, *v, "domid", 1, 0x7fef));  // DOMID_FIRST_RESERVED - 1
  } else if (auto* v = t->get("glob")) {
    s.kind = Selector::Kind::Glob;
    s.text = get_string(r, *v, "glob");
    if (s.text.empty() || s.text.size() > 256) r.fail(v->source(), "a glob has 1 to 256 bytes");
  } else {
    const toml::node* k = t->get("xenstore");
    s.kind = Selector::Kind::Xenstore;
    s.text = get_string(r, *k, "xenstore");
    if (!is_xenstore_key(s.text))
      r.fail(k->source(), "xenstore key " + q(s.text) + " is not a relative xenstore path",
             "give a key below /local/domain/<domid>/, such as \"vm-data/role\" (letters, digits, _ - . and /)");
  }
  if (auto* v = t->get("value")) {
    if (s.kind != Selector::Kind::Xenstore)
      r.fail(v->source(), "value goes with xenstore only", "write { xenstore = \"vm-data/role\", value = \"web\" }");
    s.value = get_string(r, *v, "value");
    if (s.value.size() > 1024) r.fail(v->source(), "value has at most 1024 bytes");
  } else if (s.kind == Selector::Kind::Xenstore) {
    r.fail(n.source(), "a xenstore selector needs a value (a glob; \"*\" for any value)");
  }
  return s;
}

// The program's text, when it is a string written in the configuration file: where it starts
// in the file, if the file holds it verbatim (a literal string, or a basic one without
// escapes), so that its errors can point into the file.
std::optional<std::size_t> inline_start(const Reporter& r, const toml::node& n, const std::string& src) {
  const std::string& text = r.text();
  std::size_t off = r.offset(static_cast<int>(n.source().begin.line), static_cast<int>(n.source().begin.column));
  for (std::string_view delim : {"'''", "\"\"\"", "'", "\""}) {
    if (text.compare(off, delim.size(), delim) != 0) continue;
    off += delim.size();
    if (delim.size() == 3) {  // a newline right after the opening delimiter is not part of the string
      if (text.compare(off, 1, "\n") == 0) off += 1;
      else if (text.compare(off, 2, "\r\n") == 0) off += 2;
    }
    if (text.compare(off, src.size(), src) == 0) return off;
    return std::nullopt;
  }
  return std::nullopt;
}

ProgramConfig parse_program(const Reporter& r, const toml::node& n, const std::filesystem::path& dir) {
  const toml::table* t = n.as_table();
  if (!t) r.fail(n.source(), "program must be a table", "write each program as [[program]] with its keys below");
  known_keys(
      r, *t,
      {"name", "source", "file", "domains", "outputs", "events_per_second", "event_burst", "maxactive", "method"},
      "a [[program]]");
  ProgramConfig p;
  const toml::node* name = t->get("name");
  if (!name) r.fail(n.source(), "this [[program]] has no name", "add name = \"NAME\" (letters, digits, _ - .)");
  p.name = get_string(r, *name, "name");
  if (!is_program_name(p.name))
    r.fail(name->source(), "program name " + q(p.name) + " is not a valid name",
           "a name starts with a letter or _ and has up to 64 letters, digits, _ - and . (it becomes a metric label)");
  const std::string prog = "program " + q(p.name);
  if (auto* v = t->get("method")) {
    std::string m = get_string(r, *v, "method");
    if (m == "trap") p.method = Method::Trap;
    else if (m == "jump") p.method = Method::Jump;
    else if (m == "fastest") p.method = Method::Fastest;
    else if (m == "async") p.method = Method::Async;
    else
      r.fail(v->source(), "method is " + q(m) + "; give \"trap\", \"jump\", \"fastest\" or \"async\"",
             "trap (the default) works on every channel; jump and async need the guest channel; fastest is "
             "a jump where one can go, else a trap");
  }

  const toml::node* source = t->get("source");
  const toml::node* file = t->get("file");
  if ((source != nullptr) == (file != nullptr))
    r.fail(n.source(), prog + (source ? " has both source and file" : " has neither source nor file"),
           "give the program inline with source = '''...''' or in a file with file = \"PATH\"");
  xenprobe::Program parsed;
  if (source) {
    p.source = get_string(r, *source, "source");
    p.origin = r.path() + ":" + std::to_string(source->source().begin.line);
    auto start = inline_start(r, *source, p.source);
    // The positions in a message ("from 1:19") are the program's: made the file's when the
    // file holds the program verbatim.
    auto in_file = [&](const xenprobe::ProgramError& e, const std::string& prefix) {
      std::string what = prefix + e.what();
      if (auto ref = find_position_ref(what)) {
        std::size_t off = *start, line = 1;
        while (line < ref->line && off < r.text().size()) line += r.text()[off++] == '\n';
        xenprobe::Pos at = r.pos_at(off + ref->col - 1);
        what.replace(ref->begin, ref->end - ref->begin,
                     "(from " + std::to_string(at.line) + ":" + std::to_string(at.col) + ")");
      }
      xenprobe::ProgramError moved(r.pos_at(*start + std::min(e.pos.offset, p.source.size())), e.length, what,
                                   no_btf_hint(e));
      return ConfigError(xenprobe::format_error(moved, r.text(), r.path()));
    };
    auto at_source = [&](const std::string& what, const xenprobe::ProgramError& e) {
      return ConfigError(r.path() + ":" + std::to_string(source->source().begin.line) + ":" +
                         std::to_string(source->source().begin.column) + ": error: " + prog + " " + what + ":\n" +
                         xenprobe::format_error(e, p.source, "source"));
    };
    try {
      check_program(p);
    } catch (const xenprobe::ProgramError& e) {
      if (start) throw in_file(e, "");
      throw at_source("does not compile", e);
    } catch (const AsyncRefused& a) {
      if (start) throw in_file(a.error, prog + ": ");
      throw at_source(kCannotRunAsync, a.error);
    }
  } else {
    std::string f = get_string(r, *file, "file");
    std::filesystem::path fp(f);
    if (fp.is_relative()) fp = dir / fp;
    std::string why;
    p.source = read_limited(fp.string(), &why);
    if (!why.empty()) r.fail(file->source(), "cannot read " + prog + "'s file " + fp.string() + ": " + why);
    p.origin = fp.string();
    auto at_file = [&](const std::string& what, const xenprobe::ProgramError& e) {
      return ConfigError(r.path() + ":" + std::to_string(file->source().begin.line) + ":" +
                         std::to_string(file->source().begin.column) + ": error: " + prog + " " + what + ":\n" +
                         xenprobe::format_error(e, p.source, fp.string()));
    };
    try {
      check_program(p);
    } catch (const xenprobe::ProgramError& e) { throw at_file("does not compile", e); } catch (const AsyncRefused& a) {
      throw at_file(kCannotRunAsync, a.error);
    }
  }
  const xenprobe::Program& prog_ast = p.compiled ? p.compiled->program : *p.parsed;
  const bool has_probe = std::any_of(prog_ast.blocks.begin(), prog_ast.blocks.end(), [](const xenprobe::ProbeBlock& b) {
    return std::any_of(b.specs.begin(), b.specs.end(), [](const auto& s) {
      return s.kind == xenprobe::ProbeKind::Kprobe || s.kind == xenprobe::ProbeKind::Kretprobe;
    });
  });
  if (!has_probe)
    r.fail((source ? source : file)->source(), prog + " has no kprobe or kretprobe",
           "a daemon program watches guests: give it at least one kprobe:FUNC or kretprobe:FUNC");

  const toml::node* doms = t->get("domains");
  if (!doms) r.fail(n.source(), prog + " has no domains", "add domains = [{ glob = \"*\" }] to watch every guest");
  const toml::array* arr = doms->as_array();
  if (!arr) r.fail(doms->source(), "domains must be an array of selectors, not " + std::string(type_name(*doms)));
  if (arr->empty()) r.fail(doms->source(), prog + "'s domains are empty", "add a selector: { glob = \"*\" }");
  if (arr->size() > kMaxSelectors) r.fail(doms->source(), prog + " has more than 256 selectors");
  for (const toml::node& s : *arr) p.domains.push_back(parse_selector(r, s, p.name));

  if (auto* v = t->get("outputs")) {
    std::string o = get_string(r, *v, "outputs");
    if (o == "metrics") p.outputs = Outputs::Metrics;
    else if (o == "events") p.outputs = Outputs::Events;
    else if (o == "both") p.outputs = Outputs::Both;
    else r.fail(v->source(), "outputs is " + q(o) + "; give \"metrics\", \"events\" or \"both\"");
  }
  if (auto* v = t->get("events_per_second")) p.events_per_second = get_number(r, *v, "events_per_second", 1e-6, 1e6);
  if (auto* v = t->get("event_burst")) p.event_burst = get_number(r, *v, "event_burst", 1, 1e6);
  if (auto* v = t->get("maxactive")) p.maxactive = static_cast<unsigned>(get_int(r, *v, "maxactive", 1, 4096));
  return p;
}

}  // namespace

std::string Selector::describe() const {
  switch (kind) {
    case Kind::Name: return "name " + text;
    case Kind::Domid: return "domid " + std::to_string(domid);
    case Kind::Glob: return "glob " + text;
    case Kind::Xenstore: return "xenstore " + text + "=" + value;
  }
  return "?";
}

const char* outputs_name(Outputs o) {
  switch (o) {
    case Outputs::Metrics: return "metrics";
    case Outputs::Events: return "events";
    case Outputs::Both: return "both";
  }
  return "?";
}

const char* method_name(Method m) {
  switch (m) {
    case Method::Trap: return "trap";
    case Method::Jump: return "jump";
    case Method::Fastest: return "fastest";
    case Method::Async: return "async";
  }
  return "?";
}

std::vector<xenprobe::AsyncPlan> plan_async_program(xenprobe::Compiled& c) {
  try {
    return xenprobe::plan_async(c);
  } catch (const xenprobe::ProgramError& e) {
    // xenprobe's planner speaks of its --method option: the daemon's is the method key.
    auto reword = [](std::string s) {
      for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"--method async", "method = \"async\""},
                              {"--method trap (or jump)", "method = \"trap\" (or \"jump\")"}})
        for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
          s.replace(at, from.size(), to);
      return s;
    };
    throw xenprobe::ProgramError(e.pos, e.length, reword(e.what()), reword(e.hint), e.needs_types);
  }
}

std::optional<ListenAddress> parse_listen(const std::string& s) {
  ListenAddress a;
  std::size_t colon;
  if (s.starts_with('[')) {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return std::nullopt;
    a.host = s.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0) return std::nullopt;
    a.host = s.substr(0, colon);
    if (a.host.find(':') != std::string::npos) return std::nullopt;
  }
  std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit)) return std::nullopt;
  a.port = std::stoi(port);
  if (a.port > 65535 || a.host.empty()) return std::nullopt;
  return a;
}

Config parse_config(const std::string& text, const std::string& path) {
  Reporter r(text, path);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) { r.fail(e.source(), std::string(e.description())); }
  known_keys(r, root, {"daemon", "program"}, "the configuration");
  Config c;
  c.path = path;
  if (auto* d = root.get("daemon")) {
    const toml::table* t = d->as_table();
    if (!t) r.fail(d->source(), "daemon must be a table", "write [daemon] and its keys below");
    known_keys(r, *t,
               {"channel", "event_log", "metrics_listen", "metrics_textfile", "control_socket", "max_map_series",
                "max_map_keys"},
               "[daemon]");
    if (auto* v = t->get("channel")) {
      c.channel = get_string(r, *v, "channel");
      if (c.channel != "auto" && c.channel != "guest" && c.channel != "vmevent" && c.channel != "debugger")
        r.fail(v->source(), "channel is " + q(c.channel) + "; give auto, guest, vmevent or debugger");
    }
    if (auto* v = t->get("event_log")) {
      c.event_log = get_string(r, *v, "event_log");
      if (c.event_log.empty()) r.fail(v->source(), "event_log is empty", "give \"-\" for stdout or a file's path");
    }
    if (auto* v = t->get("metrics_listen")) {
      c.metrics_listen = get_string(r, *v, "metrics_listen");
      if (!c.metrics_listen.empty() && !parse_listen(c.metrics_listen))
        r.fail(v->source(), "metrics_listen " + q(c.metrics_listen) + " is not HOST:PORT",
               "write \"127.0.0.1:9477\", \"[::1]:9477\", or \"\" for no endpoint");
    }
    if (auto* v = t->get("metrics_textfile")) c.metrics_textfile = get_string(r, *v, "metrics_textfile");
    if (auto* v = t->get("control_socket")) c.control_socket = get_string(r, *v, "control_socket");
    if (auto* v = t->get("max_map_series"))
      c.max_map_series = static_cast<unsigned>(get_int(r, *v, "max_map_series", 0, 100000));
    if (auto* v = t->get("max_map_keys"))
      c.max_map_keys = static_cast<std::size_t>(
          get_int(r, *v, "max_map_keys", 1, static_cast<std::int64_t>(xenprobe::kMaxMapKeysLimit)));
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (auto* p = root.get("program")) {
    const toml::array* arr = p->as_array();
    if (!arr) r.fail(p->source(), "program must be an array of tables", "write each program as [[program]]");
    if (arr->size() > kMaxPrograms) r.fail(p->source(), "more than 256 programs");
    std::set<std::string> names;
    for (const toml::node& n : *arr) {
      ProgramConfig pc = parse_program(r, n, dir);
      if (!names.insert(pc.name).second)
        r.fail(n.as_table()->get("name")->source(), "a second program is named " + q(pc.name),
               "program names are unique: they tell the metrics and events apart");
      c.programs.push_back(std::move(pc));
    }
  }
  if (c.programs.empty())
    throw ConfigError(path +
                      ":1:1: error: the configuration has no [[program]]\n"
                      "add at least one: [[program]] name = \"...\" source = '''...''' domains = [...]\n");
  return c;
}

Config load_config(const std::string& path) {
  std::string why;
  std::string text = read_limited(path, &why);
  if (!why.empty()) throw ConfigError(path + ": error: cannot read the configuration: " + why + "\n");
  return parse_config(text, path);
}

}  // namespace xenprobesd
