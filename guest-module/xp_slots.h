/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobes: whether a task may still run code in the module's slots (the OEA pool, where Dom0
 * copies probed instructions and builds jump detours, and the fixup slots, where it copies the
 * instructions the kernel's exception table covers), a pure part of the guest module like
 * xp_release.h (all of it here, inline; the module's glue is xp_slots.c).
 *
 * The slots are the module's own text: rmmod frees them. After the detach's restore pass no
 * int3 or jump leads into them any more, but a task may still be on its way through one: an
 * interrupt or a preemption in an OEA copy, a page fault taken by a copy in a fixup slot that
 * sleeps (a uaccess copy of a page that must be read in, a userfaultfd region, a contended mmap
 * lock), a jump detour's call into the jump entry. Each of these leaves the slot's address on
 * the task's own kernel stack (the interrupted context's saved ip, the detour's return
 * address) for as long as the task may still come back to it. A voluntary context switch is no
 * proof (synchronize_rcu_tasks() takes it for one: a task sleeping in a fault taken in a slot
 * passes it), so the module looks at the stacks themselves: with every other CPU held in the
 * stop_machine() stopper, every task but the stoppers is switched out, and the live part of its
 * stack, from its saved stack pointer to the top, holds every frame it will return through. A
 * task none of whose live words lies in the slots never runs slot code again (nothing new
 * enters them); one with such a word may. Or the word is stale: the syscall entry's random
 * stack offset (RANDOMIZE_KSTACK_OFFSET) is an uninitialised gap inside the live part, which
 * may hold the saved ip of an int3 frame of an earlier syscall, one that did resume in a slot.
 * So a task whose words name a slot is asked again of the kernel's ORC unwinder, frame by frame
 * (return addresses and the interrupted ip of every exception frame): when it walks the whole
 * stack without an error and meets no slot, the word was stale (xp_stack_confirm()); an
 * unwinder error leaves the task counted. The module lets itself be unloaded only once no task
 * holds a slot.
 */
#ifndef XENPROBES_XP_SLOTS_H
#define XENPROBES_XP_SLOTS_H

#include <xenprobes/protocol.h>

#ifndef __KERNEL__
#include <stdbool.h>
#endif

/* slot_wait_ms: 0 (one look) .. this. */
#define XP_SLOT_WAIT_MAX_MS 60000u
#define XP_SLOT_WAIT_DEFAULT_MS 5000u
/* How often the module looks again while a task holds a slot (each look is a stop_machine()). */
#define XP_SLOT_POLL_MS 100u

/* One switched-out task's stack. */
enum xp_stack {
	XP_STACK_CLEAR,		/* no live word in the slots: it never returns there */
	XP_STACK_IN_SLOT,	/* a live word in the slots: it may return there */
	XP_STACK_UNKNOWN,	/* its saved stack pointer is not in its stack, or the stack unreadable */
};

/*
 * The live part of a switched-out task's stack [base, base + size): from its saved stack
 * pointer `sp` to the top, as `*words` 8-byte words from `*first`. False (nothing can be said)
 * when sp is not 8-byte aligned or lies outside the stack; sp == the top is an empty live part.
 */
static inline bool xp_stack_live(xenprobes_u64 base, xenprobes_u64 size, xenprobes_u64 sp, xenprobes_u64 *first,
				 xenprobes_u64 *words)
{
	if (!size || size % 8 || base % 8 || base + size < base)
		return false;
	if (sp % 8 || sp < base || sp > base + size)
		return false;
	*first = sp;
	*words = (base + size - sp) / 8;
	return true;
}

/* The index of the first of the n words in [lo, hi), or n when none is. */
static inline xenprobes_u64 xp_slots_find(const xenprobes_u64 *w, xenprobes_u64 n, xenprobes_u64 lo,
					  xenprobes_u64 hi)
{
	xenprobes_u64 i;

	for (i = 0; i < n; i++)
		if (w[i] >= lo && w[i] < hi)
			return i;
	return n;
}

/*
 * A task whose live words name a slot (`scan` XP_STACK_IN_SLOT), after the unwinder's walk
 * (`unwound`: XP_STACK_CLEAR = the whole stack walked without an error and no frame in the
 * slots; XP_STACK_IN_SLOT = a frame there; XP_STACK_UNKNOWN = an error, or no unwinder): only a
 * clean walk clears it. Nothing clears XP_STACK_UNKNOWN from the scan (a stack pointer outside
 * the stack: no walk from there is trusted either).
 */
static inline enum xp_stack xp_stack_confirm(enum xp_stack scan, enum xp_stack unwound)
{
	if (scan == XP_STACK_IN_SLOT && unwound == XP_STACK_CLEAR)
		return XP_STACK_CLEAR;
	return scan;
}

/* What a wait for the slots came to. */
enum xp_slots {
	XP_SLOTS_WAIT,		/* a task holds a slot: look again (until the deadline) */
	XP_SLOTS_CLEAR,		/* no task holds one: the module may be unloaded */
	XP_SLOTS_HELD,		/* still held at the deadline: the module stays loaded */
};

/*
 * One look: `busy` tasks were found holding a slot (XP_STACK_IN_SLOT or XP_STACK_UNKNOWN, both
 * counted: nothing unknown is taken for clear); `expired`: slot_wait_ms has passed since the
 * first look. Never WAIT once expired.
 */
static inline enum xp_slots xp_slots_look(unsigned int busy, bool expired)
{
	if (!busy)
		return XP_SLOTS_CLEAR;
	return expired ? XP_SLOTS_HELD : XP_SLOTS_WAIT;
}

/* For the detach and unload lines. */
static inline const char *xp_slots_name(enum xp_slots r)
{
	switch (r) {
	case XP_SLOTS_CLEAR:
		return "no task in them";
	case XP_SLOTS_HELD:
		return "a task may still return into them: the module stays loaded";
	case XP_SLOTS_WAIT:
		break;
	}
	return "still looking";
}

#endif /* XENPROBES_XP_SLOTS_H */
