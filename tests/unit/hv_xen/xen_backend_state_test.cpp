// The real Xen backend's pure translations of a vCPU's and a domain's state, checked against
// hand-built Xen buffers: a full HVM context patched for one vCPU, the
// XEN_DOMCTL_{get,set}vcpuextstate buffers, and getdomaininfo's answer.

#include "unit/hv_xen/xen_backend_fixture.hpp"

namespace xenprobes::hv {
namespace {

using namespace xen;

// ---- patching a full HVM context ---------------------------------------------------------
//
//   [HEADER][hvm_save_header] [CPU/0][hvm_hw_cpu] [CPU/1][hvm_hw_cpu] [XSAVE/0][64 B]
//   [XSAVE/1][64 B] [END]

void put_record(std::vector<std::uint8_t>& blob, std::uint16_t type, std::uint16_t inst, const void* data,
                std::uint32_t len) {
  hvm_save_descriptor d{type, inst, len};
  auto* p = reinterpret_cast<const std::uint8_t*>(&d);
  blob.insert(blob.end(), p, p + sizeof d);
  auto* q = static_cast<const std::uint8_t*>(data);
  blob.insert(blob.end(), q, q + len);
}

std::vector<std::uint8_t> make_hvm_context(unsigned vcpus) {
  std::vector<std::uint8_t> blob;
  hvm_save_header h{HVM_FILE_MAGIC, HVM_FILE_VERSION, 0, 0x906ea, 2400000};
  put_record(blob, HVM_SAVE_CODE(HEADER), 0, &h, sizeof h);
  for (unsigned v = 0; v < vcpus; ++v) {
    auto c = make_hvm_cpu(0x1000 * (v + 1));
    put_record(blob, HVM_SAVE_CODE(CPU), v, &c, sizeof c);
  }
  for (unsigned v = 0; v < vcpus; ++v) {
    std::uint8_t xsave[64];
    std::memset(xsave, 0xa0 + v, sizeof xsave);
    put_record(blob, CPU_XSAVE_CODE, v, xsave, sizeof xsave);
  }
  put_record(blob, HVM_SAVE_CODE(END), 0, nullptr, 0);
  return blob;
}

// Offset of vCPU v's CPU payload in make_hvm_context's layout.
std::size_t cpu_payload_offset(unsigned v) {
  return sizeof(hvm_save_descriptor) + sizeof(hvm_save_header) +
         v * (sizeof(hvm_save_descriptor) + sizeof(hvm_hw_cpu)) + sizeof(hvm_save_descriptor);
}

TEST(HvmContext, PatchesOnlyTheCpuRecordOfThatVcpu) {
  auto blob = make_hvm_context(2);
  const auto before = blob;
  hvm_hw_cpu c1;
  std::memcpy(&c1, blob.data() + cpu_payload_offset(1), sizeof c1);
  VcpuRegs r = regs_from_hvm(c1);
  r.rip = 0xffffffff8100dead;
  r.rax = 0x42;
  ASSERT_TRUE(hvm_context_set_cpu_regs(blob, 1, r));

  std::memcpy(&c1, blob.data() + cpu_payload_offset(1), sizeof c1);
  EXPECT_EQ(c1.rip, 0xffffffff8100deadu);
  EXPECT_EQ(c1.rax, 0x42u);

  // Every byte outside vCPU 1's rax..rflags and dr6/dr7 is unchanged: the other vCPU, the
  // header, and the XSAVE records that restore the extended state after the CPU records.
  ASSERT_EQ(blob.size(), before.size());
  const std::size_t gprs = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, rax);
  const std::size_t gprs_end = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, cr0);
  const std::size_t drs = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, dr6);
  const std::size_t drs_end = cpu_payload_offset(1) + offsetof(hvm_hw_cpu, cs_sel);
  for (std::size_t i = 0; i < blob.size(); ++i) {
    if ((i >= gprs && i < gprs_end) || (i >= drs && i < drs_end)) continue;
    ASSERT_EQ(blob[i], before[i]) << "byte " << i;
  }
}

TEST(HvmContext, NoCpuRecordForAnOfflineVcpu) {
  auto blob = make_hvm_context(2);
  auto r = hvm_context_set_cpu_regs(blob, 5, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(HvmContext, TruncatedBlobIsIo) {
  auto blob = make_hvm_context(2);
  blob.resize(cpu_payload_offset(1) + 100);  // vCPU 1's record claims more than is left
  auto r = hvm_context_set_cpu_regs(blob, 1, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

TEST(HvmContext, UnexpectedCpuRecordLengthIsIo) {
  std::vector<std::uint8_t> blob;
  hvm_save_header h{HVM_FILE_MAGIC, HVM_FILE_VERSION, 0, 0, 0};
  put_record(blob, HVM_SAVE_CODE(HEADER), 0, &h, sizeof h);
  std::vector<std::uint8_t> short_cpu(sizeof(hvm_hw_cpu) - 8, 0);
  put_record(blob, HVM_SAVE_CODE(CPU), 0, short_cpu.data(), short_cpu.size());
  put_record(blob, HVM_SAVE_CODE(END), 0, nullptr, 0);
  auto r = hvm_context_set_cpu_regs(blob, 0, VcpuRegs{});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Io);
}

// ---- domain info --------------------------------------------------------------------------

// ---- XEN_DOMCTL_{get,set}vcpuextstate buffers ----------------------------------------------
// Xen's part is played by hand: an AVX host (xfeature_mask x87|SSE|YMM, CPUID 0xD size 832).

constexpr std::uint64_t kAvxMask = 0x7;
constexpr std::size_t kAvxMax = 16 + 832;

ExtStateHost avx_host() {
  xen_domctl_vcpuextstate q{};
  q.vcpu = 1;
  q.xfeature_mask = kAvxMask;
  q.size = kAvxMax;
  auto h = ext_state_host_from_query(q);
  EXPECT_TRUE(h) << h.error().what;
  return h ? *h : ExtStateHost{};
}

void put64(std::vector<std::uint8_t>& b, std::size_t off, std::uint64_t v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// A getvcpuextstate answer: the domctl as copied back and the buffer as filled.
struct ExtAnswer {
  xen_domctl_vcpuextstate dc{};
  std::vector<std::uint8_t> buf;
};

ExtAnswer answer(unsigned vcpu, std::uint64_t xcr0, std::uint64_t accum, std::uint64_t bv, std::size_t size = kAvxMax) {
  ExtAnswer a;
  ext_state_prepare_get(a.dc, vcpu, avx_host());
  a.buf.assign(kAvxMax, 0);
  put64(a.buf, 0, xcr0);
  put64(a.buf, 8, accum);
  if (size > 16) {
    a.buf[16] = 0x7f;            // FCW, just to have some payload
    put64(a.buf, 16 + 512, bv);  // xstate_bv
    a.buf[16 + 576] = 0xa5;      // first YMM_Hi128 byte
  }
  a.dc.size = size;  // Xen writes back the size it filled
  return a;
}

Result<ExtStateImage> parse(const ExtAnswer& a, unsigned vcpu = 1) {
  return ext_state_parse(a.dc, vcpu, avx_host(), a.buf);
}

TEST(ExtState, SizeQueryAsksWithZeroSizeMaskAndNullBuffer) {
  xen_domctl_vcpuextstate q;
  std::memset(&q, 0xff, sizeof q);
  ext_state_prepare_query(q, 3);
  EXPECT_EQ(q.vcpu, 3u);
  EXPECT_EQ(q.xfeature_mask, 0u);
  EXPECT_EQ(q.size, 0u);
  EXPECT_EQ(q.buffer.p, nullptr);
}

TEST(ExtState, HostFromQuery) {
  auto h = avx_host();
  EXPECT_TRUE(h.has_xsave());
  EXPECT_EQ(h.xfeature_mask, kAvxMask);
  EXPECT_EQ(h.max_size, kAvxMax);

  xen_domctl_vcpuextstate q{};  // no XSAVE: PV_XSAVE_SIZE(0) = 16
  q.size = 16;
  auto none = ext_state_host_from_query(q);
  ASSERT_TRUE(none) << none.error().what;
  EXPECT_FALSE(none->has_xsave());
}

TEST(ExtState, ImplausibleQueryAnswersAreIo) {
  struct Case {
    std::uint64_t mask, size;
  };
  for (auto c : {Case{0, 848},              // no XSAVE, yet a size
                 Case{0x5, kAvxMax},        // YMM without SSE
                 Case{0x1, kAvxMax},        // no SSE
                 Case{0x27, kAvxMax},       // OPMASK without ZMM/HI_ZMM
                 Case{kAvxMask, 16 + 512},  // smaller than legacy + header
                 Case{kAvxMask, 16 + 1024 * 1024}, Case{kAvxMask, ~0ull}}) {
    xen_domctl_vcpuextstate q{};
    q.xfeature_mask = c.mask;
    q.size = c.size;
    auto h = ext_state_host_from_query(q);
    ASSERT_FALSE(h) << std::hex << c.mask << " " << c.size;
    EXPECT_EQ(h.error().code, Errc::Io);
  }
}

TEST(ExtState, GetAsksWithTheHostMaskAndTheMaximumSize) {
  xen_domctl_vcpuextstate g;
  std::memset(&g, 0xff, sizeof g);
  ext_state_prepare_get(g, 2, avx_host());
  EXPECT_EQ(g.vcpu, 2u);
  EXPECT_EQ(g.xfeature_mask, kAvxMask);
  EXPECT_EQ(g.size, kAvxMax);
}

TEST(ExtState, ParsesAnAvxImageAndSetsItBackWithTheSameSize) {
  auto a = answer(1, 0x7, 0x7, 0x6);
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_EQ(img->xcr0, 0x7u);
  EXPECT_EQ(img->xcr0_accum, 0x7u);
  EXPECT_EQ(img->xstate_bv, 0x6u);
  EXPECT_EQ(img->size, kAvxMax);
  EXPECT_TRUE(img->needs_restore());

  xen_domctl_vcpuextstate s;
  std::memset(&s, 0xff, sizeof s);
  ext_state_prepare_set(s, 1, *img);
  EXPECT_EQ(s.vcpu, 1u);
  EXPECT_EQ(s.xfeature_mask, 0u);  // ignored by SET
  EXPECT_EQ(s.size, kAvxMax);      // PV_XSAVE_SIZE(xcr0_accum), as Xen reported it
}

TEST(ExtState, SubsetOfTheHostMaskMayBeSmaller) {
  auto a = answer(1, 0x3, 0x3, 0x3, 16 + 576);  // guest never enabled AVX
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_EQ(img->size, 16u + 576u);
  EXPECT_TRUE(img->needs_restore());
}

TEST(ExtState, NoImageBeforeTheFirstXsetbvNeedsNoRestore) {
  auto a = answer(1, 0, 0, 0, 16);
  auto img = parse(a);
  ASSERT_TRUE(img) << img.error().what;
  EXPECT_FALSE(img->needs_restore());
  EXPECT_EQ(img->size, 16u);
}

TEST(ExtState, HostileAnswersAreIo) {
  struct Case {
    const char* name;
    ExtAnswer a;
  };
  std::vector<Case> cases;
  cases.push_back({"size beyond the buffer", answer(1, 7, 7, 7, kAvxMax + 8)});
  cases.push_back({"size below the header", answer(1, 7, 7, 7, 8)});
  cases.push_back({"image too small", answer(1, 3, 3, 3, 16 + 575)});
  cases.push_back({"full mask, wrong size", answer(1, 7, 7, 7, kAvxMax - 64)});
  cases.push_back({"accum 0 with xcr0", answer(1, 7, 0, 0, 16)});
  cases.push_back({"accum 0 with an image", answer(1, 0, 0, 0, kAvxMax)});
  cases.push_back({"accum beyond the host", answer(1, 0x7, 0x207, 0x7)});
  cases.push_back({"xcr0 beyond accum", answer(1, 0x7, 0x3, 0x3, 16 + 576)});
  cases.push_back({"xcr0 without FP", answer(1, 0x6, 0x7, 0x7)});
  cases.push_back({"xstate_bv beyond accum", answer(1, 0x3, 0x3, 0x7, 16 + 576)});
  {
    auto a = answer(1, 7, 7, 7);
    put64(a.buf, 16 + 512 + 8, 1ull << 63 | 7);  // compacted: not the toolstack ABI
    cases.push_back({"compacted", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    put64(a.buf, 16 + 512 + 16 + 5 * 8, 1);  // last reserved header word
    cases.push_back({"reserved word", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    a.dc.vcpu = 2;
    cases.push_back({"vcpu changed", std::move(a)});
  }
  {
    auto a = answer(1, 7, 7, 7);
    a.dc.xfeature_mask = 0x3;
    cases.push_back({"mask changed", std::move(a)});
  }
  for (const auto& c : cases) {
    auto img = parse(c.a);
    ASSERT_FALSE(img) << c.name;
    EXPECT_EQ(img.error().code, Errc::Io) << c.name << ": " << img.error().what;
  }
}

TEST(ExtState, BufferSmallerThanTheQueryAnswerIsRefused) {
  auto a = answer(1, 7, 7, 7);
  a.buf.resize(kAvxMax - 1);
  auto img = parse(a);
  ASSERT_FALSE(img);
  EXPECT_EQ(img.error().code, Errc::InvalidArgument);
}

TEST(DomainInfo, FromGetdomaininfo) {
  xen_domctl_getdomaininfo x;
  std::memset(&x, 0, sizeof x);
  x.domain = 7;
  x.flags = XEN_DOMINF_hvm_guest | XEN_DOMINF_paused | XEN_DOMINF_debugged;
  x.max_vcpu_id = 3;
  x.nr_online_vcpus = 2;
  for (unsigned i = 0; i < 16; ++i) x.handle[i] = static_cast<std::uint8_t>(0xa0 + i);
  DomainInfo d = domain_info_from_xen(x);
  EXPECT_EQ(d.domid, DomId{7});
  EXPECT_EQ(d.handle, (DomainHandle{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad,
                                    0xae, 0xaf}))
      << "the domain's unique handle (xen_domain_handle_t)";
  EXPECT_EQ(d.type, GuestType::Hvm);
  EXPECT_EQ(d.vcpus, 4u);
  EXPECT_EQ(d.online_vcpus, 2u);
  EXPECT_TRUE(d.paused);
  EXPECT_TRUE(d.debugged);
  EXPECT_FALSE(d.dying);
  EXPECT_FALSE(d.shutdown);
  EXPECT_FALSE(d.crashed);
  EXPECT_EQ(d.name, "");
}

TEST(DomainInfo, CrashedIsShutdownWithReasonCrash) {
  xen_domctl_getdomaininfo x;
  std::memset(&x, 0, sizeof x);
  x.domain = 3;
  x.flags = XEN_DOMINF_shutdown | XEN_DOMINF_dying | (SHUTDOWN_crash << XEN_DOMINF_shutdownshift);
  x.max_vcpu_id = XEN_INVALID_MAX_VCPU_ID;
  DomainInfo d = domain_info_from_xen(x);
  EXPECT_EQ(d.type, GuestType::Pv);
  EXPECT_EQ(d.vcpus, 0u);
  EXPECT_TRUE(d.shutdown);
  EXPECT_TRUE(d.dying);
  EXPECT_TRUE(d.crashed);

  x.flags = XEN_DOMINF_shutdown | (SHUTDOWN_poweroff << XEN_DOMINF_shutdownshift);
  d = domain_info_from_xen(x);
  EXPECT_TRUE(d.shutdown);
  EXPECT_FALSE(d.crashed);
}

}  // namespace
}  // namespace xenprobes::hv
