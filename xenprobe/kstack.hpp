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
  std::vector<Fn> fns_;                                           // by start
  mutable std::unordered_map<std::uint64_t, std::string> cache_;  // bounded (kMaxCached)
  static constexpr std::size_t kMaxCached = 1u << 16;
};

// A domain's kstack text for its hits: the stack from Session::kernel_stack, named with the
// domain's functions, fetched again (find_symbols) whenever the library says the domain's
// symbols changed (Session::symbols_generation: a module came or went), so that a frame in a
// module loaded after the start is named and one of a module that went is not.
class StackNamer {
 public:
  StackNamer(xenprobes::Session& s, xenprobes::DomId dom) : s_(s), dom_(dom) {}
  // The unwind tables and the names, before any probe is in place; why not, on failure.
  xenprobes::Result<void> prepare();
  // The hit's stack as kstack text (at most `frames` frames); false when it has none.
  bool stack(xenprobes::HitContext& c, unsigned frames, std::string& out);

 private:
  xenprobes::Result<void> fetch_names();
  xenprobes::Session& s_;
  xenprobes::DomId dom_;
  StackSymbols names_;
  std::uint64_t generation_ = 0;
  bool told_stale_ = false;  // a failed fetch was reported (once per domain)
};

}  // namespace xenprobe
