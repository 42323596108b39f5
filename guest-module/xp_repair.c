// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: before the OEA (the module's text) goes away, every live return-probe instance
 * whose stack slot still holds a trampoline address gets its real return address back
 * (moved out of xp_text.c as it was).
 */
#include <linux/kernel.h>
#include <linux/rcupdate.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/stop_machine.h>

#include "xp_internal.h"

#define XP_MAX_TRAMPOLINES 16

struct xp_repair {
	u64 tramp[XP_MAX_TRAMPOLINES];
	unsigned int nr_tramp;
	unsigned int repaired;
};

static bool xp_in_some_task_stack(u64 slot)
{
	struct task_struct *g, *t;
	bool found = false;

	rcu_read_lock();
	for_each_process_thread(g, t) {
		unsigned long lo = (unsigned long)READ_ONCE(t->stack);

		if (lo && slot >= lo && slot + 8 <= lo + THREAD_SIZE) {
			found = true;
			break;
		}
	}
	rcu_read_unlock();
	return found;
}

/* Runs with every other CPU stopped: no stack frame can change under us. */
static int xp_repair_stopped(void *arg)
{
	struct xp_repair *rp = arg;
	u32 i;

	for (i = 0; i < xp.ret_cap; i++) {
		u64 slot = xp_ld64(&xp.rets[i].slot);
		u64 ret = xp_ld64(&xp.rets[i].ret);
		u64 cur;
		unsigned int k;

		if (!slot || !xp_resume_ok(&xp.bounds, ret) || !xp_in_some_task_stack(slot))
			continue;
		if (!xp_read_kernel_u64(slot, &cur))
			continue;
		for (k = 0; k < rp->nr_tramp; k++) {
			if (cur != rp->tramp[k])
				continue;
			/*
			 * The entry stays: a task that already popped the slot is about to
			 * trap at the trampoline and needs it for the fallback.
			 */
			if (xp_write_kernel_u64(slot, ret))
				rp->repaired++;
			break;
		}
	}
	return 0;
}

/*
 * Before the OEA (the module's text) goes away: every live return-probe instance whose
 * stack slot still holds a trampoline address gets its real return address back, so no
 * function returns into freed memory. Only slots inside some task's stack are written.
 */
unsigned int xp_repair_return_slots(void)
{
	struct xp_repair rp = { .nr_tramp = 0 };
	u32 n = xp_live_traps(READ_ONCE(xp.hdr->nr_traps), xp.trap_cap);
	u32 i;

	if (!xp.ret_cap)
		return 0;
	for (i = 0; i < n && rp.nr_tramp < XP_MAX_TRAMPOLINES; i++) {
		struct xenprobes_trap e;

		xp_trap_snapshot(&e, &xp.traps[i]);
		if (e.flags == XENPROBES_TRAP_RETURN &&
		    xp_addr_classify(&xp.bounds, e.addr) == XP_ADDR_OEA)
			rp.tramp[rp.nr_tramp++] = e.addr;
	}
	if (!rp.nr_tramp)
		return 0;
	stop_machine(xp_repair_stopped, &rp, NULL);
	return rp.repaired;
}
