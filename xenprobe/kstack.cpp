// kstack's text (kstack.hpp).
#include "kstack.hpp"

#include <algorithm>
#include <cstdio>

namespace xenprobe {

StackSymbols::StackSymbols(std::vector<xenprobes::SymbolInfo> symbols) {
  for (auto& s : symbols) {
    if (!s.function) continue;
    // A loaded module's function comes as "module:func"; a stack names it as /proc/kallsyms does.
    std::string n = std::move(s.name);
    if (auto colon = n.find(':'); colon != std::string::npos) n = n.substr(colon + 1) + " [" + n.substr(0, colon) + "]";
    fns_.push_back(Fn{s.address.value, s.size, std::move(n)});
  }
  std::stable_sort(fns_.begin(), fns_.end(), [](const Fn& a, const Fn& b) { return a.start < b.start; });
}

std::string StackSymbols::name(std::uint64_t addr) const {
  if (auto c = cache_.find(addr); c != cache_.end()) return c->second;
  char buf[40];
  std::string out;
  auto it = std::upper_bound(fns_.begin(), fns_.end(), addr, [](std::uint64_t a, const Fn& f) { return a < f.start; });
  if (it != fns_.begin()) {
    // Of aliases at one address the first listed one names it.
    auto f = std::prev(it);
    while (f != fns_.begin() && std::prev(f)->start == f->start) --f;
    const std::uint64_t off = addr - f->start;
    if (off < f->size || off == 0) {
      std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(off));
      const auto bracket = f->name.find(" [");
      out = bracket == std::string::npos ? f->name + buf : f->name.substr(0, bracket) + buf + f->name.substr(bracket);
    }
  }
  if (out.empty()) {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(addr));
    out = buf;
  }
  if (cache_.size() < kMaxCached) cache_.emplace(addr, out);
  return out;
}

std::string StackSymbols::format(const std::vector<xenprobes::Gva>& frames) const {
  std::string s = "\n";
  for (const xenprobes::Gva& f : frames) s += "        " + name(f.value) + "\n";
  return s;
}

xenprobes::Result<void> StackNamer::fetch_names() {
  // The generation before the names: a change between the two is fetched again next time.
  const std::uint64_t gen = s_.symbols_generation(dom_);
  auto fns = s_.find_symbols(dom_, "*");
  if (!fns) return std::unexpected(fns.error());
  names_ = StackSymbols(std::move(*fns));
  generation_ = gen;
  return {};
}

xenprobes::Result<void> StackNamer::prepare() {
  if (auto t = s_.load_unwind_tables(dom_); !t) return std::unexpected(t.error());
  return fetch_names();
}

bool StackNamer::stack(xenprobes::HitContext& c, unsigned frames, std::string& out) {
  auto st = s_.kernel_stack(c, frames);
  if (!st || st->frames.empty()) return false;
  // A failed fetch keeps the names there were (and tries again at the next stack); said once.
  if (s_.symbols_generation(dom_) != generation_)
    if (auto f = fetch_names(); !f && !told_stale_) {
      std::fprintf(stderr,
                   "xenprobe: domain %u: the modules changed but their names could not be read again (%s); "
                   "kstack names frames with the names read before\n",
                   dom_.value, f.error().what.c_str());
      told_stale_ = true;
    }
  out = names_.format(st->frames);
  return true;
}

}  // namespace xenprobe
