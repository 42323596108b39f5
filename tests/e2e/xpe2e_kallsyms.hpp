// The guest kernel's own symbols as Dom0 reads them, for the commands that find their points
// in the running guest independently of the library (safety, safety-extable-all, kill-icall).
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "xpe2e_common.hpp"

namespace xpe2e {

// Dom0's /proc/kallsyms (a PV guest runs Dom0's kernel build, no KASLR; the PVH guest boots
// with nokaslr), and the kernel's System.map for linker symbols kallsyms might leave out.
struct Kallsyms {
  struct Sym {
    std::uint64_t addr;
    char type;
    std::string name;
  };
  std::vector<Sym> all;  // sorted by address; the kernel's own symbols only (no [module])
  std::map<std::string, std::vector<std::uint64_t>> by_name;
  std::string source;

  bool load(const std::string& path) {
    std::ifstream in(path);
    if (!in) return false;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string addr, type, name, mod;
      if (!(ls >> addr >> type >> name) || type.size() != 1) continue;
      if (ls >> mod) continue;  // a module's symbol
      std::uint64_t a = std::strtoull(addr.c_str(), nullptr, 16);
      if (!a) continue;
      all.push_back(Sym{a, type[0], name});
    }
    std::stable_sort(all.begin(), all.end(), [](const Sym& x, const Sym& y) { return x.addr < y.addr; });
    for (auto& y : all) by_name[y.name].push_back(y.addr);
    source = path;
    return !all.empty();
  }
  std::optional<std::uint64_t> addr(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second.empty()) return std::nullopt;
    return it->second.front();
  }
  // The extent of the function at `start`: up to the next symbol at a higher address (`start`
  // itself when there is none: an empty extent).
  std::uint64_t end_of(std::uint64_t start) const {
    auto it = std::upper_bound(all.begin(), all.end(), start, [](std::uint64_t a, const Sym& y) { return a < y.addr; });
    return it == all.end() ? start : it->addr;
  }
  // "name+0xoff" of an address (the symbol at or below it).
  std::string describe(std::uint64_t a) const {
    auto it = std::upper_bound(all.begin(), all.end(), a, [](std::uint64_t v, const Sym& y) { return v < y.addr; });
    if (it == all.begin()) return fmt("%#" PRIx64, a);
    --it;
    return fmt("%s+0x%" PRIx64, it->name.c_str(), a - it->addr);
  }
  // The name of the symbol exactly at `a`, or "".
  std::string at(std::uint64_t a) const {
    auto it = std::lower_bound(all.begin(), all.end(), a, [](const Sym& y, std::uint64_t v) { return y.addr < v; });
    return it != all.end() && it->addr == a ? it->name : std::string();
  }
};

}  // namespace xpe2e
