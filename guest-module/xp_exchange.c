// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: the mailbox exchange with Dom0 (protocol.h, "A hit on vCPU v", steps 1-4, and
 * "Spinning instead of notifying"): a hit of the int3 hook or of the jump entry (xp_hook.c)
 * handed to Dom0 in this vCPU's mailbox, the wait for the answer (a spin, then SCHEDOP_poll),
 * giving the hit up, and whether the caller may use the answer. Called from xp_hook.c with
 * interrupts off, at depth 1 only: no lock, no sleep, no allocation, no printk here either.
 */
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/timekeeping.h>
#include <xen/events.h>

#include "xp_budget.h"
#include "xp_internal.h"

/* A poll slice: how late a lost wakeup (shared port, see xp_wait) can make an answer. */
#define XP_POLL_SLICE_NS (1000ull * 1000ull)

static DEFINE_PER_CPU(u32, xp_seq);	/* the module's own copy of mailbox.seq */
static DEFINE_PER_CPU(struct xp_budget, xp_budget);	/* xp_budget.h */

static void xp_mbox_store_regs(struct xenprobes_mailbox *mb, const struct xenprobes_regs *x)
{
	/* Plain stores: Dom0 reads them only after state = HIT, behind smp_wmb(). */
	mb->regs = *x;
}

/*
 * Step 2's spin (protocol.h, "Spinning instead of notifying"): before blocking, the vCPU says
 * mailbox.spinning = 1 and checks the mailbox in a loop for up to spin_us, so that Dom0, seeing
 * the flag, can leave out the notification of its answer (and the vCPU the SCHEDOP_poll and
 * the wakeup through Xen). Interrupts are off here (the int3 handler, or the jump entry's
 * interrupts-off section): spin_us is capped at XP_SPIN_MAX_US and measured with
 * ktime_get_mono_fast_ns() (NMI safe, as the rest of the wait). Every check is xp_wait_step()'s,
 * with the same deadlines and the same give_up, so a spin ends at once on the answer, on a
 * deadline, or when detaching, and never extends a deadline (xp_spin_step()).
 *
 * The barriers, against Dom0's step d ("state = DONE, a full barrier, then load spinning;
 * notify only if it reads 0"):
 *   (S1) spinning = 1, smp_mb(), then the first check: the flag is out before we look, so a
 *        Dom0 answering from then on may already see it (for promptness: correctness rests
 *        on S2 alone, since a Dom0 that sees 1 and skips the notification is covered by S2);
 *   (S2) spinning = 0, smp_mb(), then one more check (the first check of xp_wait()'s loop,
 *        whose own xen_clear_irq_pending() and smp_mb() come after this barrier). Dom0 stores
 *        DONE before it loads spinning and we store 0 before we load state, each with a full
 *        barrier between: either Dom0's load sees our 0 (it notifies, and the SCHEDOP_poll
 *        below wakes up as it always did), or our check after S2 sees its DONE. Every
 *        answer is either notified or seen.
 * The flag is cleared with the same barrier on every way out (answer, timeout, bound passed),
 * and always before state goes IDLE or ABANDONED: a later hit on this mailbox never starts
 * with a stale spinning = 1. Returns xp_wait_step()'s result; XP_WAIT_AGAIN when the bound
 * passed unanswered (*now: the time of the last check).
 */
static enum xp_wait xp_spin(struct xenprobes_mailbox *mb, u32 seq, u64 deadline,
			    u64 claim_deadline, u64 *now)
{
	u64 until = xp_spin_until(*now, xp.spin_us);
	enum xp_wait w;
	enum xp_spin s;

	WRITE_ONCE(mb->spinning, 1);
	smp_mb();	/* S1 */
	for (;;) {
		w = xp_wait_step(READ_ONCE(mb->state), READ_ONCE(mb->answer_seq), seq, *now,
				 deadline, claim_deadline, READ_ONCE(xp.detaching));
		s = xp_spin_step(w, *now, until);
		if (s != XP_SPIN_AGAIN)
			break;
		cpu_relax();
		*now = ktime_get_mono_fast_ns();
	}
	WRITE_ONCE(mb->spinning, 0);
	smp_mb();	/* S2: before the one more check (xp_wait()) */
	if (w == XP_WAIT_DONE)
		atomic64_inc(&xp.spin_answered);
	else if (s == XP_SPIN_BLOCK)
		atomic64_inc(&xp.spin_blocked);
	return w;
}

/*
 * Waits for Dom0's answer to `seq`, until `deadline`, or while Dom0 holds a claim on the hit
 * until `claim_deadline` (xp_wait_step). With `spin` and spin_us > 0 it first spins (xp_spin());
 * the loop below then makes the protocol's "one more check" after the spin, before it blocks.
 * Clearing the port's pending bit before each check
 * keeps SCHEDOP_poll from returning at once forever (interrupts are off, so the irq
 * handler never clears it); checking after the clear means an answer written before the
 * clear is seen now and one written after it sets the bit again. With one port shared by
 * all vCPUs, a vCPU that clears the bit between another vCPU's check and its poll delays
 * that vCPU by at most one slice.
 */
static enum xp_wait xp_wait(struct xenprobes_mailbox *mb, u32 seq, u64 deadline,
			    u64 claim_deadline, bool spin)
{
	u64 now = ktime_get_mono_fast_ns();
	enum xp_wait w;

	if (spin && xp.spin_us) {
		w = xp_spin(mb, seq, deadline, claim_deadline, &now);
		if (w != XP_WAIT_AGAIN)
			return w;
	}
	for (;;) {
		xen_clear_irq_pending(xp.irq);
		smp_mb();
		w = xp_wait_step(READ_ONCE(mb->state), READ_ONCE(mb->answer_seq), seq, now,
				 deadline, claim_deadline, READ_ONCE(xp.detaching));
		if (w != XP_WAIT_AGAIN)
			return w;
		/* Past the deadline only a claim keeps us here, up to its bound. */
		xp_poll_for(min((now < deadline ? deadline : claim_deadline) - now,
				XP_POLL_SLICE_NS));
		now = ktime_get_mono_fast_ns();
	}
}

/*
 * Before a hit is handed to Dom0 (interrupts off, so the CPU cannot change under us): has
 * this CPU spent its waiting budget since it last switched (xp_budget.h)? Then the caller
 * resumes without Dom0, counted in over_budget.
 */
bool xp_over_budget(void)
{
	struct xp_budget *b = this_cpu_ptr(&xp_budget);

	xp_budget_look(b, (u64)(unsigned long)current, current->nvcsw + current->nivcsw);
	if (xp_budget_allows(b, xp.budget_ns))
		return false;
	xp_count(&xp.over_budget, &xp.hdr->over_budget);
	return true;
}

/* One hit's wait for Dom0, from its mailbox write: into the sum, the maximum and the budget. */
static void xp_account_wait(u64 start)
{
	u64 d = ktime_get_mono_fast_ns() - start;
	s64 old = atomic64_read(&xp.wait_max_ns);

	xp_budget_charge(this_cpu_ptr(&xp_budget), d);

	WRITE_ONCE(xp.hdr->wait_ns, (xenprobes_u64)atomic64_add_return((s64)d, &xp.wait_ns));
	while ((u64)old < d) {
		s64 seen = atomic64_cmpxchg(&xp.wait_max_ns, old, (s64)d);

		if (seen == old) {
			WRITE_ONCE(xp.hdr->wait_max_ns, d);
			break;
		}
		old = seen;
	}
}

/*
 * Hands the hit to Dom0 and waits (steps 1-4 of the protocol; mailbox.trap = trap, the
 * entry's address). true with *answer = a private snapshot of Dom0's answer, which the caller
 * validates (xp_answer_taken), and *ret = ret_expect and ret_value of the answer (protocol.h,
 * "Return slots written by the module"; the caller takes ret_slot itself, with xp_ret_apply()
 * once the answer is taken); false when the hit was abandoned: the caller
 * resumes without Dom0. Timeouts count towards declaring Dom0 gone here.
 */
bool xp_exchange(struct xenprobes_mailbox *mb, u64 trap, const struct xenprobes_regs *hit,
		 struct xenprobes_regs *answer, struct xp_ret_request *ret)
{
	u64 top = 0;
	u32 seq = this_cpu_inc_return(xp_seq);
	u32 expected = XENPROBES_MBOX_HIT, seen, tries = 0, polling;
	u64 start, deadline, claim_deadline;
	enum xp_wait w;

	WRITE_ONCE(mb->seq, seq);
	WRITE_ONCE(mb->trap, trap);
	xp_mbox_store_regs(mb, hit);
	/* The return address a return probe's entry sees, so Dom0 need not map the stack. */
	if (!xp_read_kernel_u64(hit->rsp, &top))
		top = 0;
	WRITE_ONCE(mb->stack_top, top);
	WRITE_ONCE(mb->ret_slot, 0);
	smp_wmb();
	WRITE_ONCE(mb->state, XENPROBES_MBOX_HIT);
	/*
	 * Step 1 (protocol.h, "Spinning instead of notifying"): state = HIT, a full barrier, then
	 * load header.dom0_polling; notify only if it is 0. Dom0, when it stops polling, stores
	 * dom0_polling = 0, a full barrier, then looks at every mailbox once more. Each side
	 * stores, then loads the other's word, with a full barrier between, so the two loads
	 * cannot both miss the other's store: if ours did not see the clear (Dom0 still polls,
	 * or its clear is not visible yet), Dom0's look after the clear sees this HIT; if that
	 * look missed the HIT, our load saw the 0 and we notify. A nonzero value we read is
	 * never trusted further than that (xp_hit_notify()). The jump entry's synchronous hits
	 * come through here too.
	 */
	smp_mb();
	polling = READ_ONCE(xp.hdr->dom0_polling);
	xp_count(&xp.hits, &xp.hdr->hits);
	if (xp_hit_notify(polling))
		xp_notify_dom0();
	else
		xp_count(&xp.notify_skipped, &xp.hdr->notify_skipped);

	start = ktime_get_mono_fast_ns();
	deadline = start + (u64)xp.timeout_ms * NSEC_PER_MSEC;
	claim_deadline = start + xp.claim_bound_ms * NSEC_PER_MSEC;
	w = xp_wait(mb, seq, deadline, claim_deadline, true);
	/*
	 * Step 4: abandon by compare-and-swap only, so that an answer completed or a claim taken
	 * after our last check is honoured.
	 */
	while (w == XP_WAIT_TIMEOUT) {
		seen = cmpxchg(&mb->state, expected, XENPROBES_MBOX_ABANDONED);
		if (seen == expected) {
			if (expected == XENPROBES_MBOX_CLAIMED)
				atomic64_inc(&xp.claims_expired);	/* Dom0 died or hangs */
			break;
		}
		switch (xp_give_up_step(seen, READ_ONCE(mb->answer_seq), seq,
					ktime_get_mono_fast_ns() >= claim_deadline, tries++)) {
		case XP_GIVE_UP_ANSWERED:
			w = XP_WAIT_DONE;
			break;
		case XP_GIVE_UP_WAIT:
			/*
			 * Claimed at the last moment: Dom0 runs the handlers now. Past the
			 * deadline, no second spin: the hit already had its spin in step 2.
			 */
			w = xp_wait(mb, seq, deadline, claim_deadline, false);
			expected = XENPROBES_MBOX_HIT;
			break;
		case XP_GIVE_UP_SWAP:
			expected = seen;
			break;
		case XP_GIVE_UP_FORCE:
			WRITE_ONCE(mb->state, XENPROBES_MBOX_ABANDONED);
			goto abandoned;
		}
	}
	if (w == XP_WAIT_DONE) {
		smp_rmb();
		xp_regs_snapshot(answer, &mb->regs);
		ret->slot = 0;	/* taken later, by xp_ret_apply()'s exchange */
		ret->expect = READ_ONCE(mb->ret_expect);
		ret->value = READ_ONCE(mb->ret_value);
		WRITE_ONCE(mb->state, XENPROBES_MBOX_IDLE);
		xp_account_wait(start);
		return true;
	}
abandoned:
	xp_account_wait(start);
	if (!READ_ONCE(xp.detaching) && xp_dead_after(atomic_inc_return(&xp.consecutive)))
		xp_declare_dom0_gone(XP_GONE_TIMEOUTS);
	return false;
}

/*
 * Whether the caller may use Dom0's answer (a = its validation). An answer, usable or not,
 * ends a run of timeouts only when usable; an unusable one (Dom0 alive, answer wrong) is
 * counted and resumed without Dom0, but is no timeout in a row either.
 */
bool xp_answer_taken(enum xp_answer a)
{
	if (a == XP_ANSWER_OK) {
		atomic_set(&xp.consecutive, 0);
		return true;
	}
	atomic64_inc(&xp.bad_answers);
	return false;
}
