#include "common/hex.hpp"
#include "symbols/symbol_table.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

namespace xenprobes::symbols {
namespace {

constexpr std::size_t npos = static_cast<std::size_t>(-1);

std::string signed_hex(std::int64_t v) {
  if (v >= 0) return hex(static_cast<std::uint64_t>(v));
  return "-" + hex(0 - static_cast<std::uint64_t>(v));
}

// Quoted for messages; hostile text is cut short and non-printable bytes escaped.
std::string quoted(std::string_view s) {
  std::string out = "'";
  const std::size_t n = std::min<std::size_t>(s.size(), 64);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > n) out += "...";
  return out + "'";
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// 1..16 hex digits, no prefix.
bool parse_hex(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = hex_digit(c);
    if (d < 0) return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  *out = v;
  return true;
}

// "0x<hex>" or decimal, no sign, no overflow.
bool parse_offset(std::string_view s, std::uint64_t* out) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return parse_hex(s.substr(2), out);
  if (s.empty() || s.size() > 20) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool is_valid_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLen) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

bool is_text_type(char t) { return t == 'T' || t == 't' || t == 'W' || t == 'w'; }
bool is_data_type(char t) {
  switch (t) {
    case 'D':
    case 'd':
    case 'B':
    case 'b':
    case 'R':
    case 'r':
    case 'G':
    case 'g':
    case 'S':
    case 's':
    case 'V':
    case 'v': return true;
    default: return false;
  }
}
bool is_type_letter(char t) { return (t >= 'A' && t <= 'Z') || (t >= 'a' && t <= 'z') || t == '?'; }

// Splits on runs of blanks; false if there are more than `max` fields.
bool split_fields(std::string_view line, std::string_view* f, std::size_t max, std::size_t* n) {
  *n = 0;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_blank(line[i])) ++i;
    if (i == line.size()) break;
    const std::size_t start = i;
    while (i < line.size() && !is_blank(line[i])) ++i;
    if (*n == max) return false;
    f[(*n)++] = line.substr(start, i - start);
  }
  return true;
}

}  // namespace

Result<SymbolTable> SymbolTable::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail_errno(errno ? errno : ENOENT, "cannot open symbol file " + path.string());
  // Read in chunks: /proc/kallsyms reports size 0, and a hostile file may be huge.
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes)
      return fail(Errc::InvalidArgument, path.string() + " is larger than " + std::to_string(kMaxFileBytes >> 20) +
                                             " MiB; not a System.map or kallsyms file");
  }
  if (in.bad()) return fail_errno(errno ? errno : EIO, "cannot read symbol file " + path.string());
  return parse(text, path.string());
}

Result<SymbolTable> SymbolTable::parse(std::string_view text, std::string source) {
  SymbolTable t;
  t.source_ = std::move(source);
  LoadStats& st = t.stats_;
  bool all_zero = true;
  std::size_t parsed = 0;
  std::size_t line_no = 0;
  auto malformed = [&] {
    if (st.malformed++ == 0) st.first_malformed_line = line_no;
  };

  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (std::all_of(line.begin(), line.end(), is_blank)) continue;
    ++st.lines;
    if (line.size() > kMaxLineLen) {
      malformed();
      continue;
    }

    // "<addr> <type> <name>" or, in kallsyms, "<addr> <type> <name>\t[<module>]".
    std::string_view f[4];
    std::size_t n = 0;
    std::uint64_t addr = 0;
    if (!split_fields(line, f, 4, &n) || n < 3 || !parse_hex(f[0], &addr) || f[1].size() != 1 ||
        !is_type_letter(f[1][0]) || !is_valid_name(f[2])) {
      malformed();
      continue;
    }
    if (n == 4) {
      const std::string_view m = f[3];
      if (m.size() < 3 || m.front() != '[' || m.back() != ']' || !is_valid_name(m)) {
        malformed();
        continue;
      }
      // Module symbols live in module space and do not move with the kernel's KASLR slide.
      ++st.module_symbols;
      continue;
    }
    ++parsed;
    if (addr != 0) all_zero = false;
    const char type = f[1][0];
    SymbolKind kind;
    if (is_text_type(type)) {
      kind = SymbolKind::Text;
    } else if (is_data_type(type)) {
      kind = SymbolKind::Data;
    } else {
      ++st.other_types;
      continue;
    }
    Entry e;
    e.name = std::string(f[2]);
    e.link = addr;
    e.type = type;
    e.kind = kind;
    e.end_marker = kind == SymbolKind::Text && (e.name == "_etext" || e.name == "_einittext");
    t.syms_.push_back(std::move(e));
  }

  if (parsed > 0 && all_zero)
    return fail(Errc::Permission, t.source_ +
                                      ": every symbol address is 0 (kallsyms read with "
                                      "kptr_restrict in force?); read it as root");

  // x86-64 System.map lists per-CPU variables as small offsets from 0 (e.g. "0000000000000000 D
  // fixed_percpu_data"); they are not addresses in the image and do not slide. If the file has
  // kernel-half symbols, the low ones are such offsets: keep them out of address lookups.
  const bool has_kernel_half =
      std::any_of(t.syms_.begin(), t.syms_.end(), [](const Entry& e) { return e.link >= kKernelHalfStart; });
  if (has_kernel_half) {
    const auto low = std::erase_if(t.syms_, [](const Entry& e) { return e.link < kKernelHalfStart; });
    st.other_types += low;
  }
  for (const Entry& e : t.syms_) ++(e.kind == SymbolKind::Text ? st.text : st.data);

  if (t.syms_.empty())
    return fail(
        Errc::InvalidArgument,
        "no usable symbol in " + t.source_ + " (" + std::to_string(st.lines) + " lines, " +
            std::to_string(st.malformed) + " malformed" +
            (st.first_malformed_line ? ", first at line " + std::to_string(st.first_malformed_line) : std::string{}) +
            ")");
  t.index();
  return t;
}

void SymbolTable::index() {
  std::stable_sort(syms_.begin(), syms_.end(), [](const Entry& a, const Entry& b) { return a.link < b.link; });

  // A symbol extends to the next symbol at a higher address (aliases share an extent), so the
  // last function of .text ends at _etext, which the map lists after it. The symbols at the
  // highest address have nothing above them: their size is unknown (0).
  std::size_t i = 0;
  while (i < syms_.size()) {
    std::size_t j = i;
    while (j < syms_.size() && syms_[j].link == syms_[i].link) ++j;
    std::uint64_t size = 0;
    if (j < syms_.size()) size = syms_[j].link - syms_[i].link;
    for (std::size_t k = i; k < j; ++k) syms_[k].size = size;
    i = j;
  }

  by_name_.resize(syms_.size());
  for (std::size_t k = 0; k < syms_.size(); ++k) by_name_[k] = static_cast<std::uint32_t>(k);
  std::stable_sort(by_name_.begin(), by_name_.end(),
                   [this](std::uint32_t a, std::uint32_t b) { return syms_[a].name < syms_[b].name; });
}

std::uint64_t SymbolTable::running(std::uint64_t link) const {
  // set_slide() checked that no symbol wraps.
  return link + static_cast<std::uint64_t>(slide_);
}

bool SymbolTable::is_link_in_table(std::uint64_t running_addr, std::uint64_t* link) const {
  const __int128 l = static_cast<__int128>(running_addr) - slide_;
  if (l < 0 || l > static_cast<__int128>(std::numeric_limits<std::uint64_t>::max())) return false;
  *link = static_cast<std::uint64_t>(l);
  return true;
}

Symbol SymbolTable::to_symbol(const Entry& e) const {
  return Symbol{e.name, Gva{running(e.link)}, e.type, e.kind, e.size};
}

namespace {
// The names the kernel's linker script gives section bounds: _text, _stext, _etext, _sinittext,
// _einittext, __<section>_start / __<section>_end (__entry_text_start, __noinstr_text_end, ...),
// __start_<section> / __stop_<section>. They mark addresses, never start code of their own.
bool is_section_marker(std::string_view n) {
  if (n == "_text" || n == "_stext" || n == "_etext" || n == "_sinittext" || n == "_einittext") return true;
  if (n.starts_with("__start_") || n.starts_with("__stop_")) return true;
  return n.starts_with("__") && (n.ends_with("_start") || n.ends_with("_end"));
}
}  // namespace

std::size_t SymbolTable::covering(std::uint64_t link) const {
  auto it =
      std::upper_bound(syms_.begin(), syms_.end(), link, [](std::uint64_t v, const Entry& e) { return v < e.link; });
  if (it == syms_.begin()) return npos;
  const std::uint64_t start = std::prev(it)->link;
  // Several names at one address (_text, _stext, startup_64; __noinstr_text_end with the local
  // function after it): prefer a real function, then a name that is not a section marker (a
  // global marker must not hide a local function: the address rules key on the function's
  // name), then a global symbol, then one without a leading '_', then file order.
  auto rank = [](const Entry& e) {
    return std::tuple{e.end_marker, e.kind != SymbolKind::Text, is_section_marker(e.name), e.type >= 'a',
                      e.name.starts_with('_')};
  };
  std::size_t best = npos;
  for (auto k = static_cast<std::size_t>(it - syms_.begin()); k > 0 && syms_[k - 1].link == start; --k)
    if (best == npos || !(rank(syms_[best]) < rank(syms_[k - 1]))) best = k - 1;  // ties: earliest wins
  return best;
}

std::vector<Symbol> SymbolTable::matching(std::string_view pattern) const {
  const std::string pat(pattern);  // fnmatch needs a terminated string
  std::vector<Symbol> out;
  for (std::uint32_t i : by_name_)
    if (::fnmatch(pat.c_str(), syms_[i].name.c_str(), 0) == 0) out.push_back(to_symbol(syms_[i]));
  if (mods_.empty()) return out;
  const bool qualified = pattern.find(':') != std::string_view::npos;
  const std::size_t core = out.size();
  for (std::uint32_t i : mods_by_name_) {
    const ModuleFunction& f = mods_[i];
    const std::string n = qualified ? f.module + ":" + f.name : f.name;
    if (::fnmatch(pat.c_str(), n.c_str(), 0) == 0)
      out.push_back(Symbol{f.name, Gva{f.start}, f.type, SymbolKind::Text, f.size, f.module});
  }
  std::inplace_merge(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(core), out.end(),
                     [](const Symbol& a, const Symbol& b) { return a.name < b.name; });
  return out;
}

Result<std::vector<Symbol>> SymbolTable::lookup(std::string_view name) const {
  const auto lo = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [this](std::uint32_t i, std::string_view n) { return syms_[i].name < n; });
  const auto hi = std::upper_bound(lo, by_name_.end(), name,
                                   [this](std::string_view n, std::uint32_t i) { return n < syms_[i].name; });
  if (lo == hi) {
    // Not the core kernel's: a loaded module's function ("func" or "module:func")?
    if (auto m = module_lookup(name); !m.empty()) return m;
    return fail(Errc::NotFound, "no symbol " + quoted(name) + " in " + source_ +
                                    (mods_.empty() ? std::string{} : " or its loaded modules"));
  }
  std::vector<Symbol> out;
  for (auto it = lo; it != hi; ++it) out.push_back(to_symbol(syms_[*it]));
  std::stable_sort(out.begin(), out.end(), [](const Symbol& a, const Symbol& b) { return a.address < b.address; });
  return out;
}

Result<std::uint64_t> SymbolTable::check_offset(const Entry& e, std::uint64_t off) const {
  if (off == 0) return off;
  const char* what = e.kind == SymbolKind::Text ? "function" : "symbol";
  if (e.size == 0)
    return fail(Errc::Range, std::string(what) + " '" + e.name + "' has unknown size (last symbol in " + source_ +
                                 ", no _etext after it); cannot apply offset " + hex(off));
  if (off >= e.size)
    return fail(Errc::Range, "offset " + hex(off) + " is beyond the end of " + what + " '" + e.name + "' (size " +
                                 hex(e.size) + ")");
  return off;
}

Result<Gva> SymbolTable::resolve(std::string_view expr) const {
  if (expr.empty()) return fail(Errc::InvalidArgument, "empty symbol expression");
  if (expr.size() > kMaxLineLen)
    return fail(Errc::InvalidArgument, "symbol expression longer than " + std::to_string(kMaxLineLen) + " bytes");

  const std::size_t plus = expr.find('+');
  const std::string_view target = expr.substr(0, plus);
  std::uint64_t off = 0;
  if (plus != std::string_view::npos && !parse_offset(expr.substr(plus + 1), &off))
    return fail(Errc::InvalidArgument, "bad offset in " + quoted(expr) + ": expected name+0x<hex> or name+<decimal>");

  if (target.size() >= 2 && target[0] == '0' && (target[1] == 'x' || target[1] == 'X')) {
    std::uint64_t addr = 0;
    if (!parse_hex(target.substr(2), &addr))
      return fail(Errc::InvalidArgument, "bad address in " + quoted(expr) + ": expected 0x<1-16 hex digits>");
    // An offset from a symbol's start is checked against that symbol's size.
    std::uint64_t link = 0;
    if (off != 0 && is_link_in_table(addr, &link)) {
      const std::size_t k = covering(link);
      if (k != npos && syms_[k].link == link) XP_TRY(check_offset(syms_[k], off));
    }
    if (addr > std::numeric_limits<std::uint64_t>::max() - off)
      return fail(Errc::Range, quoted(expr) + " overflows the address space");
    return Gva{addr + off};
  }

  if (!is_valid_name(target))
    return fail(Errc::InvalidArgument, "bad symbol name " + quoted(target) + " in " + quoted(expr));
  const std::vector<Symbol> matches = XP_TRY(lookup(target));
  if (!matches.front().module.empty()) return resolve_module(target, off, plus != std::string_view::npos);
  // Duplicates at one address (repeated lines, aliases) are harmless; distinct addresses are
  // same-named static functions, and picking one silently would probe the wrong code.
  std::vector<std::uint64_t> addrs;
  for (const Symbol& s : matches)
    if (addrs.empty() || addrs.back() != s.address.value) addrs.push_back(s.address.value);
  if (addrs.size() > 1) {
    std::string list;
    for (std::size_t k = 0; k < addrs.size() && k < 16; ++k) list += (k ? ", " : "") + hex(addrs[k]);
    if (addrs.size() > 16) list += ", ...";
    return fail(Errc::InvalidArgument, "symbol " + quoted(target) + " is ambiguous in " + source_ + " (" +
                                           std::to_string(addrs.size()) + " addresses: " + list +
                                           "); pass the address instead, e.g. '" + hex(addrs[0]) +
                                           (plus != std::string_view::npos ? "+" + hex(off) : std::string{}) + "'");
  }
  std::uint64_t link = 0;
  (void)is_link_in_table(addrs[0], &link);
  const std::size_t k = covering(link);  // same extent for every alias at this address
  XP_TRY(check_offset(syms_[k], off));
  return Gva{addrs[0] + off};
}

Result<Function> SymbolTable::function_containing(Gva addr) const {
  if (const ModuleFunction* f = module_function_at(addr.value))
    return Function{f->name + " [" + f->module + "]", Gva{f->start}, f->size};
  std::uint64_t link = 0;
  const std::size_t k = is_link_in_table(addr.value, &link) ? covering(link) : npos;
  if (k == npos) return fail(Errc::NotFound, hex(addr.value) + " is below every symbol in " + source_);
  const Entry& e = syms_[k];
  const std::uint64_t off = link - e.link;
  if (e.kind != SymbolKind::Text || e.end_marker)
    return fail(Errc::NotFound, hex(addr.value) + " is not in a function (" + e.name + "+" + hex(off) + " is " +
                                    (e.end_marker ? "past the end of a text section" : "data") + ")");
  if (e.size == 0)
    return fail(Errc::NotFound, hex(addr.value) + " is " + e.name + "+" + hex(off) + " but '" + e.name +
                                    "' is the last symbol in " + source_ +
                                    " (no _etext after it): its "
                                    "size is unknown");
  if (off >= e.size) return fail(Errc::NotFound, hex(addr.value) + " is past the end of '" + e.name + "'");
  return Function{e.name, Gva{running(e.link)}, e.size};
}

std::string SymbolTable::symbolize(Gva addr) const {
  if (const ModuleFunction* f = module_function_at(addr.value))
    return f->name + "+" + hex(addr.value - f->start) + " [" + f->module + "]";
  std::uint64_t link = 0;
  const std::size_t k = is_link_in_table(addr.value, &link) ? covering(link) : npos;
  if (k == npos) return hex(addr.value);
  const Entry& e = syms_[k];
  const std::uint64_t off = link - e.link;
  if (off < e.size || off == 0) return e.name + "+" + hex(off);
  return hex(addr.value);
}

Result<void> SymbolTable::set_slide(std::int64_t slide) {
  if (slide % static_cast<std::int64_t>(kSlideAlign) != 0)
    return fail(Errc::InvalidArgument,
                "KASLR slide " + signed_hex(slide) + " is not a multiple of 2 MiB (CONFIG_PHYSICAL_ALIGN)");
  if (slide != 0 && !syms_.empty()) {
    const __int128 lo = static_cast<__int128>(syms_.front().link) + slide;
    const __int128 hi = static_cast<__int128>(syms_.back().link) + syms_.back().size + slide;
    if (lo < static_cast<__int128>(kKernelHalfStart) ||
        hi > static_cast<__int128>(std::numeric_limits<std::uint64_t>::max()))
      return fail(Errc::InvalidArgument, "KASLR slide " + signed_hex(slide) + " moves the symbols of " + source_ +
                                             " out of the canonical kernel half");
  }
  slide_ = slide;
  return {};
}

Result<std::int64_t> SymbolTable::slide_from_text(Gva running_text) {
  if (running_text.value < kKernelHalfStart)
    return fail(Errc::InvalidArgument,
                "running _text " + hex(running_text.value) + " is not a canonical upper-half kernel address");
  const Entry* anchor = nullptr;
  for (const char* name : {"_text", "_stext"}) {
    for (const Entry& e : syms_)
      if (e.name == name) {
        anchor = &e;
        break;
      }
    if (anchor) break;
  }
  if (!anchor) return fail(Errc::NotFound, "no _text or _stext in " + source_ + " to compute the KASLR slide from");
  auto in_image = [](std::uint64_t a) { return a >= kKernelImageStart && a < kKernelImageEnd; };
  if (in_image(anchor->link) && !in_image(running_text.value))
    return fail(Errc::InvalidArgument, "running _text " + hex(running_text.value) +
                                           " is outside the x86-64 kernel image window [" + hex(kKernelImageStart) +
                                           ", " + hex(kKernelImageEnd) + ")");
  const __int128 d = static_cast<__int128>(running_text.value) - anchor->link;
  if (d < std::numeric_limits<std::int64_t>::min() || d > std::numeric_limits<std::int64_t>::max())
    return fail(Errc::InvalidArgument, "running _text " + hex(running_text.value) + " is implausibly far from " +
                                           anchor->name + " " + hex(anchor->link) + " in " + source_);
  const auto slide = static_cast<std::int64_t>(d);
  if (slide % static_cast<std::int64_t>(kSlideAlign) != 0)
    return fail(Errc::InvalidArgument, "running _text " + hex(running_text.value) + " gives KASLR slide " +
                                           signed_hex(slide) + " from " + anchor->name + " " + hex(anchor->link) +
                                           ", not a multiple of 2 MiB (CONFIG_PHYSICAL_ALIGN)");
  XP_TRY(set_slide(slide));
  return slide;
}

}  // namespace xenprobes::symbols
