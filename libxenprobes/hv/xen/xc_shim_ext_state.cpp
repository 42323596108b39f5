// The XEN_DOMCTL_{get,set}vcpuextstate buffers: the domctls prepared and Xen's answers
// checked (declared in xen_internal.hpp; file map: xc_shim_internal.hpp).
#include <cstring>
#include <span>
#include <string>

#include "common/hex.hpp"
#include "hv/xen/xc_shim_internal.hpp"

namespace xenprobes::hv::xen {

// ---- XEN_DOMCTL_{get,set}vcpuextstate buffers (layout: xen_internal.hpp) ------------------

namespace {

// XCR0 bits (Intel SDM vol. 1 §13.1; Xen's asm/x86-defns.h:81-100, not in the public headers).
constexpr std::uint64_t kXcr0Fp = 1u << 0, kXcr0Sse = 1u << 1, kXcr0Ymm = 1u << 2;
constexpr std::uint64_t kXcr0BndRegs = 1u << 3, kXcr0BndCsr = 1u << 4;
constexpr std::uint64_t kXcr0Avx512 = (1u << 5) | (1u << 6) | (1u << 7);  // OPMASK ZMM HI_ZMM

// Xen's valid_xcr0() (xstate.c:583-609): validate_xstate() refuses a set whose xcr0 or
// xcr0_accum fails it.
bool valid_xcr0(std::uint64_t x) {
  if (!(x & kXcr0Fp)) return false;
  if ((x & kXcr0Ymm) && !(x & kXcr0Sse)) return false;
  if ((x & kXcr0Avx512) && (!(x & kXcr0Ymm) || (x & kXcr0Avx512) != kXcr0Avx512)) return false;
  if (!(x & kXcr0BndRegs) != !(x & kXcr0BndCsr)) return false;
  return true;
}

std::uint64_t load_u64(std::span<const std::uint8_t> b, std::size_t off) {
  std::uint64_t v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

}  // namespace

void ext_state_prepare_query(xen_domctl_vcpuextstate& e, unsigned vcpu) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = 0;
  e.size = 0;
  set_xen_guest_handle_raw(e.buffer, static_cast<std::uint64_t*>(nullptr));
}

Result<ExtStateHost> ext_state_host_from_query(const xen_domctl_vcpuextstate& e) {
  const std::string what = "XEN_DOMCTL_getvcpuextstate size query: ";
  ExtStateHost h;
  h.xfeature_mask = e.xfeature_mask;
  if (e.xfeature_mask == 0) {
    // No XSAVE on the host: PV_XSAVE_SIZE(0) = 16 + xstate_ctxt_size(0) = 16 (xstate.c:577).
    if (e.size != kExtStateHeaderSize)
      return fail(Errc::Io, what + "no XSAVE features but a size of " + std::to_string(e.size));
    h.max_size = kExtStateHeaderSize;
    return h;
  }
  // xstate_init() insists on FP|SSE whenever XSAVE is used, and the mask must itself be a
  // valid XCR0 (the guest's xcr0_accum, a subset, is checked against it).
  if ((e.xfeature_mask & (kXcr0Fp | kXcr0Sse)) != (kXcr0Fp | kXcr0Sse) || !valid_xcr0(e.xfeature_mask))
    return fail(Errc::Io, what + "implausible xfeature_mask " + hex(e.xfeature_mask));
  if (e.size < kExtStateHeaderSize + kXsaveAreaMinSize || e.size > kExtStateHeaderSize + kExtStateMaxSize)
    return fail(Errc::Io, what + "implausible size " + std::to_string(e.size) + " for mask " + hex(e.xfeature_mask));
  h.max_size = static_cast<std::size_t>(e.size);
  return h;
}

void ext_state_prepare_get(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateHost& h) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = h.xfeature_mask;  // must equal Xen's, or EINVAL (domctl.c:955)
  e.size = h.max_size;                // must be >= PV_XSAVE_SIZE(xcr0_accum) (domctl.c:955)
}

Result<ExtStateImage> ext_state_parse(const xen_domctl_vcpuextstate& a, unsigned vcpu, const ExtStateHost& h,
                                      std::span<const std::uint8_t> buf) {
  const std::string what = "XEN_DOMCTL_getvcpuextstate(vcpu " + std::to_string(vcpu) + "): ";
  // The domctl is copied back whole (domctl.c:1072-1073): the inputs must come back unchanged.
  if (a.vcpu != vcpu || a.xfeature_mask != h.xfeature_mask)
    return fail(Errc::Io, what + "vcpu/xfeature_mask changed in the answer");
  if (buf.size() < h.max_size) return fail(Errc::InvalidArgument, what + "buffer smaller than the size query's answer");
  if (a.size < kExtStateHeaderSize || a.size > h.max_size)
    return fail(Errc::Io,
                what + "answered size " + std::to_string(a.size) + " outside [16, " + std::to_string(h.max_size) + "]");
  ExtStateImage img;
  img.size = static_cast<std::size_t>(a.size);
  img.xcr0 = load_u64(buf, 0);
  img.xcr0_accum = load_u64(buf, 8);

  if (img.xcr0_accum == 0) {
    // No XSAVE image (xstate_alloc_save_area leaves xcr0 = xcr0_accum = 0 until the guest's
    // first XSETBV, xstate.c:545-546): size is PV_XSAVE_SIZE(0) = 16, and set accepts that
    // only with xcr0 == 0 too (domctl.c:1027-1035).
    if (img.xcr0 != 0 || img.size != kExtStateHeaderSize)
      return fail(Errc::Io, what + "xcr0_accum 0 with xcr0 " + hex(img.xcr0) + " and size " + std::to_string(img.size));
    return img;
  }
  // What validate_xstate() (xstate.c:689-711) and the size checks of the set (domctl.c:
  // 1041-1048) will demand when the image is handed back.
  if (img.size < kExtStateHeaderSize + kXsaveAreaMinSize)
    return fail(Errc::Io, what + "size " + std::to_string(img.size) + " too small for an XSAVE image");
  if (img.xcr0_accum & ~h.xfeature_mask)
    return fail(Errc::Io,
                what + "xcr0_accum " + hex(img.xcr0_accum) + " beyond the host's mask " + hex(h.xfeature_mask));
  if (!valid_xcr0(img.xcr0_accum) || !valid_xcr0(img.xcr0) || (img.xcr0 & ~img.xcr0_accum))
    return fail(Errc::Io, what + "invalid xcr0 " + hex(img.xcr0) + " / xcr0_accum " + hex(img.xcr0_accum));
  // Only when xcr0_accum is the host's full mask is the exact size known here (the query's);
  // otherwise it is CPUID 0xD's for that subset, which Xen re-checks on set.
  if (img.xcr0_accum == h.xfeature_mask && img.size != h.max_size)
    return fail(Errc::Io, what + "size " + std::to_string(img.size) +
                              " for the full mask, "
                              "expected " +
                              std::to_string(h.max_size));
  const std::size_t hdr = kExtStateHeaderSize + 512;  // XSAVE header inside the buffer
  img.xstate_bv = load_u64(buf, hdr);
  const std::uint64_t xcomp_bv = load_u64(buf, hdr + 8);
  if (img.xstate_bv & ~img.xcr0_accum)
    return fail(Errc::Io, what + "xstate_bv " + hex(img.xstate_bv) + " beyond xcr0_accum " + hex(img.xcr0_accum));
  if (xcomp_bv != 0)  // the toolstack ABI is strictly uncompressed (xstate.c:231-240)
    return fail(Errc::Io, what + "compacted image (xcomp_bv " + hex(xcomp_bv) + ")");
  for (std::size_t i = 0; i < 6; ++i)
    if (load_u64(buf, hdr + 16 + 8 * i) != 0)
      return fail(Errc::Io, what + "reserved XSAVE header word " + std::to_string(i) + " is not zero");
  return img;
}

void ext_state_prepare_set(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateImage& img) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = 0;  // "SET: Ignored." (domctl.h)
  e.size = img.size;    // must be PV_XSAVE_SIZE(xcr0_accum) exactly (domctl.c:1047)
}

}  // namespace xenprobes::hv::xen
