// A kernel image's core text and functions as the jump index decodes them from a guest
// (probe/jump_index.hpp), and the index as the engine built it before the lean decoder
// (x86::decode_function() on one thread): for tests/unit/probe/jump_index_decode_test.cpp and
// bench/jump_index_bench.cpp. Debian's kernels come from the cache
// tools/fetch-debian-kernels.sh fills (XENPROBES_KERNEL_CACHE, else /var/cache/xenprobes-kernels).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernel/tables.hpp"
#include "probe/jump_index.hpp"
#include "symbols/kernel_image.hpp"
#include "x86/insn.hpp"

namespace xenprobes::testing {

struct IndexKernel {
  std::vector<std::uint8_t> text;  // the core text, [_stext, _etext)
  std::uint64_t base = 0;          // _stext
  std::vector<symbols::Function> fns;
  std::vector<bool> unread;  // per page: none unless a test marks some
};

inline constexpr std::uint64_t kIndexPage = 4096;
inline constexpr std::uint64_t kIndexMaxFunctionBytes = std::uint64_t{256} * 1024;  // as the engine

inline std::optional<IndexKernel> load_index_kernel(const std::filesystem::path& vmlinux,
                                                    const std::filesystem::path& system_map, std::string& why) {
  // Debian's vmlinux is a decompressed vmlinuz, without a symbol table: System.map names.
  auto elf = elf::load(vmlinux);
  auto syms = symbols::SymbolTable::load(system_map);
  if (!elf || !syms) {
    why = !elf ? elf.error().what : syms.error().what;
    return std::nullopt;
  }
  const symbols::KernelImage img = symbols::KernelImage::with_symbols(std::move(*elf), *syms, vmlinux.string());
  const auto read = [&](Gva a, std::span<std::byte> out) { return img.read(a, out); };
  const kernel::KernelTables t = kernel::KernelTables::read(*syms, read);
  const kernel::Range r = t.core_text();
  if (r.empty()) {
    why = "no _stext/_etext";
    return std::nullopt;
  }
  IndexKernel k;
  k.base = r.start;
  k.text.resize(r.end - r.start);
  if (auto ok = read(Gva{r.start}, std::as_writable_bytes(std::span(k.text))); !ok) {
    why = ok.error().what;
    return std::nullopt;
  }
  k.unread.assign((k.text.size() + kIndexPage - 1) / kIndexPage, false);
  k.fns = probe::index_functions(*syms, r);
  return k;
}

// The directory of the cached Debian kernel whose version starts with `version` ("6.1.").
inline std::optional<std::filesystem::path> cached_debian_kernel(const std::string& version) {
  namespace fs = std::filesystem;
  const char* e = std::getenv("XENPROBES_KERNEL_CACHE");
  const fs::path dir = e && *e ? fs::path(e) : fs::path("/var/cache/xenprobes-kernels");
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(dir, ec))
    if (d.path().filename().string().starts_with(version) && fs::exists(d.path() / "vmlinux") &&
        fs::exists(d.path() / "System.map"))
      return d.path();
  return std::nullopt;
}

// What decode_function() made of a function the loop decoded (not called for one on an unread
// page).
using DecodedFn =
    std::function<void(const symbols::Function&, std::span<const std::uint8_t>, const Result<std::vector<x86::Insn>>&)>;

// The engine's loop before the lean decoder (Engine::cross_function_branches), verbatim but for
// where it puts things.
inline probe::CrossBranches old_index(const IndexKernel& k, const DecodedFn& each = {}) {
  probe::CrossBranches out;
  const std::uint64_t size = k.text.size();
  std::vector<std::uint64_t> starts;
  for (const symbols::Function& f : k.fns) starts.push_back(f.start.value);
  for (const symbols::Function& f : k.fns) {
    const std::uint64_t lo = f.start.value - k.base;
    if (f.size == 0 || f.size > kIndexMaxFunctionBytes || f.size > size - lo) continue;
    bool readable = true;
    for (std::uint64_t p = lo / kIndexPage; p <= (lo + f.size - 1) / kIndexPage; ++p)
      readable = readable && !k.unread[p];
    const auto bytes = std::span(k.text).subspan(lo, f.size);
    auto insns = readable ? x86::decode_function(bytes, f.start)
                          : Result<std::vector<x86::Insn>>(fail(Errc::Fault, "unreadable"));
    if (readable && each) each(f, bytes, insns);
    if (!insns) {
      ++out.unknown;
      continue;
    }
    const std::uint64_t hi = f.start.value + f.size;
    bool named = false;
    for (const x86::Insn& i : *insns) {
      const std::uint64_t t = i.branch_target.value;
      if (!i.is_relative_branch() || (t >= f.start.value && t < hi) || t < k.base || t - k.base >= size) continue;
      if (std::binary_search(starts.begin(), starts.end(), t)) continue;
      if (!named) out.names.push_back(f.name), named = true;
      out.branches.push_back({t - k.base, i.address.value - k.base, static_cast<std::uint32_t>(out.names.size() - 1)});
    }
  }
  return out;
}

}  // namespace xenprobes::testing
