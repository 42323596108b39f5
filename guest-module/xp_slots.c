// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: may the module's slots (the OEA pool and the fixup slots, its own text) be
 * freed? The decision is xp_slots.h's; this file looks at every task's stack under
 * stop_machine() and waits, bounded, until none holds a slot's address (xp_main.c's detach and
 * unload call xp_slots_wait()).
 *
 * Why stop_machine(): a running task's saved stack pointer is stale and its stack changes
 * under the reader. In the stopper's callback every other CPU spins in its own stopper with
 * interrupts off, so every task but the stoppers is switched out: its saved stack pointer
 * (thread.sp, stored by __switch_to_asm) is where its live stack begins, and nothing writes
 * that stack while the callback reads it. The stoppers themselves (on_cpu) run
 * multi_cpu_stop(), never slot code (after the restore pass and the grace periods nothing
 * enters a slot, and a stopper has no slot frame: it runs only stop-work functions). The idle
 * tasks are not in the task list: each is switched out only from its own idle loop
 * (schedule_idle(), with preemption off), never in the middle of other code.
 */
#include <linux/delay.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/stop_machine.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <asm/unwind.h>

#include "xp_internal.h"
#include "xp_slots.h"

static bool xp_task_on_cpu(struct task_struct *t)
{
#ifdef CONFIG_SMP
	return READ_ONCE(t->on_cpu);
#else
	return t == current;
#endif
}

/* One switched-out task; *word gets the slot address found. */
static enum xp_stack xp_stack_check(struct task_struct *t, u64 lo, u64 hi, u64 *word)
{
	u64 base = (u64)(unsigned long)READ_ONCE(t->stack);
	u64 sp = (u64)READ_ONCE(t->thread.sp);
	u64 buf[64], first, n, i, k, j;

	/* A dead task's stack is released (tsk->stack = NULL): it never runs again. */
	if (!base)
		return XP_STACK_CLEAR;
	if (!xp_stack_live(base, THREAD_SIZE, sp, &first, &n))
		return XP_STACK_UNKNOWN;
	for (i = 0; i < n; i += k) {
		k = min_t(u64, n - i, ARRAY_SIZE(buf));
		if (copy_from_kernel_nofault(buf, (const void *)(unsigned long)(first + i * 8), k * 8))
			return XP_STACK_UNKNOWN;
		j = xp_slots_find(buf, k, lo, hi);
		if (j < k) {
			*word = buf[j];
			return XP_STACK_IN_SLOT;
		}
	}
	return XP_STACK_CLEAR;
}

/*
 * A switched-out task's frames, as the kernel's unwinder finds them: XP_STACK_IN_SLOT (*word =
 * the frame's address) at the first return address or interrupted ip in [lo, hi),
 * XP_STACK_CLEAR when the walk reaches the end of the stack without an error, else
 * XP_STACK_UNKNOWN. Only the ORC unwinder (Debian's) is trusted for this: it knows every
 * frame's size from objtool's tables, as the reliable stack traces livepatch relies on do.
 */
static enum xp_stack xp_stack_unwind(struct task_struct *t, u64 lo, u64 hi, u64 *word)
{
#ifdef CONFIG_UNWINDER_ORC
	struct unwind_state st;
	unsigned int frames = 0;
	unsigned long addr;

	for (unwind_start(&st, t, NULL, NULL); !unwind_done(&st); unwind_next_frame(&st)) {
		addr = unwind_get_return_address(&st);
		if (addr >= lo && addr < hi) {
			*word = addr;
			return XP_STACK_IN_SLOT;
		}
		if (++frames > THREAD_SIZE / 8)
			return XP_STACK_UNKNOWN;
	}
	return unwind_error(&st) ? XP_STACK_UNKNOWN : XP_STACK_CLEAR;
#else
	return XP_STACK_UNKNOWN;
#endif
}

/* The stop_machine() callback: every task but the stoppers is switched out. */
static int xp_slots_scan_stopped(void *arg)
{
	struct xp_slots_scan *s = arg;
	struct task_struct *g, *t;
	enum xp_stack why;
	u64 word = 0;

	rcu_read_lock();
	for_each_process_thread(g, t) {
		if (xp_task_on_cpu(t))
			continue;
		s->tasks++;
		why = xp_stack_check(t, s->lo, s->hi, &word);
		if (why == XP_STACK_IN_SLOT) {
			u64 frame = 0;
			enum xp_stack unwound = xp_stack_unwind(t, s->lo, s->hi, &frame);

			why = xp_stack_confirm(why, unwound);
			if (why == XP_STACK_CLEAR)
				s->stale++;
			else if (unwound == XP_STACK_IN_SLOT)
				word = frame;
		}
		if (why == XP_STACK_CLEAR)
			continue;
		if (!s->busy++) {
			s->pid = task_pid_nr(t);
			memcpy(s->comm, t->comm, sizeof(s->comm));
			s->comm[sizeof(s->comm) - 1] = 0;
			s->unknown = why == XP_STACK_UNKNOWN;
			s->word = s->unknown ? 0 : word;
		}
	}
	rcu_read_unlock();
	return 0;
}

enum xp_slots xp_slots_wait(unsigned int wait_ms, struct xp_slots_scan *s)
{
	unsigned long start = jiffies;
	unsigned long deadline = start + msecs_to_jiffies(min(wait_ms, XP_SLOT_WAIT_MAX_MS));
	unsigned int looks = 0;
	enum xp_slots r;

	for (;;) {
		memset(s, 0, sizeof(*s));
		s->lo = xp.bounds.oea.start;	/* the pool, then the fixup slots (xp_text.c) */
		s->hi = xp.bounds.oea.end;
		stop_machine(xp_slots_scan_stopped, s, NULL);
		looks++;
		r = xp_slots_look(s->busy, time_after_eq(jiffies, deadline));
		if (r != XP_SLOTS_WAIT)
			break;
		msleep(XP_SLOT_POLL_MS);
	}
	s->looks = looks;
	s->waited_ms = jiffies_to_msecs(jiffies - start);
	return r;
}
