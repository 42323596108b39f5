// A demo guest with one loaded module whose types come from the guest's memory: for the tests
// of xenprobe (tests/xenprobe/xenprobe_test.cpp) and of xenprobesd (tests/xenprobesd/), which
// run the tools as subprocesses on the simulated Xen with `--sim-image` and a System.map.
//
// The demo guest has no modules, so this one gets one: an extra read-only PT_LOAD segment at
// kSeg holding the kernel's BTF (struct module in 6.12's layout, struct btf_module and struct
// btf: fake_module_btf.hpp), the `modules` list head, the `btf_modules` list head, one LIVE
// struct module "xfs" with its core_kallsyms (a function and a data symbol) and its split BTF
// (struct xfs_inode), and its "text" (data a program reads through the function's address as a
// struct xfs_inode: i_ino = kIno, i_flags = kFlags). As on a real kernel once the module's init
// ran, its struct module's btf_data is NULL (btf_data_size kept) and its BTF is reachable only
// through its entry on the kernel's btf_modules list (a struct btf_module at kBtfModule naming
// the struct module, whose struct btf at kBtfStruct has data = kModBtf). Its System.map is the
// demo guest's plus __start_BTF, __stop_BTF, modules and btf_modules.
//
// Variants (ModuleBtfGuest::Options): the module loaded without BTF (btf_data 0 and no
// btf_modules entry, as the kernel leaves a module built without BTF), its BTF through
// btf_data instead of the list (the shape of a kernel that keeps btf_data), or no module at
// all (both lists empty): the kernel's BTF is there in every case.
//
// (tests/engine/module_guest.hpp is another guest: a module list a test changes while it runs.)
#pragma once

#include <elf.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo_image.hpp"
#include "unit/kernel/fake_module_btf.hpp"

namespace xenprobes::testing {

struct ModuleBtfGuest {
  static constexpr std::uint64_t kSeg = 0xffffffff81200000ull;  // 2 MiB above the demo's _text
  // kHead: the `modules` list head; kBtfHead (right after it) the `btf_modules` list head.
  static constexpr std::uint64_t kHead = kSeg + 0x2000, kBtfHead = kHead + 0x10, kBtfModule = kSeg + 0x2100,
                                 kBtfStruct = kSeg + 0x2200, kStruct = kSeg + 0x3000, kSymtab = kSeg + 0x4000,
                                 kStrtab = kSeg + 0x5000, kTypetab = kSeg + 0x6000, kModBtf = kSeg + 0x7000,
                                 kModText = kSeg + 0x8000, kFn = kModText + 0x100;
  static constexpr std::uint64_t kIno = 0x1122334455667788ull;
  static constexpr std::uint32_t kFlags = 42;

  struct Options {
    bool module = true;      // "xfs" is on the module list
    bool module_btf = true;  // and has its split BTF
    bool btf_data = false;   // that BTF through struct module's btf_data, none on btf_modules
    bool linked = true;      // false: "xfs" is laid out in memory but both lists are empty, as
                             // before an insmod; writing link_bytes() at kHead loads it
  };
  // The two list heads' pointers once "xfs" is on both lists (each head's next and prev: the
  // module's list_head, then its struct btf_module): what an insmod writes last
  // (Options::linked, with the BTF on the list).
  static std::vector<std::uint8_t> link_bytes() {
    std::vector<std::uint8_t> b(32);
    const std::uint64_t node = kStruct + k612.list, entry = kBtfModule;
    std::memcpy(b.data(), &node, 8);
    std::memcpy(b.data() + 8, &node, 8);
    std::memcpy(b.data() + 16, &entry, 8);
    std::memcpy(b.data() + 24, &entry, 8);
    return b;
  }

  std::string image, map;  // files, removed with the object

  ModuleBtfGuest() = default;
  ModuleBtfGuest(const ModuleBtfGuest&) = delete;
  ModuleBtfGuest& operator=(const ModuleBtfGuest&) = delete;
  ModuleBtfGuest(ModuleBtfGuest&& o) noexcept : image(std::move(o.image)), map(std::move(o.map)) {
    o.image.clear();
    o.map.clear();
  }
  ~ModuleBtfGuest() {
    if (!image.empty()) std::filesystem::remove(image);
    if (!map.empty()) std::filesystem::remove(map);
  }
};

namespace module_btf_guest_detail {

// The module's split BTF over `base_raw`: struct xfs_inode { u64 i_ino; u32 i_flags; }.
inline std::vector<std::byte> split_module_btf(const std::vector<std::byte>& base_raw) {
  btf* base = btf__new(base_raw.data(), static_cast<__u32>(base_raw.size()));
  btf* b = btf__new_empty_split(base);
  const int u32 = btf__find_by_name_kind(base, "unsigned int", BTF_KIND_INT);
  const int u64 = btf__add_int(b, "long long unsigned int", 8, 0);
  btf__add_struct(b, "xfs_inode", 16);
  btf__add_field(b, "i_ino", u64, 0, 0);
  btf__add_field(b, "i_flags", u32, 64, 0);
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> out(raw, raw + n);
  btf__free(b);
  btf__free(base);
  return out;
}

}  // namespace module_btf_guest_detail

inline ModuleBtfGuest module_btf_guest(ModuleBtfGuest::Options opt = {}) {
  using G = ModuleBtfGuest;
  const Offsets& o = k612;
  std::vector<std::uint8_t> seg(0x9000);
  auto put = [&](std::uint64_t at, const void* p, std::size_t n) { std::memcpy(seg.data() + (at - G::kSeg), p, n); };
  auto u64 = [&](std::uint64_t at, std::uint64_t v) { put(at, &v, 8); };
  auto u32 = [&](std::uint64_t at, std::uint32_t v) { put(at, &v, 4); };
  const auto kbtf = module_btf(o);
  if (kbtf.size() > G::kHead - G::kSeg) throw std::runtime_error("the kernel's BTF does not fit below the list heads");
  put(G::kSeg, kbtf.data(), kbtf.size());
  // Empty lists: each head points at itself (the module's entries linked below).
  for (std::uint64_t h : {G::kHead, G::kBtfHead}) {
    u64(h, h);
    u64(h + 8, h);
  }
  if (opt.module) {
    // The list: head <-> xfs (the head's side written above when it is not linked yet).
    if (opt.linked) {
      u64(G::kHead, G::kStruct + o.list);
      u64(G::kHead + 8, G::kStruct + o.list);
    }
    u64(G::kStruct + o.list, G::kHead);
    u64(G::kStruct + o.list + 8, G::kHead);
    u32(G::kStruct + o.state, 0);  // MODULE_STATE_LIVE
    put(G::kStruct + o.name, "xfs", 4);
    u64(G::kStruct + o.text, G::kModText);  // mem[MOD_TEXT].base
    u32(G::kStruct + o.text + 8, 0x1000);   // mem[MOD_TEXT].size
    u64(G::kStruct + o.core_kallsyms, G::kSymtab);
    u32(G::kStruct + o.core_kallsyms + 8, 3);
    u64(G::kStruct + o.core_kallsyms + 16, G::kStrtab);
    u64(G::kStruct + o.core_kallsyms + 24, G::kTypetab);
    if (opt.module_btf) {
      const auto mbtf = module_btf_guest_detail::split_module_btf(kbtf);
      put(G::kModBtf, mbtf.data(), mbtf.size());
      u32(G::kStruct + o.btf_size, static_cast<std::uint32_t>(mbtf.size()));
      if (opt.btf_data) {
        u64(G::kStruct + o.btf_data, G::kModBtf);
      } else {
        // btf_modules: head <-> one struct btf_module naming "xfs", its struct btf's data the BTF.
        if (opt.linked) {
          u64(G::kBtfHead, G::kBtfModule);
          u64(G::kBtfHead + 8, G::kBtfModule);
        }
        u64(G::kBtfModule, G::kBtfHead);
        u64(G::kBtfModule + 8, G::kBtfHead);
        u64(G::kBtfModule + kBtfModuleModule, G::kStruct);
        u64(G::kBtfModule + kBtfModuleBtf, G::kBtfStruct);
        u64(G::kBtfStruct + kBtfData, G::kModBtf);
        u32(G::kBtfStruct + kBtfDataSize, static_cast<std::uint32_t>(mbtf.size()));
      }
    }
    // core_kallsyms: the null symbol, xfs_file_read_iter (t, 0x80 bytes), xfs_stats (d).
    const char strtab[] = "\0xfs_file_read_iter\0xfs_stats";
    put(G::kStrtab, strtab, sizeof strtab);
    put(G::kTypetab, "Utd", 3);
    auto sym = [&](int i, std::uint32_t name, std::uint64_t value, std::uint64_t size) {
      const std::uint64_t e = G::kSymtab + 24 * static_cast<std::uint64_t>(i);
      u32(e, name);
      const std::uint16_t shndx = 1;
      put(e + 6, &shndx, 2);
      u64(e + 8, value);
      u64(e + 16, size);
    };
    sym(1, 1, G::kFn, 0x80);
    sym(2, 20, G::kModText + 0x800, 8);
  }
  // What a program reads through the function's address as a struct xfs_inode.
  u64(G::kFn, G::kIno);
  u32(G::kFn + 8, G::kFlags);

  // The demo guest's ELF with the segment as one more PT_LOAD.
  namespace fs = std::filesystem;
  const fs::path demo = fs::path(XENPROBES_DEMO_GUEST_SYSTEM_MAP).parent_path();
  const std::vector<char> f = demo_image_with_segment((demo / "vmlinux").string(), G::kSeg, seg, PF_R);
  static std::atomic<unsigned> serial{0};
  G g;
  const std::string base =
      (fs::temp_directory_path() / ("module-btf-guest-" + std::to_string(getpid()) + "-" + std::to_string(serial++)))
          .string();
  g.image = base + ".elf";
  g.map = base + ".map";
  std::ofstream(g.image, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  std::ofstream m(g.map);
  std::stringstream demo_map;
  demo_map << std::ifstream(XENPROBES_DEMO_GUEST_SYSTEM_MAP).rdbuf();
  m << demo_map.str();
  char line[256];
  std::snprintf(line, sizeof line,
                "%016llx R __start_BTF\n%016llx R __stop_BTF\n%016llx D modules\n%016llx d btf_modules\n",
                static_cast<unsigned long long>(G::kSeg), static_cast<unsigned long long>(G::kSeg + kbtf.size()),
                static_cast<unsigned long long>(G::kHead), static_cast<unsigned long long>(G::kBtfHead));
  m << line;
  return g;
}

}  // namespace xenprobes::testing
