// guest-module/xp_release.h: whether the detaching module may free the pages Dom0 maps
// (protocol.h "Letting go"), one look at a time, as xp_release_wait() and the simulated module
// call it.
#include <gtest/gtest.h>

#include <string>

#include "xp_release.h"

namespace {

struct Looks {
  xp_release_state st{};
  xp_release look(bool bound, xenprobes_u32 hold, bool expired = false) {
    return xp_release_look(&st, bound, hold, expired);
  }
};

TEST(Release, NoDom0AtTheFirstLookFrees) {
  Looks l;
  EXPECT_EQ(l.look(false, 0), XP_RELEASE_NONE);
  EXPECT_TRUE(xp_release_frees(XP_RELEASE_NONE));
}

TEST(Release, TheReleaseFreesWhateverElseIsSeen) {
  for (bool bound : {false, true})
    for (bool expired : {false, true}) {
      Looks l;
      EXPECT_EQ(l.look(bound, XENPROBES_DOM0_RELEASED, expired), XP_RELEASE_RELEASED);
    }
  Looks l;  // after waiting for it
  EXPECT_EQ(l.look(true, XENPROBES_DOM0_MAPPED), XP_RELEASE_WAIT);
  EXPECT_EQ(l.look(true, XENPROBES_DOM0_RELEASED), XP_RELEASE_RELEASED);
  EXPECT_TRUE(xp_release_frees(XP_RELEASE_RELEASED));
}

TEST(Release, MappedWithThePortClosedIsAKilledDom0AndKeeps) {
  Looks l;
  EXPECT_EQ(l.look(false, XENPROBES_DOM0_MAPPED), XP_RELEASE_KILLED);
  EXPECT_FALSE(xp_release_frees(XP_RELEASE_KILLED));
}

TEST(Release, AHolderIsWaitedForUntilTheDeadlineThenKept) {
  Looks l;
  EXPECT_EQ(l.look(true, XENPROBES_DOM0_MAPPED), XP_RELEASE_WAIT);
  EXPECT_EQ(l.look(true, XENPROBES_DOM0_MAPPED), XP_RELEASE_WAIT);
  EXPECT_EQ(l.look(true, XENPROBES_DOM0_MAPPED, true), XP_RELEASE_TIMEOUT);
  EXPECT_FALSE(xp_release_frees(XP_RELEASE_TIMEOUT));
}

TEST(Release, AnOlderDom0sBoundPortIsAHolderEvenOnceItUnbinds) {
  // An older Dom0 never writes dom0_hold: its bound port is all the module sees of it.
  Looks l;
  EXPECT_EQ(l.look(true, 0), XP_RELEASE_WAIT);
  // It unbinds (killed, or detaching its own way): no release came, the pages stay.
  EXPECT_EQ(l.look(false, 0), XP_RELEASE_KILLED);
  Looks late;
  EXPECT_EQ(late.look(true, 0, true), XP_RELEASE_TIMEOUT);
}

TEST(Release, AnUnknownWordIsNoRelease) {
  Looks l;  // a guest-corrupted or future value: only RELEASED frees a holder's pages
  EXPECT_EQ(l.look(true, 7), XP_RELEASE_WAIT);
  EXPECT_EQ(l.look(true, 7, true), XP_RELEASE_TIMEOUT);
  Looks none;
  EXPECT_EQ(none.look(false, 7), XP_RELEASE_NONE) << "no port bound: nobody holds them";
}

TEST(Release, EveryOutcomeHasAName) {
  for (xp_release r : {XP_RELEASE_WAIT, XP_RELEASE_NONE, XP_RELEASE_RELEASED, XP_RELEASE_KILLED, XP_RELEASE_TIMEOUT})
    EXPECT_NE(std::string(xp_release_name(r)), "");
  EXPECT_NE(std::string(xp_release_name(XP_RELEASE_KILLED)).find("kept, not freed"), std::string::npos);
  EXPECT_NE(std::string(xp_release_name(XP_RELEASE_RELEASED)).find("Dom0 released them: freed"), std::string::npos);
}

}  // namespace
