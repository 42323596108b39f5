// A demo guest with kallsyms of its own: the demo guest has none, so a test gives it tables in
// Linux 6.12's layout built from its System.map (with two compression tokens, so names really
// are expanded) and a small BTF blob that __start_BTF/__stop_BTF bound, as one extra read-only
// PT_LOAD segment 2 MiB above the image, past unmapped pages the search has to step over. The
// simulated Xen boots it in place of the demo image (DomainConfig::image, xenprobe --sim-image).
#pragma once

#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo_image.hpp"

namespace xenprobes::testing {

constexpr std::uint64_t kTablesVa = 0xffffffff81200000ull;  // 2 MiB above the demo's _text

struct Sym {
  char type;
  std::string name;
  std::uint64_t addr;
};

inline std::vector<Sym> symbols_of_map(const std::string& system_map) {
  std::vector<Sym> out;
  std::ifstream f(system_map);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string a, n;
    char t;
    if (is >> a >> t >> n && t != 'A' && t != 'a' && t != 'U' && t != 'N')
      out.push_back({t, n, std::stoull(a, nullptr, 16)});
  }
  return out;
}

inline void put(std::vector<std::uint8_t>& b, const void* p, std::size_t n) {
  b.insert(b.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
}
inline void align8(std::vector<std::uint8_t>& b) { b.resize((b.size() + 7) & ~std::size_t{7}); }

// A minimal valid BTF: one 4-byte signed int named "int".
inline std::vector<std::uint8_t> tiny_btf() {
  const char strs[] = "\0int";
  const std::uint32_t type[] = {1, 1u << 24, 4, (1u << 24) | 32};  // name_off, INT kind, size, encoding
  struct {
    std::uint16_t magic = 0xeb9f;
    std::uint8_t version = 1, flags = 0;
    std::uint32_t hdr_len = 24, type_off = 0, type_len = sizeof type, str_off = sizeof type, str_len = sizeof strs;
  } h;
  std::vector<std::uint8_t> b;
  put(b, &h, sizeof h);
  put(b, type, sizeof type);
  put(b, strs, sizeof strs);
  return b;
}

// Tables in the 6.12 order, at kTablesVa: num_syms, names, markers, token_table, token_index,
// offsets, relative_base; then the BTF blob, which __start_BTF / __stop_BTF bound.
inline std::vector<std::uint8_t> kallsyms_segment(std::vector<Sym>& syms, std::size_t* btf_at) {
  std::vector<std::string> tokens(256);
  for (int c = 1; c < 256; ++c) tokens[c] = std::string(1, static_cast<char>(c));
  tokens[1] = "demo_";  // bytes 1 and 2 occur in no name: free for substrings
  tokens[2] = "sys_";
  // __start_BTF/__stop_BTF are placed after the tables, whose size does not depend on their
  // addresses: lay out once with placeholders, then fill in.
  const std::vector<std::uint8_t> btf = tiny_btf();
  syms.push_back({'R', "__start_BTF", 0});
  syms.push_back({'R', "__stop_BTF", 0});
  auto build = [&]() {
    std::stable_sort(syms.begin(), syms.end(), [](const Sym& a, const Sym& b) { return a.addr < b.addr; });
    std::vector<std::uint8_t> b;
    const std::uint32_t n = static_cast<std::uint32_t>(syms.size());
    put(b, &n, 4);
    align8(b);
    const std::size_t names = b.size();
    std::vector<std::uint32_t> markers;
    for (std::size_t i = 0; i < syms.size(); ++i) {
      if (i % 256 == 0) markers.push_back(static_cast<std::uint32_t>(b.size() - names));
      std::string body = std::string(1, syms[i].type) + syms[i].name, packed;
      for (std::size_t k = 0; k < body.size();) {
        if (body.compare(k, 5, "demo_") == 0) packed += '\1', k += 5;
        else if (body.compare(k, 4, "sys_") == 0) packed += '\2', k += 4;
        else packed += body[k++];
      }
      b.push_back(static_cast<std::uint8_t>(packed.size()));
      put(b, packed.data(), packed.size());
    }
    align8(b);
    put(b, markers.data(), 4 * markers.size());
    align8(b);
    const std::size_t table = b.size();
    std::vector<std::uint16_t> index;
    for (const auto& t : tokens) {
      index.push_back(static_cast<std::uint16_t>(b.size() - table));
      put(b, t.c_str(), t.size() + 1);
    }
    align8(b);
    put(b, index.data(), 2 * index.size());
    align8(b);
    std::uint64_t base = ~0ull;
    for (const Sym& s : syms) base = std::min(base, s.addr);
    for (const Sym& s : syms) {
      const std::uint32_t off = static_cast<std::uint32_t>(s.addr - base);
      put(b, &off, 4);
    }
    align8(b);
    put(b, &base, 8);
    align8(b);
    *btf_at = b.size();
    put(b, btf.data(), btf.size());
    return b;
  };
  std::vector<std::uint8_t> first = build();
  for (Sym& s : syms) {
    if (s.name == "__start_BTF") s.addr = kTablesVa + *btf_at;
    if (s.name == "__stop_BTF") s.addr = kTablesVa + *btf_at + btf.size();
  }
  std::vector<std::uint8_t> out = build();
  if (out.size() != first.size()) throw std::logic_error("kallsyms_segment: the layout moved with the BTF's address");
  return out;
}

// The demo guest's ELF (`vmlinux`) with `extra` as one more read-only PT_LOAD at kTablesVa, in
// a file of its own (the caller removes it).
inline std::string image_with_segment(const std::string& vmlinux, const std::vector<std::uint8_t>& extra) {
  const std::vector<char> f = demo_image_with_segment(vmlinux, kTablesVa, extra, PF_R);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("xp-kallsyms-guest-" + std::to_string(::getpid()))).string();
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  return path;
}

}  // namespace xenprobes::testing
