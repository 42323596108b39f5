// The jump probes' index per kernel build (probe/jump_index.hpp, docs/probes.md "Jump probes"):
// the branches between the kernel's functions are decoded once per build per process; a second
// domain of the same build, or a second session, reuses them after checking that its own text
// and functions hash the same; a guest that claims another's build id with other text decodes
// its own. On the simulated Xen, guest channel, with demo guests whose images the tests change.
#include <cstdlib>

#include "common/log.hpp"
#include "engine/jump_index_fixture.hpp"

namespace xenprobes::testing {
namespace {

using probe::JumpIndexCache;

auto nothing = [](HitContext&) { return 0; };

TEST(JumpIndex, TwoDomainsOfOneKernelBuildDecodeItOnce) {
  JumpIndexCache::process().clear();
  const Delta d;
  SessionGuest g(config(), {}, guest_channel());
  const DomId b = add_domain(g);
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  EXPECT_EQ(d.builds(), 1u) << "the first domain decodes the kernel";
  ASSERT_TRUE(g.session->prepare_jump_probes(b));
  EXPECT_EQ(d.builds(), 1u) << "the second domain of the same build does not";
  EXPECT_EQ(d.reuses(), 1u);
  EXPECT_EQ(d.mismatches(), 0u);

  // The reused index serves the second domain: the branch from demo_cross_from into
  // demo_cross_into (guest/safety.S) is known there too.
  auto p = g.session->probe(b, Gva{demo_sym("demo_cross_into")}, nothing, {}, ProbeOptions{ProbeMethod::Jump});
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("a branch from demo_cross_from"), std::string::npos) << p.error().what;
  // And a jump probe there counts every call.
  std::uint64_t hits = 0;
  auto q = g.session->probe(
      b, "sys_getppid", [&](HitContext&) { return ++hits, 0; }, {}, ProbeOptions{ProbeMethod::Jump});
  ASSERT_TRUE(q) << q.error().what;
  EXPECT_EQ(q->info()->method, ProbeMethod::Jump);
  ASSERT_TRUE(g.session->hypervisor().unpause(b));
  ASSERT_TRUE(run_until(g, [&] { return g.host->wait_halted(b, std::chrono::milliseconds(0)); }))
      << g.host->crash_reason(b);
  EXPECT_EQ(hits, expected_calls(DEMO_FN_GETPPID, kIters));
}

TEST(JumpIndex, ASecondSessionInTheProcessReusesIt) {
  JumpIndexCache::process().clear();
  const Delta d;
  {
    SessionGuest g(config(), {}, guest_channel());
    ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  }
  SessionGuest g(config(), {}, guest_channel());
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  EXPECT_EQ(d.builds(), 1u);
  EXPECT_EQ(d.reuses(), 1u);
}

TEST(JumpIndex, AnotherBuildDecodesItsOwn) {
  JumpIndexCache::process().clear();
  const Delta d;
  const std::string image = demo_image_of_another_build("other-build");
  SessionGuest g(config(), {}, guest_channel());
  const DomId b = add_domain(g, image);
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  ASSERT_TRUE(g.session->prepare_jump_probes(b));
  EXPECT_EQ(d.builds(), 2u) << "each build decodes its own";
  EXPECT_EQ(d.reuses(), 0u);
  EXPECT_EQ(d.mismatches(), 0u) << "a different build id is no lie";
  std::filesystem::remove(image);
}

// A guest that says it runs another's build (the same build id) with other text: the branch
// its text has and the other's has not must still be seen. Image A is the demo with
// demo_cross_from's `jmp 1b` into demo_cross_into made a jump to itself (no branch between
// the two), its build id unchanged; domain B runs the demo itself. A is indexed first.
TEST(JumpIndex, AForgedBuildIdWithOtherTextIsNotReused) {
  JumpIndexCache::process().clear();
  const Delta d;
  const std::uint64_t jmp = demo_sym("demo_cross_from") + 5;
  {
    std::vector<char> f = demo_file();
    ASSERT_EQ(static_cast<std::uint8_t>(f[file_offset(f, jmp, 2)]), 0xeb) << "guest/safety.S changed";
  }
  const std::string image = demo_image_with(jmp, {0xeb, 0xfe}, "forged");
  SessionGuest g(config(image), {}, guest_channel());
  const DomId b = add_domain(g);
  const Gva into{demo_sym("demo_cross_into")};
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  auto a = g.session->probe(g.dom, into, nothing, {}, ProbeOptions{ProbeMethod::Jump});
  ASSERT_TRUE(a) << "image A has no branch into demo_cross_into: " << a.error().what;
  EXPECT_EQ(a->info()->method, ProbeMethod::Jump);

  ASSERT_TRUE(g.session->prepare_jump_probes(b));
  EXPECT_EQ(d.reuses(), 0u) << "B's text is not A's: A's index must not serve it";
  EXPECT_EQ(d.mismatches(), 1u);
  EXPECT_EQ(d.builds(), 2u);
  auto p = g.session->probe(b, into, nothing, {}, ProbeOptions{ProbeMethod::Jump});
  ASSERT_FALSE(p) << "B's branch from demo_cross_from lands inside the region";
  EXPECT_NE(p.error().what.find("a branch from demo_cross_from"), std::string::npos) << p.error().what;
  std::filesystem::remove(image);
}

// ---- The build id, from hostile bytes.

std::vector<std::uint8_t> note(std::uint32_t namesz, std::uint32_t descsz, std::uint32_t type, std::string name,
                               std::vector<std::uint8_t> desc) {
  const std::size_t name_at = 12, desc_at = name_at + ((name.size() + 3) & ~std::size_t{3});
  std::vector<std::uint8_t> n(desc_at + ((desc.size() + 3) & ~std::size_t{3}), 0);
  const std::uint32_t h[3] = {namesz, descsz, type};
  std::memcpy(n.data(), h, sizeof h);
  for (std::size_t k = 0; k < name.size(); ++k) n[name_at + k] = static_cast<std::uint8_t>(name[k]);
  for (std::size_t k = 0; k < desc.size(); ++k) n[desc_at + k] = desc[k];
  return n;
}

TEST(JumpIndexBuild, TheGnuBuildIdIsFoundAfterOtherNotes) {
  auto xen = note(4, 8, 1, std::string("Xen\0", 4), std::vector<std::uint8_t>(8, 7));
  auto gnu = note(4, 3, NT_GNU_BUILD_ID, std::string("GNU\0", 4), {0xab, 0x01, 0xff});
  xen.insert(xen.end(), gnu.begin(), gnu.end());
  EXPECT_EQ(probe::gnu_build_id(xen), "ab01ff");
}

TEST(JumpIndexBuild, MalformedNotesGiveNoBuildId) {
  const std::string gnu("GNU\0", 4);
  EXPECT_FALSE(probe::gnu_build_id({}));
  auto n = note(4, 20, NT_GNU_BUILD_ID, gnu, std::vector<std::uint8_t>(20, 1));
  EXPECT_FALSE(probe::gnu_build_id(std::span(n).first(n.size() - 4))) << "its descriptor runs past the notes";
  auto huge = note(4, 20, NT_GNU_BUILD_ID, gnu, std::vector<std::uint8_t>(20, 1));
  const std::uint32_t big = 0xfffffff0u;
  std::memcpy(huge.data(), &big, 4);
  EXPECT_FALSE(probe::gnu_build_id(huge)) << "a name size past the notes";
  EXPECT_FALSE(probe::gnu_build_id(note(4, 0, NT_GNU_BUILD_ID, gnu, {})));
  EXPECT_FALSE(probe::gnu_build_id(note(4, 65, NT_GNU_BUILD_ID, gnu, std::vector<std::uint8_t>(65, 1))))
      << "longer than any build id";
  EXPECT_FALSE(probe::gnu_build_id(note(4, 4, NT_GNU_BUILD_ID, std::string("GNV\0", 4), {1, 2, 3, 4})));
}

TEST(JumpIndexBuild, TheKeyedHashDoesNotDependOnHowTheBytesArePassed) {
  std::vector<std::uint8_t> b(1000);
  for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<std::uint8_t>(k * 7);
  probe::KeyedHash whole, pieces, other;
  whole.update(b);
  pieces.update(std::span(b).first(3));
  pieces.update(std::span(b).subspan(3, 500));
  pieces.update(std::span(b).subspan(503));
  ASSERT_TRUE(whole.finish());
  EXPECT_EQ(whole.finish(), pieces.finish());
  b[999] ^= 1;
  other.update(b);
  ASSERT_TRUE(other.finish());
  EXPECT_NE(whole.finish(), other.finish());
}

// SipHash-2-4's published 64-bit tags (its authors' vectors.h) under the key 00 01 ... 0f, for
// the messages 00 01 ... of lengths 0, 1, 7, 8 and 15, each tag's bytes as printed there.
constexpr std::uint8_t kSipKey[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
struct SipVector {
  std::size_t len;
  std::uint8_t tag[8];
};
constexpr SipVector kSipVectors[] = {
    {0, {0x31, 0x0e, 0x0e, 0xdd, 0x47, 0xdb, 0x6f, 0x72}},  {1, {0xfd, 0x67, 0xdc, 0x93, 0xc5, 0x39, 0xf8, 0x74}},
    {7, {0x37, 0xd1, 0x01, 0x8b, 0xf5, 0x00, 0x02, 0xab}},  {8, {0x62, 0x24, 0x93, 0x9a, 0x79, 0xf5, 0xf5, 0x93}},
    {15, {0xe5, 0x45, 0xbe, 0x49, 0x61, 0xca, 0x29, 0xa1}},
};

std::uint64_t tag_of(const SipVector& v) {
  std::uint64_t t = 0;
  for (unsigned k = 0; k < 8; ++k) t |= std::uint64_t{v.tag[k]} << (8 * k);
  return t;
}

std::vector<std::uint8_t> counting(std::size_t n) {
  std::vector<std::uint8_t> m(n);
  for (std::size_t k = 0; k < n; ++k) m[k] = static_cast<std::uint8_t>(k);
  return m;
}

TEST(JumpIndexBuild, TheKeyedHashIsSipHash24) {
  for (const SipVector& v : kSipVectors) {
    const std::vector<std::uint8_t> m = counting(v.len);
    probe::KeyedHash h{std::span(kSipKey)};
    h.update(m);
    EXPECT_EQ(h.finish(), tag_of(v)) << v.len << " bytes";
    // The same bytes split at every point, and one at a time.
    for (std::size_t cut = 0; cut <= v.len; ++cut) {
      probe::KeyedHash s{std::span(kSipKey)};
      s.update(std::span(m).first(cut));
      s.update(std::span(m).subspan(cut));
      EXPECT_EQ(s.finish(), tag_of(v)) << v.len << " bytes cut at " << cut;
    }
    probe::KeyedHash bytewise{std::span(kSipKey)};
    for (std::uint8_t c : m) bytewise.update(std::span(&c, 1));
    EXPECT_EQ(bytewise.finish(), tag_of(v)) << v.len << " bytes one at a time";
  }
  // update_u64 passes its bytes least significant first: 00 01 ... 07 is the 8-byte vector.
  probe::KeyedHash u{std::span(kSipKey)};
  u.update_u64(0x0706050403020100ull);
  EXPECT_EQ(u.finish(), tag_of(kSipVectors[3]));
}

TEST(JumpIndexBuild, KeyedHashCopiesAndFinishLeaveEachOtherAlone) {
  const std::vector<std::uint8_t> m = counting(15);
  probe::KeyedHash h{std::span(kSipKey)};
  h.update(std::span(m).first(7));
  ASSERT_EQ(h.finish(), tag_of(kSipVectors[2])) << "finish() on the first 7 bytes";
  probe::KeyedHash copy = h;
  h.update(std::span(m).subspan(7));
  EXPECT_EQ(h.finish(), tag_of(kSipVectors[4])) << "bytes after finish() go on from where they were";
  EXPECT_EQ(copy.finish(), tag_of(kSipVectors[2])) << "a copy does not see what the original takes after";
  copy.update(std::span(m).subspan(7, 1));
  EXPECT_EQ(copy.finish(), tag_of(kSipVectors[3]));
  EXPECT_EQ(h.finish(), tag_of(kSipVectors[4])) << "nor the original what the copy takes";
  probe::KeyedHash assigned;
  assigned = copy;
  EXPECT_EQ(assigned.finish(), tag_of(kSipVectors[3]));
  probe::KeyedHash moved = std::move(assigned);
  EXPECT_EQ(moved.finish(), tag_of(kSipVectors[3]));
}

TEST(JumpIndexBuild, TheProcessKeyIsNotAFixedOne) {
  const std::vector<std::uint8_t> m = counting(15);
  probe::KeyedHash a, b;
  a.update(m);
  b.update(m);
  ASSERT_TRUE(a.finish());
  EXPECT_EQ(a.finish(), b.finish()) << "one key for the whole process";
  EXPECT_NE(a.finish(), tag_of(kSipVectors[4])) << "not the test key";
  constexpr std::uint8_t kZeroKey[16] = {};
  probe::KeyedHash zero{std::span(kZeroKey)};
  zero.update(m);
  ASSERT_TRUE(zero.finish());
  EXPECT_NE(a.finish(), zero.finish()) << "not a key of zeros";
}

// Without SipHash in OpenSSL (the ctest JumpIndexWithoutSipHash runs this under
// openssl-base-only.cnf, an OpenSSL that has none): nothing hashes, so no index is kept or
// reused, every domain decodes its own and still knows its branches, and the reason is logged
// once. Skipped elsewhere.
TEST(JumpIndexWithoutSipHash, EveryDomainDecodesItsOwnAndNothingIsKept) {
  if (!std::getenv("XENPROBES_TEST_NO_SIPHASH"))
    GTEST_SKIP() << "run by the ctest JumpIndexWithoutSipHash, with an OpenSSL that has no SIPHASH";
  const log::Level level = log::level();
  log::set_level(log::Level::Info);
  ::testing::internal::CaptureStderr();
  const std::vector<std::uint8_t> m = counting(15);
  probe::KeyedHash h, k{std::span(kSipKey)};
  h.update(m);
  k.update(m);
  EXPECT_FALSE(h.finish());
  EXPECT_FALSE(k.finish());
  EXPECT_FALSE(probe::KeyedHash(h).finish());

  JumpIndexCache::process().clear();
  const Delta d;
  {
    SessionGuest g(config(), {}, guest_channel());
    const DomId b = add_domain(g);
    ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
    ASSERT_TRUE(g.session->prepare_jump_probes(b));
    EXPECT_EQ(d.builds(), 0u) << "no index kept";
    EXPECT_EQ(d.reuses(), 0u);
    for (const DomId dom : {g.dom, b}) {
      auto p = g.session->probe(dom, Gva{demo_sym("demo_cross_into")}, nothing, {}, ProbeOptions{ProbeMethod::Jump});
      ASSERT_FALSE(p);
      EXPECT_NE(p.error().what.find("a branch from demo_cross_from"), std::string::npos) << p.error().what;
    }
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  log::set_level(level);
  const std::string why = "jump probes: no keyed hash (OpenSSL has no SIPHASH";
  const std::size_t at = said.find(why);
  EXPECT_NE(at, std::string::npos) << said;
  EXPECT_EQ(said.find(why, at + 1), std::string::npos) << "said once: " << said;
  EXPECT_NE(said.find("not kept, its text could not be hashed"), std::string::npos) << said;
}

}  // namespace
}  // namespace xenprobes::testing
