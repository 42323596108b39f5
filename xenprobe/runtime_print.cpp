// Running a compiled program (runtime.hpp): printing maps.
#include "runtime_internal.hpp"

namespace xenprobe {

// ---- printing maps ----

namespace {

// 1024 -> "1K", 3 -> "3": hist's labels, powers of two in binary units as bpftrace prints them.
std::string hist_label_value(std::uint64_t v) {
  static const char* kUnits[] = {"", "K", "M", "G", "T", "P", "E"};
  int unit = 0;
  while (v >= 1024 && v % 1024 == 0 && unit < 6) v /= 1024, ++unit;
  return std::to_string(v) + kUnits[unit];
}

bool key_less(const std::vector<Value>& a, const std::vector<Value>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].s != b[i].s) return a[i].s < b[i].s;
    if (a[i].i != b[i].i) return a[i].i < b[i].i;
  }
  return a.size() < b.size();
}

}  // namespace

std::vector<const Instance::Entry*> Instance::sorted(int slot) const {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  std::vector<const Entry*> es;
  for (const auto& [k, e] : maps_[static_cast<std::size_t>(slot)]) es.push_back(&e);
  auto value = [&](const Entry* e) { return d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v; };
  std::sort(es.begin(), es.end(), [&](const Entry* a, const Entry* b) {
    if (d.kind != MapKind::Str && d.kind != MapKind::Hist && d.kind != MapKind::Lhist && value(a) != value(b))
      return value(a) < value(b);
    return key_less(a->keys, b->keys);
  });
  return es;
}

namespace {

std::string key_text(const MapDecl& d, const std::vector<Value>& keys, const char* sep, bool text) {
  std::string s;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i) s += sep;
    const bool stack = i < d.key_is_stack.size() && d.key_is_stack[i];
    s += d.key_is_str[i] ? (text && !stack ? printable(keys[i].s) : keys[i].s) : std::to_string(keys[i].i);
  }
  return s;
}

struct Bucket {
  std::string label;
  bool has_min = false, has_max = false;
  std::int64_t min = 0, max = 0;
  std::uint64_t count = 0;
};

// The buckets from the first to the last non-empty one, with their text labels and the
// inclusive bounds JSON gives.
std::vector<Bucket> buckets_of(const MapDecl& d, const std::vector<std::uint64_t>& b) {
  std::vector<Bucket> out;
  std::size_t first = 0, last = b.size();
  while (first < b.size() && b[first] == 0) ++first;
  while (last > first && b[last - 1] == 0) --last;
  for (std::size_t i = first; i < last; ++i) {
    Bucket k;
    k.count = b[i];
    if (d.kind == MapKind::Hist) {
      if (i == 0) {
        k.label = "(..., 0)";
        k.has_max = true, k.max = -1;
      } else if (i == 1 || i == 2) {
        k.label = "[" + std::to_string(i - 1) + "]";
        k.has_min = k.has_max = true, k.min = k.max = static_cast<std::int64_t>(i - 1);
      } else {
        const std::uint64_t lo = 1ull << (i - 2);
        const std::uint64_t hi = lo << 1;  // 2^63 for the last bucket: still fits unsigned
        k.label = "[" + hist_label_value(lo) + ", " + hist_label_value(hi) + ")";
        k.has_min = k.has_max = true, k.min = static_cast<std::int64_t>(lo), k.max = static_cast<std::int64_t>(hi - 1);
      }
    } else {
      const std::size_t lastb = b.size() - 1;
      if (i == 0) {
        k.label = "(..., " + std::to_string(d.lo) + ")";
        k.has_max = true, k.max = d.lo - 1;
      } else if (i == lastb) {
        k.label = "[" + std::to_string(d.hi) + ", ...)";
        k.has_min = true, k.min = d.hi;
      } else {
        const std::int64_t lo = d.lo + static_cast<std::int64_t>(i - 1) * d.step;
        k.label = d.step == 1 ? "[" + std::to_string(lo) + "]"
                              : "[" + std::to_string(lo) + ", " + std::to_string(lo + d.step) + ")";
        k.has_min = k.has_max = true, k.min = lo, k.max = lo + d.step - 1;
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace

std::string Instance::map_text(int slot) const {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  std::string s;
  for (const Entry* e : sorted(slot)) {
    std::string name = d.name + (e->keys.empty() ? "" : "[" + key_text(d, e->keys, ", ", true) + "]");
    if (d.kind == MapKind::Hist || d.kind == MapKind::Lhist) {
      s += name + ":\n";
      std::vector<Bucket> bs = buckets_of(d, e->buckets);
      std::uint64_t top = 0;
      for (const Bucket& b : bs) top = std::max(top, b.count);
      char line[160];
      for (const Bucket& b : bs) {
        const int bar = top ? static_cast<int>(static_cast<double>(b.count) / static_cast<double>(top) * 52) : 0;
        std::snprintf(line, sizeof line, "%-16s%8llu |%-52s|\n", b.label.c_str(),
                      static_cast<unsigned long long>(b.count),
                      std::string(static_cast<std::size_t>(bar), '@').c_str());
        s += line;
      }
      s += "\n";
    } else if (d.kind == MapKind::Str) {
      s += name + ": " + printable(e->s) + "\n";
    } else {
      const std::int64_t v = d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v;
      s += name + ": " + std::to_string(v) + "\n";
    }
  }
  if (d.kind != MapKind::Hist && d.kind != MapKind::Lhist) s += "\n";
  return s;
}

std::string Instance::map_json(int slot, const char** type) const {
  using nlohmann::ordered_json;
  const MapDecl& d = c_.maps[static_cast<std::size_t>(slot)];
  const bool hist = d.kind == MapKind::Hist || d.kind == MapKind::Lhist;
  *type = hist ? "hist" : "map";
  auto value = [&](const Entry* e) -> ordered_json {
    if (hist) {
      ordered_json arr = ordered_json::array();
      for (const Bucket& b : buckets_of(d, e->buckets)) {
        ordered_json o;
        if (b.has_min) o["min"] = b.min;
        if (b.has_max) o["max"] = b.max;
        o["count"] = b.count;
        arr.push_back(std::move(o));
      }
      return arr;
    }
    if (d.kind == MapKind::Str) return e->s;
    return d.kind == MapKind::Avg ? (e->n ? e->v / e->n : 0) : e->v;
  };
  ordered_json data;
  if (d.key_is_str.empty()) {
    auto es = sorted(slot);
    data[d.name] = es.empty() ? ordered_json() : value(es.front());
  } else {
    ordered_json m = ordered_json::object();
    for (const Entry* e : sorted(slot)) m[key_text(d, e->keys, ",", false)] = value(e);
    data[d.name] = std::move(m);
  }
  return json_text(data);
}

void Instance::print_map(int slot) {
  if (maps_[static_cast<std::size_t>(slot)].empty()) return;
  if (out_.format() == OutputFormat::Json) {
    const char* type = "map";
    std::string data = map_json(slot, &type);
    out_.record(domain_, type, data);
  } else {
    out_.text(domain_, map_text(slot));
  }
}

void Instance::print_all_maps() {
  std::vector<int> order(c_.maps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return c_.maps[static_cast<std::size_t>(a)].name < c_.maps[static_cast<std::size_t>(b)].name;
  });
  for (int m : order) print_map(m);
}

std::map<std::string, std::int64_t> Instance::snapshot(const std::string& map) const {
  std::map<std::string, std::int64_t> out;
  for (std::size_t slot = 0; slot < c_.maps.size(); ++slot) {
    const MapDecl& d = c_.maps[slot];
    if (d.name != map) continue;
    for (const auto& [k, e] : maps_[slot]) {
      std::int64_t v = d.kind == MapKind::Avg ? (e.n ? e.v / e.n : 0) : e.v;
      if (d.kind == MapKind::Hist || d.kind == MapKind::Lhist) {
        v = 0;
        for (auto b : e.buckets) v += static_cast<std::int64_t>(b);
      }
      out[key_text(d, e.keys, ",", false)] = v;
    }
  }
  return out;
}

}  // namespace xenprobe
