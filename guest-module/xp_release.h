/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobes: whether the module may free the pages Dom0 maps (the control area, the async
 * rings) when it detaches, a pure part of the guest module like xp_budget.h (all of it here,
 * inline; the module's glue is xp_release_wait() in xp_main.c, the simulated module's in
 * SimHostImpl::module_unload). The protocol is protocol.h "Letting go".
 *
 * After its restore pass the module looks, again and again until it is decided: first
 * whether its event channel is bound by a Dom0 process, then (after a full barrier) the
 * header's dom0_hold. A Dom0 that ever held the areas (dom0_hold MAPPED, or the port bound:
 * an older Dom0 binds it and never writes dom0_hold) must store RELEASED before anything is
 * freed; one that closes its port without it (killed, or an older one) never will, and the
 * pages are kept (never freed: still the guest's memory, unused). The wait is bounded by the
 * module parameter release_wait_ms.
 */
#ifndef XENPROBES_XP_RELEASE_H
#define XENPROBES_XP_RELEASE_H

#include <xenprobes/protocol.h>

#ifndef __KERNEL__
#include <stdbool.h>
#endif

/* release_wait_ms: 0 (keep at once whenever a Dom0 holds the areas) .. this. */
#define XP_RELEASE_WAIT_MAX_MS 60000u
#define XP_RELEASE_WAIT_DEFAULT_MS 5000u
/* How often the module looks again while it waits. */
#define XP_RELEASE_POLL_MS 10u

enum xp_release {
	XP_RELEASE_WAIT,	/* a Dom0 holds the areas: look again (until the deadline) */
	XP_RELEASE_NONE,	/* no Dom0 held them: free */
	XP_RELEASE_RELEASED,	/* Dom0 stored RELEASED: free */
	XP_RELEASE_KILLED,	/* the port was closed without RELEASED: keep */
	XP_RELEASE_TIMEOUT,	/* no RELEASED within release_wait_ms: keep */
};

/* What the looks so far saw (zeroed before the first). */
struct xp_release_state {
	bool held;		/* a Dom0 held the areas at some look */
};

/*
 * One look: `bound` (the port's status, read first) and `hold` (header.dom0_hold, read after
 * a full barrier); `expired`: release_wait_ms has passed since the first look. Never WAIT
 * once expired.
 */
static inline enum xp_release xp_release_look(struct xp_release_state *st, bool bound, xenprobes_u32 hold,
					      bool expired)
{
	if (hold == XENPROBES_DOM0_RELEASED)
		return XP_RELEASE_RELEASED;
	if (bound || hold == XENPROBES_DOM0_MAPPED)
		st->held = true;
	if (!st->held)
		return XP_RELEASE_NONE;
	if (!bound)
		return XP_RELEASE_KILLED;
	return expired ? XP_RELEASE_TIMEOUT : XP_RELEASE_WAIT;
}

/* May the pages Dom0 maps be freed after this outcome? */
static inline bool xp_release_frees(enum xp_release r)
{
	return r == XP_RELEASE_NONE || r == XP_RELEASE_RELEASED;
}

/* For the unload line and dmesg. */
static inline const char *xp_release_name(enum xp_release r)
{
	switch (r) {
	case XP_RELEASE_NONE:
		return "no Dom0 held them: freed";
	case XP_RELEASE_RELEASED:
		return "Dom0 released them: freed";
	case XP_RELEASE_KILLED:
		return "Dom0 closed its port without releasing them (killed?): kept, not freed";
	case XP_RELEASE_TIMEOUT:
		return "Dom0 did not release them within release_wait_ms: kept, not freed";
	case XP_RELEASE_WAIT:
		break;
	}
	return "still waiting for Dom0";
}

#endif /* XENPROBES_XP_RELEASE_H */
