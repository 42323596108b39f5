// The Patcher: the order of a patch's steps, the undo of each failing step, and the two-phase
// removal, over guest memory in fake frames, a channel that records what it is told, and a
// real journal.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "guardian/journal.hpp"
#include "mem/fake_frame_source.hpp"
#include "probe/patcher.hpp"

namespace xenprobes::probe {
namespace {

using mem::FakeFrameSource;

constexpr std::uint64_t kAt = 0x5000;  // paging off: guest addresses are physical ones
const DomId kDom{3};

// Records every trap-table call and every trap_forgotten, with what the guest memory held at
// kAt at that moment.
class RecordingChannel final : public channel::Channel, public channel::TrapTable {
 public:
  explicit RecordingChannel(FakeFrameSource& ram) : ram_(ram) {}
  const char* name() const override { return "recording"; }
  channel::ChannelTraits traits() const override { return {.trap_byte = 0xcc}; }
  channel::TrapTable* trap_table() override { return this; }
  Result<void> attach(DomId) override { return {}; }
  Result<void> detach(DomId) override { return {}; }
  int fd() const override { return -1; }
  int poll_interval_ms() const override { return 0; }
  Result<unsigned> process(channel::StopSink&) override { return 0u; }
  Result<unsigned> process_domain(DomId, channel::StopSink&) override { return 0u; }
  Result<unsigned> flush(DomId, channel::StopSink&) override { return 0u; }
  void trap_forgotten(DomId, Gva a) override { log.push_back("forgotten " + std::to_string(a.value)); }
  Result<void> trap_added(DomId, const channel::TrapEntry& e) override {
    log.push_back("added " + std::to_string(e.addr.value) + " memory " + std::to_string(byte_at_kat()));
    if (fail_add) return fail(Errc::NoSpace, "the trap table is full");
    entries[e.addr.value] = e;
    return {};
  }
  void trap_removed(DomId, Gva a) override {
    log.push_back("removed " + std::to_string(a.value));
    entries.erase(a.value);
  }
  Result<void> return_added(DomId, Gva, Gva) override { return {}; }
  void return_removed(DomId, Gva) override {}
  std::vector<std::uint64_t> resumes_in_flight(DomId) const override { return {}; }
  int byte_at_kat() const {
    std::byte b{};
    ram_.read(Gpa{kAt}, std::span(&b, 1));
    return int(b);
  }

  std::vector<std::string> log;
  std::map<std::uint64_t, channel::TrapEntry> entries;
  bool fail_add = false;

 private:
  FakeFrameSource& ram_;
};

struct PatcherTest : ::testing::Test {
  void SetUp() override {
    ram.add_frame(Frame{kAt >> 12});
    const std::uint8_t insn[] = {0x55, 0x48, 0x89, 0xe5};  // push rbp; mov rbp, rsp
    ram.write(Gpa{kAt}, std::as_bytes(std::span(insn)));
    mem.set_context(mem::PagingMode::None, 0);
    auto j = guardian::Journal::create({.domains = 2, .patches = 1, .returns = 1});
    ASSERT_TRUE(j) << j.error().what;
    journal = std::move(*j);
    ASSERT_TRUE(journal->add_domain(kDom, hv::DomainHandle{}, guardian::JournalChannel::Debugger, 0xcc,
                                    guardian::JournalMonitor::None, 1));
  }
  PatchSpec trap_spec() {
    PatchSpec s;
    s.at = Gva{kAt};
    s.bytes = {0xcc};
    s.expect = {0x55};
    channel::TrapEntry e;
    e.addr = Gva{kAt};
    e.resume_at = Gva{0x9000};
    s.trap = e;
    s.journal = PatchSpec::Record{guardian::PatchKind::Text, Gva{kAt}, {0xcc}, {0x55}, Gva{kAt}};
    s.on_undo = [this] { ++undone; };
    return s;
  }
  int at() const { return ch.byte_at_kat(); }
  bool journaled() const { return journal->has_patch(kDom, Gva{kAt}); }

  FakeFrameSource ram;
  mem::GuestMemory mem{ram};
  RecordingChannel ch{ram};
  std::unique_ptr<guardian::Journal> journal;
  Patcher patcher{mem, ch, &ch, nullptr, kDom};  // replaced in tests that journal
  int undone = 0;
};

TEST_F(PatcherTest, TheChannelAndTheJournalKnowThePatchBeforeTheGuestSeesIt) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_TRUE(patch) << patch.error().what;
  EXPECT_EQ(at(), 0xcc);
  ASSERT_EQ(ch.log.size(), 1u);
  EXPECT_EQ(ch.log[0], "added " + std::to_string(kAt) + " memory " + std::to_string(0x55));  // not yet written
  EXPECT_TRUE(journaled());
  EXPECT_EQ(patch->state(), Patch::State::Applied);
}

TEST_F(PatcherTest, BytesThatAreNotTheExpectedOnesAreNeverWritten) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  PatchSpec s = trap_spec();
  s.expect = {0x90};
  auto patch = p.apply(std::move(s));
  ASSERT_FALSE(patch);
  EXPECT_EQ(patch.error().code, Errc::Again);
  EXPECT_NE(patch.error().what.find("holds 55"), std::string::npos) << patch.error().what;
  EXPECT_EQ(at(), 0x55);
  EXPECT_TRUE(ch.log.empty());
  EXPECT_FALSE(journaled());
  EXPECT_EQ(undone, 1);  // on_undo runs for every failure after apply() began
}

TEST_F(PatcherTest, AFailedTrapEntryLeavesNothingBehind) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  ch.fail_add = true;
  auto patch = p.apply(trap_spec());
  ASSERT_FALSE(patch);
  EXPECT_EQ(patch.error().code, Errc::NoSpace);
  EXPECT_EQ(at(), 0x55);
  EXPECT_FALSE(journaled());
  EXPECT_TRUE(ch.entries.empty());
  EXPECT_EQ(ch.log.size(), 1u);  // the failed add only: no remove of an entry never added
  EXPECT_EQ(undone, 1);
}

TEST_F(PatcherTest, AFullJournalTakesTheTrapEntryAwayAndWritesNothing) {
  ASSERT_TRUE(journal->add_patch(kDom, guardian::PatchKind::Text, Gva{0x7000}, std::vector<std::uint8_t>{0xcc},
                                 std::vector<std::uint8_t>{0x90}, Gva{0x7000}));  // the only record
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_FALSE(patch);
  EXPECT_EQ(at(), 0x55);
  EXPECT_FALSE(journaled());
  EXPECT_TRUE(ch.entries.empty());
  ASSERT_EQ(ch.log.size(), 3u);
  EXPECT_EQ(ch.log[1], "removed " + std::to_string(kAt));
  EXPECT_EQ(ch.log[2], "forgotten " + std::to_string(kAt));
  EXPECT_EQ(undone, 1);
}

TEST_F(PatcherTest, AFailedWriteTakesTheRecordAndTheEntryAway) {
  ram.deny_writable(Frame{kAt >> 12});
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_FALSE(patch);
  EXPECT_EQ(at(), 0x55);
  EXPECT_FALSE(journaled());
  EXPECT_TRUE(ch.entries.empty());
  EXPECT_EQ(undone, 1);
}

TEST_F(PatcherTest, AnUncommittedPatchIsUndoneWhenDropped) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  {
    auto patch = p.apply(trap_spec());
    ASSERT_TRUE(patch);
    EXPECT_EQ(at(), 0xcc);
  }
  EXPECT_EQ(at(), 0x55);
  EXPECT_FALSE(journaled());
  EXPECT_TRUE(ch.entries.empty());
  EXPECT_EQ(undone, 1);
}

TEST_F(PatcherTest, ACommittedPatchStaysUntilRestoredThenForgotten) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  std::optional<Patch> kept;
  {
    auto patch = p.apply(trap_spec());
    ASSERT_TRUE(patch);
    patch->commit();
    kept = std::move(*patch);
  }  // the moved-from handle undoes nothing
  EXPECT_EQ(at(), 0xcc);
  auto r = kept->restore();
  ASSERT_TRUE(r);
  EXPECT_TRUE(*r);
  EXPECT_EQ(at(), 0x55);
  // A vCPU may still be stopped on the trap: the channel and the journal keep it until forget().
  EXPECT_TRUE(journaled());
  EXPECT_TRUE(ch.entries.contains(kAt));
  kept->forget();
  EXPECT_FALSE(journaled());
  EXPECT_FALSE(ch.entries.contains(kAt));
  EXPECT_EQ(kept->state(), Patch::State::None);
  kept.reset();
  EXPECT_EQ(undone, 0);
}

TEST_F(PatcherTest, RestoreLeavesTheGuestsOwnBytesAlone) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_TRUE(patch);
  patch->commit();
  const std::uint8_t guest = 0xe9;  // the guest rewrote the site (a jump label, say)
  ram.write(Gpa{kAt}, std::as_bytes(std::span(&guest, 1)));
  auto r = patch->restore();
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
  EXPECT_EQ(at(), 0xe9);
}

TEST_F(PatcherTest, ReapplyChecksTheBytesAgainAndUpdatesTheEntry) {
  Patcher p(mem, ch, &ch, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_TRUE(patch);
  patch->commit();
  ASSERT_TRUE(patch->restore());
  channel::TrapEntry moved;
  moved.addr = Gva{kAt};
  moved.resume_at = Gva{0xa000};
  ASSERT_TRUE(patch->reapply(moved));
  EXPECT_EQ(at(), 0xcc);
  EXPECT_EQ(ch.entries.at(kAt).resume_at, Gva{0xa000});
  ASSERT_TRUE(patch->restore());
  const std::uint8_t guest = 0x90;
  ram.write(Gpa{kAt}, std::as_bytes(std::span(&guest, 1)));
  auto again = patch->reapply();
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Errc::Again);
  EXPECT_EQ(at(), 0x90);
}

TEST_F(PatcherTest, WithoutAJournalThePatchStillGoesInOrder) {
  auto patch = patcher.apply(trap_spec());
  ASSERT_TRUE(patch);
  EXPECT_FALSE(journaled());
  EXPECT_EQ(at(), 0xcc);
  ASSERT_TRUE(patch->undo());
  EXPECT_EQ(at(), 0x55);
  EXPECT_TRUE(ch.entries.empty());
}

// A channel without a trap table (vmevent, debugger) is told nothing when the trap goes in,
// and that the trap is forgotten when it goes: once, after the byte is back.
TEST_F(PatcherTest, WithoutATrapTableTheChannelHearsOnlyThatTheTrapIsForgotten) {
  Patcher p(mem, ch, nullptr, journal.get(), kDom);
  auto patch = p.apply(trap_spec());
  ASSERT_TRUE(patch) << patch.error().what;
  EXPECT_EQ(at(), 0xcc);
  EXPECT_TRUE(journaled());
  EXPECT_TRUE(ch.log.empty());
  patch->commit();
  channel::TrapEntry moved = *trap_spec().trap;
  moved.resume_at = Gva{0xa000};
  ASSERT_TRUE(patch->update_trap(moved));
  ASSERT_TRUE(patch->restore());
  ASSERT_TRUE(patch->reapply(moved));
  EXPECT_TRUE(ch.log.empty());
  ASSERT_TRUE(patch->restore());
  patch->forget();
  EXPECT_EQ(ch.log, std::vector<std::string>{"forgotten " + std::to_string(kAt)});
  EXPECT_FALSE(journaled());
  EXPECT_TRUE(ch.entries.empty());
}

TEST_F(PatcherTest, ReplaceWritesOnlyOverTheExpectedBytes) {
  const std::uint8_t expect[] = {0x55}, jmp[] = {0xeb, 0x00};
  auto r = patcher.replace(Gva{kAt}, std::span(jmp, 1), jmp);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Again);
  EXPECT_EQ(at(), 0x55);
  ASSERT_TRUE(patcher.replace(Gva{kAt}, expect, jmp));
  EXPECT_EQ(at(), 0xeb);
}

// The module reference a text patch in a module's text gets in the journal: the name and text
// base where the guest's struct module keeps them, and the hash of the module's own.
TEST(JournalModule, FromTheLayoutAndTheModule) {
  kernel::ModuleLayout l;
  l.name = {24, 56};
  l.core_base = {360, 8};
  const kernel::ModuleIdentity m{"ext4", 0xffffffffc0a01040, {0xffffffffc0a10000, 0xffffffffc0a40000}};
  auto j = journal_module(l, m);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->address, Gva{0xffffffffc0a01040});
  EXPECT_EQ(j->name_off, 24u);
  EXPECT_EQ(j->base_off, 360u);
  EXPECT_EQ(j->hash, guardian::module_hash("ext4", 0xffffffffc0a10000));

  kernel::ModuleLayout narrow = l;
  narrow.name.size = 4;  // no room for "ext4" and its NUL
  EXPECT_FALSE(journal_module(narrow, m));
  kernel::ModuleLayout base32 = l;
  base32.core_base.size = 4;
  EXPECT_FALSE(journal_module(base32, m));
  kernel::ModuleLayout overlap = l;
  overlap.core_base.offset = 40;  // inside the 56 bytes the guardian reads as the name
  EXPECT_FALSE(journal_module(overlap, m));
  kernel::ModuleLayout far = l;
  far.name.offset = 0x10000;
  EXPECT_FALSE(journal_module(far, m));
  EXPECT_FALSE(journal_module(l, kernel::ModuleIdentity{"", m.address, m.text})) << "no name";
  EXPECT_FALSE(journal_module(l, kernel::ModuleIdentity{"ext4", 0x00007f0000001000, m.text}))
      << "a struct module outside the kernel's half: no reference the journal would take";
}

}  // namespace
}  // namespace xenprobes::probe
