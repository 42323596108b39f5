// Fuzz target: the page-table walker (mem/walker.cpp) and GuestMemory on top of it, over
// arbitrary page-table contents in every paging mode. The guest owns its page tables.
//
// Input: mode, MAXPHYADDR, CR4.PSE, EFER.NXE, CR3, then up to 8 guest pages given as sparse
// entries (index, value), then the addresses to walk. In "mirror" mode every frame number
// maps to one of those pages (frame % pages), so any entry leads somewhere; otherwise page i
// is frame 0x100 + i and every other frame is absent.
//
// Invariants: the walker agrees with a reference walker written here from the SDM (success,
// error class, address, page size, R/W, U/S, XD, depth); a translation keeps the address's
// offset within its page and lands on a page-size-aligned base below MAXPHYADDR; GuestMemory's
// translate() (cached or not) says the same, read() returns the bytes the reference finds
// there, read_string() stops at the first NUL or at its bound; paging_context() agrees with
// paging_mode().
#include <array>

#include "fuzz/fuzz_common.hpp"
#include "hv/hypervisor.hpp"
#include "mem/guest_memory.hpp"
#include "mem/map_cache.hpp"
#include "mem/paging.hpp"
#include "mem/walker.hpp"

using namespace xenprobes;
using namespace xenprobes::mem;
using fuzz::Input;

namespace {

constexpr std::uint64_t kFirstFrame = 0x100;

struct Pages final : FrameSource {
  std::vector<std::unique_ptr<std::array<std::byte, kPageSize>>> pages;
  bool mirror = false;
  std::set<std::uint64_t> failing;  // frames whose map fails with EIO

  // The page of a frame, or null; `code` says why not.
  std::byte* find(std::uint64_t f, Errc* code) {
    if (failing.contains(f)) {
      *code = Errc::Io;
      return nullptr;
    }
    if (mirror) return pages[f % pages.size()]->data();
    if (f >= kFirstFrame && f - kFirstFrame < pages.size()) return pages[f - kFirstFrame]->data();
    *code = Errc::Fault;
    return nullptr;
  }
  Result<hv::ForeignMapping> map(Frame f, hv::MapAccess access) override {
    FUZZ_CHECK(access == hv::MapAccess::Read, "a walk or a read asked for a writable mapping");
    Errc code = Errc::Io;
    std::byte* p = find(f.value, &code);
    if (!p) return fail(code, "frame " + fuzz::hexs(f.value) + " is not there (fuzz)");
    return hv::ForeignMapping(p, 1, [](std::byte*, std::size_t) {});
  }
};

constexpr std::uint64_t bits(unsigned hi, unsigned lo) {
  return (hi >= 63 ? ~0ull : (1ull << (hi + 1)) - 1) & ~((1ull << lo) - 1);
}

struct Ref {
  bool ok = false;
  Errc code = Errc::Io;
  std::uint64_t addr = 0, size = 0;
  bool w = true, u = true, nx = false;
  unsigned depth = 0;
};

// The reference walk, from the SDM (Vol. 3 §4.3 to §4.5), one mode at a time.
Ref ref_walk(const PagingContext& c, std::uint64_t va, Pages& ram) {
  Ref r;
  auto fail_with = [&](Errc e) {
    r.ok = false;
    r.code = e;
    return r;
  };
  const unsigned maxphys = std::clamp(c.max_phys_bits, 32u, 52u);
  const std::uint64_t above = maxphys < 52 ? bits(51, maxphys) : 0;
  auto read = [&](std::uint64_t pa, unsigned bytes, std::uint64_t* out) -> bool {
    Errc code = Errc::Io;
    std::byte* p = ram.find(pa >> 12, &code);
    if (!p) {
      r.code = code;
      return false;
    }
    *out = 0;
    std::memcpy(out, p + (pa & 0xfff), bytes);
    ++r.depth;
    return true;
  };
  std::uint64_t e = 0;
  switch (c.mode) {
    case PagingMode::None:
      if (va >> 32) return fail_with(Errc::InvalidArgument);
      r.ok = true;
      r.addr = va;
      r.size = kPageSize;
      return r;
    case PagingMode::Legacy32: {
      if (va >> 32) return fail_with(Errc::InvalidArgument);
      if (!read((c.cr3 & 0xfffff000) + ((va >> 22) & 0x3ff) * 4, 4, &e)) return fail_with(r.code);
      if (!(e & 1)) return fail_with(Errc::Fault);
      r.w = e & 2, r.u = e & 4;
      if ((e & 0x80) && c.pse) {  // 4 MiB, PSE-36
        std::uint64_t rsvd = 1ull << 21;
        if (maxphys < 40) rsvd |= bits(20, 13 + (maxphys - 32));
        if (e & rsvd) return fail_with(Errc::Io);
        r.ok = true;
        r.size = 4ull << 20;
        r.addr = (e & 0xffc00000) | (((e >> 13) & 0xff) << 32) | (va & 0x3fffff);
        return r;
      }
      if (!read((e & 0xfffff000) + ((va >> 12) & 0x3ff) * 4, 4, &e)) return fail_with(r.code);
      if (!(e & 1)) return fail_with(Errc::Fault);
      r.w = r.w && (e & 2), r.u = r.u && (e & 4);
      r.ok = true;
      r.size = kPageSize;
      r.addr = (e & 0xfffff000) | (va & 0xfff);
      return r;
    }
    case PagingMode::Pae: {
      if (va >> 32) return fail_with(Errc::InvalidArgument);
      const std::uint64_t xd = c.nxe ? 0 : 1ull << 63;
      if (!read((c.cr3 & 0xffffffe0) + ((va >> 30) & 3) * 8, 8, &e)) return fail_with(r.code);
      if (!(e & 1)) return fail_with(Errc::Fault);
      if (e & (bits(63, 52) | bits(8, 5) | bits(2, 1) | above)) return fail_with(Errc::Io);
      if (!read((e & bits(51, 12)) + ((va >> 21) & 0x1ff) * 8, 8, &e)) return fail_with(r.code);
      if (!(e & 1)) return fail_with(Errc::Fault);
      r.w = e & 2, r.u = e & 4, r.nx = c.nxe && (e >> 63);
      if (e & 0x80) {
        if (e & (bits(62, 52) | bits(20, 13) | above | xd)) return fail_with(Errc::Io);
        r.ok = true;
        r.size = 2ull << 20;
        r.addr = (e & bits(51, 21)) | (va & 0x1fffff);
        return r;
      }
      if (e & (bits(62, 52) | above | xd)) return fail_with(Errc::Io);
      if (!read((e & bits(51, 12)) + ((va >> 12) & 0x1ff) * 8, 8, &e)) return fail_with(r.code);
      if (!(e & 1)) return fail_with(Errc::Fault);
      if (e & (bits(62, 52) | above | xd)) return fail_with(Errc::Io);
      r.w = r.w && (e & 2), r.u = r.u && (e & 4), r.nx = r.nx || (c.nxe && (e >> 63));
      r.ok = true;
      r.size = kPageSize;
      r.addr = (e & bits(51, 12)) | (va & 0xfff);
      return r;
    }
    case PagingMode::Long4:
    case PagingMode::Long5: {
      const unsigned levels = c.mode == PagingMode::Long5 ? 5 : 4;
      const unsigned vbits = levels == 5 ? 57 : 48;
      const std::uint64_t top = va >> (vbits - 1);
      if (top != 0 && top != (~0ull >> (vbits - 1))) return fail_with(Errc::InvalidArgument);
      if (c.cr3 & bits(51, 12) & above) return fail_with(Errc::InvalidArgument);
      const std::uint64_t xd = c.nxe ? 0 : 1ull << 63;
      std::uint64_t table = c.cr3 & bits(51, 12);
      for (unsigned level = levels; level >= 1; --level) {
        const unsigned shift = 12 + 9 * (level - 1);
        if (!read(table + ((va >> shift) & 0x1ff) * 8, 8, &e)) return fail_with(r.code);
        if (!(e & 1)) return fail_with(Errc::Fault);
        const bool ps = e & 0x80;
        std::uint64_t rsvd = above | xd;
        if (level >= 4 && ps) return fail_with(Errc::Io);  // PS is reserved in PML4Es and PML5Es
        const bool leaf = level == 1 || ((level == 2 || level == 3) && ps);
        if (leaf && level > 1) rsvd |= bits(shift - 1, 13);
        if (e & rsvd) return fail_with(Errc::Io);
        r.w = r.w && (e & 2), r.u = r.u && (e & 4), r.nx = r.nx || (c.nxe && (e >> 63));
        if (leaf) {
          r.ok = true;
          r.size = 1ull << shift;
          r.addr = (e & bits(51, shift)) | (va & (r.size - 1));
          return r;
        }
        table = e & bits(51, 12);
      }
      return fail_with(Errc::Io);
    }
  }
  return fail_with(Errc::Io);
}

std::string describe(const PagingContext& c, std::uint64_t va) {
  return std::string(to_string(c.mode)) + " cr3 " + fuzz::hexs(c.cr3) + " maxphys " + std::to_string(c.max_phys_bits) +
         " pse " + std::to_string(c.pse) + " nxe " + std::to_string(c.nxe) + " va " + fuzz::hexs(va);
}

void check_walk(const PagingContext& c, std::uint64_t va, Pages& ram, MapCache& cache, GuestMemory& gm) {
  auto t = walk(c, Gva{va}, cache);
  const Ref ref = ref_walk(c, va, ram);
  const std::string at = describe(c, va);
  FUZZ_TRACE("%s: %s", at.c_str(),
             t ? ("-> " + fuzz::hexs(t->address.value) + " size " + fuzz::hexs(t->page_size)).c_str()
               : t.error().what.c_str());
  FUZZ_CHECK(t.has_value() == ref.ok, at + ": walker " + (t ? "succeeded" : "failed: " + t.error().what));
  if (!t) {
    FUZZ_CHECK(t.error().code == ref.code, at + ": " + t.error().what);
    FUZZ_CHECK(fuzz::printable(t.error().what));
    auto g = gm.translate(Gva{va});
    FUZZ_CHECK(!g && g.error().code == t.error().code, at + ": GuestMemory disagrees with the walker");
    return;
  }
  FUZZ_CHECK(t->address.value == ref.addr,
             at + ": address " + fuzz::hexs(t->address.value) + ", reference " + fuzz::hexs(ref.addr));
  FUZZ_CHECK(t->page_size == ref.size && t->writable == ref.w && t->user == ref.u && t->nx == ref.nx, at);
  FUZZ_CHECK(t->depth == ref.depth, at + ": depth " + std::to_string(t->depth));
  // The translation page-aligns: same offset in the page, a base aligned to the page size.
  FUZZ_CHECK((t->address.value & (t->page_size - 1)) == (va & (t->page_size - 1)), at);
  FUZZ_CHECK(t->page_size == kPageSize || t->page_size == (2ull << 20) || t->page_size == (4ull << 20) ||
             t->page_size == (1ull << 30));
  const unsigned maxphys = std::clamp(c.max_phys_bits, 32u, 52u);
  if (c.mode == PagingMode::Legacy32) FUZZ_CHECK(t->address.value >> std::min(40u, maxphys) == 0, at);
  else if (c.mode != PagingMode::None) FUZZ_CHECK(t->address.value >> maxphys == 0, at + ": above MAXPHYADDR");
  for (unsigned i = 0; i < t->depth; ++i) FUZZ_CHECK(t->entries[i] & 1, at + ": a walk through a non-present entry");
  auto g = gm.translate(Gva{va});
  FUZZ_CHECK(g && g->address == t->address && g->nx == t->nx && g->writable == t->writable,
             at + ": GuestMemory disagrees");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 8192) return 0;
  Input in(data, size);
  const PagingMode modes[] = {PagingMode::None, PagingMode::Legacy32, PagingMode::Pae, PagingMode::Long4,
                              PagingMode::Long5};
  PagingContext c;
  const std::uint8_t b0 = in.u8();
  c.mode = modes[(b0 & 7) % 5];
  c.pse = b0 & 0x08;
  c.nxe = b0 & 0x10;
  Pages ram;
  ram.mirror = b0 & 0x20;
  c.max_phys_bits = in.u8() % 64;  // clamped to [32, 52] by the walker
  c.cr3 = in.flag() ? in.u64() : (kFirstFrame << 12) | (in.u8() & 0xe0);
  const unsigned npages = 1 + in.u8() % 8;
  for (unsigned p = 0; p < npages; ++p) {
    ram.pages.push_back(std::make_unique<std::array<std::byte, kPageSize>>());
    ram.pages.back()->fill(std::byte{0});
    for (unsigned k = in.u8() % 16; k-- > 0;) {
      const unsigned idx = in.u16() % 1024;
      if (c.mode == PagingMode::Legacy32) {
        const std::uint32_t v = in.u32();
        std::memcpy(ram.pages.back()->data() + idx * 4, &v, 4);
      } else {
        const std::uint64_t v = in.u64();
        std::memcpy(ram.pages.back()->data() + (idx % 512) * 8, &v, 8);
      }
    }
  }
  if (in.u8() == 0xfe) ram.failing.insert(in.u16());

  // paging_context agrees with the mode rules, for PV and HVM alike.
  {
    hv::DomainInfo info;
    info.type = in.flag() ? hv::GuestType::Hvm : hv::GuestType::Pv;
    info.guest_width = in.u8() % 8 == 0 ? 4 : 8;
    hv::VcpuRegs r;
    r.cr0 = in.u32(), r.cr4 = in.u32(), r.efer = in.u32(), r.cr3 = c.cr3;
    auto pc = paging_context(info, r);
    if (info.type == hv::GuestType::Pv) {
      FUZZ_CHECK(pc.has_value() == (info.guest_width == 8));
      if (pc) FUZZ_CHECK(pc->mode == pv_paging_mode(r.cr4) && pc->nxe && pc->cr3 == r.cr3);
    } else {
      FUZZ_CHECK(pc && pc->mode == paging_mode(r.cr0, r.cr4, r.efer) && pc->nxe == ((r.efer & kEferNxe) != 0));
    }
  }

  MapCache cache(ram, 1 + in.u8() % 8);
  GuestMemoryOptions gopts;
  gopts.mapping_cache_frames = 4;
  gopts.translation_cache_pages = 8;
  GuestMemory gm(ram, gopts);
  gm.set_context(c);
  std::vector<std::uint64_t> vas;
  while (!in.empty() && vas.size() < 32) {
    std::uint64_t va = in.u64();
    if (c.mode == PagingMode::Legacy32 || c.mode == PagingMode::Pae) va &= in.flag() ? 0xffffffffull : ~0ull;
    vas.push_back(va);
    check_walk(c, va, ram, cache, gm);
    check_walk(c, va | 0xfff, ram, cache, gm);  // the same page again: GuestMemory's cache answers
  }
  // Reads across pages: the reference's bytes, or the first page's failure.
  for (std::uint64_t va : vas) {
    std::array<std::byte, 6000> buf;
    const std::size_t n = 1 + (va >> 3) % buf.size();
    auto r = gm.read(Gva{va}, std::span(buf.data(), n));
    std::size_t done = 0;
    bool ok = true;
    for (std::uint64_t a = va; done < n;) {
      const Ref t = ref_walk(c, a, ram);
      const std::size_t chunk = std::min<std::size_t>(n - done, kPageSize - (a & 0xfff));
      Errc code = Errc::Io;
      std::byte* p = t.ok ? ram.find(t.addr >> 12, &code) : nullptr;
      if (!p) {
        ok = false;
        break;
      }
      if (r)
        FUZZ_CHECK(std::memcmp(buf.data() + done, p + (t.addr & 0xfff), chunk) == 0,
                   describe(c, a) + ": read() bytes differ");
      done += chunk;
      a += chunk;
    }
    FUZZ_CHECK(r.has_value() == ok,
               describe(c, va) + ": read() " + (r ? "succeeded" : "failed") + " against the reference");
    auto s = gm.read_string(Gva{va}, n % 300);
    if (s) {
      FUZZ_CHECK(s->size() <= n % 300 && s->find('\0') == std::string::npos);
      if (r && s->size() < n)
        FUZZ_CHECK(std::memcmp(s->data(), buf.data(), s->size()) == 0, "read_string() bytes differ");
    }
  }
  return 0;
}
