// A demo guest with a loaded-module list in its memory that a test changes while a Session
// probes it: modules loaded and unloaded after attach (docs/guest-symbols.md "When modules
// come and go"). Shared by the library's tests (tests/engine/module_refresh_test.cpp) and
// xenprobe's (tests/xenprobe/module_refresh_test.cpp).
//
// The module's text is real, running code: part of the demo guest's kstack chain
// (guest/kstack.S: demo_kstack_entry calls outer, which calls middle, which calls leaf; its
// hand-written ORC table describes all four). The guest's System.map given to the library
// moves the core kernel's text bounds so that the chain is cut in two:
//  - Split::Callee: the module is outer, middle and leaf ([outer, _etext), `_etext` moved down
//    to outer): a probe on `kmod:demo_kstack_leaf` is a probe in module text, and its stack
//    leaves the module for the kernel's demo_kstack_entry;
//  - Split::Caller: the module is entry and outer ([entry, middle), `_stext` moved up to
//    middle): a probe on the kernel's demo_kstack_leaf has the module's functions as callers.
//  - Split::Cross: the module is every function from demo_cross_into to the end of the text
//    (`_etext` moved down to demo_cross_into): demo_cross_from's jump into the middle of
//    demo_cross_into (guest/safety.S) is a branch between two functions of one module.
// Those functions are left out of the map: they are the module's (its core_kallsyms). The
// module's ORC table is the demo's whole table (struct module's arch.*): the reader keeps the
// entries in the module's text, the kernel's keeps those in its own.
//
// One more PT_LOAD segment, writable, 2 MiB above the image, holds the kernel's BTF (struct
// module in Linux 6.12's layout, unit/kernel/fake_module_btf.hpp), the `modules` list head, two
// struct module slots and the module's symbol tables.
#pragma once

#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo_image.hpp"
#include "unit/kernel/fake_module_btf.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {

enum class Split { Callee, Caller, Cross };

struct ModuleGuest {
  static constexpr std::uint64_t kSeg = 0xffffffff81200000ull;
  static constexpr std::uint64_t kHead = kSeg + 0x8000, kSlot0 = kSeg + 0x9000, kSlot1 = kSeg + 0xa000,
                                 kSymtab = kSeg + 0xb000, kStrtab = kSeg + 0xc000, kTypetab = kSeg + 0xd000,
                                 kSegSize = 0xe000;
  Offsets o = k612;
  std::string image, map;
  std::uint64_t text_start = 0, text_end = 0;  // the module's text
  std::vector<std::string> functions;          // its functions, by address
  std::uint64_t orc_ip = 0, orc = 0, orc_num = 0;

  ModuleGuest() = default;
  ModuleGuest(const ModuleGuest&) = delete;
  ~ModuleGuest() {
    std::filesystem::remove(image);
    std::filesystem::remove(map);
  }
};

namespace module_guest_detail {

struct MapLine {
  std::uint64_t addr;
  char type;
  std::string name;
};

inline std::vector<MapLine> read_map(const std::string& path) {
  std::vector<MapLine> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string a, n;
    char t;
    if (is >> a >> t >> n) out.push_back({std::stoull(a, nullptr, 16), t, n});
  }
  return out;
}

inline std::uint64_t addr_of(const std::vector<MapLine>& m, const std::string& name) {
  for (const MapLine& l : m)
    if (l.name == name) return l.addr;
  throw std::runtime_error("no " + name + " in the demo guest's System.map");
}

}  // namespace module_guest_detail

// Builds the image and the map (files removed with the ModuleGuest).
inline void make_module_guest(ModuleGuest& g, Split split) {
  using namespace module_guest_detail;
  const std::string dir = hv::sim::default_guest_dir();
  std::vector<MapLine> map = read_map(dir + "/System.map");
  const std::uint64_t entry = addr_of(map, "demo_kstack_entry"), outer = addr_of(map, "demo_kstack_outer"),
                      middle = addr_of(map, "demo_kstack_middle"), etext = addr_of(map, "_etext");
  if (split == Split::Callee) {
    g.text_start = outer, g.text_end = etext;
    g.functions = {"demo_kstack_outer", "demo_kstack_middle", "demo_kstack_leaf"};
  } else if (split == Split::Cross) {
    g.text_start = addr_of(map, "demo_cross_into"), g.text_end = etext;
    // Every function there, by address (demo_nokprobe_fn_end, a label at demo_ibt_fn, is left out
    // of both: module functions do not overlap).
    for (const MapLine& l : map)
      if ((l.type == 't' || l.type == 'T') && l.addr >= g.text_start && l.addr < etext &&
          l.name != "demo_nokprobe_fn_end")
        g.functions.push_back(l.name);
    std::stable_sort(g.functions.begin(), g.functions.end(),
                     [&](const std::string& a, const std::string& b) { return addr_of(map, a) < addr_of(map, b); });
  } else {
    g.text_start = entry, g.text_end = middle;
    g.functions = {"demo_kstack_entry", "demo_kstack_outer"};
  }
  g.orc_ip = addr_of(map, "__start_orc_unwind_ip");
  g.orc = addr_of(map, "__start_orc_unwind");
  g.orc_num = (addr_of(map, "__stop_orc_unwind_ip") - g.orc_ip) / 4;

  // The segment: the kernel's BTF at its start, the module's symbols (loaded later by
  // load_module, which writes struct module itself).
  std::vector<std::uint8_t> seg(ModuleGuest::kSegSize);
  auto put = [&](std::uint64_t at, const void* p, std::size_t n) { std::memcpy(seg.data() + (at - g.kSeg), p, n); };
  const std::vector<std::byte> btf = module_btf(g.o);
  put(g.kSeg, btf.data(), btf.size());
  const std::uint64_t head_self[2] = {ModuleGuest::kHead, ModuleGuest::kHead};  // an empty list
  put(ModuleGuest::kHead, head_self, sizeof head_self);
  std::string strtab(1, '\0'), typetab = "U";
  for (std::size_t i = 0; i < g.functions.size(); ++i) {
    const std::uint32_t name = static_cast<std::uint32_t>(strtab.size());
    strtab += g.functions[i] + '\0';
    typetab += 't';
    std::uint8_t e[24] = {};
    std::memcpy(e, &name, 4);
    const std::uint16_t shndx = 1;
    std::memcpy(e + 6, &shndx, 2);
    const std::uint64_t value = addr_of(map, g.functions[i]);
    std::memcpy(e + 8, &value, 8);  // st_size 0: up to the next function or the text's end
    put(ModuleGuest::kSymtab + 24 * (i + 1), e, sizeof e);
  }
  put(ModuleGuest::kStrtab, strtab.data(), strtab.size());
  put(ModuleGuest::kTypetab, typetab.data(), typetab.size());

  // The map: the module's functions out, the core text's bounds moved, the BTF and the list in.
  std::ostringstream m;
  char line[640];
  for (const MapLine& l : map) {
    if (std::find(g.functions.begin(), g.functions.end(), l.name) != g.functions.end()) continue;
    if (split == Split::Cross && l.name == "demo_nokprobe_fn_end") continue;
    std::uint64_t a = l.addr;
    if (split == Split::Callee && l.name == "_etext") a = outer;
    if (split == Split::Cross && l.name == "_etext") a = g.text_start;
    if (split == Split::Caller && l.name == "_stext") a = middle;
    std::snprintf(line, sizeof line, "%016llx %c %s\n", static_cast<unsigned long long>(a), l.type, l.name.c_str());
    m << line;
  }
  std::snprintf(line, sizeof line, "%016llx R __start_BTF\n%016llx R __stop_BTF\n%016llx D modules\n",
                static_cast<unsigned long long>(g.kSeg), static_cast<unsigned long long>(g.kSeg + btf.size()),
                static_cast<unsigned long long>(ModuleGuest::kHead));
  m << line;

  // The demo guest's ELF with the segment as one more PT_LOAD.
  const std::vector<char> f = demo_image_with_segment(dir + "/vmlinux", g.kSeg, seg, PF_R | PF_W);
  static int serial = 0;
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("xp-module-guest-" + std::to_string(::getpid()) + "-" + std::to_string(serial++)))
                               .string();
  g.image = base + ".elf";
  g.map = base + ".map";
  std::ofstream(g.image, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  std::ofstream(g.map) << m.str();
}

// What insmod and rmmod change in the guest's memory, written from Dom0.
class ModuleWriter {
 public:
  ModuleWriter(hv::Hypervisor& hv, DomId dom, const ModuleGuest& g) : g_(g), sim_(hv::sim::sim_host_of(hv)), dom_(dom) {
    auto v = GuestView::open(hv, dom);
    if (!v) throw std::runtime_error("GuestView: " + v.error().what);
    view_ = std::move(*v);
  }
  void u64(std::uint64_t at, std::uint64_t v) { write(at, &v, 8); }
  void u32(std::uint64_t at, std::uint32_t v) { write(at, &v, 4); }
  void write(std::uint64_t at, const void* p, std::size_t n) {
    auto r = view_->write(Gva{at}, std::as_bytes(std::span(static_cast<const std::uint8_t*>(p), n)));
    if (!r) throw std::runtime_error("write: " + r.error().what);
  }
  // A LIVE module `name` at struct module `slot`, alone in the list.
  void load(const std::string& name = "kmod", std::uint64_t slot = ModuleGuest::kSlot0) {
    const Offsets& o = g_.o;
    std::vector<std::uint8_t> zero(o.size);
    write(slot, zero.data(), zero.size());
    u32(slot + o.state, 0);  // MODULE_STATE_LIVE
    char nm[56] = {};
    std::snprintf(nm, sizeof nm, "%s", name.c_str());
    write(slot + o.name, nm, sizeof nm);
    u64(slot + o.text, g_.text_start);  // mem[MOD_TEXT].base, .size
    u32(slot + o.text + 8, static_cast<std::uint32_t>(g_.text_end - g_.text_start));
    u64(slot + o.core_kallsyms, ModuleGuest::kSymtab);
    u32(slot + o.core_kallsyms + 8, static_cast<std::uint32_t>(g_.functions.size() + 1));
    u64(slot + o.core_kallsyms + 16, ModuleGuest::kStrtab);
    u64(slot + o.core_kallsyms + 24, ModuleGuest::kTypetab);
    u32(slot + o.arch, static_cast<std::uint32_t>(g_.orc_num));  // arch.num_orcs, orc_unwind_ip, orc_unwind
    u64(slot + o.arch + 8, g_.orc_ip);
    u64(slot + o.arch + 16, g_.orc);
    // Linked last, as the kernel adds a module to the list once it is formed.
    u64(slot + o.list, ModuleGuest::kHead);
    u64(slot + o.list + 8, ModuleGuest::kHead);
    u64(ModuleGuest::kHead, slot + o.list);
    u64(ModuleGuest::kHead + 8, slot + o.list);
    notify(name, false);  // MODULE_STATE_COMING: the kernel's module notifier
  }
  // GOING, then out of the list.
  void unload(std::uint64_t slot = ModuleGuest::kSlot0) {
    u32(slot + g_.o.state, 2);
    char nm[57] = {};
    auto v = view_->read(Gva{slot + g_.o.name}, std::as_writable_bytes(std::span(nm, 56)));
    if (!v) throw std::runtime_error("read: " + v.error().what);
    notify(nm, true);  // MODULE_STATE_GOING, while the module is still in the list
    u64(ModuleGuest::kHead, ModuleGuest::kHead);
    u64(ModuleGuest::kHead + 8, ModuleGuest::kHead);
  }
  // How many modules the guest module's set of modules that went held after the last notification.
  unsigned gone = 0;

 private:
  void notify(const std::string& name, bool going) {
    if (!sim_) return;
    auto r = sim_->module_state(dom_, name, g_.text_start, going);
    if (!r) throw std::runtime_error("module_state: " + r.error().what);
    gone = *r;
  }
  const ModuleGuest& g_;
  hv::sim::SimHost* sim_;
  DomId dom_;
  std::unique_ptr<GuestView> view_;
};

}  // namespace xenprobes::testing
