// The page-table walker: one loop, driven by one mask table per paging mode.
#pragma once

#include "common/result.hpp"
#include "common/types.hpp"
#include "mem/map_cache.hpp"
#include "mem/paging.hpp"

namespace xenprobes::mem {

// Translates a guest-virtual address by reading the guest's own page tables, starting from
// ctx.cr3 >> 12 and mapping each frame number found in the entries through `tables`
// (read-only). PV and HVM guests run the same code: the entries hold MFNs or GFNs and the
// FrameSource behind `tables` maps that same kind of number.
//
// Page tables are hostile input: the walk reads at most one entry per level (so it cannot
// loop, whatever the entries point at), never reads outside a mapped frame, and rejects
// reserved bits. Errors:
//   InvalidArgument  address not canonical (48/57-bit) or above 4 GiB for 32-bit modes;
//                    cr3 above MAXPHYADDR
//   Fault            an entry is not present ("... PDE (level 2) index 0x1 not present ...")
//   Io               "reserved bits 0x... set in <entry> (level N) index ..." (malformed table)
//   (any)            mapping a table frame failed: the FrameSource's code, with context
[[nodiscard]] Result<Translation> walk(const PagingContext& ctx, Gva va, MapCache& tables);

}  // namespace xenprobes::mem
