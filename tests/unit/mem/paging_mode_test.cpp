// paging_mode(): the pure CR0/CR4/EFER → mode function, and the PV rule.
#include <gtest/gtest.h>

#include "hv/hypervisor.hpp"
#include "mem/paging.hpp"

namespace xenprobes::mem {
namespace {

constexpr std::uint64_t PE = 1;  // CR0.PE

// The function is constexpr: the SDM table, checked at compile time.
static_assert(paging_mode(PE, 0, 0) == PagingMode::None);
static_assert(paging_mode(PE | kCr0Pg, 0, 0) == PagingMode::Legacy32);
static_assert(paging_mode(PE | kCr0Pg, kCr4Pse, 0) == PagingMode::Legacy32);
static_assert(paging_mode(PE | kCr0Pg, kCr4Pae, 0) == PagingMode::Pae);
static_assert(paging_mode(PE | kCr0Pg, kCr4Pae, kEferLme | kEferLma) == PagingMode::Long4);
static_assert(paging_mode(PE | kCr0Pg, kCr4Pae | kCr4La57, kEferLme | kEferLma) == PagingMode::Long5);

TEST(PagingMode, PagingOffIsNoneWhateverElseIsSet) {
  EXPECT_EQ(paging_mode(PE, kCr4Pae | kCr4La57, kEferLme | kEferLma), PagingMode::None);
}

TEST(PagingMode, La57WithoutLongModeIsIgnored) {
  // LA57 only has meaning in IA-32e mode.
  EXPECT_EQ(paging_mode(kCr0Pg, kCr4Pae | kCr4La57, 0), PagingMode::Pae);
}

TEST(PagingMode, LmeWithPaeCountsAsLongModeWhenLmaIsNotReported) {
  EXPECT_EQ(paging_mode(kCr0Pg, kCr4Pae, kEferLme), PagingMode::Long4);
  // LME without PAE cannot be active long mode (the CPU would #GP on CR0.PG).
  EXPECT_EQ(paging_mode(kCr0Pg, 0, kEferLme), PagingMode::Legacy32);
}

TEST(PagingMode, PvIsLong4UnlessLa57) {
  EXPECT_EQ(pv_paging_mode(0), PagingMode::Long4);
  EXPECT_EQ(pv_paging_mode(kCr4La57), PagingMode::Long5);
}

TEST(PagingMode, NamesAreStable) {
  EXPECT_EQ(to_string(PagingMode::None), "None");
  EXPECT_EQ(to_string(PagingMode::Legacy32), "Legacy32");
  EXPECT_EQ(to_string(PagingMode::Pae), "Pae");
  EXPECT_EQ(to_string(PagingMode::Long4), "Long4");
  EXPECT_EQ(to_string(PagingMode::Long5), "Long5");
}

TEST(PagingContext, PvIgnoresCr0AndEfer) {
  hv::DomainInfo dom;
  dom.type = hv::GuestType::Pv;
  dom.guest_width = 8;
  hv::VcpuRegs regs;
  regs.cr0 = 0;  // a PV guest's virtualised CR0 may say "no paging": ignored
  regs.cr3 = 0x1234'5000;
  auto ctx = paging_context(dom, regs);
  ASSERT_TRUE(ctx) << ctx.error().what;
  EXPECT_EQ(ctx->mode, PagingMode::Long4);
  EXPECT_EQ(ctx->cr3, 0x1234'5000u);
  EXPECT_TRUE(ctx->nxe);

  regs.cr4 = kCr4La57;
  EXPECT_EQ(paging_context(dom, regs)->mode, PagingMode::Long5);
}

TEST(PagingContext, Pv32IsNotSupported) {
  hv::DomainInfo dom;
  dom.type = hv::GuestType::Pv;
  dom.guest_width = 4;
  auto ctx = paging_context(dom, hv::VcpuRegs{});
  ASSERT_FALSE(ctx);
  EXPECT_EQ(ctx.error().code, Errc::NotSupported);
}

TEST(PagingContext, HvmFollowsTheRegisters) {
  hv::DomainInfo dom;
  dom.type = hv::GuestType::Hvm;
  hv::VcpuRegs regs;
  regs.cr0 = kCr0Pg | PE;
  regs.cr4 = kCr4Pse;
  regs.cr3 = 0x3000;
  auto ctx = paging_context(dom, regs);
  ASSERT_TRUE(ctx);
  EXPECT_EQ(ctx->mode, PagingMode::Legacy32);
  EXPECT_TRUE(ctx->pse);
  EXPECT_FALSE(ctx->nxe);

  regs.cr4 = kCr4Pae;
  regs.efer = kEferLme | kEferLma | kEferNxe;
  ctx = paging_context(dom, regs);
  EXPECT_EQ(ctx->mode, PagingMode::Long4);
  EXPECT_TRUE(ctx->nxe);
  EXPECT_FALSE(ctx->pse);
}

}  // namespace
}  // namespace xenprobes::mem
