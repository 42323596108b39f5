// Random bytes through decode → analyze → emit_slot: no crash (run under ASan/UBSan), and the
// invariants the engine relies on hold for whatever decodes.
#include <gtest/gtest.h>

#include <random>

#include "x86/analysis.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::x86 {
namespace {

TEST(Robustness, RandomBytes) {
  std::mt19937_64 rng(0x58656e50726f6265ull);  // fixed seed: failures reproduce
  const Gva at{0xffffffff81000000};
  const Gva slot{0xffffffffa0000000};
  int decoded = 0;
  for (int n = 0; n < 50000; ++n) {
    std::uint8_t b[kMaxInsnLen];
    for (auto& x : b) x = static_cast<std::uint8_t>(rng());
    const std::size_t len = 1 + rng() % kMaxInsnLen;
    auto i = decode(std::span(b, len), at);
    if (!i) {
      ASSERT_EQ(i.error().code, Errc::IllegalSequence);
      continue;
    }
    ++decoded;
    ASSERT_GE(i->length, 1);
    ASSERT_LE(i->length, len);
    auto plan = analyze(*i);
    if (!plan) {
      ASSERT_TRUE(plan.error().code == Errc::Busy || plan.error().code == Errc::InvalidArgument) << plan.error().what;
      continue;
    }
    if (*plan == Plan::Boost || *plan == Plan::BoostRipRel) {
      std::uint8_t out[kMaxInsnLen + kJmpRel32Len];
      auto e = emit_slot(out, slot, *i, i->next(), SlotTail::JmpBack, 0xcc);
      if (!e && i->is_rip_relative && e.error().code == Errc::Range) continue;  // random disp32
      ASSERT_TRUE(e) << e.error().what;
      auto again = decode(std::span(out, *e), slot);
      ASSERT_TRUE(again) << i->describe();
      EXPECT_EQ(again->length, i->length) << i->describe();
      if (i->is_rip_relative) {
        EXPECT_EQ(effective_address(*again, CpuState{}).value(), effective_address(*i, CpuState{}).value())
            << i->describe();
      }
    }
  }
  EXPECT_GT(decoded, 10000);
}

}  // namespace
}  // namespace xenprobes::x86
