// The Prometheus text exposition format (version 0.0.4): families with HELP and TYPE, samples
// grouped under their family, label values escaped and made valid UTF-8 (map keys come from
// guest memory).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xenprobesd {

using Labels = std::vector<std::pair<std::string, std::string>>;

// A label value as the format wants it: \ " and newline escaped, bytes that are not UTF-8
// replaced by U+FFFD, at most `max` bytes of input kept.
std::string escape_label_value(std::string_view, std::size_t max = 256);

class Exposition {
 public:
  // Declares a family (in the order they are declared); samples are added to it by name.
  void family(const std::string& name, const char* type, const std::string& help);
  void add(const std::string& name, const Labels&, double value);
  void add(const std::string& name, const Labels&, std::uint64_t value);
  std::string text() const;

 private:
  struct Family {
    std::string name, type, help;
    std::vector<std::string> samples;
  };
  Family& find(const std::string& name);
  void add_line(const std::string& name, const Labels&, const std::string& value);
  std::vector<Family> families_;
};

}  // namespace xenprobesd
