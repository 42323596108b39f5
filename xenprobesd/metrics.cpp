// Prometheus text exposition (metrics.hpp).
#include "metrics.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace xenprobesd {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF).
std::size_t utf8_len(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xe1 && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  return n;
}

std::string escape_help(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string escape_label_value(std::string_view s, std::size_t max) {
  if (s.size() > max) s = s.substr(0, max);
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_len(s, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
      continue;
    }
    if (n == 1) {
      char c = s[i];
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

void Exposition::family(const std::string& name, const char* type, const std::string& help) {
  for (const Family& f : families_)
    if (f.name == name) return;
  families_.push_back(Family{name, type, help, {}});
}

Exposition::Family& Exposition::find(const std::string& name) {
  for (Family& f : families_)
    if (f.name == name) return f;
  throw std::logic_error("metric family " + name + " was not declared");
}

void Exposition::add_line(const std::string& name, const Labels& labels, const std::string& value) {
  Family& f = find(name);
  std::string line = name;
  if (!labels.empty()) {
    line += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) line += ',';
      first = false;
      line += k + "=\"" + escape_label_value(v) + "\"";
    }
    line += '}';
  }
  line += ' ' + value + '\n';
  f.samples.push_back(std::move(line));
}

void Exposition::add(const std::string& name, const Labels& labels, double value) {
  char b[64];
  if (std::isnan(value)) std::snprintf(b, sizeof b, "NaN");
  else if (std::isinf(value)) std::snprintf(b, sizeof b, value > 0 ? "+Inf" : "-Inf");
  else std::snprintf(b, sizeof b, "%.9g", value);
  add_line(name, labels, b);
}

void Exposition::add(const std::string& name, const Labels& labels, std::uint64_t value) {
  add_line(name, labels, std::to_string(value));
}

std::string Exposition::text() const {
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    for (const std::string& s : f.samples) out += s;
  }
  return out;
}

}  // namespace xenprobesd
