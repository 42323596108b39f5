/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobesU: the pure rules for a jump probe's region and a short jump's island (protocol.h,
 * "Jump probes" and "Short jumps to islands"): whose bytes they hold, and when the module's own
 * restore (Dom0 gone, unload) writes them back. Included by xp_logic.h; implemented in
 * xp_region.c. Everything in a struct xenprobes_trap here is a private snapshot of an entry
 * Dom0 wrote (hostile).
 */
#ifndef XENPROBES_XP_REGION_H
#define XENPROBES_XP_REGION_H

#include "xp_logic.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Jump regions (protocol.h, "Jump probes"). A REDIRECT entry describes the region [addr,
 * addr + len), 5 <= len <= 15, whose original bytes are insn[0..len); fallback is its detour.
 */
#define XP_JUMP_REGION_MIN 5u
#define XP_JMP_REL32 0xe9u
#define XP_JMP_REL32_LEN 5u

/*
 * Do the current bytes at a REDIRECT entry's region (cur[0..n), n >= e->len) hold what Dom0
 * put there: the int3 (first byte; the rest either the original or the new rel32), or
 * `e9 <rel32>` jumping to e->fallback. Anything else (the original bytes, someone else's
 * patch) is not ours to touch.
 */
bool xp_region_bytes_ours(const struct xenprobes_trap *e, const xenprobes_u8 *cur,
			  xenprobes_u32 n);

/*
 * May the module write a REDIRECT entry's insn[0..len) back over its whole region (once Dom0
 * is gone, or at detach; e: a private snapshot, cur[0..n): the bytes there now): flags exactly
 * REDIRECT, len 5..15, the region in kernel text or module text outside the OEA (all of it of
 * one kind), insn[0] not an int3, xp_region_bytes_ours(), and the pages of its first and last
 * byte executable. Else the region is left as it is: never half a region.
 */
bool xp_region_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *e,
			  const xenprobes_u8 *cur, xenprobes_u32 n);

/*
 * Short jumps to islands (protocol.h, "Short jumps to islands"; XENPROBES_FEATURE_JUMP_ISLAND).
 * A short region (REDIRECT, len 2..15) starts with `eb rel8` to an island: an ISLAND entry
 * (addr the island, len 5, insn the padding's original bytes) of the same fallback (the
 * detour), whose 5 bytes hold `e9 <rel32 -> fallback>`.
 */
#define XP_JUMP_SHORT_MIN 2u
#define XP_JMP_REL8 0xebu
#define XP_JMP_REL8_LEN 2u
#define XP_ISLAND_LEN 5u

/* Is isl (a private snapshot, or NULL) the island of the REDIRECT entry e: ISLAND, len 5, e's fallback. */
bool xp_island_pairs(const struct xenprobes_trap *e, const struct xenprobes_trap *isl);

/* cur[0..n) at addr is `eb rel8`: *target is where it goes. */
bool xp_short_jump_target(xenprobes_u64 addr, const xenprobes_u8 *cur, xenprobes_u32 n,
			  xenprobes_u64 *target);

/*
 * xp_region_bytes_ours() knowing the region's island (isl: a private snapshot of the live
 * ISLAND entry xp_island_pairs() accepts, or NULL): with it the region may be 2..15 bytes and
 * `eb rel8` to isl->addr is Dom0's too; e9 counts only for a region of 5 bytes or more.
 * NULL (or an island that does not pair): exactly xp_region_bytes_ours().
 */
bool xp_region_bytes_ours_island(const struct xenprobes_trap *e, const xenprobes_u8 *cur,
				 xenprobes_u32 n, const struct xenprobes_trap *isl);

/* xp_region_restore_ok() with the region's island as above. */
bool xp_region_restore_ok_island(const struct xp_bounds *b, const struct xenprobes_trap *e,
				 const xenprobes_u8 *cur, xenprobes_u32 n,
				 const struct xenprobes_trap *isl);

/* The island's bytes now (cur[0..n), n >= 5) are Dom0's: `e9 <rel32 -> isl->fallback>`. */
bool xp_island_bytes_ours(const struct xenprobes_trap *isl, const xenprobes_u8 *cur,
			  xenprobes_u32 n);

/*
 * May the module write an ISLAND entry's insn[0..5) back (after the restore of the regions
 * and a quiescence; isl: a private snapshot, cur: its bytes now): flags exactly ISLAND, len 5,
 * the 5 bytes in kernel or module text outside the OEA (all of one kind), the bytes Dom0's
 * (xp_island_bytes_ours), and the pages of the first and last byte executable. The caller
 * also checks that no live region still jumps there.
 */
bool xp_island_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *isl,
			  const xenprobes_u8 *cur, xenprobes_u32 n);

#ifdef __cplusplus
}
#endif

#endif /* XENPROBES_XP_REGION_H */
