// Sweep over the demo guest's text: every function decodes fully from its System.map start, and
// every instruction either gets a plan or a documented refusal.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "x86/analysis.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::x86 {
namespace {

struct Text {
  std::uint64_t addr = 0;
  std::vector<std::uint8_t> bytes;
};

// Loads .text of the demo guest ELF (a fixture we build ourselves; minimal checks suffice).
bool load_text(const char* path, Text& out) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> img((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (img.size() < sizeof(Elf64_Ehdr)) return false;
  Elf64_Ehdr eh;
  std::memcpy(&eh, img.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return false;
  auto shdr = [&](unsigned k) {
    Elf64_Shdr sh;
    std::memcpy(&sh, img.data() + eh.e_shoff + k * sizeof(Elf64_Shdr), sizeof sh);
    return sh;
  };
  const Elf64_Shdr strs = shdr(eh.e_shstrndx);
  for (unsigned k = 0; k < eh.e_shnum; ++k) {
    const Elf64_Shdr sh = shdr(k);
    if (std::strcmp(img.data() + strs.sh_offset + sh.sh_name, ".text") != 0) continue;
    out.addr = sh.sh_addr;
    out.bytes.assign(img.begin() + sh.sh_offset, img.begin() + sh.sh_offset + sh.sh_size);
    return true;
  }
  return false;
}

TEST(DemoGuestSweep, EveryFunctionDecodesAndClassifies) {
  Text text;
  ASSERT_TRUE(load_text(XENPROBES_DEMO_GUEST_VMLINUX, text)) << XENPROBES_DEMO_GUEST_VMLINUX;
  std::ifstream map(XENPROBES_DEMO_GUEST_SYSTEM_MAP);
  ASSERT_TRUE(map) << XENPROBES_DEMO_GUEST_SYSTEM_MAP;
  std::map<std::uint64_t, std::string> starts;  // text symbols by address
  std::string line;
  const std::uint64_t end = text.addr + text.bytes.size();
  while (std::getline(map, line)) {
    std::istringstream ls(line);
    std::string a, type, name;
    ls >> a >> type >> name;
    const std::uint64_t addr = std::stoull(a, nullptr, 16);
    if ((type == "T" || type == "t") && addr >= text.addr && addr < end) starts[addr] = name;
  }
  ASSERT_GE(starts.size(), 5u);

  std::map<std::string, int> tally;
  std::size_t total = 0;
  for (auto it = starts.begin(); it != starts.end(); ++it) {
    const auto next = std::next(it);
    const std::uint64_t stop = next == starts.end() ? end : next->first;
    const std::span<const std::uint8_t> fn(text.bytes.data() + (it->first - text.addr), stop - it->first);
    auto insns = decode_function(fn, Gva{it->first});
    ASSERT_TRUE(insns) << it->second << ": " << insns.error().what;
    for (const Insn& i : *insns) {
      ++total;
      auto plan = analyze(i);
      if (!plan) {
        // The only refusals the demo guest can trigger: the hlt of its idle loop, and the
        // ud2s and int3s of safety.S's demo_bug_end (never run).
        if (it->second == "demo_bug_end" && (is_deliberate_ud(i) || is_trap_byte(i))) {
          ++tally["refused"];
          continue;
        }
        EXPECT_TRUE(is_halt(i)) << it->second << ": " << plan.error().what;
        EXPECT_EQ(plan.error().code, Errc::InvalidArgument);
        ++tally["refused"];
        continue;
      }
      ++tally[std::string(plan_name(*plan))];
      // Every boostable instruction builds a slot in a module area 256 MiB above the text,
      // and RIP-relative operands keep their effective address.
      if (*plan == Plan::Boost || *plan == Plan::BoostRipRel) {
        const Gva slot{text.addr + 0x10000000};
        std::uint8_t buf[kMaxInsnLen + kJmpRel32Len];
        auto n = emit_slot(buf, slot, i, i.next(), SlotTail::JmpBack, 0xcc);
        ASSERT_TRUE(n) << n.error().what;
        if (i.is_rip_relative) {
          auto moved = decode(std::span(buf, *n), slot);
          ASSERT_TRUE(moved);
          EXPECT_EQ(effective_address(*moved, CpuState{}).value(), effective_address(i, CpuState{}).value())
              << i.describe();
        }
      }
      // Relative branch targets stay inside the text (the demo guest has no external calls).
      if (i.is_relative_branch()) {
        EXPECT_GE(i.branch_target.value, text.addr) << i.describe();
        EXPECT_LT(i.branch_target.value, end) << i.describe();
      }
    }
  }
  std::string summary;
  for (auto& [k, n] : tally) summary += k + "=" + std::to_string(n) + " ";
  std::printf("demo guest: %zu instructions in %zu functions: %s\n", total, starts.size(), summary.c_str());
  EXPECT_GT(tally["boost"], 0);
  EXPECT_GT(tally["emulate-branch"], 0);
  EXPECT_GT(tally["emulate-loaded"], 0);
  EXPECT_GT(tally["skip"], 0);
}

}  // namespace
}  // namespace xenprobes::x86

#ifdef XP_OBJDUMP
namespace xenprobes::x86 {
namespace {

// Differential against binutils: the instruction starts objdump finds in .text are exactly ours.
TEST(DemoGuestSweep, BoundariesMatchObjdump) {
  Text text;
  ASSERT_TRUE(load_text(XENPROBES_DEMO_GUEST_VMLINUX, text));
  const std::string cmd = std::string(XP_OBJDUMP) + " -d -j .text --no-show-raw-insn " + XENPROBES_DEMO_GUEST_VMLINUX;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) GTEST_SKIP() << "cannot run " << cmd;
  std::vector<std::uint64_t> theirs;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    // "ffffffff81000001:\txor    %ebp,%ebp"
    char* colon = std::strchr(buf, ':');
    if (colon == nullptr || colon[1] != '\t') continue;
    char* endp = nullptr;
    const std::uint64_t a = std::strtoull(buf, &endp, 16);
    if (endp != colon) continue;
    theirs.push_back(a);
  }
  if (pclose(p) != 0 || theirs.empty()) GTEST_SKIP() << "objdump unavailable";
  auto ours = decode_function(text.bytes, Gva{text.addr});
  ASSERT_TRUE(ours) << ours.error().what;
  std::vector<std::uint64_t> mine;
  for (const Insn& i : *ours) mine.push_back(i.address.value);
  EXPECT_EQ(mine, theirs);
}

}  // namespace
}  // namespace xenprobes::x86
#endif
