// Kallsyms and BTF read out of real Debian kernels, the way they are read out of a guest: the
// kernel ELF inside Debian's vmlinuz is laid out at its link addresses (what the boot loader
// does, minus the relocation), the tables are searched for from the start of its text, and
// every decoded symbol is compared with the System.map of the same build, from Debian's -dbg
// package. tools/fetch-debian-kernels.sh fills the cache (the test command runs it); each
// kernel in the cache is one test case.
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <elf.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/elf_image.hpp"
#include "kernel/addresses_taken.hpp"
#include "kernel/btf.hpp"
#include "kernel/module_btf.hpp"
#include "kernel/module_symbols.hpp"
#include "kernel/tables.hpp"
#include "symbols/kallsyms.hpp"
#include "symbols/kernel_image.hpp"

namespace fs = std::filesystem;
using namespace xenprobes;

namespace {

fs::path cache_dir() {
  const char* e = std::getenv("XENPROBES_KERNEL_CACHE");
  return e && *e ? fs::path(e) : fs::path("/var/cache/xenprobes-kernels");
}

std::vector<std::string> cached_kernels() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(cache_dir(), ec))
    if (fs::exists(d.path() / "vmlinux") && fs::exists(d.path() / "System.map")) out.push_back(d.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// The loadable segments of an ELF at their virtual addresses: a guest's memory, minus paging.
struct Image {
  struct Segment {
    std::uint64_t vaddr;
    std::vector<std::byte> bytes;
  };
  std::vector<Segment> segments;
  std::uint64_t text_start = 0;
  std::size_t reads = 0;

  static Image load(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    Image img;
    Elf64_Ehdr eh;
    if (file.size() < sizeof eh) return img;
    std::memcpy(&eh, file.data(), sizeof eh);
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      std::memcpy(&ph, file.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
      // The per-CPU segment is linked at 0: not where the kernel image is.
      if (ph.p_type != PT_LOAD || ph.p_vaddr < symbols::kKernelImageStart) continue;
      Segment s{ph.p_vaddr, std::vector<std::byte>(ph.p_memsz)};
      std::memcpy(s.bytes.data(), file.data() + ph.p_offset, std::min(ph.p_filesz, ph.p_memsz));
      if (img.text_start == 0 || ph.p_vaddr < img.text_start) img.text_start = ph.p_vaddr;
      img.segments.push_back(std::move(s));
    }
    return img;
  }

  Result<void> read(std::uint64_t addr, std::span<std::byte> out) {
    ++reads;
    for (const Segment& s : segments)
      if (addr >= s.vaddr && addr - s.vaddr <= s.bytes.size() && s.bytes.size() - (addr - s.vaddr) >= out.size()) {
        std::memcpy(out.data(), s.bytes.data() + (addr - s.vaddr), out.size());
        return {};
      }
    return std::unexpected(Error{Errc::Fault, "not mapped"});
  }
};

struct MapLine {
  std::uint64_t addr;
  char type;
};

std::multimap<std::string, MapLine> read_system_map(const fs::path& p) {
  std::multimap<std::string, MapLine> m;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string addr, name;
    char type;
    if (is >> addr >> type >> name) m.emplace(name, MapLine{std::stoull(addr, nullptr, 16), type});
  }
  return m;
}

class RealKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = cache_dir() / GetParam();
    // Loaded once per kernel (60-100 MB each); a test that pokes bytes puts them back.
    static std::map<std::string, Image> loaded;
    if (!loaded.count(GetParam())) loaded.emplace(GetParam(), Image::load(dir_ / "vmlinux"));
    image_ = &loaded.at(GetParam());
    ASSERT_FALSE(image_->segments.empty())
        << dir_ / "vmlinux"
        << " is missing or has no kernel segment: run sh tools/fetch-debian-kernels.sh "
        << "(or point XENPROBES_KERNEL_CACHE at its cache)";
  }
  symbols::MemoryReadFn reader() {
    return [this](std::uint64_t a, std::span<std::byte> out) { return image_->read(a, out); };
  }
  fs::path dir_;
  Image* image_ = nullptr;
};

// Every symbol kallsyms holds is in System.map at the same address with the same type, and
// every System.map symbol kallsyms is meant to hold (scripts/kallsyms.c keeps everything with
// --all-symbols but undefined, debugging and absolute symbols and its own tables) is there.
TEST_P(RealKernel, KallsymsFromTheImageMatchSystemMap) {
  auto found = symbols::find_kallsyms(reader(), image_->text_start, symbols::kKernelImageEnd);
  ASSERT_TRUE(found) << found.error().what;
  const auto map = read_system_map(dir_ / "System.map");

  // The tables are where the linker put them.
  auto at = [&](const char* n) { return map.find(n) == map.end() ? 0 : map.find(n)->second.addr; };
  EXPECT_EQ(found->where.token_table, at("kallsyms_token_table"));
  EXPECT_EQ(found->where.token_index, at("kallsyms_token_index"));
  EXPECT_EQ(found->where.markers, at("kallsyms_markers"));
  EXPECT_EQ(found->where.names, at("kallsyms_names"));
  EXPECT_EQ(found->where.num_syms, at("kallsyms_num_syms"));
  EXPECT_EQ(found->where.offsets, at("kallsyms_offsets"));
  EXPECT_EQ(found->where.relative_base, at("kallsyms_relative_base"));
  EXPECT_EQ(found->entries.size(), found->where.count);

  std::size_t mismatched = 0;
  std::set<std::pair<std::string, std::uint64_t>> decoded;
  for (const auto& e : found->entries) {
    decoded.emplace(e.name, e.address);
    bool ok = false;
    auto [lo, hi] = map.equal_range(e.name);
    for (auto it = lo; it != hi; ++it) {
      // With CONFIG_KALLSYMS_ABSOLUTE_PERCPU scripts/kallsyms.c retypes the per-CPU
      // variables (linked at small offsets, not in the image) as absolute: 'A'.
      const char want = found->absolute_percpu && it->second.addr < symbols::kKernelHalfStart ? 'A' : it->second.type;
      ok |= it->second.addr == e.address && want == e.type;
    }
    if (!ok && mismatched++ < 10)
      ADD_FAILURE() << e.name << " " << std::hex << e.address << " " << e.type << " is not in System.map";
  }
  EXPECT_EQ(mismatched, 0u);

  std::size_t missing = 0;
  for (const auto& [name, l] : map) {
    const bool excluded = l.type == 'A' || l.type == 'a' || l.type == 'U' || l.type == 'N' ||
                          name.rfind("kallsyms_", 0) == 0 || name.rfind("__kcfi_typeid_", 0) == 0;
    if (excluded || decoded.count({name, l.addr})) continue;
    if (missing++ < 10) ADD_FAILURE() << name << " " << std::hex << l.addr << " " << l.type << " is not in kallsyms";
  }
  EXPECT_EQ(missing, 0u);

  // And as a SymbolTable: names resolve to System.map's addresses.
  auto table = symbols::to_symbol_table(found->entries, GetParam() + " kallsyms");
  ASSERT_TRUE(table) << table.error().what;
  auto vfs_read = table->resolve("vfs_read");
  ASSERT_TRUE(vfs_read) << vfs_read.error().what;
  EXPECT_EQ(vfs_read->value, at("vfs_read"));
  auto fn = table->function_containing(Gva{at("vfs_read") + 1});
  ASSERT_TRUE(fn) << fn.error().what;
  EXPECT_EQ(fn->name, "vfs_read");
}

// The ELF inside a vmlinux (it has no symbol table) goes with the symbols a session already
// has (Session::load_symbols), here the guest's own kallsyms: as a kernel that runs where it was
// linked lists them (a PV guest), and as one moved by KASLR does (every address in the kernel
// half moved by the slide). Either way link_to_image puts them at the image's link addresses:
// the image's build-id note is read through them, and it forms the same code addresses inside
// functions as it does with its System.map (what the tail-call proof takes).
TEST_P(RealKernel, AnImageWithoutSymbolsGoesWithTheGuestsKallsyms) {
  auto found = symbols::find_kallsyms(reader(), image_->text_start, symbols::kKernelImageEnd);
  ASSERT_TRUE(found) << found.error().what;
  auto elf = elf::load((dir_ / "vmlinux").string());
  ASSERT_TRUE(elf) << elf.error().what;
  ASSERT_TRUE(elf->symtab.empty()) << "the ELF inside Debian's vmlinuz has no symbol table";
  auto map = symbols::SymbolTable::load(dir_ / "System.map");
  ASSERT_TRUE(map) << map.error().what;
  auto taken_with = [](const symbols::KernelImage& img, kernel::Range* core) {
    const kernel::KernelTables t =
        kernel::KernelTables::read(img.symbols(), [&](Gva a, std::span<std::byte> out) { return img.read(a, out); });
    *core = t.core_text();
    std::set<std::uint64_t> to;
    for (const kernel::TakenAddress& a : kernel::addresses_taken(img, t.core_text(), t.init_text())) to.insert(a.to);
    return to;
  };
  kernel::Range ref_core;
  const std::set<std::uint64_t> ref = taken_with(symbols::KernelImage::with_symbols(*elf, *map, "vmlinux"), &ref_core);
  ASSERT_FALSE(ref_core.empty());
  ASSERT_GT(ref.size(), 1000u);
  const std::uint64_t vfs_read = map->resolve("vfs_read")->value;
  for (const std::int64_t slide : {std::int64_t{0}, std::int64_t{0x3a00000}}) {
    SCOPED_TRACE("kallsyms slid by " + std::to_string(slide));
    std::vector<symbols::KallsymsEntry> entries = found->entries;
    for (symbols::KallsymsEntry& e : entries)
      if (e.address >= symbols::kKernelHalfStart) e.address += static_cast<std::uint64_t>(slide);
    auto table = symbols::to_symbol_table(entries, "kallsyms");
    ASSERT_TRUE(table) << table.error().what;
    ASSERT_EQ(table->resolve("vfs_read")->value, vfs_read + static_cast<std::uint64_t>(slide));
    auto moved = symbols::link_to_image(*table, *elf, "vmlinux");
    ASSERT_TRUE(moved) << moved.error().what;
    EXPECT_EQ(*moved, -slide);
    EXPECT_EQ(table->resolve("vfs_read")->value, vfs_read);
    const symbols::KernelImage img = symbols::KernelImage::with_symbols(*elf, *table, "vmlinux");
    // The GNU build-id note (type 3) between __start_notes and __stop_notes, as the engine reads
    // the image's build id.
    const std::uint64_t n0 = img.symbols().resolve("__start_notes")->value,
                        n1 = img.symbols().resolve("__stop_notes")->value;
    ASSERT_LT(n0, n1);
    std::vector<std::byte> notes(n1 - n0);
    ASSERT_TRUE(img.read(Gva{n0}, notes));
    bool build_id = false;
    for (std::size_t o = 0; o + 12 + 4 <= notes.size() && !build_id;) {
      std::uint32_t h[3];
      std::memcpy(h, notes.data() + o, sizeof h);
      build_id = h[0] == 4 && h[2] == 3 && std::memcmp(notes.data() + o + 12, "GNU", 4) == 0 && h[1] >= 16;
      o += 12 + ((h[0] + 3) & ~3u) + ((h[1] + 3) & ~3u);
    }
    EXPECT_TRUE(build_id) << "no GNU build-id note read through the kallsyms";
    kernel::Range core;
    EXPECT_EQ(taken_with(img, &core), ref);
    EXPECT_EQ(core.start, ref_core.start);
    EXPECT_EQ(core.end, ref_core.end);
  }
  // Symbols of another kernel (moved by no multiple of 2 MiB) do not go with it.
  std::vector<symbols::KallsymsEntry> off = found->entries;
  for (symbols::KallsymsEntry& e : off)
    if (e.address >= symbols::kKernelHalfStart) e.address += 0x1000;
  auto other = symbols::to_symbol_table(off, "kallsyms");
  ASSERT_TRUE(other);
  auto refused = symbols::link_to_image(*other, *elf, "vmlinux");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().what.find("does not fit the symbols loaded before"), std::string::npos)
      << refused.error().what;
}

// A KASLR slide applied to System.map from one running address (what MSR_LSTAR gives).
TEST_P(RealKernel, SlideFromTheSyscallEntryPoint) {
  auto map = symbols::SymbolTable::load(dir_ / "System.map");
  ASSERT_TRUE(map) << map.error().what;
  const std::uint64_t link = map->resolve("entry_SYSCALL_64")->value;
  const std::int64_t slide = 0x1e400000;
  auto s = symbols::slide_from_symbol(*map, "entry_SYSCALL_64", link + slide);
  ASSERT_TRUE(s) << s.error().what;
  EXPECT_EQ(*s, slide);
  EXPECT_EQ(map->resolve("vfs_read")->value,
            read_system_map(dir_ / "System.map").find("vfs_read")->second.addr + slide);
  // Not 2 MiB aligned: not a slide.
  EXPECT_FALSE(symbols::slide_from_symbol(*map, "entry_SYSCALL_64", link + 0x1000));
  EXPECT_FALSE(symbols::slide_from_symbol(*map, "no_such_symbol", link));
}

// The BTF between __start_BTF and __stop_BTF (found through the decoded kallsyms) is the
// image's .BTF section, byte for byte, and libbpf parses it to the same types.
TEST_P(RealKernel, BtfThroughKallsymsIsTheImagesBtfSection) {
  auto found = symbols::find_kallsyms(reader(), image_->text_start, symbols::kKernelImageEnd);
  ASSERT_TRUE(found) << found.error().what;
  auto table = symbols::to_symbol_table(found->entries, "kallsyms");
  ASSERT_TRUE(table) << table.error().what;
  auto blob =
      kernel::read_kernel_btf(*table, [this](Gva a, std::span<std::byte> out) { return image_->read(a.value, out); });
  ASSERT_TRUE(blob) << blob.error().what;

  btf* ref = btf__parse_elf((dir_ / "vmlinux").c_str(), nullptr);
  ASSERT_EQ(libbpf_get_error(ref), 0) << "libbpf cannot parse .BTF of " << dir_ / "vmlinux";
  __u32 ref_size = 0;
  const void* ref_data = btf__raw_data(ref, &ref_size);
  ASSERT_EQ(blob->size(), ref_size);
  EXPECT_EQ(std::memcmp(blob->data(), ref_data, ref_size), 0);

  btf* mine = btf__new(blob->data(), static_cast<__u32>(blob->size()));
  ASSERT_EQ(libbpf_get_error(mine), 0);
  EXPECT_EQ(btf__type_cnt(mine), btf__type_cnt(ref));
  EXPECT_GT(btf__find_by_name_kind(mine, "task_struct", BTF_KIND_STRUCT), 0);
  btf__free(mine);
  btf__free(ref);

  // Cut short, the same bytes are refused.
  std::vector<std::byte> cut(blob->begin(), blob->begin() + static_cast<std::ptrdiff_t>(blob->size() / 2));
  EXPECT_FALSE(kernel::validate_btf(cut));
}

// The kernel's btf_modules list (where a loaded module's BTF lives once its init ran, kernel/
// module_btf.hpp) through the decoded kallsyms, as Dom0 reads it from a guest: the static symbol
// is there (KALLSYMS_ALL) at System.map's address, struct btf_module and struct btf are in the
// kernel's BTF with the offsets Debian's builds have, and the list read from the image (no
// module loaded: the head points at itself, as LIST_HEAD() leaves it) is read whole and empty.
TEST_P(RealKernel, BtfModulesListThroughKallsymsAndTheKernelsBtf) {
  auto found = symbols::find_kallsyms(reader(), image_->text_start, symbols::kKernelImageEnd);
  ASSERT_TRUE(found) << found.error().what;
  auto table = symbols::to_symbol_table(found->entries, "kallsyms");
  ASSERT_TRUE(table) << table.error().what;
  const auto map = read_system_map(dir_ / "System.map");
  auto head = table->resolve("btf_modules");
  ASSERT_TRUE(head) << head.error().what;
  ASSERT_NE(map.find("btf_modules"), map.end());
  EXPECT_EQ(head->value, map.find("btf_modules")->second.addr);
  kernel::ReadFn read = [this](Gva a, std::span<std::byte> out) { return image_->read(a.value, out); };
  auto blob = kernel::read_kernel_btf(*table, read);
  ASSERT_TRUE(blob) << blob.error().what;
  auto layout = kernel::btf_list_layout_from_btf(*blob);
  ASSERT_TRUE(layout) << layout.error().what;
  EXPECT_EQ(layout->describe(),
            "struct btf_module 48 bytes (list +0, module +16, btf +24), struct btf's data at +0 and data_size at +80");
  auto mods = kernel::walk_modules(*table, read, *blob);
  ASSERT_TRUE(mods) << mods.error().what;
  auto list = kernel::read_btf_module_list(*table, read, *layout, mods->modules());
  EXPECT_TRUE(list.read) << list.why;
  EXPECT_EQ(list.why, "");
  EXPECT_EQ(list.nodes, 0u);
}

// Damaged tables are refused, not decoded into wrong symbols.
TEST_P(RealKernel, DamagedTablesAreRefused) {
  auto found = symbols::find_kallsyms(reader(), image_->text_start, symbols::kKernelImageEnd);
  ASSERT_TRUE(found) << found.error().what;
  auto poke = [&](std::uint64_t addr, std::uint8_t v) {
    for (auto& s : image_->segments)
      if (addr >= s.vaddr && addr - s.vaddr < s.bytes.size()) {
        std::byte old = s.bytes[addr - s.vaddr];
        s.bytes[addr - s.vaddr] = std::byte{v};
        return old;
      }
    return std::byte{0};
  };
  // A marker that disagrees with the names.
  std::byte old = poke(found->where.markers + 4, 0x01);
  EXPECT_FALSE(symbols::find_kallsyms(reader(), found->where.token_table, found->where.token_table + 4096));
  poke(found->where.markers + 4, std::to_integer<std::uint8_t>(old));
  // A token index entry that points elsewhere.
  old = poke(found->where.token_index + 2 * 0x41, 0xff);
  auto r2 = symbols::find_kallsyms(reader(), found->where.token_table, found->where.token_table + 4096);
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().what.find("token"), std::string::npos) << r2.error().what;
  poke(found->where.token_index + 2 * 0x41, std::to_integer<std::uint8_t>(old));
  // Undamaged again, found again.
  EXPECT_TRUE(symbols::find_kallsyms(reader(), found->where.token_table, found->where.token_table + 4096));
}

std::vector<std::string> kernels_or_placeholder() {
  auto k = cached_kernels();
  if (k.empty()) k.push_back("none");
  return k;
}

INSTANTIATE_TEST_SUITE_P(Debian, RealKernel, ::testing::ValuesIn(kernels_or_placeholder()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

// Without a cache the suite above has one case, "none", which fails in SetUp: a test command
// that forgot to fetch the kernels must not pass silently.

}  // namespace
