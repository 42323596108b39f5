// The jump index's decode (probe/jump_index.hpp, decode_cross_branches()), over every function
// of the demo guest and, when tools/fetch-debian-kernels.sh cached them, of Debian's 6.1 and
// 6.12 (skipped otherwise), as the engine lists them (index_functions() of the core text):
//   - x86::relative_branches() against decode_function() + is_relative_branch(), function by
//     function: the same functions fail, the others give the same branches;
//   - the index built on 1 and on 4 threads is the one the engine's loop built before, with
//     decode_function() on one thread: the same names, branches and unknown count, in order
//     (also with pages of the text unread).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "jump_index_kernel.hpp"

namespace xenprobes::probe {
namespace {

using testing::IndexKernel;

// The old index, and relative_branches() compared with decode_function() for every function
// it decoded.
CrossBranches reference_index(const IndexKernel& k, std::size_t& compared, std::size_t& failing) {
  std::vector<x86::RelativeBranch> rel;
  std::size_t mismatches = 0;
  const CrossBranches out = testing::old_index(k, [&](const symbols::Function& f, std::span<const std::uint8_t> bytes,
                                                      const Result<std::vector<x86::Insn>>& insns) {
    ++compared;
    failing += !insns;
    const bool lean_ok = x86::relative_branches(bytes, f.start, rel).has_value();
    bool same = lean_ok == insns.has_value();
    if (same && lean_ok) {
      std::vector<x86::RelativeBranch> want;
      for (const x86::Insn& i : *insns)
        if (i.is_relative_branch()) want.push_back({i.address, i.branch_target});
      same = std::equal(rel.begin(), rel.end(), want.begin(), want.end(),
                        [](const auto& a, const auto& b) { return a.address == b.address && a.target == b.target; });
    }
    if (!same && ++mismatches <= 5)
      ADD_FAILURE() << f.name << " (" << x86::hex_addr(f.start.value) << ", " << f.size
                    << " bytes): relative_branches() " << (lean_ok ? "decodes" : "fails") << ", decode_function() "
                    << (insns ? "decodes" : "fails: " + insns.error().what);
  });
  EXPECT_EQ(mismatches, 0u) << "functions where relative_branches() and decode_function() differ";
  return out;
}

void expect_same_index(const CrossBranches& got, const CrossBranches& want, const std::string& what) {
  EXPECT_EQ(got.unknown, want.unknown) << what;
  EXPECT_EQ(got.names, want.names) << what;
  ASSERT_EQ(got.branches.size(), want.branches.size()) << what;
  for (std::size_t k = 0; k < want.branches.size(); ++k) {
    const auto &a = got.branches[k], &b = want.branches[k];
    ASSERT_TRUE(a.to == b.to && a.from == b.from && a.fn == b.fn)
        << what << ": branch " << k << " is " << x86::hex_addr(a.from) << "->" << x86::hex_addr(a.to) << " in "
        << got.names[a.fn] << ", was " << x86::hex_addr(b.from) << "->" << x86::hex_addr(b.to) << " in "
        << want.names[b.fn];
  }
}

// The whole check over one kernel; returns the reference index (for the caller's own checks).
CrossBranches check(const IndexKernel& k, const std::string& name, std::vector<unsigned> threads_tried = {1, 4}) {
  std::size_t compared = 0, failing = 0;
  const CrossBranches want = reference_index(k, compared, failing);
  std::printf(
      "[ %s ] %zu functions, %zu decoded both ways (%zu fail both ways), %zu branches into another's "
      "middle from %zu functions\n",
      name.c_str(), k.fns.size(), compared, failing, want.branches.size(), want.names.size());
  for (unsigned threads : threads_tried) {
    CrossBranches got;
    decode_cross_branches(k.text, k.base, k.unread, k.fns, threads, got);
    expect_same_index(got, want, name + " on " + std::to_string(threads) + " thread(s)");
  }
  return want;
}

TEST(JumpIndexDecode, TheDemoGuestsIndexIsTheSameLeanAndOnFourThreads) {
  std::string why;
  auto k = testing::load_index_kernel(XENPROBES_DEMO_GUEST_VMLINUX, XENPROBES_DEMO_GUEST_SYSTEM_MAP, why);
  ASSERT_TRUE(k) << why;
  ASSERT_GE(k->fns.size(), 8u);
  // Also on a thread per function: any merge out of order shows.
  const CrossBranches want = check(*k, "demo guest", {1, 4, static_cast<unsigned>(k->fns.size())});
  // guest/safety.S's demo_cross_from jumps into the middle of demo_cross_into.
  EXPECT_NE(std::find(want.names.begin(), want.names.end(), "demo_cross_from"), want.names.end());
}

// More threads than functions, and none: each part may be empty.
TEST(JumpIndexDecode, MoreThreadsThanFunctions) {
  std::string why;
  auto k = testing::load_index_kernel(XENPROBES_DEMO_GUEST_VMLINUX, XENPROBES_DEMO_GUEST_SYSTEM_MAP, why);
  ASSERT_TRUE(k) << why;
  std::size_t compared = 0, failing = 0;
  IndexKernel few = *k;
  few.fns.resize(3);
  const CrossBranches want = reference_index(few, compared, failing);
  CrossBranches got;
  decode_cross_branches(few.text, few.base, few.unread, few.fns, 16, got);
  expect_same_index(got, want, "3 functions on 16 threads");
  CrossBranches none;
  decode_cross_branches(few.text, few.base, few.unread, {}, 4, none);
  EXPECT_TRUE(none.branches.empty() && none.names.empty() && none.unknown == 0);
}

TEST(JumpIndexDecode, IndexThreads) {
  EXPECT_EQ(index_threads(0), 1u);
  EXPECT_EQ(index_threads(100), 1u);
  EXPECT_EQ(index_threads(kMinIndexFunctionsPerThread * 2 - 1), 1u);
  EXPECT_LE(index_threads(kMinIndexFunctionsPerThread * 2), 2u);
  EXPECT_LE(index_threads(50000), kMaxIndexThreads);
  EXPECT_GE(index_threads(50000), 1u);
}

class DebianKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(DebianKernel, TheIndexIsTheSameLeanAndOnFourThreads) {
  const auto dir = testing::cached_debian_kernel(GetParam());
  if (!dir) GTEST_SKIP() << "no Debian " << GetParam() << "x kernel cached: run sh tools/fetch-debian-kernels.sh";
  std::string why;
  auto k = testing::load_index_kernel(*dir / "vmlinux", *dir / "System.map", why);
  ASSERT_TRUE(k) << *dir << ": " << why;
  EXPECT_GT(k->fns.size(), 30000u);
  const CrossBranches want = check(*k, dir->filename().string());
  EXPECT_GT(want.branches.size(), 1000u);

  // Its first 3,000 functions with every seventh page unread (a guest's text read in part):
  // the functions on those pages are unknown, the same way on every thread. (The calls to the
  // functions left out count as branches into a middle here, the same way too.)
  k->fns.resize(3000);
  for (std::size_t p = 0; p < k->unread.size(); p += 7) k->unread[p] = true;
  const CrossBranches partial = check(*k, dir->filename().string() + ", 3000 functions, pages unread");
  EXPECT_GT(partial.unknown, 300u);
  EXPECT_FALSE(partial.branches.empty());
}

INSTANTIATE_TEST_SUITE_P(Debian, DebianKernel, ::testing::Values("6.1.", "6.12."), [](const auto& info) {
  std::string n = "v" + info.param;
  n.pop_back();
  std::replace(n.begin(), n.end(), '.', '_');
  return n;
});

}  // namespace
}  // namespace xenprobes::probe
