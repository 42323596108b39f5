// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * xenprobesU: the producer side of an async ring. See xp_ring.h and protocol.h.
 */
#include "xp_ring.h"

#define XP_REC_ALIGN 8u

static inline xenprobes_u32 xp_round8(xenprobes_u32 n)
{
	return (n + (XP_REC_ALIGN - 1)) & ~(XP_REC_ALIGN - 1);
}

int xp_ring_init(struct xp_ring *r, void *mem, xenprobes_u32 order, xenprobes_u32 vcpu)
{
	struct xenprobes_ring_header *h = (struct xenprobes_ring_header *)mem;

	if (order < XENPROBES_RING_MIN_ORDER || order > XENPROBES_RING_MAX_ORDER)
		return -XP_EINVAL;
	h->magic = XENPROBES_RING_MAGIC;
	h->version = XENPROBES_PROTOCOL_VERSION;
	h->vcpu = vcpu;
	h->data_order = order;
	r->hdr = h;
	r->data = (xenprobes_u8 *)mem + XENPROBES_RING_DATA_OFFSET;
	r->size = (xenprobes_u64)1 << order;
	r->head = 0;
	r->drops = 0;
	r->nested = 0;
	r->notifies = 0;
	r->seq = 0;
	r->busy = 0;
	return 0;
}

xenprobes_u32 xp_ring_record_max(const struct xenprobes_capture_spec *specs, unsigned nspecs)
{
	xenprobes_u32 len = sizeof(struct xenprobes_rec);
	unsigned i;

	for (i = 0; i < nspecs; i++)
		len += sizeof(struct xenprobes_cap) + xp_round8(specs[i].max);
	return len;
}

int xp_ring_specs_check(const struct xenprobes_capture_spec *specs, unsigned nspecs)
{
	unsigned i;

	if (nspecs > XENPROBES_RING_CAPS_MAX || (nspecs && !specs))
		return -XP_EINVAL;
	for (i = 0; i < nspecs; i++) {
		xenprobes_u8 kind = specs[i].kind & (xenprobes_u8)~(XENPROBES_CAP_USER | XENPROBES_CAP_AUTO);

		if (kind != XENPROBES_CAP_BYTES && kind != XENPROBES_CAP_STRING)
			return -XP_EINVAL;
		if (specs[i].reg > XENPROBES_CAP_REG_MAX)
			return -XP_EINVAL;
		if (specs[i].max == 0 || (xenprobes_u32)specs[i].max > XENPROBES_CAP_MAX_BYTES)
			return -XP_EINVAL;
	}
	/* At most 8 specs of at most 1024 bytes: the sum cannot overflow 32 bits. */
	if (xp_ring_record_max(specs, nspecs) > XENPROBES_RING_REC_MAX)
		return -XP_EINVAL;
	return 0;
}

/* The base register of a capture: struct xenprobes_regs starts with the 16 GPRs and rip. */
static xenprobes_u64 xp_cap_base(const struct xenprobes_regs *regs, xenprobes_u8 reg)
{
	xenprobes_u64 v;

	__builtin_memcpy(&v, (const xenprobes_u8 *)regs + (size_t)reg * sizeof(v), sizeof(v));
	return v;
}

/*
 * A string capture of at most max bytes with its NUL (max - 1 characters), read as a
 * synchronous str() of max - 1 characters reads it: its first max - 1 bytes up to the NUL
 * (read_str never reads a page past the one holding the NUL), then, only when none of them is
 * the NUL, the one byte after them, which says whether the string ends there (Ok) or goes on
 * (Truncated). That byte is the only one read beyond what the synchronous read reads: when it
 * cannot be read the string does not end within max bytes, so Truncated, not Fault, and the
 * max - 1 characters read stay. Returns the bytes with the NUL, or 0 on a fault (*status then
 * left as the caller set it, FAULT).
 */
static xenprobes_u32 xp_ring_string(xenprobes_u8 *dst, xenprobes_u64 addr, xenprobes_u32 max,
				    bool user, const struct xp_read_ops *ops, xenprobes_u8 *status)
{
	xenprobes_u64 last = addr + (max - 1);
	xenprobes_u8 b = 1;
	long n = 0;

	if (max > 1) {
		n = ops->read_str(ops->ctx, dst, addr, max - 1, user);
		if (n > 0 && (xenprobes_u64)n <= (xenprobes_u64)(max - 1) && dst[n - 1] == 0) {
			*status = XENPROBES_CAP_OK;
			return (xenprobes_u32)n;
		}
		if (n != (long)(max - 1))
			return 0;	/* a fault within the characters: *status stays FAULT */
	}
	/* No NUL among the max - 1 characters (none at all when max is 1): their end. */
	if (last >= addr && ops->read(ops->ctx, &b, last, 1, user) == 0) {
		*status = b == 0 ? XENPROBES_CAP_OK : XENPROBES_CAP_TRUNCATED;
	} else {
		if (max == 1)
			return 0;	/* not one byte readable: a fault */
		*status = XENPROBES_CAP_TRUNCATED;
	}
	dst[max - 1] = 0;
	return max;
}

/* One capture item at p (room for its maximum); returns its size in the record. */
static xenprobes_u32 xp_ring_capture(xenprobes_u8 *p, unsigned index,
				     const struct xenprobes_capture_spec *spec,
				     const struct xenprobes_regs *regs, const struct xp_read_ops *ops)
{
	struct xenprobes_cap *cap = (struct xenprobes_cap *)p;
	xenprobes_u8 *dst = p + sizeof(*cap);
	bool user = (spec->kind & XENPROBES_CAP_USER) != 0;
	xenprobes_u8 kind = spec->kind & (xenprobes_u8)~(XENPROBES_CAP_USER | XENPROBES_CAP_AUTO);
	xenprobes_u32 len = 0, padded, i;
	xenprobes_u8 status = XENPROBES_CAP_FAULT;
	xenprobes_u64 addr;

	/* xp_ring_specs_check passed them at registration; a spec that did not reads nothing. */
	if (spec->reg > XENPROBES_CAP_REG_MAX || spec->max == 0 ||
	    (xenprobes_u32)spec->max > XENPROBES_CAP_MAX_BYTES)
		kind = 0;
	addr = kind ? xp_cap_base(regs, spec->reg) + (xenprobes_u64)(xp_s64)(xp_s32)spec->offset : 0;
	/* AUTO: the lower half is user space, the upper half the kernel's (x86-64, LA57 too). */
	if (spec->kind & XENPROBES_CAP_AUTO)
		user = addr < XENPROBES_CAP_USER_TOP;
	if (kind == XENPROBES_CAP_BYTES) {
		if (ops && ops->read && ops->read(ops->ctx, dst, addr, spec->max, user) == 0) {
			len = spec->max;
			status = XENPROBES_CAP_OK;
		}
	} else if (kind == XENPROBES_CAP_STRING && ops && ops->read && ops->read_str) {
		len = xp_ring_string(dst, addr, spec->max, user, ops, &status);
	}
	padded = xp_round8(len);
	for (i = len; i < padded; i++)
		dst[i] = 0;
	cap->len = (xenprobes_u16)len;
	cap->index = (xenprobes_u8)index;
	cap->status = status;
	cap->pad0 = 0;
	return (xenprobes_u32)sizeof(*cap) + padded;
}

enum xp_ring_result xp_ring_write_hit(struct xp_ring *r, xenprobes_u32 probe, xenprobes_u64 time,
				      const struct xenprobes_regs *regs,
				      const struct xenprobes_capture_spec *specs, unsigned nspecs,
				      const struct xp_read_ops *ops)
{
	struct xenprobes_ring_header *h = r->hdr;
	xenprobes_u64 tail, used, off, contiguous, need, head;
	xenprobes_u32 max, len;
	struct xenprobes_rec *rec;
	enum xp_ring_result res = XP_RING_WRITTEN;
	unsigned i;

	if (r->busy) {
		r->nested++;
		__atomic_store_n(&h->nested, r->nested, __ATOMIC_RELAXED);
		return XP_RING_NESTED;
	}
	r->busy = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);

	max = xp_ring_record_max(specs, nspecs);
	tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
	used = r->head - tail;
	off = r->head & (r->size - 1);
	contiguous = r->size - off;
	need = contiguous < max ? contiguous + max : max;
	/* A tail Dom0 moved past head or too far back: no room rather than overwriting. */
	if (used > r->size || need > r->size - used) {
		r->drops++;
		__atomic_store_n(&h->drops, r->drops, __ATOMIC_RELAXED);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		r->busy = 0;
		return XP_RING_DROPPED;
	}
	head = r->head;
	if (contiguous < max) {
		/* The pad: len, type and ncap, its first 8 bytes (there are at least 8 left). */
		xenprobes_u8 *pad = r->data + off;
		xenprobes_u32 pad_len = (xenprobes_u32)contiguous;
		xenprobes_u16 pad_type = XENPROBES_REC_PAD, pad_ncap = 0;

		__builtin_memcpy(pad, &pad_len, 4);
		__builtin_memcpy(pad + 4, &pad_type, 2);
		__builtin_memcpy(pad + 6, &pad_ncap, 2);
		head += contiguous;
		off = 0;
	}
	rec = (struct xenprobes_rec *)(r->data + off);
	len = sizeof(*rec);
	for (i = 0; i < nspecs; i++)
		len += xp_ring_capture(r->data + off + len, i, &specs[i], regs, ops);
	rec->regs = *regs;
	rec->len = len;
	rec->type = XENPROBES_REC_HIT;
	rec->ncap = (xenprobes_u16)nspecs;
	rec->probe = probe;
	rec->seq = r->seq++;
	rec->time = time;
	head += len;
	r->head = head;
	__atomic_store_n(&h->head, head, __ATOMIC_RELEASE);

	/* Dom0 arms wakeup, then reads head: order this store of head before the load of wakeup. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->wakeup, __ATOMIC_RELAXED) &&
	    head - __atomic_load_n(&h->tail, __ATOMIC_RELAXED) >=
		    __atomic_load_n(&h->watermark, __ATOMIC_RELAXED) &&
	    __atomic_exchange_n(&h->wakeup, 0, __ATOMIC_ACQ_REL)) {
		r->notifies++;
		__atomic_store_n(&h->notifies, r->notifies, __ATOMIC_RELAXED);
		res = XP_RING_NOTIFY;
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	r->busy = 0;
	return res;
}

long xp_read_str_pieces(const struct xp_read_ops *ops, void *dst, xenprobes_u64 addr,
			xenprobes_u32 max, bool user)
{
	xenprobes_u8 *out = (xenprobes_u8 *)dst;
	xenprobes_u32 done = 0, n, i;
	xenprobes_u64 at, page_left;

	if (!ops || !ops->read)
		return -XP_EFAULT;
	while (done < max) {
		at = addr + done;
		if (done && at < addr)
			return -XP_EFAULT;	/* past the top of the address space */
		page_left = XP_PAGE_SIZE - (at & (XP_PAGE_SIZE - 1));
		n = max - done;
		if (n > XP_STR_PIECE)
			n = XP_STR_PIECE;
		if (n > page_left)
			n = (xenprobes_u32)page_left;
		if (ops->read(ops->ctx, out + done, at, n, user) != 0)
			return -XP_EFAULT;
		for (i = 0; i < n; i++)
			if (out[done + i] == 0)
				return (long)(done + i + 1);
		done += n;
	}
	return (long)max;
}

int xp_rings_size(xenprobes_u32 count, xenprobes_u32 order, xenprobes_u64 *stride,
		  xenprobes_u64 *total)
{
	xenprobes_u64 one;

	if (count == 0 || order < XENPROBES_RING_MIN_ORDER || order > XENPROBES_RING_MAX_ORDER)
		return -XP_EINVAL;
	/* At most 2^32 rings of 2^24 + 4096 bytes: below 2^57, no overflow. */
	one = XENPROBES_RING_DATA_OFFSET + ((xenprobes_u64)1 << order);
	*stride = one;
	*total = one * count;
	return 0;
}

void xp_specs_snapshot(struct xenprobes_capture_spec *dst,
		       const struct xenprobes_capture_spec *src, unsigned n)
{
	const volatile struct xenprobes_capture_spec *s = src;
	unsigned i;

	for (i = 0; i < n; i++) {
		dst[i].kind = s[i].kind;
		dst[i].reg = s[i].reg;
		dst[i].max = s[i].max;
		dst[i].offset = s[i].offset;
	}
}

enum xp_async_result xp_async_hit(const struct xp_bounds *b, const struct xenprobes_trap *e,
				  struct xp_ring *rings, xenprobes_u32 nrings, xenprobes_u32 vcpu,
				  xenprobes_u64 time, const struct xenprobes_regs *regs,
				  const struct xp_read_ops *ops)
{
	struct xenprobes_capture_spec specs[XENPROBES_RING_CAPS_MAX];
	struct xp_async_key k;

	if (!rings || vcpu >= nrings)
		return XP_ASYNC_BAD;
	if (xp_jump_async_key(b, e, &k) != 0)
		return XP_ASYNC_BAD;
	/* The key checked that ncaps specs lie inside the OEA, 8-byte aligned (none: nothing read). */
	xp_specs_snapshot(specs, (const struct xenprobes_capture_spec *)(unsigned long)k.specs,
			  k.ncaps);
	if (xp_ring_specs_check(specs, k.ncaps) != 0)
		return XP_ASYNC_BAD;
	switch (xp_ring_write_hit(&rings[vcpu], k.probe, time, regs, specs, k.ncaps, ops)) {
	case XP_RING_WRITTEN:
		return XP_ASYNC_WRITTEN;
	case XP_RING_NOTIFY:
		return XP_ASYNC_NOTIFY;
	case XP_RING_DROPPED:
		return XP_ASYNC_DROPPED;
	case XP_RING_NESTED:
		return XP_ASYNC_NESTED;
	}
	return XP_ASYNC_BAD;
}
