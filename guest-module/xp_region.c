// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * xenprobesU: a jump probe's region and a short jump's island (see xp_region.h). Compiled into
 * the module and into the userspace unit tests; keep it free of kernel and libc calls.
 */
#include "xp_logic.h"

static bool xp_exec(const struct xp_bounds *b, xenprobes_u64 addr)
{
	return !b->is_exec || b->is_exec(b->ctx, addr);
}

bool xp_island_pairs(const struct xenprobes_trap *e, const struct xenprobes_trap *isl)
{
	return isl && isl->flags == XENPROBES_TRAP_ISLAND && isl->len == XP_ISLAND_LEN &&
	       isl->fallback == e->fallback;
}

bool xp_short_jump_target(xenprobes_u64 addr, const xenprobes_u8 *cur, xenprobes_u32 n,
			  xenprobes_u64 *target)
{
	if (n < XP_JMP_REL8_LEN || cur[0] != XP_JMP_REL8)
		return false;
	*target = addr + XP_JMP_REL8_LEN + (xenprobes_u64)(xp_s64)(signed char)cur[1];
	return true;
}

bool xp_region_bytes_ours(const struct xenprobes_trap *e, const xenprobes_u8 *cur,
			  xenprobes_u32 n)
{
	return xp_region_bytes_ours_island(e, cur, n, NULL);
}

bool xp_region_bytes_ours_island(const struct xenprobes_trap *e, const xenprobes_u8 *cur,
				 xenprobes_u32 n, const struct xenprobes_trap *isl)
{
	bool island = xp_island_pairs(e, isl);
	xenprobes_u64 rel, to;

	if (e->len < (island ? XP_JUMP_SHORT_MIN : XP_JUMP_REGION_MIN) ||
	    e->len > sizeof(e->insn) || n < e->len)
		return false;
	if (cur[0] == XP_INT3)
		return true;	/* the jump being put in place (or taken down) */
	if (island && xp_short_jump_target(e->addr, cur, n, &to))
		return to == isl->addr;
	if (cur[0] != XP_JMP_REL32 || e->len < XP_JMP_REL32_LEN)
		return false;
	/* e9 <rel32>: the jump to this entry's detour, rel32 counted from addr + 5. */
	rel = (xenprobes_u64)xp_rel32_at(&cur[1]);
	return e->addr + XP_JMP_REL32_LEN + rel == e->fallback;
}

bool xp_region_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *e,
			  const xenprobes_u8 *cur, xenprobes_u32 n)
{
	return xp_region_restore_ok_island(b, e, cur, n, NULL);
}

/* [addr, addr + len) lies in kernel or module text outside the OEA, all of it of one kind. */
static bool xp_text_span(const struct xp_bounds *b, xenprobes_u64 addr, xenprobes_u32 len)
{
	enum xp_addr_kind k = xp_addr_classify(b, addr);
	xenprobes_u64 last = addr + len - 1;

	if (!len || last < addr)
		return false;	/* wraps */
	if (k != XP_ADDR_KTEXT && k != XP_ADDR_MODULE)
		return false;
	return xp_addr_classify(b, last) == k;
}

bool xp_region_restore_ok_island(const struct xp_bounds *b, const struct xenprobes_trap *e,
				 const xenprobes_u8 *cur, xenprobes_u32 n,
				 const struct xenprobes_trap *isl)
{
	enum xp_addr_kind k = xp_addr_classify(b, e->addr);
	xenprobes_u64 last;

	if (e->flags != XENPROBES_TRAP_REDIRECT)
		return false;
	if (e->len < (xp_island_pairs(e, isl) ? XP_JUMP_SHORT_MIN : XP_JUMP_REGION_MIN) ||
	    e->len > sizeof(e->insn))
		return false;
	last = e->addr + e->len - 1;
	if (last < e->addr)
		return false;	/* wraps */
	/* Kernel or module text outside the OEA, the whole region of one kind. */
	if (k != XP_ADDR_KTEXT && k != XP_ADDR_MODULE)
		return false;
	if (xp_addr_classify(b, last) != k)
		return false;
	/* Putting an int3 back as the original first byte would be pointless (and wrong). */
	if (e->insn[0] == XP_INT3)
		return false;
	if (!xp_region_bytes_ours_island(e, cur, n, isl))
		return false;
	/* Both pages when the region crosses a page boundary. */
	return xp_exec(b, e->addr) && xp_exec(b, last);
}

bool xp_island_bytes_ours(const struct xenprobes_trap *isl, const xenprobes_u8 *cur,
			  xenprobes_u32 n)
{
	xenprobes_u64 rel;

	if (n < XP_ISLAND_LEN || cur[0] != XP_JMP_REL32)
		return false;
	rel = (xenprobes_u64)xp_rel32_at(&cur[1]);
	return isl->addr + XP_JMP_REL32_LEN + rel == isl->fallback;
}

bool xp_island_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *isl,
			  const xenprobes_u8 *cur, xenprobes_u32 n)
{
	if (isl->flags != XENPROBES_TRAP_ISLAND || isl->len != XP_ISLAND_LEN)
		return false;
	if (!xp_text_span(b, isl->addr, XP_ISLAND_LEN))
		return false;
	if (!xp_island_bytes_ours(isl, cur, n))
		return false;
	return xp_exec(b, isl->addr) && xp_exec(b, isl->addr + XP_ISLAND_LEN - 1);
}
