// Tail calls proven from the kernel image (docs/probes.md "Jump probes"): a function whose only
// indirect jump is a tail call through a register (demo_tail_call, guest/safety.S) is refused
// as a jump probe from the guest's memory alone, since its indirect jump could land anywhere in
// it; given the guest's vmlinux as its symbols, the code addresses that image forms show that
// nothing forms an address inside it, and the probe is a jump. An image of another build gives
// no proof, and the refusal says why. On the simulated Xen, guest channel.
#include "engine/jump_index_fixture.hpp"

namespace xenprobes::testing {
namespace {

ProbeOptions jump() { return ProbeOptions{ProbeMethod::Jump}; }
auto nothing = [](HitContext&) { return 0; };

TEST(JumpImage, ATailCallThroughARegisterIsRefusedWithoutTheImage) {
  SessionGuest g(config(), {}, guest_channel());  // the demo's System.map
  auto p = g.session->probe(g.dom, "demo_tail_call", nothing, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("no-branch-into-region"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("indirect jump"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("tail calls are proven only from the kernel image"), std::string::npos)
      << p.error().what;
  // Fastest says the same of the trap probe it made.
  auto q = g.session->probe(g.dom, "demo_tail_call", nothing, {}, ProbeOptions{ProbeMethod::Fastest});
  ASSERT_TRUE(q) << q.error().what;
  EXPECT_EQ(q->info()->method, ProbeMethod::Trap);
  EXPECT_NE(q->info()->not_jump_because.find("tail calls are proven only"), std::string::npos)
      << q->info()->not_jump_because;
}

TEST(JumpImage, ATailCallThroughARegisterIsAJumpWithTheGuestsImage) {
  JumpIndexCache::process().clear();
  const JumpIndexCache::Counters before = JumpIndexCache::process().counters();
  SessionGuest g(config(), {}, guest_channel(), false);
  ASSERT_TRUE(g.session->load_symbols(g.dom, demo_vmlinux()));
  // Its symbol table serves as a System.map would.
  auto at = g.session->resolve(g.dom, "demo_tail_call");
  ASSERT_TRUE(at) << at.error().what;
  EXPECT_EQ(at->value, demo_sym("demo_tail_call"));
  {
    auto p = g.session->probe(g.dom, "demo_tail_call", nothing, {}, jump());
    ASSERT_TRUE(p) << p.error().what;
    EXPECT_EQ(p->info()->method, ProbeMethod::Jump);
    EXPECT_EQ(p->info()->address.value, at->value) << "its own region: the 7-byte RIP-relative load";
    EXPECT_EQ(JumpIndexCache::process().counters().proofs - before.proofs, 1u);
    // A second domain of the same build, with the same image: no second reading of it.
    const DomId b = add_domain(g);
    ASSERT_TRUE(g.session->load_symbols(b, demo_vmlinux()));
    auto q = g.session->probe(b, "demo_tail_call", nothing, {}, jump());
    ASSERT_TRUE(q) << q.error().what;
    EXPECT_EQ(q->info()->method, ProbeMethod::Jump);
    EXPECT_EQ(JumpIndexCache::process().counters().proofs - before.proofs, 1u) << "once per build";
    // The jump goes in, and the guest's workload is unharmed.
    g.start();
    ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; })) << "the jump was never written";
    EXPECT_EQ(g.peek(at->value, 1)[0], 0xe9);
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  }
  EXPECT_EQ(g.text(), g.text_before) << "unregistered: the text is the guest's again";
}

TEST(JumpImage, AnImageOfAnotherBuildGivesNoProofAndTheRefusalSaysWhy) {
  JumpIndexCache::process().clear();
  const std::uint64_t proofs = JumpIndexCache::process().counters().proofs;
  const std::string image = demo_image_of_another_build("image-of-another-build");
  SessionGuest g(config(), {}, guest_channel(), false);
  ASSERT_TRUE(g.session->load_symbols(g.dom, image)) << "its symbols are still the kernel's";
  auto p = g.session->probe(g.dom, "demo_tail_call", nothing, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("no-branch-into-region"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("no tail-call proof: the kernel image " + image + " is build-id "), std::string::npos)
      << p.error().what;
  EXPECT_NE(p.error().what.find("not the guest's kernel (build-id "), std::string::npos) << p.error().what;
  EXPECT_EQ(JumpIndexCache::process().counters().proofs, proofs) << "an image of another build is not read for it";
  std::filesystem::remove(image);
}

// A vmlinux without a symbol table (a decompressed vmlinuz; here the demo's with its section
// headers cut off) goes with the System.map loaded before it: the proof, not the symbols.
TEST(JumpImage, AnImageWithoutSymbolsGoesWithTheSystemMapLoadedBefore) {
  std::vector<char> f = demo_file();
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  eh.e_shnum = 0;
  eh.e_shoff = 0;
  std::memcpy(f.data(), &eh, sizeof eh);
  const auto path =
      std::filesystem::temp_directory_path() / ("xp-jump-index-" + std::to_string(::getpid()) + "-stripped.vmlinux");
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  SessionGuest g(config(), {}, guest_channel(), false);
  auto early = g.session->load_symbols(g.dom, path.string());
  ASSERT_FALSE(early) << "no symbols to go with yet";
  EXPECT_NE(early.error().what.find("has no symbol table: load the kernel's System.map first"), std::string::npos)
      << early.error().what;
  ASSERT_TRUE(g.session->load_symbols(g.dom, demo_map()));
  ASSERT_TRUE(g.session->load_symbols(g.dom, path.string()));
  auto p = g.session->probe(g.dom, "demo_tail_call", nothing, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  EXPECT_EQ(p->info()->method, ProbeMethod::Jump);
  std::filesystem::remove(path);
}

// A vmlinuz is not taken for a System.map: the refusal says what it is and what to give instead.
TEST(JumpImage, ACompressedKernelIsRefusedSayingWhatToGive) {
  std::vector<char> f(0x1000, '\0');
  std::memcpy(f.data() + 0x202, "HdrS", 4);
  const auto path =
      std::filesystem::temp_directory_path() / ("xp-jump-index-" + std::to_string(::getpid()) + "-vmlinuz");
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  SessionGuest g(config(), {}, guest_channel(), false);
  auto r = g.session->load_symbols(g.dom, path.string());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
  EXPECT_NE(r.error().what.find("is a compressed kernel (an x86 bzImage, vmlinuz): give load_symbols() the ELF inside"),
            std::string::npos)
      << r.error().what;
  std::filesystem::remove(path);
}

// A vmlinux whose symbol table is broken (its string table named as a PROGBITS section) is
// refused, saying why, even with a System.map loaded: its symbols are not quietly missing.
TEST(JumpImage, AnImageWithABrokenSymbolTableIsRefusedSayingWhy) {
  std::vector<char> f = demo_file();
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  bool broken = false;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, f.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_SYMTAB) continue;
    sh.sh_link = 1;  // .text
    std::memcpy(f.data() + eh.e_shoff + i * sizeof sh, &sh, sizeof sh);
    broken = true;
  }
  ASSERT_TRUE(broken) << "the demo vmlinux has a symbol table";
  const auto path =
      std::filesystem::temp_directory_path() / ("xp-jump-index-" + std::to_string(::getpid()) + "-badsyms.vmlinux");
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  SessionGuest g(config(), {}, guest_channel(), false);
  ASSERT_TRUE(g.session->load_symbols(g.dom, demo_map()));
  auto r = g.session->load_symbols(g.dom, path.string());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
  EXPECT_NE(r.error().what.find(path.string() + ": the symbol table (section "), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("names section 1 as its string table, which is of type 1, not SHT_STRTAB"),
            std::string::npos)
      << r.error().what;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace xenprobes::testing
