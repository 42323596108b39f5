/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenprobesU: state shared by the module's kernel files.
 *
 *   xp_main.c     parameters, load/unload, detach, the control area, the rings, the OEA pool
 *   xp_xenstore.c xenstore publication, Dom0's requests (oea-request, quiesce-request)
 *   xp_hook.c     the int3 hook and the jump hit
 *   xp_exchange.c the mailbox exchange with Dom0 (a hit handed over, the wait, giving up)
 *   xp_jump.S     the jump entry a jump probe's detour calls (published as jump-entry)
 *   xp_xen.c      the event channel, Xen system time, SCHEDOP_poll waits
 *   xp_text.c     kernel text bounds, executable checks, writing trap bytes back
 *   xp_logic.c    the pure decisions (also unit-tested in userspace)
 *   xp_fallback.c the pure fallback: branch emulation, the return table (unit-tested too)
 *   xp_ring.c     the async rings' producer and the async jump hit (pure, unit-tested too)
 *   xp_slots.c    at unload: no task left on its way through a slot (xp_slots.h decides)
 *   xp_oea.S      the static OEA pool in the module's text
 */
#ifndef XENPROBES_XP_INTERNAL_H
#define XENPROBES_XP_INTERNAL_H

#include <linux/atomic.h>
#include <linux/irq_work.h>
#include <linux/linkage.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/types.h>
#include <linux/workqueue.h>
#include <xen/interface/event_channel.h>

#include "xp_fixup.h"
#include "xp_logic.h"
#include "xp_ret_write.h"
#include "xp_ring.h"
#include "xp_slots.h"

#define XP_NAME "xenprobes"

/* Size of the static OEA pool in bytes (Kbuild passes it; see xp_oea.S). */
#ifndef XP_OEA_POOL_SIZE
#error "XP_OEA_POOL_SIZE must be defined by the build"
#endif

extern const u8 xp_oea_pool[];
extern const u8 xp_fixup_slots[];	/* XP_FIXUP_SLOTS * 32 bytes, right after the pool (xp_oea.S) */
/* The jump entry (xp_jump.S): code, but never called from C (its own calling convention). */
extern const u8 xp_jump_entry[];

/* Why the module stopped handing hits to Dom0 (xp.gone_reason). */
enum xp_gone_reason {
	XP_GONE_NOT = 0,
	XP_GONE_TIMEOUTS,	/* XENPROBES_DEAD_AFTER consecutive timeouts */
	XP_GONE_RESUMED,	/* the domain was saved/restored or migrated */
};

struct xp_state {
	/* The control area (alloc_pages_exact, zeroed, page aligned). */
	void *ctl;
	size_t ctl_bytes;
	struct xp_layout layout;
	struct xenprobes_ctl_header *hdr;
	struct xenprobes_mailbox *mbox;
	struct xenprobes_trap *traps;
	struct xenprobes_ret *rets;
	/*
	 * The module's own copies of what it wrote into the header: Dom0 can overwrite the
	 * shared header, so the hook never reads these back from there.
	 */
	u32 nr_mailboxes;
	u32 trap_cap;
	u32 ret_cap;
	u32 timeout_ms;
	u64 claim_bound_ms;	/* xp_claim_bound_ms(timeout_ms) */
	u32 spin_us;		/* step 2's spin bound (0: never spin; xp_spin_us_ok()) */
	u64 budget_ns;		/* each CPU's waiting budget (xp_budget.h; 0: none) */

	/*
	 * The async rings (protocol.h, "Async jump probes"): one vzalloc'd, page-aligned block of
	 * ring_count rings of ring_stride bytes (ring v at ring_mem + v * ring_stride, v the Xen
	 * vCPU id), published as rings/addr, rings/count and rings/order; rings holds the
	 * producer's private state of each (xp_ring.h), which Dom0 cannot write. ring_count 0: no
	 * rings (ring_order=0).
	 */
	void *ring_mem;
	struct xp_ring *rings;
	u32 ring_count;
	u32 ring_order;
	u64 ring_stride;

	/* The unbound port for Dom0 and the irq it is bound to in this guest. */
	evtchn_port_t port;
	int irq;

	/* Where the guest may resume, what may be patched (xp_text.c). */
	struct xp_bounds bounds;
	/*
	 * The same ranges for a nested hit's fallback (xp_hook.c, "Nesting"): is_exec walks the
	 * page tables (lookup_address()) only for an address outside kernel text and the OEA.
	 */
	struct xp_bounds nested_bounds;
	unsigned long ktext;	/* _text */

	/* Liveness of Dom0. */
	atomic_t consecutive;	/* timeouts in a row */
	atomic_t dom0_gone;	/* 0, or an enum xp_gone_reason */
	bool detaching;		/* READ_ONCE/WRITE_ONCE: hits stop going to Dom0 */

	/* Counters mirrored into the header (Dom0 reports them). */
	atomic64_t hits;
	atomic64_t timeouts;
	atomic64_t foreign;
	atomic64_t nested;	/* jump hits inside the hook or another jump hit: no Dom0 */
	atomic64_t async_bad;	/* async jump hits whose key, specs or vCPU broke a rule: no record */
	atomic64_t redirects;	/* int3s at a jump's region sent to its detour (module-private) */
	atomic64_t bad_answers;	/* answers refused by xp_answer_apply (module-private) */
	atomic64_t no_fallback;	/* hits with no usable fallback (module-private) */
	atomic64_t claims_expired; /* claimed hits abandoned at the claim bound (module-private) */
	/*
	 * Spinning instead of notifying (protocol.h): hits that skipped the notification because
	 * Dom0 said it was polling (mirrored into the header's notify_skipped), spins that found
	 * the answer, and spins that ran out their spin_us unanswered (the vCPU then blocked as
	 * without spinning; these two module-private).
	 */
	atomic64_t notify_skipped;
	/* Waits for Dom0 in the hook (protocol.h, header.wait_ns and wait_max_ns), in ns. */
	atomic64_t wait_ns;
	atomic64_t wait_max_ns;
	/* Hits resumed without Dom0 for their CPU's spent budget (header.over_budget). */
	atomic64_t over_budget;
	atomic64_t spin_answered;
	atomic64_t spin_blocked;
	/*
	 * Return slots written for Dom0 (protocol.h, "Return slots written by the module";
	 * module-private) and the writes refused (mirrored into header.ret_refused, a u32).
	 */
	atomic64_t ret_written;
	atomic64_t ret_refused;
	/*
	 * int3s executed at a trap-table address outside the OEA whose byte was no longer an
	 * int3 when the hook read it (module-private): the CPU ran an instruction fetched before
	 * the byte was restored. Counted, then handled like any hit of the entry (once Dom0 is
	 * gone: its fallback, which runs the original instruction). stale_first: the first such
	 * address.
	 */
	atomic64_t stale;
	u64 stale_first;
	/*
	 * Hits after the module restored the text once Dom0 was gone (module-private): at a
	 * text address still holding an int3, and in the OEA (calls in flight at the restore).
	 */
	bool text_restored;	/* READ_ONCE/WRITE_ONCE */
	atomic64_t late_text;
	atomic64_t late_oea;

	/* Declaring Dom0 gone from the int3 hook: irq_work, then a work item. */
	struct irq_work gone_irq_work;
	struct work_struct disarm_work;
	struct work_struct quiesce_work;
	struct workqueue_struct *wq;

	/* The OEA pool, carved into published areas; oea_lock serialises growth. */
	struct mutex oea_lock;
	struct xp_oea_pool oea;
};

extern struct xp_state xp;

/* Counts in c and mirrors the count into the header's field (xp_hook.c, xp_exchange.c). */
static inline void xp_count(atomic64_t *c, xenprobes_u64 *field)
{
	/* Dom0 may overwrite the shared copy; the private counter stays right. */
	WRITE_ONCE(*field, (xenprobes_u64)atomic64_inc_return(c));
}

/* xp_hook.c */
void xp_hook_init(void);
int xp_hook_register(void);
void xp_hook_unregister(void);
void xp_declare_dom0_gone(enum xp_gone_reason why);
struct pt_regs;
asmlinkage void xp_jump_hit(struct pt_regs *regs, u64 ret);	/* called by xp_jump_entry */

/* xp_exchange.c */
bool xp_exchange(struct xenprobes_mailbox *mb, u64 trap, const struct xenprobes_regs *hit,
		 struct xenprobes_regs *answer, struct xp_ret_request *ret);
bool xp_answer_taken(enum xp_answer a);
bool xp_over_budget(void);

/* xp_xenstore.c */
int xp_publish(void);
void xp_watches_unregister(void);
void xp_quiesce(void);
void xp_quiesce_work(struct work_struct *w);

/* xp_xen.c */
int xp_evtchn_open(void);
void xp_evtchn_close(void);
void xp_clock_init(void);
void xp_clock_exit(void);
const char *xp_clock_name(void);
void xp_poll_for(u64 ns);
bool xp_evtchn_bound(void);
void xp_notify_dom0(void);
int xp_resume_watch_register(void);
void xp_resume_watch_unregister(void);

/* xp_text.c */
int xp_text_init(unsigned long kernel_text_param);
bool xp_is_exec(void *ctx, u64 addr);
bool xp_is_exec_nested(void *ctx, u64 addr);
void xp_module_text(unsigned long *start, unsigned long *end);
bool xp_read_kernel_u64(u64 addr, u64 *val);
bool xp_write_kernel_u64(u64 addr, u64 val);
unsigned int xp_restore_traps(void);
/* After xp_restore_traps() and a quiescence: the short jumps' islands (xp_text.c). */
unsigned int xp_restore_islands(void);
unsigned int xp_repair_return_slots(void);

/* xp_slots.c: what the last look at the tasks' stacks found. */
struct xp_slots_scan {
	u64 lo, hi;		/* the slots: the OEA pool and the fixup slots */
	unsigned int tasks;	/* switched-out tasks looked at */
	unsigned int busy;	/* of them, holding a slot's address or not readable */
	unsigned int stale;	/* a slot's address in a live word but in no frame (xp_slots.h) */
	pid_t pid;		/* the first of them */
	char comm[TASK_COMM_LEN];
	bool unknown;		/* its stack could not be read */
	u64 word;		/* the slot address on its stack */
	unsigned int looks, waited_ms;
};
enum xp_slots xp_slots_wait(unsigned int wait_ms, struct xp_slots_scan *s);

/* xp_modules.c */
int xp_modules_watch(void);
void xp_modules_unwatch(void);
void xp_modules_lock(void);
void xp_modules_unlock(void);
bool xp_module_went(const struct xenprobes_trap *e);

#endif /* XENPROBES_XP_INTERNAL_H */
