/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobesU: the producer side of an async ring (include/xenprobes/protocol.h, "Async
 * rings"): a vCPU's hit written as one record for Dom0 to read later, with no trap and no
 * hypercall (one notification when Dom0 asked for one).
 *
 * Pure, like xp_logic.c: it compiles in the kernel module and in userspace, where the unit
 * tests drive it against Dom0's reader (libxenprobes/guestmod/ring.cpp). Memory is read
 * through struct xp_read_ops (the kernel's no-fault helpers in the module). It never sleeps,
 * allocates or locks. One ring has one producer: the caller keeps preemption off while it
 * writes (the ring is per vCPU); a hit that interrupts a record being written on the same vCPU
 * (a probed interrupt or NMI handler) finds the ring busy and is counted, not written.
 *
 * The ring's shared memory is writable by Dom0 (tail, wakeup, watermark: its fields); the
 * producer keeps its own copies of everything it relies on (the size, head, seq, counters),
 * so whatever Dom0 writes it only ever writes inside the data area.
 */
#ifndef XENPROBES_XP_RING_H
#define XENPROBES_XP_RING_H

#include <xenprobes/protocol.h>

#include "xp_logic.h"

#ifdef __KERNEL__
#include <linux/stddef.h>
#else
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct xp_ring {
	struct xenprobes_ring_header *hdr; /* shared with Dom0 */
	xenprobes_u8 *data;                /* the data area, `size` bytes */
	xenprobes_u64 size;                /* 2^order, fixed at init */
	xenprobes_u64 head;                /* bytes written: the shared head is written from it */
	xenprobes_u64 drops, nested, notifies;
	xenprobes_u32 seq;                 /* the next record's number */
	volatile xenprobes_u32 busy;       /* a record is being written on this vCPU */
};

/*
 * Reads for captures. read: `len` bytes at `addr` into dst, 0 or nonzero when any byte could
 * not be read. read_str: a NUL-terminated string at `addr` into dst (at most `max` bytes, the
 * NUL included); the bytes copied with the NUL, `max` when the string was longer (dst then
 * holds max bytes, not terminated), or a negative value on a fault. `user` tells a user
 * address from a kernel one.
 */
struct xp_read_ops {
	int (*read)(void *ctx, void *dst, xenprobes_u64 addr, xenprobes_u32 len, bool user);
	long (*read_str)(void *ctx, void *dst, xenprobes_u64 addr, xenprobes_u32 max, bool user);
	void *ctx;
};

/*
 * Makes a ring in `mem` (XENPROBES_RING_DATA_OFFSET + 2^order bytes, zeroed by the caller):
 * fills the header and *r. 0, or -XP_EINVAL for an order outside
 * [XENPROBES_RING_MIN_ORDER, XENPROBES_RING_MAX_ORDER].
 */
int xp_ring_init(struct xp_ring *r, void *mem, xenprobes_u32 order, xenprobes_u32 vcpu);

/*
 * Checks a probe's capture specs once, at registration: 0, or -XP_EINVAL (more than
 * XENPROBES_RING_CAPS_MAX, an unknown kind, a register past XENPROBES_CAP_REG_MAX, a max of 0
 * or above XENPROBES_CAP_MAX_BYTES, a record that could outgrow XENPROBES_RING_REC_MAX).
 */
int xp_ring_specs_check(const struct xenprobes_capture_spec *specs, unsigned nspecs);

/* The largest record a probe with these (checked) specs writes. */
xenprobes_u32 xp_ring_record_max(const struct xenprobes_capture_spec *specs, unsigned nspecs);

enum xp_ring_result {
	XP_RING_WRITTEN = 0,	/* the record is published */
	XP_RING_NOTIFY,		/* published, and Dom0 asked to be notified: send it the event */
	XP_RING_DROPPED,	/* no room: counted in drops */
	XP_RING_NESTED,		/* the ring was busy on this vCPU: counted in nested */
};

/*
 * Writes one hit: the registers, then one capture item per spec (checked with
 * xp_ring_specs_check), then publishes it. `time` is the guest's clock in ns. A string spec of
 * max bytes reads ops->read_str of max - 1 bytes and, only when those hold no NUL, the one byte
 * after them with ops->read (protocol.h, "Captures").
 */
enum xp_ring_result xp_ring_write_hit(struct xp_ring *r, xenprobes_u32 probe, xenprobes_u64 time,
				      const struct xenprobes_regs *regs,
				      const struct xenprobes_capture_spec *specs, unsigned nspecs,
				      const struct xp_read_ops *ops);

/*
 * A read_str built on ops->read alone (the kernel exports no-fault copies of bytes to modules,
 * not of strings): the string at `addr` in pieces of at most XP_STR_PIECE bytes that never cross
 * a page boundary, stopping at the piece holding the NUL, so only pages holding bytes of the
 * string (up to `max`) are read. Returns as read_str does: the bytes with the NUL, `max` when
 * there is none in the first max bytes, -XP_EFAULT when a piece could not be read or the string
 * would run past the top of the address space. dst may receive bytes past the NUL, never past
 * dst + max.
 */
#define XP_STR_PIECE 64u
long xp_read_str_pieces(const struct xp_read_ops *ops, void *dst, xenprobes_u64 addr,
			xenprobes_u32 max, bool user);

/* ---- the rings of all vCPUs (protocol.h, "Async jump probes") ---- */

/*
 * The one allocation holding `count` rings of 2^order data bytes each, back to back: 0 with
 * *stride (the bytes of one ring, XENPROBES_RING_DATA_OFFSET + 2^order: ring v starts at
 * v * stride) and *total, or -XP_EINVAL for no ring or an order outside
 * [XENPROBES_RING_MIN_ORDER, XENPROBES_RING_MAX_ORDER] (the module's ring_order 0, "no rings",
 * is its own decision and never gets here).
 */
int xp_rings_size(xenprobes_u32 count, xenprobes_u32 order, xenprobes_u64 *stride,
		  xenprobes_u64 *total);

/* Copies n capture specs field by field with single loads (Dom0 may be writing them). */
void xp_specs_snapshot(struct xenprobes_capture_spec *dst,
		       const struct xenprobes_capture_spec *src, unsigned n);

enum xp_async_result {
	XP_ASYNC_BAD = 0,	/* key, specs or vCPU broke a rule, or no rings: ++async_bad, no record */
	XP_ASYNC_WRITTEN,	/* the record is in the vCPU's ring */
	XP_ASYNC_NOTIFY,	/* written, and Dom0 asked for the event: send it */
	XP_ASYNC_DROPPED,	/* no room: counted in the ring's drops */
	XP_ASYNC_NESTED,	/* the ring was busy on this vCPU: counted in the ring's nested */
};

/*
 * One async jump hit (e: the private snapshot of the entry xp_jump_lookup called
 * XP_JUMP_ASYNC): the key (xp_jump_async_key), the specs copied out of the OEA
 * (xp_specs_snapshot, at the address the key gives, which lies inside b->oea) and checked
 * (xp_ring_specs_check), then the record into rings[vcpu] (regs: the hit's, rip the probed
 * address; time: the guest's clock in ns). rings may be NULL with nrings 0 (no rings made): every
 * hit is then XP_ASYNC_BAD, as is one on a vCPU without a ring (vcpu >= nrings). The caller
 * keeps interrupts off on this vCPU throughout.
 */
enum xp_async_result xp_async_hit(const struct xp_bounds *b, const struct xenprobes_trap *e,
				  struct xp_ring *rings, xenprobes_u32 nrings, xenprobes_u32 vcpu,
				  xenprobes_u64 time, const struct xenprobes_regs *regs,
				  const struct xp_read_ops *ops);

#ifdef __cplusplus
}
#endif

#endif /* XENPROBES_XP_RING_H */
