// Writes the btf_modules seeds of the kallsyms fuzz target (tests/fuzz/corpus/kallsyms/
// btf_modules_*: the input's first u32 with its two top bits set, then the format
// btf_modules_fuzz.hpp describes): a kernel's btf_modules list as Linux lays it out (struct
// btf_module 48 bytes: list +0, module +16, btf +24; struct btf: data +0, data_size +80), with
// module BTF split over fake_module_btf.hpp's 6.12 kernel BTF, honest and hostile. Not built by
// the project; run once by hand:
//   g++ -std=c++20 -Itests tests/fuzz/make_btf_modules_seeds.cpp -o /tmp/seedgen -lbpf
//   /tmp/seedgen tests/fuzz/corpus/kallsyms
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "unit/kernel/fake_module_btf.hpp"

using xenprobes::testing::k612;
using xenprobes::testing::module_btf;

namespace {

constexpr std::uint64_t kMem = 0xffffffffc7000000ull, kModA = 0xffffffffc1000000ull;
constexpr std::uint64_t kEntry0 = 0x100, kEntry1 = 0x200, kBtf0 = 0x400, kBtf1 = 0x500, kData0 = 0x1000,
                        kData1 = 0x2000;

std::vector<std::byte> split(const std::vector<std::byte>& base_raw, const char* name) {
  btf* base = btf__new(base_raw.data(), static_cast<__u32>(base_raw.size()));
  btf* b = btf__new_empty_split(base);
  const int u32 = btf__find_by_name_kind(base, "unsigned int", BTF_KIND_INT);
  btf__add_struct(b, name, 8);
  btf__add_field(b, "flags", u32, 0, 0);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> out(raw, raw + n);
  btf__free(b);
  btf__free(base);
  return out;
}

struct Mem {
  std::vector<std::uint8_t> b = std::vector<std::uint8_t>(0x3000);
  void u64(std::uint64_t at, std::uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
  void u32(std::uint64_t at, std::uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
  void put(std::uint64_t at, const std::vector<std::byte>& v) { std::memcpy(b.data() + at, v.data(), v.size()); }
};

// head -> entry 0 (module 0) -> entry 1 (module 1) -> head; module 2 has none.
Mem honest_list(const std::vector<std::byte>& a, const std::vector<std::byte>& c) {
  Mem m;
  m.u64(0, kMem + kEntry0);
  m.u64(8, kMem + kEntry1);
  m.u64(kEntry0, kMem + kEntry1);
  m.u64(kEntry0 + 8, kMem);
  m.u64(kEntry0 + 16, kModA);
  m.u64(kEntry0 + 24, kMem + kBtf0);
  m.u64(kEntry1, kMem);
  m.u64(kEntry1 + 8, kMem + kEntry0);
  m.u64(kEntry1 + 16, kModA + 0x1000);
  m.u64(kEntry1 + 24, kMem + kBtf1);
  m.u64(kBtf0, kMem + kData0);
  m.u32(kBtf0 + 80, static_cast<std::uint32_t>(a.size()));
  m.u64(kBtf1, kMem + kData1);
  m.u32(kBtf1 + 80, static_cast<std::uint32_t>(c.size()));
  m.put(kData0, a);
  m.put(kData1, c);
  return m;
}

void write(const std::string& dir, const std::string& name, std::uint8_t flags, const std::vector<std::uint8_t>& extra,
           const Mem& m) {
  std::ofstream o(dir + "/btf_modules_" + name, std::ios::binary);
  const std::uint32_t sel = 0xc0000000u;
  o.write(reinterpret_cast<const char*>(&sel), 4);
  const std::uint8_t limit = 15;
  const std::uint16_t max_bytes = 4096;
  o.write(reinterpret_cast<const char*>(&flags), 1);
  o.write(reinterpret_cast<const char*>(&limit), 1);
  o.write(reinterpret_cast<const char*>(&max_bytes), 2);
  o.write(reinterpret_cast<const char*>(extra.data()), static_cast<std::streamsize>(extra.size()));
  o.write(reinterpret_cast<const char*>(m.b.data()), static_cast<std::streamsize>(m.b.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  const auto kernel = module_btf(k612);
  const auto a = split(kernel, "mod_a_type"), c = split(kernel, "mod_b_type");
  write(dir, "honest", 1, {}, honest_list(a, c));
  write(dir, "linux_shape", 1 | 4, {}, honest_list(a, c));
  {
    Mem m = honest_list(a, c);
    m.u64(kEntry1, kMem + kEntry0);  // entry 1 loops back to entry 0
    write(dir, "loop", 1, {}, m);
  }
  {
    Mem m = honest_list(a, c);
    m.u64(kEntry0 + 16, kModA + 0x800);  // no module
    m.u64(kEntry1 + 16, kModA + 0x800);
    write(dir, "stray", 1, {}, m);
  }
  {
    Mem m = honest_list(a, c);
    m.b[kData0] = 0xeb;  // big-endian magic
    m.b[kData0 + 1] = 0x9f;
    m.u32(kBtf1 + 80, 0xffffffffu);  // a huge data_size
    write(dir, "bad_magic_huge_size", 1, {}, m);
  }
  {
    // Module 0 keeps btf_data (at kData1, the other module's blob); its entry's BTF is junk past
    // its header, so libbpf refuses it and btf_data serves.
    Mem m = honest_list(a, c);
    std::memset(m.b.data() + kData0 + 24, 0x5a, a.size() - 24);
    std::vector<std::uint8_t> extra(6);
    const std::uint32_t off = kData1;
    const std::uint16_t size = static_cast<std::uint16_t>(c.size());
    std::memcpy(extra.data(), &off, 4);
    std::memcpy(extra.data() + 4, &size, 2);
    write(dir, "btf_data_kept", 1 | 8, extra, m);
  }
  {
    // The layout from a kernel BTF given in the input (the hand-made one, as bytes).
    std::vector<std::uint8_t> extra(2 + kernel.size());
    const auto n = static_cast<std::uint16_t>(kernel.size());
    std::memcpy(extra.data(), &n, 2);
    std::memcpy(extra.data() + 2, kernel.data(), kernel.size());
    write(dir, "layout_from_input", 1 | 2, extra, honest_list(a, c));
  }
  return 0;
}
