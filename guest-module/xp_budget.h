/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobes: how long one CPU may wait for Dom0 between two of its context switches, a pure
 * part of the guest module like xp_logic.h (all of it here, inline; the module's glue is in
 * xp_hook.c and xp_exchange.c, the simulated module's in SimHostImpl).
 *
 * A hit waits for Dom0 with interrupts off, each wait bounded (timeout_ms, or the claim bound
 * once Dom0 claimed it). What no single bound limits is their sum while the CPU cannot
 * schedule: many hits inside one lock-held region, or in a kernel loop with no preemption
 * point, each answered but slowly (a starved Dom0), add up until the kernel's watchdogs see a
 * CPU that did not schedule (soft lockup after 2 x watchdog_thresh = 20 s by default) or did
 * not pass a quiescent state (RCU stall after 21 s), and the CPUs spinning on that lock with
 * it. So each CPU keeps the sum of its waits since its last context switch; past the budget,
 * its hits resume without Dom0 (the fallback, as after a timeout) and are counted
 * (header.over_budget) until the CPU switches. Between two context switches a CPU then waits
 * for Dom0 at most the budget plus one hit's bound (protocol.h "Waiting budget").
 *
 * "Switched" is read from what the kernel keeps anyway: the task running on the CPU and that
 * task's context-switch count (nvcsw + nivcsw, which __schedule() raises for the task it
 * switches away from). Another task, or the same one with another count, means the CPU
 * scheduled since the last charge. A busy loop that returns to user space still switches at
 * least when the soft-lockup watchdog's stopper thread runs on its CPU (every 4 s by default),
 * so the budget of a healthy workload refills; one that never switches is the case above.
 */
#ifndef XENPROBES_XP_BUDGET_H
#define XENPROBES_XP_BUDGET_H

#include <xenprobes/protocol.h>

#ifndef __KERNEL__
#include <stdbool.h>
#endif

/* One CPU's waits since it last switched (per CPU in the module, per vCPU in the sim). */
struct xp_budget {
	xenprobes_u64 task;	/* the running task at the last look (its address: an identity) */
	xenprobes_u64 switches;	/* that task's context-switch count then */
	xenprobes_u64 spent_ns;	/* waits for Dom0 charged since */
};

/*
 * A hit on this CPU, before it waits: the running task and its switch count now. Anything
 * other than what the last look saw starts the sum again.
 */
static inline void xp_budget_look(struct xp_budget *b, xenprobes_u64 task, xenprobes_u64 switches)
{
	if (b->task != task || b->switches != switches) {
		b->task = task;
		b->switches = switches;
		b->spent_ns = 0;
	}
}

/* May this hit wait for Dom0 (budget_ns 0: no budget)? */
static inline bool xp_budget_allows(const struct xp_budget *b, xenprobes_u64 budget_ns)
{
	return budget_ns == 0 || b->spent_ns < budget_ns;
}

/* A wait for Dom0 on this CPU is over, after waited_ns: into the sum (saturating). */
static inline void xp_budget_charge(struct xp_budget *b, xenprobes_u64 waited_ns)
{
	xenprobes_u64 s = b->spent_ns + waited_ns;

	b->spent_ns = s < b->spent_ns ? ~(xenprobes_u64)0 : s;
}

#endif /* XENPROBES_XP_BUDGET_H */
