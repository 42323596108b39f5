// kstack's text: a hit's guest kernel stack (Session::kernel_stack) named with the domain's
// function symbols, in bpftrace's layout: a newline, then one "        func+0xOFF" line per
// frame (the raw address in hex where no function covers it).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "xenprobes/xenprobes.hpp"

namespace xenprobe {

class StackSymbols {
 public:
  StackSymbols() = default;
  // The domain's functions (Session::find_symbols(dom, "*")); data symbols are ignored.
  explicit StackSymbols(std::vector<xenprobes::SymbolInfo> symbols);
  // "func+0x1f", or "0xffffffff81234567" when no function covers `addr`.
  std::string name(std::uint64_t addr) const;
  std::string format(const std::vector<xenprobes::Gva>& frames) const;

 private:
  struct Fn {
    std::uint64_t start = 0, size = 0;
    std::string name;
  };
  std::vector<Fn> fns_;  // by start
  mutable std::unordered_map<std::uint64_t, std::string> cache_;  // bounded (kMaxCached)
  static constexpr std::size_t kMaxCached = 1u << 16;
};

}  // namespace xenprobe
