/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobesU: the return slot the module writes for Dom0 (protocol.h, "Return slots written by
 * the module"), a pure decision like those of xp_logic.h (implemented in xp_fallback.c beside
 * the return table; unit-tested in tests/module/ret_write_logic_test.cpp, run by the simulated
 * module too).
 */
#ifndef XENPROBES_XP_RET_WRITE_H
#define XENPROBES_XP_RET_WRITE_H

#include "xp_logic.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * What Dom0's answer asks for (a private snapshot of mailbox.ret_slot, ret_expect, ret_value).
 */
struct xp_ret_request {
	xenprobes_u64 slot;	/* 0: no write */
	xenprobes_u64 expect;
	xenprobes_u64 value;
};

enum xp_ret_result {
	XP_RET_NONE = 0,	/* the answer asks for no write */
	XP_RET_WRITTEN,		/* value written at slot */
	XP_RET_BAD_SLOT,	/* slot is not the hit's stack pointer, or not 8-byte aligned */
	XP_RET_BAD_VALUE,	/* value is no RETURN entry of the trap table, or equals expect */
	XP_RET_MISMATCH,	/* the slot does not hold expect */
	XP_RET_FAULT,		/* the slot could not be read or written */
	XP_RET_UNDONE,		/* written, but the trampoline's entry was gone right after: put back */
};

/*
 * Makes the write q asks for when every rule holds: q->slot is hit_rsp (the stack pointer of
 * the hit being answered: its return address), 8-byte aligned; q->value is the address of a
 * XENPROBES_TRAP_RETURN entry among the live entries of the trap table (*nr_traps of them,
 * Dom0's header word, read each time; binary search, then the scan: the hook's own lookups);
 * q->expect differs from it; and the slot, read through m, holds q->expect. Then one write
 * through m, after which the entry is looked up again: gone (Dom0 paused the guest in between,
 * put its return slots back and removed the trampoline), the slot gets q->expect back unless
 * it no longer holds q->value (XP_RET_UNDONE). Anything else writes nothing (an unreadable slot
 * is not written either). Only XP_RET_NONE and XP_RET_WRITTEN are not refusals.
 */
enum xp_ret_result xp_ret_write(const struct xp_ret_request *q, xenprobes_u64 hit_rsp,
			       const struct xenprobes_trap *table, const xenprobes_u32 *nr_traps,
			       xenprobes_u32 capacity, const struct xp_mem_ops *m);

#ifdef __cplusplus
}
#endif

#endif /* XENPROBES_XP_RET_WRITE_H */
