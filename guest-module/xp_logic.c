// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * xenprobesU: the pure decisions of the guest module (see xp_logic.h); the fallback of a trap
 * entry (branch emulation, the return table) is in xp_fallback.c. Compiled into the module and
 * into the userspace unit tests; keep it free of kernel and libc calls.
 */
#include "xp_logic.h"
#include "xp_gone.h"

xp_s64 xp_rel32_at(const xenprobes_u8 *p)
{
	xenprobes_u32 v = (xenprobes_u32)p[0] | (xenprobes_u32)p[1] << 8 |
			  (xenprobes_u32)p[2] << 16 | (xenprobes_u32)p[3] << 24;

	return v < 0x80000000u ? (xp_s64)v : (xp_s64)v - 0x100000000ll;
}

/* ---- the control area ---- */

static xenprobes_u64 xp_align_up(xenprobes_u64 v, xenprobes_u64 a)
{
	return (v + a - 1) / a * a;
}

int xp_layout_compute(xenprobes_u32 nr_mailboxes, xenprobes_u32 trap_capacity,
		      xenprobes_u32 ret_capacity, struct xp_layout *out)
{
	xenprobes_u64 off, mb, trap, ret, pages;

	if (nr_mailboxes == 0 || trap_capacity == 0)
		return -XP_EINVAL;

	/* u32 counts times structs of a few hundred bytes: no u64 overflow possible. */
	off = xp_align_up(sizeof(struct xenprobes_ctl_header), XP_CTL_ALIGN);
	mb = off;
	off = xp_align_up(off + (xenprobes_u64)nr_mailboxes * sizeof(struct xenprobes_mailbox),
			  XP_CTL_ALIGN);
	trap = off;
	off = xp_align_up(off + (xenprobes_u64)trap_capacity * sizeof(struct xenprobes_trap),
			  XP_CTL_ALIGN);
	ret = off;
	off += (xenprobes_u64)ret_capacity * sizeof(struct xenprobes_ret);
	pages = xp_align_up(off, XP_PAGE_SIZE) / XP_PAGE_SIZE;
	if (pages > XENPROBES_CTL_MAX_PAGES)
		return -XP_E2BIG;

	out->mailbox_offset = (xenprobes_u32)mb;
	out->trap_offset = (xenprobes_u32)trap;
	out->ret_offset = (xenprobes_u32)ret;
	out->bytes = (xenprobes_u32)off;
	out->pages = (xenprobes_u32)pages;
	return 0;
}

void xp_header_init(struct xenprobes_ctl_header *h, xenprobes_u32 nr_mailboxes,
		    const struct xp_layout *l, xenprobes_u32 trap_capacity,
		    xenprobes_u32 ret_capacity, xenprobes_u32 timeout_ms)
{
	h->magic = XENPROBES_CTL_MAGIC;
	h->version = XENPROBES_PROTOCOL_VERSION;
	h->nr_mailboxes = nr_mailboxes;
	h->mailbox_offset = l->mailbox_offset;
	h->trap_capacity = trap_capacity;
	h->trap_offset = l->trap_offset;
	h->ret_capacity = ret_capacity;
	h->ret_offset = l->ret_offset;
	h->nr_traps = 0;
	h->timeout_ms = timeout_ms;
	h->dom0_gone = 0;
	h->dom0_polling = 0;
	h->hits = 0;
	h->timeouts = 0;
	h->foreign = 0;
	h->nested = 0;
	h->async_bad = 0;
	h->notify_skipped = 0;
	h->wait_ns = 0;
	h->wait_max_ns = 0;
	h->over_budget = 0;
	h->closing = 0;
	h->dom0_hold = 0;
	h->ret_refused = 0;
}

/* ---- the trap table ---- */

void xp_trap_snapshot(struct xenprobes_trap *dst, const struct xenprobes_trap *src)
{
	unsigned int i;

	dst->addr = xp_ld64(&src->addr);
	dst->fallback = xp_ld64(&src->fallback);
	dst->flags = xp_ld32(&src->flags);
	dst->len = xp_ld8(&src->len);
	for (i = 0; i < sizeof(dst->insn); i++)
		dst->insn[i] = xp_ld8(&src->insn[i]);
	dst->module = xp_ld32(&src->module);
}

bool xp_trap_search(const struct xenprobes_trap *table, xenprobes_u32 nr_traps,
		    xenprobes_u32 capacity, xenprobes_u64 addr, struct xenprobes_trap *out)
{
	xenprobes_u32 lo = 0, hi = xp_live_traps(nr_traps, capacity);

	/* [lo, hi) shrinks on every step whatever the entries hold. */
	while (lo < hi) {
		xenprobes_u32 mid = lo + (hi - lo) / 2;
		xenprobes_u64 a = xp_ld64(&table[mid].addr);

		if (a == addr) {
			xp_trap_snapshot(out, &table[mid]);
			/* Dom0 rewrote the entry between the two loads: no match. */
			return out->addr == addr;
		}
		if (a < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

bool xp_trap_scan(const struct xenprobes_trap *table, xenprobes_u32 nr_traps,
		  xenprobes_u32 capacity, xenprobes_u64 addr, struct xenprobes_trap *out)
{
	xenprobes_u32 i, n = xp_live_traps(nr_traps, capacity);

	for (i = 0; i < n; i++) {
		if (xp_ld64(&table[i].addr) != addr)
			continue;
		xp_trap_snapshot(out, &table[i]);
		if (out->addr == addr)
			return true;
	}
	return false;
}

/* ---- addresses ---- */

enum xp_addr_kind xp_addr_classify(const struct xp_bounds *b, xenprobes_u64 addr)
{
	if (xp_in_range(&b->oea, addr))
		return XP_ADDR_OEA;
	if (xp_in_range(&b->ktext, addr))
		return XP_ADDR_KTEXT;
	if (xp_in_range(&b->modules, addr))
		return XP_ADDR_MODULE;
	return XP_ADDR_BAD;
}

static bool xp_exec(const struct xp_bounds *b, xenprobes_u64 addr)
{
	return !b->is_exec || b->is_exec(b->ctx, addr);
}

bool xp_resume_ok(const struct xp_bounds *b, xenprobes_u64 addr)
{
	return xp_addr_classify(b, addr) != XP_ADDR_BAD && xp_exec(b, addr);
}

bool xp_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *e,
		   xenprobes_u8 current_byte)
{
	enum xp_addr_kind k = xp_addr_classify(b, e->addr);

	/*
	 * A jump's region is restored whole (xp_region_restore_ok), an island after its region
	 * (xp_island_restore_ok); a JUMP entry is a key.
	 */
	if (e->flags == XENPROBES_TRAP_REDIRECT || e->flags == XENPROBES_TRAP_JUMP ||
	    e->flags == XENPROBES_TRAP_ISLAND)
		return false;
	if (e->len < 1 || e->len > sizeof(e->insn))
		return false;	/* no original bytes to put back */
	if (k != XP_ADDR_KTEXT && k != XP_ADDR_MODULE)
		return false;
	if (current_byte != XP_INT3 || e->insn[0] == XP_INT3)
		return false;
	return xp_exec(b, e->addr);
}

/* ---- registers ---- */

void xp_regs_snapshot(struct xenprobes_regs *dst, const struct xenprobes_regs *src)
{
	dst->rax = xp_ld64(&src->rax);
	dst->rbx = xp_ld64(&src->rbx);
	dst->rcx = xp_ld64(&src->rcx);
	dst->rdx = xp_ld64(&src->rdx);
	dst->rsi = xp_ld64(&src->rsi);
	dst->rdi = xp_ld64(&src->rdi);
	dst->rbp = xp_ld64(&src->rbp);
	dst->rsp = xp_ld64(&src->rsp);
	dst->r8 = xp_ld64(&src->r8);
	dst->r9 = xp_ld64(&src->r9);
	dst->r10 = xp_ld64(&src->r10);
	dst->r11 = xp_ld64(&src->r11);
	dst->r12 = xp_ld64(&src->r12);
	dst->r13 = xp_ld64(&src->r13);
	dst->r14 = xp_ld64(&src->r14);
	dst->r15 = xp_ld64(&src->r15);
	dst->rip = xp_ld64(&src->rip);
	dst->rflags = xp_ld64(&src->rflags);
	dst->cs = xp_ld64(&src->cs);
	dst->ss = xp_ld64(&src->ss);
}

/* The general registers but rsp (the callers decide rsp). */
static void xp_copy_gprs(struct xenprobes_regs *out, const struct xenprobes_regs *answer)
{
	out->rax = answer->rax;
	out->rbx = answer->rbx;
	out->rcx = answer->rcx;
	out->rdx = answer->rdx;
	out->rsi = answer->rsi;
	out->rdi = answer->rdi;
	out->rbp = answer->rbp;
	out->r8 = answer->r8;
	out->r9 = answer->r9;
	out->r10 = answer->r10;
	out->r11 = answer->r11;
	out->r12 = answer->r12;
	out->r13 = answer->r13;
	out->r14 = answer->r14;
	out->r15 = answer->r15;
}

enum xp_answer xp_answer_apply(const struct xp_bounds *b, const struct xenprobes_regs *hit,
			       const struct xenprobes_regs *answer, struct xenprobes_regs *out)
{
	xenprobes_u64 moved;

	if (!xp_resume_ok(b, answer->rip))
		return XP_ANSWER_BAD_RIP;
	moved = answer->rsp >= hit->rsp ? answer->rsp - hit->rsp : hit->rsp - answer->rsp;
	if (moved > XP_RSP_SLACK)
		return XP_ANSWER_BAD_RSP;

	xp_copy_gprs(out, answer);
	out->rsp = answer->rsp;
	out->rip = answer->rip;
	out->rflags = xp_merge_flags(hit->rflags, answer->rflags);
	out->cs = hit->cs;
	out->ss = hit->ss;
	return XP_ANSWER_OK;
}

/* ---- the mailbox state machine ---- */

enum xp_route xp_route_hit(bool dom0_gone, bool detaching, bool nested,
			   xenprobes_u32 mailbox, xenprobes_u32 nr_mailboxes)
{
	if (dom0_gone || detaching || nested || mailbox >= nr_mailboxes)
		return XP_ROUTE_FALLBACK;
	return XP_ROUTE_PUBLISH;
}

xenprobes_u64 xp_claim_bound_ms(xenprobes_u32 timeout_ms)
{
	xenprobes_u64 t = timeout_ms;
	xenprobes_u64 b = (xenprobes_u64)XENPROBES_CLAIM_FACTOR * t;

	if (b > XENPROBES_CLAIM_MAX_MS)
		b = XENPROBES_CLAIM_MAX_MS;
	return b > t ? b : t;
}

enum xp_wait xp_wait_step(xenprobes_u32 state, xenprobes_u32 answer_seq, xenprobes_u32 seq,
			  xenprobes_u64 now, xenprobes_u64 deadline, xenprobes_u64 claim_deadline,
			  bool give_up)
{
	/* An answer that is there wins over a deadline that just passed. */
	if (state == XENPROBES_MBOX_DONE && answer_seq == seq)
		return XP_WAIT_DONE;
	/* Dom0 runs the handlers: leaving now would let their writes land on a moved-on stack. */
	if (state == XENPROBES_MBOX_CLAIMED && now < claim_deadline)
		return XP_WAIT_AGAIN;
	if (give_up || now >= deadline)
		return XP_WAIT_TIMEOUT;
	return XP_WAIT_AGAIN;
}

enum xp_give_up xp_give_up_step(xenprobes_u32 seen, xenprobes_u32 answer_seq, xenprobes_u32 seq,
				bool past_claim_bound, xenprobes_u32 tries)
{
	if (seen == XENPROBES_MBOX_DONE && answer_seq == seq)
		return XP_GIVE_UP_ANSWERED;
	if (seen == XENPROBES_MBOX_CLAIMED && !past_claim_bound)
		return XP_GIVE_UP_WAIT;
	/* HIT: Dom0 gave the hit back. CLAIMED past the bound: Dom0 died or hangs. */
	if ((seen == XENPROBES_MBOX_HIT || seen == XENPROBES_MBOX_CLAIMED) &&
	    tries + 1 < XP_GIVE_UP_TRIES)
		return XP_GIVE_UP_SWAP;
	return XP_GIVE_UP_FORCE;
}

xenprobes_u64 xp_spin_until(xenprobes_u64 now, xenprobes_u32 spin_us)
{
	xenprobes_u64 ns = (xenprobes_u64)spin_us * 1000u;	/* at most ~4.3e12: no overflow */

	return now > ~(xenprobes_u64)0 - ns ? ~(xenprobes_u64)0 : now + ns;
}

enum xp_spin xp_spin_step(enum xp_wait w, xenprobes_u64 now, xenprobes_u64 spin_until)
{
	/* An answer or a deadline ends the wait whether the spin bound passed or not. */
	if (w != XP_WAIT_AGAIN)
		return XP_SPIN_ENDED;
	return now >= spin_until ? XP_SPIN_BLOCK : XP_SPIN_AGAIN;
}

/* ---- jump probes ---- */

enum xp_int3_action xp_int3_action(const struct xenprobes_trap *e)
{
	switch (e->flags) {
	case XENPROBES_TRAP_JUMP:
	case XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC:
		return XP_INT3_FOREIGN;	/* a key (a detour's call), never a trap byte of ours */
	case XENPROBES_TRAP_REDIRECT:
		return XP_INT3_REDIRECT;
	case XENPROBES_TRAP_ISLAND:
		return XP_INT3_FOREIGN;	/* an island is never a trap byte of ours */
	default:
		return XP_INT3_HIT;
	}
}

enum xp_jump_lookup xp_jump_lookup(const struct xp_bounds *b, const struct xenprobes_trap *e,
				   xenprobes_u64 ret)
{
	if (!e || ret < XP_CALL_REL32_LEN)
		return XP_JUMP_FOREIGN;
	if ((e->flags != XENPROBES_TRAP_JUMP && e->flags != (XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC)) ||
	    e->addr != xp_jump_call_addr(ret))
		return XP_JUMP_FOREIGN;
	/* Detours live in the OEA: a call from anywhere else is not one of ours. */
	if (!xp_in_range(&b->oea, e->addr))
		return XP_JUMP_FOREIGN;
	return e->flags == XENPROBES_TRAP_JUMP ? XP_JUMP_HIT : XP_JUMP_ASYNC;
}

static xenprobes_u32 xp_le32(const xenprobes_u8 *p)
{
	return (xenprobes_u32)p[0] | (xenprobes_u32)p[1] << 8 | (xenprobes_u32)p[2] << 16 |
	       (xenprobes_u32)p[3] << 24;
}

int xp_jump_async_key(const struct xp_bounds *b, const struct xenprobes_trap *e,
		      struct xp_async_key *k)
{
	const xenprobes_u8 *key = e->insn;
	xenprobes_u32 ncaps = key[XENPROBES_ASYNC_KEY_NCAPS];
	xp_s32 off = (xp_s32)xp_le32(key + XENPROBES_ASYNC_KEY_SPECS);
	xenprobes_u64 specs, bytes;

	if (ncaps > XENPROBES_RING_CAPS_MAX || key[5] || key[6] || key[7])
		return -XP_EINVAL;
	k->probe = xp_le32(key + XENPROBES_ASYNC_KEY_PROBE);
	k->ncaps = ncaps;
	k->specs = 0;
	if (!ncaps)
		return 0;
	specs = e->addr + (xenprobes_u64)(xp_s64)off;
	bytes = (xenprobes_u64)ncaps * sizeof(struct xenprobes_capture_spec);
	/* Inside the OEA, without wrapping: the range check on both ends, the end from the start. */
	if (specs % 8 || !xp_in_range(&b->oea, specs) || b->oea.end - specs < bytes)
		return -XP_EINVAL;
	k->specs = specs;
	return 0;
}

enum xp_answer xp_jump_answer_apply(const struct xp_bounds *b, const struct xenprobes_regs *hit,
				    const struct xenprobes_regs *answer, xenprobes_u64 ret,
				    struct xenprobes_regs *out)
{
	xenprobes_u64 rip;

	/*
	 * The entry writes the final rflags and rip just below the new rsp: above its own frame
	 * only when the stack did not grow, and in 8-byte steps (what pops move it by).
	 */
	if (answer->rsp < hit->rsp || answer->rsp - hit->rsp > XP_JUMP_RSP_MAX ||
	    (answer->rsp - hit->rsp) % 8)
		return XP_ANSWER_BAD_RSP;
	if (answer->rip == hit->rip) {
		rip = ret;	/* the probed address: its copy in the detour, at call + 5 */
	} else {
		if (!xp_resume_ok(b, answer->rip))
			return XP_ANSWER_BAD_RIP;
		rip = answer->rip;
	}
	xp_copy_gprs(out, answer);
	out->rsp = answer->rsp;
	out->rip = rip;
	out->rflags = xp_merge_flags(hit->rflags, answer->rflags);
	out->cs = hit->cs;
	out->ss = hit->ss;
	return XP_ANSWER_OK;
}

/* ---- xenstore values ---- */

bool xp_parse_decimal(const char *s, size_t n, xenprobes_u64 max, xenprobes_u64 *out)
{
	xenprobes_u64 v = 0;
	size_t i;

	if (!s || n == 0 || n > 20 || (s[0] == '0' && n > 1))
		return false;
	for (i = 0; i < n; i++) {
		xenprobes_u64 d;

		if (s[i] < '0' || s[i] > '9')
			return false;
		d = (xenprobes_u64)(s[i] - '0');
		if (v > max / 10)
			return false;
		v *= 10;
		if (d > max - v)
			return false;
		v += d;
	}
	*out = v;
	return true;
}

/* ---- the OEA pool ---- */

enum xp_oea_result xp_oea_take(struct xp_oea_pool *p, xenprobes_u64 bytes,
			       xenprobes_u64 *addr)
{
	if (bytes == 0 || bytes % XP_PAGE_SIZE || bytes > XENPROBES_OEA_MAX_SIZE)
		return XP_OEA_BAD_REQUEST;
	if (p->count >= XENPROBES_OEA_MAX_AREAS)
		return XP_OEA_LIMIT;
	if (p->used > p->size || bytes > p->size - p->used)
		return XP_OEA_EXHAUSTED;
	*addr = p->base + p->used;
	p->areas[p->count].start = *addr;
	p->areas[p->count].end = *addr + bytes;
	p->used += bytes;
	p->count++;
	return XP_OEA_OK;
}

void xp_oea_undo_last(struct xp_oea_pool *p)
{
	struct xp_range *a;

	if (!p->count)
		return;
	a = &p->areas[p->count - 1];
	/* Areas are carved in order, so the last one ends where `used` ends. */
	if (a->end - p->base != p->used)
		return;
	p->used -= a->end - a->start;
	a->start = a->end = 0;
	p->count--;
}

const char *xp_oea_reason(enum xp_oea_result r)
{
	switch (r) {
	case XP_OEA_OK:
		return "ok";
	case XP_OEA_BAD_REQUEST:
		return "bad request: not a nonzero multiple of 4096 up to the area size limit";
	case XP_OEA_LIMIT:
		return "area limit reached";
	case XP_OEA_EXHAUSTED:
		return "static OEA pool exhausted (rebuild with a larger XENPROBES_OEA_POOL)";
	}
	return "unknown error";
}

/* ---- modules that went ---- */

bool xp_gone_going(struct xp_gone *g, xenprobes_u32 id, const struct xenprobes_trap *table,
		   xenprobes_u32 nr_traps, xenprobes_u32 capacity)
{
	xenprobes_u32 n = xp_live_traps(nr_traps, capacity), i;

	if (!id)
		return false;
	for (i = 0; i < n && xp_ld32(&table[i].module) != id; i++)
		;
	if (i == n)
		return false;
	for (i = 0; i < g->n && i < XP_GONE_MAX; i++)
		if (g->id[i] == id)
			return true;
	if (g->n >= XP_GONE_MAX) {
		g->full = true;
		return true;
	}
	g->id[g->n++] = id;
	return true;
}

void xp_gone_coming(struct xp_gone *g, xenprobes_u32 id)
{
	xenprobes_u32 n = g->n < XP_GONE_MAX ? g->n : XP_GONE_MAX, i;

	for (i = 0; i < n; i++) {
		if (g->id[i] != id)
			continue;
		g->id[i] = g->id[n - 1];
		g->n = n - 1;
		return;
	}
}

bool xp_gone_has(const struct xp_gone *g, const struct xenprobes_trap *e)
{
	xenprobes_u32 i;

	if (!e->module)
		return false;
	if (g->full)
		return true;
	for (i = 0; i < g->n && i < XP_GONE_MAX; i++)
		if (g->id[i] == e->module)
			return true;
	return false;
}
