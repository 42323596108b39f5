// The guardian's journal: what the writer leaves is what the reader reads; a record caught
// mid-update is ignored; a file that is not a sound journal is refused as a whole, and so is
// a descriptor that is not a sealed memfd.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "guardian/journal.hpp"

namespace xenprobes::guardian {
namespace {

constexpr hv::DomainHandle kHandle{0x6b, 0x1f, 0x3c, 0x55, 0x90, 0x2e, 0x4a, 0x11,
                                   0x8d, 0x07, 0xc4, 0x19, 0x3e, 0xa2, 0x5f, 0x60};

std::unique_ptr<Journal> small() {
  auto j = Journal::create(JournalLimits{4, 8, 8});
  if (!j) throw std::runtime_error(j.error().what);
  return std::move(*j);
}

std::vector<std::byte> copy(const Journal& j) { return {j.bytes().begin(), j.bytes().end()}; }

JournalHeader& header_of(std::vector<std::byte>& img) { return *reinterpret_cast<JournalHeader*>(img.data()); }

TEST(GuardianJournal, WhatIsWrittenIsRead) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{3}, kHandle, JournalChannel::Debugger, 0xf1, JournalMonitor::None, 2));
  const std::uint8_t trap[] = {0xf1}, orig[] = {0x55};
  ASSERT_TRUE(j->add_patch(DomId{3}, PatchKind::Text, Gva{0xffffffff81000010}, trap, orig, Gva{0xffffffff81000010}));
  auto r = j->add_return(DomId{3}, Gva{0xffffc90000001ff8}, 0xffffffff81000100, Gva{0xffffffffa0000020});
  ASSERT_TRUE(r);
  j->add_held_pause(DomId{3});
  j->add_held_pause(DomId{3});
  j->drop_held_pause(DomId{3});
  j->add_held_pause(DomId{3});
  j->set_owed_unpauses(DomId{3}, 2);
  auto s = read_journal(j->bytes());
  ASSERT_TRUE(s) << s.error().what;
  EXPECT_FALSE(s->clean);
  EXPECT_EQ(s->owner_pid, static_cast<std::uint32_t>(getpid()));
  ASSERT_EQ(s->domains.size(), 1u);
  EXPECT_EQ(s->domains[0].domid, DomId{3});
  EXPECT_EQ(s->domains[0].handle, kHandle) << "a domain is named by its handle as well as its domid";
  EXPECT_EQ(s->domains[0].channel, JournalChannel::Debugger);
  EXPECT_EQ(s->domains[0].vcpus, 2u);
  EXPECT_EQ(s->domains[0].held_pauses, 2u) << "a count: two held, one released, one more";
  EXPECT_EQ(s->domains[0].owed_unpauses, 2u);
  ASSERT_EQ(s->patches.size(), 1u);
  EXPECT_EQ(s->patches[0].gva, Gva{0xffffffff81000010});
  EXPECT_EQ(s->patches[0].written, std::vector<std::uint8_t>{0xf1});
  EXPECT_EQ(s->patches[0].restore, std::vector<std::uint8_t>{0x55});
  ASSERT_EQ(s->returns.size(), 1u);
  EXPECT_EQ(s->returns[0].ret, 0xffffffff81000100u);

  j->remove_return(*r);
  j->remove_domain(DomId{3});
  EXPECT_TRUE(j->empty());
  j->set_clean(true);
  s = read_journal(j->bytes());
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->clean);
  EXPECT_TRUE(s->domains.empty() && s->patches.empty() && s->returns.empty());
}

TEST(GuardianJournal, FullTablesRefuseAndCount) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::VmEvent, 0xf1, JournalMonitor::DebugExceptions, 1));
  const std::uint8_t b[] = {0xf1};
  for (unsigned i = 0; i < 8; ++i) ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x1000 + i}, b, b, Gva{0}));
  auto full = j->add_patch(DomId{1}, PatchKind::Text, Gva{0x2000}, b, b, Gva{0});
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::NoSpace);
  for (unsigned i = 0; i < 8; ++i) ASSERT_TRUE(j->add_return(DomId{1}, Gva{0x8000 + 8 * i}, 1, Gva{2}));
  EXPECT_FALSE(j->add_return(DomId{1}, Gva{0x9000}, 1, Gva{2}));
  EXPECT_EQ(read_journal(j->bytes())->refused, 2u);
}

TEST(GuardianJournal, ATornRecordIsIgnored) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::Debugger, 0xf1, JournalMonitor::None, 1));
  const std::uint8_t t[] = {0xf1}, o[] = {0x90};
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x1000}, t, o, Gva{0x1000}));
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x2000}, t, o, Gva{0x2000}));
  auto img = copy(*j);
  // The writer died between "odd" and "even" on the second patch: its fields are half new.
  const JournalHeader& h = header_of(img);
  for (std::uint32_t i = 0; i < h.max_patches; ++i) {
    auto* r = reinterpret_cast<JournalPatchRec*>(img.data() + h.patches_off) + i;
    if (r->used && r->gva == 0x2000) {
      r->seq += 1;
      r->gva = 0xdead;
    }
  }
  auto s = read_journal(img);
  ASSERT_TRUE(s) << s.error().what;
  EXPECT_EQ(s->torn, 1u);
  ASSERT_EQ(s->patches.size(), 1u);
  EXPECT_EQ(s->patches[0].gva, Gva{0x1000});
}

TEST(GuardianJournal, ImpossibleRecordsAreIgnored) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::Debugger, 0xf1, JournalMonitor::None, 1));
  const std::uint8_t t[] = {0xf1}, o[] = {0x90};
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x1000}, t, o, Gva{0x1000}));
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x2000}, t, o, Gva{0x2000}));
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0x3000}, t, o, Gva{0x3000}));
  auto img = copy(*j);
  const JournalHeader& h = header_of(img);
  for (std::uint32_t i = 0; i < h.max_patches; ++i) {
    auto* r = reinterpret_cast<JournalPatchRec*>(img.data() + h.patches_off) + i;
    if (r->used && r->gva == 0x2000) r->len = 200;   // beyond its 8 bytes
    if (r->used && r->gva == 0x3000) r->domid = 77;  // a domain the journal does not have
  }
  auto s = read_journal(img);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->invalid, 2u);
  ASSERT_EQ(s->patches.size(), 1u);
  EXPECT_EQ(s->patches[0].gva, Gva{0x1000});
}

// A text patch in a loaded module's text names the module; the writer refuses a reference the
// guardian could not use, and the reader drops a record whose module words are not one.
TEST(GuardianJournal, ModuleReferences) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::VmEvent, 0xf1, JournalMonitor::DebugExceptions, 1));
  const std::uint8_t t[] = {0xf1}, o[] = {0x55};
  const JournalModule mod{Gva{0xffffffffc0a01040}, module_hash("ext4", 0xffffffffc0a10000), 24, 360};
  EXPECT_NE(module_hash("ext4", 0xffffffffc0a10000), module_hash("ext3", 0xffffffffc0a10000));
  EXPECT_NE(module_hash("ext4", 0xffffffffc0a10000), module_hash("ext4", 0xffffffffc0b10000));
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0xffffffffc0a10020}, t, o, Gva{0xffffffffc0a10020}, mod));
  ASSERT_TRUE(j->add_patch(DomId{1}, PatchKind::Text, Gva{0xffffffff81000010}, t, o, Gva{0xffffffff81000010}));
  struct Bad {
    const char* what;
    PatchKind kind;
    JournalModule m;
  };
  const Bad bad[] = {
      {"on a slot trap", PatchKind::SlotTrap, mod},
      {"a struct module in the user half", PatchKind::Text, {Gva{0x00007f0000001000}, mod.hash, 24, 360}},
      {"the name past 64 KiB", PatchKind::Text, {Gva{mod.address}, mod.hash, 0xfff0, 360}},
      {"the base inside the name", PatchKind::Text, {Gva{mod.address}, mod.hash, 24, 40}},
  };
  for (const Bad& b : bad) {
    auto r = j->add_patch(DomId{1}, b.kind, Gva{0xffffffffc0a10040}, t, o, Gva{0xffffffffc0a10040}, b.m);
    ASSERT_FALSE(r) << b.what;
    EXPECT_EQ(r.error().code, Errc::InvalidArgument) << b.what;
  }
  auto s = read_journal(j->bytes());
  ASSERT_TRUE(s) << s.error().what;
  ASSERT_EQ(s->patches.size(), 2u);
  for (const auto& p : s->patches) {
    if (p.gva == Gva{0xffffffffc0a10020}) {
      ASSERT_TRUE(p.module);
      EXPECT_EQ(*p.module, mod);
    } else {
      EXPECT_FALSE(p.module) << "the core kernel's text names no module";
    }
  }

  // Junk in the module words: a hash without a module, a module in the user half.
  auto img = copy(*j);
  const JournalHeader& h = header_of(img);
  for (std::uint32_t i = 0; i < h.max_patches; ++i) {
    auto* r = reinterpret_cast<JournalPatchRec*>(img.data() + h.patches_off) + i;
    if (r->used && r->gva == 0xffffffff81000010) r->module_hash = 7;
    if (r->used && r->gva == 0xffffffffc0a10020) r->module = 0x1000;
  }
  s = read_journal(img);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->invalid, 2u);
  EXPECT_TRUE(s->patches.empty()) << "nothing is done for a record that is not one";
}

TEST(GuardianJournal, GarbageIsRefused) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::Debugger, 0xf1, JournalMonitor::None, 1));
  const auto good = copy(*j);
  auto refused = [&](auto mutate, const char* why) {
    auto img = good;
    mutate(img);
    auto s = read_journal(img);
    EXPECT_FALSE(s) << why;
    if (!s) { EXPECT_EQ(s.error().code, Errc::Io) << why; }
  };
  refused([](auto& img) { header_of(img).magic ^= 1; }, "bad magic");
  refused([](auto& img) { header_of(img).version = 99; }, "unknown version");
  refused([](auto& img) { header_of(img).version = 1; }, "version 1: no domain handles");
  refused([](auto& img) { header_of(img).max_patches = 0x7fffffff; }, "patch count out of range");
  refused([](auto& img) { header_of(img).max_returns = 1u << 19; }, "returns beyond the file");
  refused([](auto& img) { header_of(img).patches_off = header_of(img).domains_off; }, "tables overlap");
  refused([](auto& img) { header_of(img).domains_off = 3; }, "misaligned table");
  refused([](auto& img) { header_of(img).total_size = ~0ull; }, "size beyond the file");
  refused([](auto& img) { header_of(img).patch_size = 8; }, "record size");
  refused([](auto& img) { img.resize(100); }, "shorter than the header");
  std::vector<std::byte> zeros(8192);
  EXPECT_FALSE(read_journal(zeros));
  EXPECT_TRUE(read_journal(good));
}

// A journal of the version before domain handles is refused with a message saying so: the
// guardian cannot tell its domains from later ones under the same domids.
TEST(GuardianJournal, AnOldVersionIsRefusedClearly) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{1}, kHandle, JournalChannel::Debugger, 0xf1, JournalMonitor::None, 1));
  std::vector<std::byte> img(j->bytes().begin(), j->bytes().end());
  header_of(img).version = 1;
  auto s = read_journal(img);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().what, "journal: version 1, this guardian reads version 2");
}

TEST(GuardianJournal, ReadFromTheFileDescriptor) {
  auto j = small();
  ASSERT_TRUE(j->add_domain(DomId{5}, kHandle, JournalChannel::VmEvent, 0xcc, JournalMonitor::SoftwareBreakpoints, 4));
  auto s = read_journal_fd(j->fd());
  ASSERT_TRUE(s) << s.error().what;
  ASSERT_EQ(s->domains.size(), 1u);
  EXPECT_EQ(s->domains[0].monitor, JournalMonitor::SoftwareBreakpoints);
}

// What the guardian is handed as its journal must be what Journal::create makes: a memfd
// sealed against resizing. Anything else is refused before a byte of it is trusted.
TEST(GuardianJournalFd, OnlyASealedMemfdIsAccepted) {
  auto j = small();
  EXPECT_TRUE(check_journal_fd(j->fd())) << "what create() makes";
  EXPECT_TRUE(read_journal_fd(j->fd()));

  int unsealed = ::memfd_create("not-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, static_cast<off_t>(j->bytes().size())), 0);
  ASSERT_EQ(::pwrite(unsealed, j->bytes().data(), j->bytes().size(), 0), static_cast<ssize_t>(j->bytes().size()));
  auto r = check_journal_fd(unsealed);
  ASSERT_FALSE(r) << "a sound journal image, but its size could change under the reader";
  EXPECT_NE(r.error().what.find("not sealed"), std::string::npos) << r.error().what;
  EXPECT_FALSE(read_journal_fd(unsealed));
  ::close(unsealed);

  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  r = check_journal_fd(p[0]);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what.find("not a memfd"), std::string::npos) << r.error().what;
  ::close(p[0]);
  ::close(p[1]);

  int file = ::open(::testing::TempDir().c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  r = check_journal_fd(file);
  ASSERT_FALSE(r) << "a file that is no memfd: no seals at all (or, on tmpfs, only F_SEAL_SEAL)";
  ::close(file);
}

}  // namespace
}  // namespace xenprobes::guardian
