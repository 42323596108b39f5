// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: the int3 hook and the jump hit (protocol.h, "A hit on vCPU v" and "Jump probes"),
 * which hand their hits to Dom0 through the mailbox exchange (xp_exchange.c).
 *
 * Context. On x86-64 (6.1 and later) a kernel-mode int3 enters exc_int3(), which runs
 * poke_int3_handler() (text_poke_bp() sites), then under irqentry_nmi_enter() do_int3():
 * kgdb, kprobe_int3_handler(), then notify_die(DIE_INT3, ...) -- our hook -- and die("int3")
 * when nobody returned NOTIFY_STOP. A user-mode int3 also reaches notify_die(DIE_INT3) via
 * do_int3_user(); we leave those alone. regs->ip points after the int3, so the trap byte is
 * at regs->ip - 1. Interrupts are off and we may have interrupted any code, including code
 * holding locks: the hook takes no lock, never sleeps, never allocates, never printks on the
 * hot path, and uses irq_work to get to process context.
 *
 * Nesting. A probed address hit again on the same CPU while the hook is running (an NMI, or
 * a probe on something the hook calls) must not recurse without bound: the per-CPU depth is
 * taken before anything else the hook does (a per-CPU increment, inline, after two inline
 * tests of its arguments), and
 *  - depth 1 is the normal path;
 *  - depth 2 (a nested hit) takes the entry's fallback at once, through the simplest path:
 *    no mailbox (it is busy with the outer hit), no Dom0, no kernel function on the way
 *    except lookup_address() when the fallback resumes in another module's text (kernel
 *    text and the OEA are executable by construction, xp_is_exec_nested()). What it runs is
 *    this module's code: the table search (xp_logic.c), the fallback (xp_fallback.c), the
 *    stack accessors (inline nofault accesses, xp_text.c) and inline per-CPU and atomic
 *    operations;
 *  - depth 3 or more is a hit inside that nested path itself: Dom0 trapped this module's own
 *    code (which it must never do: the module publishes module-text for Dom0 to refuse it) or
 *    lookup_address(). Looking the entry up would run the trapped code again, so, with inline
 *    code only, the int3 is rewound if its byte is gone, else left to the kernel (die("int3"),
 *    an oops): bounded, where recursing would overflow the exception stack.
 * No depth count can guard the code that runs at every depth: the kernel's int3 path up to
 * this hook (exc_int3, do_int3, notify_die, the die notifier chain) and xp_die_notify() itself.
 * A trap there recurses whatever the module does; only Dom0 refusing those addresses (kernel
 * functions it must know, and module-text) prevents it.
 *
 * Jump hits. A jump probe's detour calls xp_jump_entry (xp_jump.S), which saves the registers
 * in a pt_regs frame and calls xp_jump_hit() here. Unlike the int3 hook it starts with
 * interrupts in whatever state the probed code had: xp_jump_hit() disables them first
 * (local_irq_save(), the pv op on PV: before the guard, like the kernel's int3 path) and keeps
 * them off to its end, then takes the same per-CPU depth. So everything here runs with
 * interrupts off: the int3 hook (the exception), the whole jump hit and its wait for Dom0.
 * Depth 1 is a jump hit handed to Dom0; at depth 2 or more (a jump hit inside the int3 hook or
 * inside another jump hit) it only counts `nested` and returns into its detour, which runs its
 * copies unanswered -- no table search, no mailbox. The int3 hook sees the jump hit's depth as
 * its own: an int3 hit inside a jump hit is a nested one (its fallback). An int3 on a REDIRECT
 * entry (the first byte of a jump's region) is sent to the detour at once, at depth 1 and 2
 * alike; a JUMP entry's address is never a trap byte (foreign).
 *
 * Async jump hits (protocol.h, "Async jump probes"): a JUMP | ASYNC entry found at depth 1
 * becomes a record in this vCPU's ring (xp_async_hit(), xp_ring.c) instead of a mailbox hit,
 * under the same interrupts-off section and depth guard; then the detour runs its copies
 * unanswered, exactly as after a timeout. No mailbox, no wait, no hypercall but the one
 * notification the ring asks for.
 */
#include <linux/kdebug.h>
#include <linux/kernel.h>
#include <linux/percpu.h>
#include <linux/ptrace.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <xen/xen-ops.h>

#include "xp_internal.h"

static DEFINE_PER_CPU(int, xp_depth);	/* hook nesting on this CPU */

static void xp_regs_from_pt(struct xenprobes_regs *x, const struct pt_regs *r, u64 trap)
{
	x->rax = r->ax;
	x->rbx = r->bx;
	x->rcx = r->cx;
	x->rdx = r->dx;
	x->rsi = r->si;
	x->rdi = r->di;
	x->rbp = r->bp;
	x->rsp = r->sp;
	x->r8 = r->r8;
	x->r9 = r->r9;
	x->r10 = r->r10;
	x->r11 = r->r11;
	x->r12 = r->r12;
	x->r13 = r->r13;
	x->r14 = r->r14;
	x->r15 = r->r15;
	x->rip = trap;
	x->rflags = r->flags;
	x->cs = r->cs;
	x->ss = r->ss;
}

/* cs and ss are never written: the hit's values stay in pt_regs. */
static void xp_regs_to_pt(struct pt_regs *r, const struct xenprobes_regs *x)
{
	r->ax = x->rax;
	r->bx = x->rbx;
	r->cx = x->rcx;
	r->dx = x->rdx;
	r->si = x->rsi;
	r->di = x->rdi;
	r->bp = x->rbp;
	r->sp = x->rsp;
	r->r8 = x->r8;
	r->r9 = x->r9;
	r->r10 = x->r10;
	r->r11 = x->r11;
	r->r12 = x->r12;
	r->r13 = x->r13;
	r->r14 = x->r14;
	r->r15 = x->r15;
	r->ip = x->rip;
	r->flags = x->rflags;
}

static bool xp_kread(void *ctx, u64 addr, u64 *val)
{
	return xp_read_kernel_u64(addr, val);
}

static bool xp_kwrite(void *ctx, u64 addr, u64 val)
{
	return xp_write_kernel_u64(addr, val);
}

static const struct xp_mem_ops xp_mem = { .read_u64 = xp_kread, .write_u64 = xp_kwrite };

/*
 * The return-slot write a taken answer asks for (protocol.h, "Return slots written by the
 * module"; hit_rsp: the hit's stack pointer). A refusal writes nothing and takes nothing else
 * from the answer away: the vCPU resumes as answered, the call just goes untracked.
 */
static void xp_ret_apply(struct xenprobes_mailbox *mb, struct xp_ret_request *q, u64 hit_rsp)
{
	/* Taken once, atomically: a request Dom0 withdrew (protocol.h, "Cancelling") reads 0. */
	q->slot = xchg(&mb->ret_slot, 0);
	switch (xp_ret_write(q, hit_rsp, xp.traps, &xp.hdr->nr_traps, xp.trap_cap, &xp_mem)) {
	case XP_RET_NONE:
		break;
	case XP_RET_WRITTEN:
		atomic64_inc(&xp.ret_written);
		break;
	default:
		WRITE_ONCE(xp.hdr->ret_refused, (u32)atomic64_inc_return(&xp.ret_refused));
		break;
	}
}

/* ---- Dom0 gone ---- */

static void xp_gone_irq_work(struct irq_work *w)
{
	/* Hard-irq context, outside the int3 handler: queue_work() is fine here. */
	queue_work(xp.wq, &xp.disarm_work);
}

void xp_declare_dom0_gone(enum xp_gone_reason why)
{
	if (atomic_cmpxchg(&xp.dom0_gone, XP_GONE_NOT, why) != XP_GONE_NOT)
		return;
	if (xp.hdr)
		WRITE_ONCE(xp.hdr->dom0_gone, 1);
	irq_work_queue(&xp.gone_irq_work);	/* NMI safe */
}

static void xp_disarm_work(struct work_struct *w)
{
	unsigned int restored;

	if (READ_ONCE(xp.detaching))
		return;		/* detach restores everything itself */
	restored = xp_restore_traps();
	WRITE_ONCE(xp.text_restored, true);
	/* Islands only once no task can still be between a region's eb and its island. */
	xp_quiesce();
	restored += xp_restore_islands();
	if (atomic_read(&xp.dom0_gone) == XP_GONE_RESUMED)
		pr_warn(XP_NAME ": domain resumed (restore/migration): restored %u trap bytes and jump regions; every hit now resumes without Dom0; reload the module to attach again\n",
			restored);
	else
		pr_warn(XP_NAME ": Dom0 did not answer %d hits in a row: restored %u trap bytes and jump regions (%lld hits resumed without Dom0 so far); every hit now resumes without Dom0; reload the module to attach again\n",
			XENPROBES_DEAD_AFTER, restored, (long long)atomic64_read(&xp.timeouts));
}

/* ---- the int3 hook ---- */

/*
 * The byte at addr, the int3 this CPU just executed (regs->ip - 1): mapped and readable, since
 * the CPU fetched it. A plain load, like kprobe_int3_handler()'s, rather than
 * copy_from_kernel_nofault(): no kernel function a probe could sit on.
 */
static __always_inline u8 xp_trap_byte(u64 addr)
{
	return READ_ONCE(*(const u8 *)(unsigned long)addr);
}

/*
 * After a failed fallback: if the byte is no longer an int3, running it is right. Inline, as
 * depth 3 runs it (see "Nesting"): no call there for a probe to sit on.
 */
static __always_inline int xp_rewind_or_die(struct pt_regs *regs, u64 addr)
{
	if (xp_trap_byte(addr) != XP_INT3) {
		regs->ip = addr;
		return NOTIFY_STOP;
	}
	atomic64_inc(&xp.no_fallback);
	return NOTIFY_DONE;	/* die("int3"): nothing correct is left to do */
}

/*
 * Resumes without Dom0 as the entry says (b: which addresses count as executable), counted in
 * timeouts unless the hit was already counted over budget.
 */
static int xp_fallback(struct pt_regs *regs, const struct xenprobes_trap *e,
		       const struct xp_bounds *b, bool over_budget)
{
	struct xenprobes_regs r;

	if (!over_budget)
		xp_count(&xp.timeouts, &xp.hdr->timeouts);
	xp_regs_from_pt(&r, regs, e->addr);
	if (xp_take_fallback(e, &r, xp.rets, xp.ret_cap, b, &xp_mem) != XP_FB_OK)
		return xp_rewind_or_die(regs, e->addr);
	xp_regs_to_pt(regs, &r);
	return NOTIFY_STOP;
}

/*
 * The int3 over the first byte of a jump's region (protocol.h, "Jump probes": the jump being
 * put in place or taken down): straight to the detour, which makes the hit itself. No
 * mailbox, no Dom0, no header counter; at any depth that looks entries up (1 and 2).
 */
static int xp_redirect(struct pt_regs *regs, const struct xenprobes_trap *e,
		       const struct xp_bounds *b)
{
	struct xenprobes_regs r;

	xp_regs_from_pt(&r, regs, e->addr);
	if (xp_take_fallback(e, &r, NULL, 0, b, &xp_mem) != XP_FB_OK)
		return xp_rewind_or_die(regs, e->addr);
	atomic64_inc(&xp.redirects);
	regs->ip = r.rip;
	return NOTIFY_STOP;
}

/* Depth 1: hand the hit to Dom0 when it can take it, else the fallback. */
static int xp_handle_hit(struct pt_regs *regs, const struct xenprobes_trap *e)
{
	struct xenprobes_regs hit, answer, out;
	struct xp_ret_request ret;
	u32 mbox = xen_vcpu_nr(smp_processor_id());
	bool over = false;

	xp_regs_from_pt(&hit, regs, e->addr);
	/* Not nested: nested hits never get here (xp_die_notify). */
	if (xp_route_hit(atomic_read(&xp.dom0_gone) != XP_GONE_NOT, READ_ONCE(xp.detaching),
			 false, mbox, xp.nr_mailboxes) == XP_ROUTE_PUBLISH &&
	    !(over = xp_over_budget()) &&
	    xp_exchange(&xp.mbox[mbox], e->addr, &hit, &answer, &ret) &&
	    xp_answer_taken(xp_answer_apply(&xp.bounds, &hit, &answer, &out))) {
		xp_ret_apply(&xp.mbox[mbox], &ret, hit.rsp);
		xp_regs_to_pt(regs, &out);
		return NOTIFY_STOP;
	}
	return xp_fallback(regs, e, &xp.bounds, over);
}

/* Depth 1 and 2: find the entry of the int3 at regs->ip - 1, then handle it. */
static int xp_int3(struct pt_regs *regs, bool nested)
{
	struct xenprobes_trap e;
	u64 addr = regs->ip - 1;
	u32 nr_traps = READ_ONCE(xp.hdr->nr_traps);

	if (!xp_trap_search(xp.traps, nr_traps, xp.trap_cap, addr, &e)) {
		/* Dom0 removed the trap after this CPU executed it: run the original byte. */
		if (xp_trap_byte(addr) != XP_INT3) {
			regs->ip = addr;
			return NOTIFY_STOP;
		}
		/* An unsorted table from a buggy Dom0 would make us oops the guest: look again. */
		if (!xp_trap_scan(xp.traps, nr_traps, xp.trap_cap, addr, &e)) {
			xp_count(&xp.foreign, &xp.hdr->foreign);
			return NOTIFY_DONE;
		}
	}
	switch (xp_int3_action(&e)) {
	case XP_INT3_FOREIGN:
		/* A JUMP entry is the key of a detour's call, never a trap byte. */
		xp_count(&xp.foreign, &xp.hdr->foreign);
		return NOTIFY_DONE;
	case XP_INT3_REDIRECT:
		return xp_redirect(regs, &e, nested ? &xp.nested_bounds : &xp.bounds);
	case XP_INT3_HIT:
		break;
	}
	/*
	 * A trap in text whose byte is restored already (the module's restore once Dom0 is gone):
	 * this CPU executed an int3 it fetched before the restore. It is counted, since once the
	 * module is unloaded such an int3 is fatal (Linux >= 6.2 no longer rewinds an int3 whose
	 * byte is gone: kprobe_int3_handler() lost its "*addr != INT3" case, so an int3 nobody
	 * claims is die("int3")), and handled as the entry says: once Dom0 is gone its fallback
	 * runs the original instruction out of line. Rewinding to addr instead could spin on an
	 * emulator's stale copy of the int3.
	 */
	if (xp_trap_stale(&xp.bounds, addr, xp_trap_byte(addr))) {
		if (atomic64_inc_return(&xp.stale) == 1)
			WRITE_ONCE(xp.stale_first, addr);
	} else if (READ_ONCE(xp.text_restored)) {
		atomic64_inc(xp_in_range(&xp.bounds.oea, addr) ? &xp.late_oea : &xp.late_text);
	}
	if (nested)
		return xp_fallback(regs, &e, &xp.nested_bounds, false);
	return xp_handle_hit(regs, &e);
}

static int xp_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	struct pt_regs *regs;
	int depth, ret;

	if (val != DIE_INT3)
		return NOTIFY_DONE;
	regs = args->regs;
	if (!regs || user_mode(regs))
		return NOTIFY_DONE;
	/* First, before any call a probe could sit on (see "Nesting"). */
	depth = this_cpu_inc_return(xp_depth);
	if (depth == 1)
		ret = xp_int3(regs, false);
	else if (depth == 2)
		ret = xp_int3(regs, true);
	else
		ret = xp_rewind_or_die(regs, regs->ip - 1);	/* inline: no call at all */
	this_cpu_dec(xp_depth);
	return ret;
}

/* ---- jump probes (protocol.h, "Jump probes") ---- */

/*
 * Capture reads for async hits (struct xp_read_ops: 0 or nonzero on a fault). The kernel's
 * no-fault copies disable page faults and return 0 or a negative errno, on 6.1 as on 6.12:
 * copy_from_kernel_nofault() refuses user and non-canonical addresses, copy_from_user_nofault()
 * kernel ones and a context whose user address space is not the loaded one (a kernel thread,
 * an NMI during a switch). The string copies the kernel has (strncpy_from_*_nofault()) are not
 * exported to modules: strings are read in pieces through the byte copies
 * (xp_read_str_pieces()), which gives read_str's contract exactly (max bytes unterminated when
 * there is no NUL among them).
 */
/*
 * Before "mm: Fix copy_from_user_nofault()" (6.4; 6.1.36 and 6.3.10 in the stable series; never
 * in 6.2), copy_from_user_nofault() ran hardened usercopy's vmalloc check on its destination,
 * find_vmap_area(), which takes vmap_area_lock: the rings are vmalloc memory, so a hit on a CPU
 * that holds the lock (a probe in the vmalloc code) would wait for itself with interrupts off.
 * There a user capture reads nothing (a fault). Debian 12's 6.1 and 13's 6.12 have the fix.
 */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 1, 36) || \
	(LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0) && LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 10))
#define XP_USER_NOFAULT_LOCKS 1
#else
#define XP_USER_NOFAULT_LOCKS 0
#endif

static int xp_cap_read(void *ctx, void *dst, u64 addr, u32 len, bool user)
{
	if (user && XP_USER_NOFAULT_LOCKS)
		return -EFAULT;
	if (user)
		return copy_from_user_nofault(dst, (const void __user *)(unsigned long)addr, len) ?
			       -EFAULT : 0;
	return copy_from_kernel_nofault(dst, (const void *)(unsigned long)addr, len) ? -EFAULT : 0;
}

static long xp_cap_read_str(void *ctx, void *dst, u64 addr, u32 max, bool user);

static const struct xp_read_ops xp_cap_ops = {
	.read = xp_cap_read,
	.read_str = xp_cap_read_str,
};

static long xp_cap_read_str(void *ctx, void *dst, u64 addr, u32 max, bool user)
{
	return xp_read_str_pieces(&xp_cap_ops, dst, addr, max, user);
}

/*
 * An async jump hit at depth 1 (interrupts off; e: the entry's snapshot): the registers as a
 * synchronous hit gives them to Dom0 (rip = the probed address, rsp = the hit's, rflags as
 * pushed), the guest's monotonic clock (NMI safe), then a record in the ring of the vCPU it
 * runs on. Dom0 gone or detaching changes nothing: the rings live until unload. The event only
 * while the port is still this module's: after a save/restore or migration the number may name
 * another channel.
 */
static void xp_jump_async(const struct pt_regs *regs, const struct xenprobes_trap *e)
{
	struct xenprobes_regs hit;

	xp_regs_from_pt(&hit, regs, e->fallback);
	switch (xp_async_hit(&xp.bounds, e, xp.rings, READ_ONCE(xp.ring_count),
			     xen_vcpu_nr(smp_processor_id()), ktime_get_mono_fast_ns(), &hit,
			     &xp_cap_ops)) {
	case XP_ASYNC_BAD:
		xp_count(&xp.async_bad, &xp.hdr->async_bad);
		break;
	case XP_ASYNC_NOTIFY:
		if (atomic_read(&xp.dom0_gone) != XP_GONE_RESUMED)
			xp_notify_dom0();
		break;
	case XP_ASYNC_WRITTEN:
	case XP_ASYNC_DROPPED:	/* counted in the ring's header */
	case XP_ASYNC_NESTED:
		break;
	}
}

/*
 * Depth 1 of a jump hit: the JUMP entry of the detour's call at ret - 5, then Dom0 (an async
 * entry: its ring). true with *out = the registers to resume with when Dom0 gave a usable
 * answer; false to resume in the detour at ret as if nothing happened (foreign call, async hit,
 * Dom0 gone, detaching, timeout, unusable answer): the detour's copies of the region then just
 * run.
 */
static bool xp_jump_handle(const struct pt_regs *regs, u64 ret, struct xenprobes_regs *out)
{
	struct xenprobes_trap e;
	struct xenprobes_regs hit, answer;
	struct xp_ret_request rq;
	u32 nr_traps = READ_ONCE(xp.hdr->nr_traps);
	u64 call = xp_jump_call_addr(ret);
	u32 mbox = xen_vcpu_nr(smp_processor_id());
	bool found;

	/* The scan: an unsorted table from a buggy Dom0 costs time, not the hit. */
	found = xp_trap_search(xp.traps, nr_traps, xp.trap_cap, call, &e) ||
		xp_trap_scan(xp.traps, nr_traps, xp.trap_cap, call, &e);
	switch (xp_jump_lookup(&xp.bounds, found ? &e : NULL, ret)) {
	case XP_JUMP_HIT:
		break;
	case XP_JUMP_ASYNC:
		xp_jump_async(regs, &e);
		return false;
	case XP_JUMP_FOREIGN:
	default:
		xp_count(&xp.foreign, &xp.hdr->foreign);
		return false;
	}
	/* rip = the probed address, rsp = the hit's (the frame says so), rflags = pushed. */
	xp_regs_from_pt(&hit, regs, e.fallback);
	if (xp_route_hit(atomic_read(&xp.dom0_gone) != XP_GONE_NOT, READ_ONCE(xp.detaching),
			 false, mbox, xp.nr_mailboxes) == XP_ROUTE_PUBLISH) {
		if (xp_over_budget())
			return false;
		if (xp_exchange(&xp.mbox[mbox], e.addr, &hit, &answer, &rq) &&
		    xp_answer_taken(xp_jump_answer_apply(&xp.bounds, &hit, &answer, ret, out))) {
			/* The slot at the hit's rsp lies above everything xp_jump_hit() writes. */
			xp_ret_apply(&xp.mbox[mbox], &rq, hit.rsp);
			return true;
		}
	}
	xp_count(&xp.timeouts, &xp.hdr->timeouts);
	return false;
}

/*
 * Called by xp_jump_entry (xp_jump.S) with the frame it built (regs: the general registers,
 * ip = ret, sp = the hit's rsp, flags = the hit's rflags) and ret = the detour's call + 5.
 * Leaves in regs the general registers to resume with and in regs->sp where the entry's
 * popfq and ret find the final rflags and rip: new_rsp - 16.
 *
 * Interrupts are off from the first statement to the last (local_irq_save(): on a PV guest
 * the pv op, which like the kernel's int3 path runs before any guard and must not be probed),
 * so the task cannot migrate between taking and dropping the per-CPU depth, and the wait for
 * Dom0 runs with interrupts off as the int3 hook's does. The depth is the int3 hook's
 * (xp_depth, "Nesting"), taken before anything else: a jump hit inside the hook or inside
 * another jump hit (an NMI, a probe on something either calls) goes to no mailbox: ++nested
 * and back into its detour, without even a table search.
 */
asmlinkage void xp_jump_hit(struct pt_regs *regs, u64 ret)
{
	u64 hit_rsp = regs->sp, new_rsp = hit_rsp;
	struct xenprobes_regs out;
	unsigned long irqflags;
	bool answered = false;

	local_irq_save(irqflags);
	if (this_cpu_inc_return(xp_depth) == 1)
		answered = xp_jump_handle(regs, ret, &out);
	else
		xp_count(&xp.nested, &xp.hdr->nested);
	this_cpu_dec(xp_depth);
	/*
	 * Unanswered: the slots the call and the pushfq filled hold ret and the hit's rflags,
	 * the frame the hit's registers. Answered: the final rip and rflags go just below the
	 * new rsp, which lies in [hit_rsp, hit_rsp + 4096] (xp_jump_answer_apply), so above this
	 * frame and above every live word below the hit's rsp. The higher word first: should it
	 * fault (an rsp past the top of the stack), nothing was written. A fault on either is an
	 * unusable answer.
	 */
	if (answered) {
		if (xp_write_kernel_u64(out.rsp - 8, out.rip) &&
		    xp_write_kernel_u64(out.rsp - 16, out.rflags)) {
			xp_regs_to_pt(regs, &out);
			new_rsp = out.rsp;
		} else {
			atomic64_inc(&xp.bad_answers);
			xp_count(&xp.timeouts, &xp.hdr->timeouts);
		}
	}
	regs->sp = new_rsp - 16;
	local_irq_restore(irqflags);
}

static struct notifier_block xp_die_nb = {
	.notifier_call = xp_die_notify,
	/*
	 * kprobes is called before the die chain; kgdb's notifier runs last (-INT_MAX) and
	 * still sees every int3 we leave alone (NOTIFY_DONE).
	 */
	.priority = 0,
};

static bool xp_hook_on;

void xp_hook_init(void)
{
	init_irq_work(&xp.gone_irq_work, xp_gone_irq_work);
	INIT_WORK(&xp.disarm_work, xp_disarm_work);
}

int xp_hook_register(void)
{
	int err = register_die_notifier(&xp_die_nb);

	xp_hook_on = !err;
	return err;
}

void xp_hook_unregister(void)
{
	/* atomic_notifier_chain_unregister() waits for running hooks (synchronize_rcu()). */
	if (xp_hook_on)
		unregister_die_notifier(&xp_die_nb);
	xp_hook_on = false;
	irq_work_sync(&xp.gone_irq_work);
	cancel_work_sync(&xp.disarm_work);
}
