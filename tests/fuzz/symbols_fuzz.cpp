// Fuzz target: symbol files (symbols/symbol_table.cpp): System.map or /proc/kallsyms text, and
// the expressions and addresses looked up in it. A guest's System.map comes from wherever the
// user found it, and the running _text that sets the KASLR slide from the guest module.
//
// Input: the file's text up to the first NUL byte; after it, one query per line:
//   @<hex>    function_containing and symbolize of that running address
//   #<hex>    slide_from_text(<hex>)
//   %<dec>    set_slide(<dec>) (signed, in units of 2 MiB when it ends in 'm')
//   <expr>    resolve(expr) ("name", "name+off", "0xaddr+off")
// Invariants: parse never throws and its counters add up; every lookup gives symbols of that
// name in address order at link + slide; a function found for an address contains it and is
// listed under its name; parse -> symbolize -> resolve gives the address back (or an
// ambiguity); resolve's answers match the symbol and the offset; a slide is 2 MiB aligned and
// moves _text to the running _text; messages are printable whatever the file holds.
#include <charconv>

#include "fuzz/fuzz_common.hpp"
#include "symbols/symbol_table.hpp"

using namespace xenprobes;
using namespace xenprobes::symbols;

namespace {

std::optional<std::uint64_t> hex_of(std::string_view s) {
  if (s.starts_with("0x") || s.starts_with("0X")) s.remove_prefix(2);
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc{} || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

void check_error(const Error& e) {
  FUZZ_CHECK(fuzz::printable(e.what), "hostile bytes in a message: " + e.what.substr(0, 200));
  FUZZ_CHECK(!e.what.empty());
}

void check_address(const SymbolTable& t, std::uint64_t a) {
  const std::string sym = t.symbolize(Gva{a});
  FUZZ_CHECK(fuzz::printable(sym), sym.substr(0, 200));
  auto f = t.function_containing(Gva{a});
  if (f) {
    FUZZ_CHECK(f->size > 0 && a - f->start.value < f->size, "function_containing(" + fuzz::hexs(a) + ") = " + f->name);
    auto l = t.lookup(f->name);
    FUZZ_CHECK(l && std::any_of(l->begin(), l->end(),
                                [&](const Symbol& s) { return s.address == f->start && s.kind == SymbolKind::Text; }),
               "the function found is not listed under its name: " + f->name);
  } else {
    FUZZ_CHECK(f.error().code == Errc::NotFound, f.error().what);
    check_error(f.error());
  }
  // symbolize -> resolve round trip.
  if (sym.find('+') == std::string::npos) {  // nothing covers it
    FUZZ_CHECK(hex_of(sym) == a, sym);
    return;
  }
  // A name resolve() cannot take apart ("a+b", "0x10") is parsed and listed all the same; it
  // only ever appears in messages. Such names are no kernel's: the round trip skips them.
  const std::string name = sym.substr(0, sym.rfind('+'));
  if (name.find('+') != std::string::npos || name.starts_with("0x") || name.starts_with("0X")) return;
  auto back = t.resolve(sym);
  if (back) {
    FUZZ_CHECK(back->value == a, sym + " resolves to " + fuzz::hexs(back->value) + ", not " + fuzz::hexs(a));
  } else {
    // Only a name at several addresses may refuse (it then names them).
    FUZZ_CHECK(back.error().code == Errc::InvalidArgument && back.error().what.find("ambiguous") != std::string::npos,
               sym + ": " + back.error().what);
  }
}

void check_resolve(const SymbolTable& t, std::string_view expr) {
  auto r = t.resolve(expr);
  if (!r) {
    FUZZ_CHECK(
        r.error().code == Errc::InvalidArgument || r.error().code == Errc::NotFound || r.error().code == Errc::Range,
        r.error().what);
    check_error(r.error());
    return;
  }
  const std::size_t plus = expr.find('+');
  const std::string_view target = expr.substr(0, plus);
  std::uint64_t off = 0;
  if (plus != std::string_view::npos) {
    std::string_view o = expr.substr(plus + 1);
    if (o.starts_with("0x") || o.starts_with("0X")) {
      off = hex_of(o).value_or(~0ull);
    } else {
      auto [p, ec] = std::from_chars(o.data(), o.data() + o.size(), off, 10);
      FUZZ_CHECK(ec == std::errc{} && p == o.data() + o.size(), "a bad offset accepted: " + std::string(expr));
    }
  }
  if (target.starts_with("0x") || target.starts_with("0X")) {
    FUZZ_CHECK(hex_of(target).has_value() && r->value == *hex_of(target) + off, std::string(expr));
    return;
  }
  auto l = t.lookup(target);
  FUZZ_CHECK(l && !l->empty(), "resolved a name lookup does not know");
  for (const Symbol& s : *l) FUZZ_CHECK(s.address == l->front().address, "resolved an ambiguous name");
  FUZZ_CHECK(r->value == l->front().address.value + off, std::string(expr));
  FUZZ_CHECK(off == 0 || off < l->front().size, "an offset past the symbol's end");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 16384) return 0;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = all.find('\0');
  const std::string_view file = all.substr(0, nul);
  std::string_view queries = nul == std::string_view::npos ? std::string_view{} : all.substr(nul + 1);

  auto parsed = SymbolTable::parse(file, "fuzz.map");
  if (!parsed) {
    FUZZ_CHECK(parsed.error().code == Errc::InvalidArgument || parsed.error().code == Errc::Permission,
               parsed.error().what);
    check_error(parsed.error());
    return 0;
  }
  SymbolTable& t = *parsed;
  const LoadStats& st = t.stats();
  FUZZ_CHECK(t.size() >= 1 && st.text + st.data == t.size(), "counters do not add up");
  FUZZ_CHECK(st.malformed <= st.lines && (st.malformed == 0) == (st.first_malformed_line == 0));
  FUZZ_CHECK(st.text + st.data + st.other_types + st.module_symbols + st.malformed == st.lines,
             "lines " + std::to_string(st.lines) + " != text " + std::to_string(st.text) + " + data " +
                 std::to_string(st.data) + " + other " + std::to_string(st.other_types) + " + module " +
                 std::to_string(st.module_symbols) + " + malformed " + std::to_string(st.malformed));

  // Every name on a line of the file that looks like "<addr> <type> <name>".
  std::vector<std::string> names;
  for (std::string_view rest = file; !rest.empty() && names.size() < 16;) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    const std::size_t a = line.find(' '), b = a == std::string_view::npos ? a : line.find(' ', a + 1);
    if (b != std::string_view::npos) names.emplace_back(line.substr(b + 1, line.find_first_of(" \t\r", b + 1) - b - 1));
  }
  auto check_names = [&] {
    for (const auto& n : names) {
      auto l = t.lookup(n);
      if (!l) {
        FUZZ_CHECK(l.error().code == Errc::NotFound);
        check_error(l.error());
        continue;
      }
      for (std::size_t k = 0; k < l->size(); ++k) {
        const Symbol& s = (*l)[k];
        FUZZ_CHECK(s.name == n && (k == 0 || (*l)[k - 1].address <= s.address), "lookup out of order: " + n);
        FUZZ_CHECK((s.kind == SymbolKind::Text) == (s.type == 'T' || s.type == 't' || s.type == 'W' || s.type == 'w'));
        check_address(t, s.address.value);
        if (s.size) check_address(t, s.address.value + s.size - 1);
        check_resolve(t, n);
        check_resolve(t, n + "+1");
      }
    }
  };
  check_names();

  for (unsigned q = 0; !queries.empty() && q < 64; ++q) {
    const std::size_t nl = queries.find('\n');
    std::string_view line = queries.substr(0, nl);
    queries = nl == std::string_view::npos ? std::string_view{} : queries.substr(nl + 1);
    if (line.empty()) continue;
    if (line[0] == '@') {
      if (auto a = hex_of(line.substr(1))) check_address(t, *a);
    } else if (line[0] == '#') {
      auto a = hex_of(line.substr(1));
      if (!a) continue;
      const std::int64_t before = t.slide();
      auto s = t.slide_from_text(Gva{*a});
      if (!s) {
        check_error(s.error());
        FUZZ_CHECK(t.slide() == before, "a refused slide was applied");
        continue;
      }
      FUZZ_CHECK(*s % static_cast<std::int64_t>(kSlideAlign) == 0 && t.slide() == *s);
      auto anchor = t.lookup("_text");
      if (!anchor) anchor = t.lookup("_stext");
      FUZZ_CHECK(
          anchor && std::any_of(anchor->begin(), anchor->end(), [&](const Symbol& x) { return x.address.value == *a; }),
          "the running _text is not where the slide puts _text");
      check_names();
    } else if (line[0] == '%') {
      std::int64_t v = 0;
      std::string_view num = line.substr(1);
      const bool mib = num.ends_with("m");
      if (mib) num.remove_suffix(1);
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v, 10);
      if (ec != std::errc{}) continue;
      if (mib && (v > (std::int64_t{1} << 40) || v < -(std::int64_t{1} << 40))) continue;
      if (mib) v *= static_cast<std::int64_t>(kSlideAlign);
      const std::int64_t before = t.slide();
      auto r = t.set_slide(v);
      FUZZ_CHECK(r ? t.slide() == v : t.slide() == before);
      if (!r) check_error(r.error());
      if (r) check_names();
    } else {
      check_resolve(t, line);
    }
  }
  return 0;
}
