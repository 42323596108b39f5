// The ORC tables of Debian's real 6.1 and 6.12 kernels (tools/fetch-debian-kernels.sh fills
// the cache; without it the tests skip), read the way a guest's are: from the image laid out
// at its link addresses, through the symbols of its System.map. The table must be found,
// sorted, in the release's format; functions' first instructions must have the entry every
// function entry has (the return address at the stack pointer: SP + 8, a call frame), the
// syscall entry an end-of-stack one then a pt_regs one, the first frame of a new task an
// end-of-stack one; and a stack built from real call sites (vfs_read called by ksys_read,
// itself reached from do_syscall_64, called by the syscall entry) must unwind to exactly those
// return addresses and end at the entry's pt_regs from user mode.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include "kernel/orc.hpp"
#include "symbols/symbol_table.hpp"

namespace fs = std::filesystem;

namespace xenprobes::kernel::orc {
namespace {

fs::path cache_dir() {
  const char* e = std::getenv("XENPROBES_KERNEL_CACHE");
  return e && *e ? fs::path(e) : fs::path("/var/cache/xenprobes-kernels");
}

std::vector<fs::path> cached_kernels() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(cache_dir(), ec))
    if (fs::exists(d.path() / "vmlinux") && fs::exists(d.path() / "System.map")) out.push_back(d.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The image's kernel segments at their virtual addresses.
struct Image {
  std::vector<std::pair<std::uint64_t, std::vector<std::byte>>> segments;
  explicit Image(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    Elf64_Ehdr eh;
    if (file.size() < sizeof eh) return;
    std::memcpy(&eh, file.data(), sizeof eh);
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      std::memcpy(&ph, file.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
      if (ph.p_type != PT_LOAD || ph.p_vaddr < symbols::kKernelImageStart) continue;
      std::vector<std::byte> b(ph.p_memsz);
      std::memcpy(b.data(), file.data() + ph.p_offset, std::min(ph.p_filesz, ph.p_memsz));
      segments.emplace_back(ph.p_vaddr, std::move(b));
    }
  }
  Result<void> read(std::uint64_t a, std::span<std::byte> out) const {
    for (const auto& [va, b] : segments)
      if (a >= va && a - va <= b.size() && b.size() - (a - va) >= out.size()) {
        std::memcpy(out.data(), b.data() + (a - va), out.size());
        return {};
      }
    return fail(Errc::Fault, "not mapped");
  }
  ReadFn reader() const {
    return [this](Gva a, std::span<std::byte> out) { return read(a.value, out); };
  }
  // The return address of the first direct call (e8 rel32) from [from, from + len) to `target`
  // (or, with target 0, to anywhere in [lo, hi)).
  std::optional<std::uint64_t> call_site(std::uint64_t from, std::uint64_t len, std::uint64_t target,
                                         std::uint64_t lo = 0, std::uint64_t hi = 0) const {
    std::vector<std::byte> code(len);
    if (!read(from, code)) return std::nullopt;
    for (std::size_t i = 0; i + 5 <= len; ++i) {
      if (code[i] != std::byte{0xe8}) continue;
      std::int32_t rel;
      std::memcpy(&rel, code.data() + i + 1, 4);
      const std::uint64_t ret = from + i + 5;
      const std::uint64_t to = ret + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));
      if (target ? to == target : to >= lo && to < hi) return ret;
    }
    return std::nullopt;
  }
};

std::uint64_t addr(const symbols::SymbolTable& t, const char* name) {
  auto a = t.resolve(name);
  return a ? a->value : 0;
}

TEST(OrcRealKernel, TheTableIsFoundSortedAndDescribesFunctionEntries) {
  auto kernels = cached_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no kernel in " << cache_dir() << ": run sh tools/fetch-debian-kernels.sh";
  for (const fs::path& dir : kernels) {
    const std::string version = dir.filename();
    SCOPED_TRACE(version);
    auto syms = symbols::SymbolTable::load(dir / "System.map");
    ASSERT_TRUE(syms) << syms.error().what;
    Image img(dir / "vmlinux");
    ASSERT_FALSE(img.segments.empty());
    auto t = read_kernel_table(*syms, img.reader());
    ASSERT_TRUE(t) << t.error().what;
    const std::uint64_t n = (addr(*syms, "__stop_orc_unwind_ip") - addr(*syms, "__start_orc_unwind_ip")) / 4;
    EXPECT_GT(n, 100000u);
    EXPECT_EQ(t->size() + t->dropped(), n);
    EXPECT_LT(t->dropped(), n / 20) << t->summary();
    if (version.starts_with("6.1.")) {
      EXPECT_EQ(t->format(), Format::V1) << t->summary();
    } else if (version.starts_with("6.12.")) {
      EXPECT_EQ(t->format(), Format::V3) << t->summary();
    }
    std::printf("[ %s ] %s\n", version.c_str(), t->summary().c_str());
    // A function's first instruction: the return address is at the stack pointer.
    for (const char* fn : {"vfs_read", "ksys_read", "do_sys_openat2", "schedule", "__x64_sys_read", "kfree"}) {
      const std::uint64_t a = addr(*syms, fn);
      ASSERT_NE(a, 0u) << fn;
      const Entry* e = t->find(a);
      ASSERT_NE(e, nullptr) << fn;
      EXPECT_EQ(e->type, Type::Call) << fn;
      EXPECT_EQ(e->sp_reg, kRegSp) << fn;
      EXPECT_EQ(e->sp_offset, 8) << fn;
    }
    // The end of the stack: the entry code's first frame of a new task is described as one
    // (ret_from_fork, which 6.12 splits into ret_from_fork_asm and a C part).
    bool end_seen = false;
    const std::uint64_t rff =
        addr(*syms, "ret_from_fork_asm") ? addr(*syms, "ret_from_fork_asm") : addr(*syms, "ret_from_fork");
    ASSERT_NE(rff, 0u);
    for (std::uint64_t k = 0; k < syms->function_containing(Gva{rff})->size && !end_seen; ++k)
      if (const Entry* e = t->find(rff + k)) end_seen = e->type == Type::EndOfStack;
    EXPECT_TRUE(end_seen) << "no end-of-stack entry in ret_from_fork";
    // The syscall entry saves a whole pt_regs and says so: a REGS entry, based on SP.
    bool regs_seen = false;
    const std::uint64_t sys = addr(*syms, "entry_SYSCALL_64");
    ASSERT_NE(sys, 0u);
    // (Its symbol is followed by labels within the same code: 0x200 bytes from it.)
    const Entry* first = t->find(sys);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->type, Type::EndOfStack);  // a syscall's first instruction: user mode's
    for (std::uint64_t k = 0; k < 0x200 && !regs_seen; ++k)
      if (const Entry* e = t->find(sys + k)) regs_seen = e->type == Type::Regs && e->sp_reg == kRegSp;
    EXPECT_TRUE(regs_seen) << "no pt_regs entry in entry_SYSCALL_64";
  }
}

TEST(OrcRealKernel, ARealCallChainUnwindsToItsReturnAddresses) {
  auto kernels = cached_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no kernel in " << cache_dir() << ": run sh tools/fetch-debian-kernels.sh";
  for (const fs::path& dir : kernels) {
    SCOPED_TRACE(dir.filename().string());
    auto syms = symbols::SymbolTable::load(dir / "System.map");
    ASSERT_TRUE(syms);
    Image img(dir / "vmlinux");
    auto t = read_kernel_table(*syms, img.reader());
    ASSERT_TRUE(t) << t.error().what;
    Unwinder u(std::move(*t));
    const std::uint64_t vfs_read = addr(*syms, "vfs_read"), ksys_read = addr(*syms, "ksys_read"),
                        syscall = addr(*syms, "do_syscall_64");
    auto fn_size = [&](std::uint64_t a) { return syms->function_containing(Gva{a})->size; };
    auto ret1 = img.call_site(ksys_read, fn_size(ksys_read), vfs_read);
    // __x64_sys_read tail-calls ksys_read: the return address above ksys_read's frame is
    // do_syscall_64's (through the syscall table); any direct call site of it stands in for it.
    auto ret2 = img.call_site(syscall, fn_size(syscall), 0, addr(*syms, "_stext"), addr(*syms, "_etext"));
    ASSERT_TRUE(ret1 && ret2) << "no direct call ksys_read -> vfs_read, or none in do_syscall_64, in this build";
    // And do_syscall_64's caller: the syscall entry, whose pt_regs frame from user mode ends
    // the kernel's stack.
    const std::uint64_t entry = addr(*syms, "entry_SYSCALL_64");
    auto ret3 = img.call_site(entry, 0x200, syscall);
    ASSERT_TRUE(ret3) << "entry_SYSCALL_64 does not call do_syscall_64 directly in this build";
    // The stack, built from the frames' own entries: vfs_read just entered (its return
    // address at rsp), then ksys_read's frame (SP-based), do_syscall_64's (SP- or BP-based:
    // its frame pointer then lies above ksys_read's frame), the syscall's pt_regs.
    const Entry* ke = u.find(*ret1 - 1);
    const Entry* de = u.find(*ret2 - 1);
    ASSERT_TRUE(ke && de);
    ASSERT_EQ(ke->sp_reg, kRegSp) << "ksys_read's frame is not SP-based in this build";
    ASSERT_TRUE(de->sp_reg == kRegSp || de->sp_reg == kRegBp) << int{de->sp_reg};
    constexpr std::uint64_t rsp = 0xffffc90000123000ull;
    std::map<std::uint64_t, std::uint64_t> words{{rsp, *ret1}};
    const std::uint64_t ksys_cfa = rsp + 8 + static_cast<std::uint64_t>(std::int64_t{ke->sp_offset});
    words[ksys_cfa - 8] = *ret2;
    const std::uint64_t bp = ksys_cfa + 0x40;  // do_syscall_64's rbp, if it keeps one
    if (ke->bp_reg == kRegPrevSp) words[ksys_cfa + static_cast<std::uint64_t>(std::int64_t{ke->bp_offset})] = bp;
    const std::uint64_t do_cfa =
        (de->sp_reg == kRegSp ? ksys_cfa : bp) + static_cast<std::uint64_t>(std::int64_t{de->sp_offset});
    words[do_cfa - 8] = *ret3;
    words[do_cfa + 136] = 0x33;  // the pt_regs' cs: user mode
    // The task's stack: 4 KiB from rsp, its other words 0.
    ReadFn stack = [&](Gva a, std::span<std::byte> out) -> Result<void> {
      if (out.size() != 8 || a.value < rsp || a.value >= rsp + 0x1000) return fail(Errc::Fault, "not on the stack");
      auto it = words.find(a.value);
      const std::uint64_t v = it == words.end() ? 0 : it->second;
      std::memcpy(out.data(), &v, 8);
      return {};
    };
    StartRegs s;
    s.rip = vfs_read, s.rsp = rsp, s.rbp = bp;
    Walk w = u.walk(s, stack);
    EXPECT_EQ(w.ips, (std::vector<std::uint64_t>{vfs_read, *ret1, *ret2, *ret3})) << to_string(w.stop);
    EXPECT_EQ(syms->function_containing(Gva{*ret2})->name, "do_syscall_64");
    EXPECT_EQ(w.stop, Stop::EndOfStack) << to_string(w.stop);
    EXPECT_FALSE(w.fallback);
  }
}

}  // namespace
}  // namespace xenprobes::kernel::orc
