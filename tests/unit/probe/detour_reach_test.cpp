// probe::detour_out_of_reach (probe/jump_index.hpp): a jump probe in a loaded module's text
// needs every slot area of the guest module within rel32 reach of its region, both ways.
#include <gtest/gtest.h>

#include <vector>

#include "probe/jump_index.hpp"

namespace xenprobes::probe {
namespace {

constexpr std::uint64_t kModules = 0xffffffffc0000000ull;  // x86-64's modules area

TEST(DetourReach, SlotsInTheModulesAreaReachAModulesRegion) {
  const std::vector<guestmod::OeaArea> areas{{Gva{kModules + 0x200000}, 0x10000}, {Gva{kModules + 0x3000000}, 0x1000}};
  EXPECT_FALSE(detour_out_of_reach(areas, Gva{kModules + 0x1000}, Gva{kModules + 0x1005}, 32));
  EXPECT_FALSE(detour_out_of_reach({}, Gva{kModules + 0x1000}, Gva{kModules + 0x1005}, 32))
      << "no area: nothing to refuse";
}

TEST(DetourReach, AnAreaOutOfReachEitherWayIsNamed) {
  // 3 GiB below: a rel32 reaches 2 GiB.
  const std::uint64_t far = kModules - (std::uint64_t{3} << 30);
  const std::vector<guestmod::OeaArea> areas{{Gva{kModules + 0x200000}, 0x10000}, {Gva{far}, 0x1000}};
  auto why = detour_out_of_reach(areas, Gva{kModules + 0x1000}, Gva{kModules + 0x1005}, 32);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("out of a rel32 jump's reach"), std::string::npos) << *why;
  EXPECT_NE(why->find("0xffffffff00000000"), std::string::npos) << *why;
  // Right at the limit: the region's jmp ends at start + 5; the last slot byte 2 GiB - 1 above.
  const std::uint64_t start = kModules - (std::uint64_t{2} << 30);
  const std::vector<guestmod::OeaArea> edge{{Gva{start + 5 + 0x7fffffffull - 0x1000 + 1}, 0x1000}};
  EXPECT_FALSE(detour_out_of_reach(edge, Gva{start}, Gva{start + 5}, 0)) << "its last byte at +2^31 - 1";
  const std::vector<guestmod::OeaArea> past{{Gva{start + 5 + 0x7fffffffull - 0x1000 + 2}, 0x1000}};
  EXPECT_TRUE(detour_out_of_reach(past, Gva{start}, Gva{start + 5}, 0)) << "its last byte at +2^31";
}

}  // namespace
}  // namespace xenprobes::probe
