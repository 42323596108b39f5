// Paging modes and what a page-table walk produces.
//
// The mode is a pure function of CR0/CR4/EFER (LibVMI style); the walker (walker.hpp) then
// picks the mask table for that mode. Nothing here talks to a hypervisor.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "common/result.hpp"
#include "common/types.hpp"

namespace xenprobes::hv {
struct DomainInfo;
struct VcpuRegs;
}  // namespace xenprobes::hv

namespace xenprobes::mem {

enum class PagingMode {
  None,      // CR0.PG = 0: linear == physical
  Legacy32,  // 2 levels, 4-byte entries, 4 MiB pages with CR4.PSE (PSE-36)
  Pae,       // 3 levels, 8-byte entries, 2 MiB pages
  Long4,     // 4 levels, 48-bit addresses, 2 MiB and 1 GiB pages
  Long5,     // 5 levels (CR4.LA57), 57-bit addresses
};

std::string_view to_string(PagingMode);

inline constexpr std::uint64_t kCr0Pg = 1ull << 31;
inline constexpr std::uint64_t kCr4Pse = 1ull << 4;
inline constexpr std::uint64_t kCr4Pae = 1ull << 5;
inline constexpr std::uint64_t kCr4La57 = 1ull << 12;
inline constexpr std::uint64_t kEferLme = 1ull << 8;
inline constexpr std::uint64_t kEferLma = 1ull << 10;
inline constexpr std::uint64_t kEferNxe = 1ull << 11;

inline constexpr unsigned kMaxLevels = 5;

// The hardware rule (SDM Vol. 3 §4.1.1), used for HVM/PVH guests.
// Long mode is EFER.LMA; EFER.LME is accepted as well when CR4.PAE is set because with
// CR0.PG=1 the CPU sets LMA from LME, and some register sources report only the MSR value
// the guest wrote (LME) rather than the live LMA bit.
constexpr PagingMode paging_mode(std::uint64_t cr0, std::uint64_t cr4, std::uint64_t efer) {
  if (!(cr0 & kCr0Pg)) return PagingMode::None;
  const bool long_mode = (efer & kEferLma) || ((efer & kEferLme) && (cr4 & kCr4Pae));
  if (long_mode) return (cr4 & kCr4La57) ? PagingMode::Long5 : PagingMode::Long4;
  if (cr4 & kCr4Pae) return PagingMode::Pae;
  return PagingMode::Legacy32;
}

// The rule for 64-bit PV guests. A 64-bit PV guest always runs in long mode with paging on,
// whatever its virtualised CR0/EFER say (Xen reports the guest's view there, which for PV is
// not what the hardware runs with), so CR0 and EFER are ignored; only CR4.LA57 is honoured.
// 32-bit PV is not handled (Xen 4.17 builds without CONFIG_PV32; see paging_context()).
constexpr PagingMode pv_paging_mode(std::uint64_t cr4) {
  return (cr4 & kCr4La57) ? PagingMode::Long5 : PagingMode::Long4;
}

// Everything a walk needs besides the address. Filled by the caller from a vCPU's registers
// (paging_context() below does it) because this layer never reads registers itself.
struct PagingContext {
  PagingMode mode = PagingMode::None;
  // Physical address of the top-level table, exactly as the vCPU's CR3 holds it (PCID and
  // other low bits are masked by the walker). HVM: a guest-physical address, cr3 >> 12 is a
  // GFN. PV: a machine address (xen_cr3_to_pfn already applied), cr3 >> 12 is an MFN.
  std::uint64_t cr3 = 0;
  unsigned max_phys_bits = 52;  // MAXPHYADDR; clamped to [32, 52]. Bits above it are reserved.
  bool pse = true;              // CR4.PSE: Legacy32 only; false makes PDE.PS ignored
  bool nxe = true;              // EFER.NXE: false makes bit 63 (XD) reserved in PAE/long mode
};

// Derives the context from a domain and one of its vCPUs: PV → pv_paging_mode(cr4);
// HVM/PVH → paging_mode(cr0, cr4, efer). 32-bit PV fails with NotSupported.
[[nodiscard]] Result<PagingContext> paging_context(const hv::DomainInfo&, const hv::VcpuRegs&);

// The result of one walk.
//
// Frame numbers here are whatever the guest's entries hold: MFNs for PV guests, GFNs for HVM
// guests. The walker never converts between them; the FrameSource it reads through maps the
// same kind of number (Xen's foreign map takes MFNs for PV domains and GFNs for HVM ones).
struct Translation {
  Gpa address;                                      // physical address of the byte: GPA (HVM) / machine address (PV)
  std::uint64_t page_size = kPageSize;              // 4 KiB, 2 MiB, 4 MiB or 1 GiB
  bool writable = true;                             // R/W set at every level (not enforced by GuestMemory: see there)
  bool user = true;                                 // U/S set at every level
  bool nx = false;                                  // XD set at any level (only with nxe)
  unsigned depth = 0;                               // tables read by the walk (0 without paging)
  std::array<Frame, kMaxLevels> table_frames{};     // [0] = top table (cr3 >> 12), then down
  std::array<std::uint64_t, kMaxLevels> entries{};  // the entry read in each of those tables

  Frame frame() const { return frame_of(address); }  // the 4 KiB frame holding the byte
};

}  // namespace xenprobes::mem
