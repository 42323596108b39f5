#include "mem/walker.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "mem/hex.hpp"

namespace xenprobes::mem {
namespace {

constexpr std::uint64_t bit(unsigned n) { return std::uint64_t{1} << n; }
// Bits hi..lo inclusive.
constexpr std::uint64_t bits(unsigned hi, unsigned lo) {
  return (hi >= 63 ? ~std::uint64_t{0} : bit(hi + 1) - 1) & ~(bit(lo) - 1);
}

constexpr std::uint64_t kPresent = bit(0);
constexpr std::uint64_t kWrite = bit(1);
constexpr std::uint64_t kUser = bit(2);
constexpr std::uint64_t kPageSizeBit = bit(7);  // PS (PAT in a PTE, never read there)
constexpr std::uint64_t kXd = bit(63);

struct LevelFormat {
  const char* entry;         // SDM name of the entry
  unsigned level;            // SDM numbering: 1 = PTE … 5 = PML5E
  unsigned va_shift;         // lowest address bit this level indexes
  unsigned index_bits;       // 10 (Legacy32), 9, or 2 (PAE PDPT)
  bool large;                // PS=1 maps a page of 1 << va_shift bytes
  bool access;               // R/W and U/S exist (not in PAE PDPTEs)
  std::uint64_t rsvd_table;  // must-be-zero when the entry points to a table
  std::uint64_t rsvd_leaf;   // must-be-zero when it maps a page (PTE, or PS=1)
};

struct ModeFormat {
  unsigned entry_bytes;
  unsigned va_bits;         // 32: zero-extended; 48/57: sign-extended (canonical)
  bool nx;                  // bit 63 is XD (reserved unless EFER.NXE)
  std::uint64_t cr3_mask;   // CR3 bits that locate the top table
  std::uint64_t addr_mask;  // entry bits holding the next table's physical address
  unsigned depth;
  LevelFormat levels[kMaxLevels];
};

// The mask tables (SDM Vol. 3 §4.3–4.5). Bits above MAXPHYADDR and XD-without-NXE are added
// at walk time because they depend on the context.

// Legacy32: CR3 → PD (1024 × 4 B) → PT (1024 × 4 B). A PDE with PS (and CR4.PSE) maps 4 MiB,
// with physical bits 39:32 in PDE bits 20:13 (PSE-36); bit 21 is reserved.
constexpr ModeFormat kLegacy32{4,
                               32,
                               false,
                               0xFFFF'F000,
                               0xFFFF'F000,
                               2,
                               {{"PDE", 2, 22, 10, true, true, 0, bit(21)}, {"PTE", 1, 12, 10, false, true, 0, 0}}};

// PAE: CR3 (32-byte aligned) → PDPT (4 × 8 B) → PD → PT. PDPTEs have no R/W, U/S or XD:
// bits 2:1, 8:5 (PS is bit 7) and 63:52 are reserved. In PD/PT, bits 62:52 are reserved
// (in long mode they are ignored instead).
constexpr ModeFormat kPae{8,
                          32,
                          true,
                          0xFFFF'FFE0,
                          bits(51, 12),
                          3,
                          {{"PDPTE", 3, 30, 2, false, false, bits(63, 52) | bits(8, 5) | bits(2, 1), 0},
                           {"PDE", 2, 21, 9, true, true, bits(62, 52), bits(62, 52) | bits(20, 13)},
                           {"PTE", 1, 12, 9, false, true, 0, bits(62, 52)}}};

// Long4: PML4 → PDPT (PS: 1 GiB) → PD (PS: 2 MiB) → PT. PS is reserved in PML4Es. In a large
// leaf, bit 12 is PAT and the bits between it and the page's alignment are reserved.
constexpr ModeFormat kLong4{8,
                            48,
                            true,
                            bits(51, 12),
                            bits(51, 12),
                            4,
                            {{"PML4E", 4, 39, 9, false, true, kPageSizeBit, 0},
                             {"PDPTE", 3, 30, 9, true, true, 0, bits(29, 13)},
                             {"PDE", 2, 21, 9, true, true, 0, bits(20, 13)},
                             {"PTE", 1, 12, 9, false, true, 0, 0}}};

// Long5 (CR4.LA57): a PML5 on top of Long4; PS is reserved in PML5Es too.
constexpr ModeFormat kLong5{8,
                            57,
                            true,
                            bits(51, 12),
                            bits(51, 12),
                            5,
                            {{"PML5E", 5, 48, 9, false, true, kPageSizeBit, 0},
                             {"PML4E", 4, 39, 9, false, true, kPageSizeBit, 0},
                             {"PDPTE", 3, 30, 9, true, true, 0, bits(29, 13)},
                             {"PDE", 2, 21, 9, true, true, 0, bits(20, 13)},
                             {"PTE", 1, 12, 9, false, true, 0, 0}}};

const ModeFormat* format_of(PagingMode m) {
  switch (m) {
    case PagingMode::Legacy32: return &kLegacy32;
    case PagingMode::Pae: return &kPae;
    case PagingMode::Long4: return &kLong4;
    case PagingMode::Long5: return &kLong5;
    case PagingMode::None: break;
  }
  return nullptr;
}

// Every index fits its frame: a hostile entry can choose which frame, never an offset.
static_assert(kPae.levels[0].index_bits == 2);  // 0xFE0 + 3 * 8 < 4096 for the PDPT
static_assert((std::uint64_t{1} << 10) * 4 == kPageSize && (std::uint64_t{1} << 9) * 8 == kPageSize);

std::string where(const PagingContext& ctx, Gva va) {
  return "translating gva " + detail::hex(va.value) + " (" + std::string(to_string(ctx.mode)) + ", cr3 " +
         detail::hex(ctx.cr3) + ")";
}

std::string at(const LevelFormat& l, std::uint64_t index, std::uint64_t entry) {
  return std::string(l.entry) + " (level " + std::to_string(l.level) + ") index " + detail::hex(index) + " (entry " +
         detail::hex(entry) + ")";
}

}  // namespace

Result<Translation> walk(const PagingContext& ctx, Gva va, MapCache& tables) {
  const std::uint64_t v = va.value;
  const ModeFormat* f = format_of(ctx.mode);
  if (!f) {  // no paging: linear == physical, 32-bit
    if (v >> 32) return fail(Errc::InvalidArgument, "gva " + detail::hex(v) + " is above 4 GiB without paging");
    return Translation{.address = Gpa{v}};
  }

  if (f->va_bits == 32) {
    if (v >> 32)
      return fail(Errc::InvalidArgument,
                  "gva " + detail::hex(v) + " is above 4 GiB in 32-bit mode " + std::string(to_string(ctx.mode)));
  } else {
    const unsigned unused = 64 - f->va_bits;
    const auto sext = static_cast<std::uint64_t>(static_cast<std::int64_t>(v << unused) >> unused);
    if (sext != v)
      return fail(Errc::InvalidArgument, "gva " + detail::hex(v) + " is non-canonical for " +
                                             std::string(to_string(ctx.mode)) + " (" + std::to_string(f->va_bits) +
                                             "-bit: bits 63:" + std::to_string(f->va_bits - 1) + " must be equal)");
  }

  const unsigned maxphys = std::clamp(ctx.max_phys_bits, 32u, 52u);
  const std::uint64_t above_maxphys = (f->entry_bytes == 8 && maxphys < 52) ? bits(51, maxphys) : 0;
  const std::uint64_t xd_reserved = (f->nx && !ctx.nxe) ? kXd : 0;

  if (ctx.cr3 & f->cr3_mask & above_maxphys)
    return fail(Errc::InvalidArgument,
                "cr3 " + detail::hex(ctx.cr3) + " is above MAXPHYADDR (" + std::to_string(maxphys) + " bits)");

  Translation t;
  std::uint64_t table = ctx.cr3 & f->cr3_mask;  // physical address of the current table
  for (unsigned i = 0; i < f->depth; ++i) {
    const LevelFormat& l = f->levels[i];
    const Frame frame = frame_of(Gpa{table});
    const std::uint64_t index = (v >> l.va_shift) & (bit(l.index_bits) - 1);
    const std::uint64_t offset = (table & (kPageSize - 1)) + index * f->entry_bytes;
    if (offset + f->entry_bytes > kPageSize)  // unreachable with the tables above; stays a check
      return fail(Errc::Io,
                  std::string(l.entry) + " offset " + detail::hex(offset) + " outside its frame " + where(ctx, va));

    auto page = tables.page(frame, hv::MapAccess::Read);
    if (!page)
      return fail(page.error().code, "cannot map the table holding " + std::string(l.entry) + " (level " +
                                         std::to_string(l.level) + ", frame " + detail::hex(frame.value) + ") " +
                                         where(ctx, va) + ": " + page.error().what);
    std::uint64_t entry = 0;
    std::memcpy(&entry, page->data() + offset, f->entry_bytes);  // x86 is little-endian

    t.table_frames[i] = frame;
    t.entries[i] = entry;
    t.depth = i + 1;

    if (!(entry & kPresent))
      return fail(Errc::Fault,
                  "gva " + detail::hex(v) + " not mapped: " + at(l, index, entry) + " not present " + where(ctx, va));

    // A PDE's PS is only honoured in Legacy32 with CR4.PSE; in PAE/long mode always.
    const bool leaf = l.level == 1 || (l.large && (entry & kPageSizeBit) && (f->entry_bytes == 8 || ctx.pse));
    std::uint64_t reserved = (leaf ? l.rsvd_leaf : l.rsvd_table) | above_maxphys | xd_reserved;
    const bool pse36 = leaf && f->entry_bytes == 4 && l.level == 2;
    if (pse36 && maxphys < 40) reserved |= bits(20, 13 + (maxphys - 32));
    if (entry & reserved)
      return fail(Errc::Io, "reserved bits " + detail::hex(entry & reserved) + " set in " + at(l, index, entry) + " " +
                                where(ctx, va));

    if (l.access) {
      t.writable = t.writable && (entry & kWrite);
      t.user = t.user && (entry & kUser);
    }
    if (f->nx && ctx.nxe && (entry & kXd)) t.nx = true;

    if (leaf) {
      t.page_size = bit(l.va_shift);
      std::uint64_t base;
      if (pse36) base = (entry & 0xFFC0'0000) | (((entry >> 13) & 0xFF) << 32);
      else base = entry & f->addr_mask & ~(t.page_size - 1);
      t.address = Gpa{base | (v & (t.page_size - 1))};
      return t;
    }
    table = entry & f->addr_mask;
  }
  // The lowest level is always a leaf, so the loop returns before getting here.
  return fail(Errc::Io, "page walk ended without a leaf " + where(ctx, va));
}

}  // namespace xenprobes::mem
