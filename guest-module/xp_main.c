// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: the guest module of libxenprobes.
 *
 * It owns no probing policy: it publishes, under data/xenprobes in the domain's xenstore
 * home, what Dom0 needs (include/xenprobes/protocol.h is the contract), provides the OEA
 * (executable memory near kernel text), the control area (mailboxes, trap table, return
 * table), an event channel to Dom0 and the int3 hook, grows the OEA and quiesces on Dom0's
 * request, and resumes the guest on its own when Dom0 does not answer.
 *
 * Unload policy: the module holds a reference on itself once it is published, so `rmmod`
 * is refused while Dom0 may have traps, slots or return trampolines pointing into it.
 * `echo 1 > /sys/module/xenprobes/parameters/detach` disarms first (Dom0 is told by the
 * removal of `state`; trap bytes and jump regions are written back; live return-probe slots
 * get their real return addresses back; every CPU is out of the hook and the jump entry), then
 * drops the reference once no task's stack holds an address in the slots (xp_slots.c: a task
 * sleeping in a fault taken in a fixup slot comes back to it; the detach then fails with EBUSY
 * and the module stays loaded, disarmed: write 1 again later); `rmmod` then succeeds. See
 * README.md.
 */
#include <linux/delay.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/vmalloc.h>
#include <xen/xen.h>
#include <xen/xenbus.h>

#include "xp_internal.h"
#include "xp_release.h"

struct xp_state xp;

/* ---- parameters ---- */

static unsigned int oea_size = 128 * 1024;
module_param(oea_size, uint, 0444);
MODULE_PARM_DESC(oea_size, "Bytes of the first OEA area, rounded up to pages "
		 "(the static pool holds " __stringify(XP_OEA_POOL_SIZE) " bytes for all areas)");

static unsigned int trap_capacity = 1024;
module_param(trap_capacity, uint, 0444);
MODULE_PARM_DESC(trap_capacity, "Entries of the trap table");

static unsigned int ret_capacity = 256;
module_param(ret_capacity, uint, 0444);
MODULE_PARM_DESC(ret_capacity, "Entries of the return table (live return-probe instances)");

#define XP_TIMEOUT_MAX_MS 5000
static unsigned int timeout_ms = 500;
module_param(timeout_ms, uint, 0444);
MODULE_PARM_DESC(timeout_ms, "How long a hit waits for Dom0 to claim it (1.." __stringify(XP_TIMEOUT_MAX_MS)
		 " ms, the vCPU waits with interrupts off). A claimed hit waits up to "
		 "min(20 x timeout_ms, 10000 ms) in all");

/*
 * Each CPU's waiting budget (protocol.h, "Waiting budget"; xp_budget.h): what its hits may
 * wait for Dom0 in all between two of its context switches. With the claim bound on top it
 * keeps a CPU that cannot schedule under the kernel's soft-lockup and RCU-stall reports.
 */
#define XP_WAIT_BUDGET_MAX_MS 10000
static unsigned int wait_budget_ms = 5000;
module_param(wait_budget_ms, uint, 0444);
MODULE_PARM_DESC(wait_budget_ms, "How long one CPU's hits may wait for Dom0 in all between two of its "
		 "context switches (0 = no bound .. " __stringify(XP_WAIT_BUDGET_MAX_MS) " ms); past it, "
		 "its hits resume without Dom0 until it switches");

/*
 * Step 2's spin (protocol.h, "Spinning instead of notifying"). Off by default: the vCPU spins
 * with interrupts off, burning its time slice, and it pays only against a Dom0 that answers
 * within the spin (see README.md).
 */
static unsigned int spin_us;
module_param(spin_us, uint, 0444);
MODULE_PARM_DESC(spin_us, "How long a hit's vCPU spins on its mailbox before it blocks in Xen "
		 "(0 = never, the default, .. " __stringify(XP_SPIN_MAX_US) " us, with interrupts "
		 "off). While it spins Dom0 need not notify the answer");

/* BUILD_BUG_ON in xp_rings_alloc() keeps the bounds in the description right. */
static unsigned int ring_order = 16;
module_param(ring_order, uint, 0444);
MODULE_PARM_DESC(ring_order, "Async ring of each vCPU: 2^ring_order bytes of records (12..24, "
		 "default 16 = 64 KiB), or 0: no rings and no async jump probes");

/*
 * How long the detach waits for a Dom0 that holds the control area and the rings to let go
 * (protocol.h "Letting go", xp_release.h); without its word by then they are kept, not freed.
 */
static unsigned int release_wait_ms = XP_RELEASE_WAIT_DEFAULT_MS;
module_param(release_wait_ms, uint, 0444);
MODULE_PARM_DESC(release_wait_ms, "How long detaching waits for a Dom0 that maps the control area and the "
		 "rings to release them (0 .. " __stringify(XP_RELEASE_WAIT_MAX_MS) " ms, default "
		 __stringify(XP_RELEASE_WAIT_DEFAULT_MS) "); without its release they are kept, never freed");

/*
 * How long the detach waits for the last task on its way through a slot (xp_slots.h); still
 * one then: the detach fails (EBUSY) and the module stays loaded.
 */
static unsigned int slot_wait_ms = XP_SLOT_WAIT_DEFAULT_MS;
module_param(slot_wait_ms, uint, 0444);
MODULE_PARM_DESC(slot_wait_ms, "How long detaching waits for tasks still on their way through the OEA or the "
		 "fixup slots (0 .. " __stringify(XP_SLOT_WAIT_MAX_MS) " ms, default "
		 __stringify(XP_SLOT_WAIT_DEFAULT_MS) "); past it the detach fails with EBUSY and the module stays loaded");

static unsigned long kernel_text;
module_param(kernel_text, ulong, 0444);
MODULE_PARM_DESC(kernel_text, "The kernel's _text (0 = find it, else it is checked)");

static DEFINE_MUTEX(xp_detach_lock);
static bool xp_detached;	/* the self reference was dropped */
static bool xp_disarmed;	/* xp_disarm_all() ran */
/* What the last look at the tasks' stacks found (xp_slots.h). */
static enum xp_slots xp_slots_found = XP_SLOTS_WAIT;
static struct xp_slots_scan xp_slots_last;
static bool xp_loaded;		/* module_init completed */
/* What detaching found of Dom0's hold on the control area and the rings (xp_release.h). */
static enum xp_release xp_released = XP_RELEASE_NONE;
static unsigned int xp_release_waited_ms;

static int xp_detach(void);

static int xp_detach_set(const char *val, const struct kernel_param *kp)
{
	bool v;
	int err = kstrtobool(val, &v);

	if (err)
		return err;
	if (!v)
		return -EINVAL;		/* there is no re-attach: reload the module */
	if (!READ_ONCE(xp_loaded))
		return -EINVAL;		/* not as a load-time parameter */
	return xp_detach();
}

static const struct kernel_param_ops xp_detach_ops = {
	.set = xp_detach_set,
	.get = param_get_bool,
};
module_param_cb(detach, &xp_detach_ops, &xp_detached, 0600);
MODULE_PARM_DESC(detach, "Write 1 to disarm and allow rmmod (reads 1 once detached)");

/* ---- the control area and the OEA ---- */

static int xp_ctl_alloc(void)
{
	int err;

	xp.nr_mailboxes = num_possible_cpus();
	xp.trap_cap = trap_capacity;
	xp.ret_cap = ret_capacity;
	xp.timeout_ms = timeout_ms;
	xp.claim_bound_ms = xp_claim_bound_ms(timeout_ms);
	xp.spin_us = spin_us;
	xp.budget_ns = (u64)wait_budget_ms * NSEC_PER_MSEC;
	err = xp_layout_compute(xp.nr_mailboxes, xp.trap_cap, xp.ret_cap, &xp.layout);
	if (err) {
		pr_err(XP_NAME ": %u mailboxes, %u traps and %u returns do not fit in %u pages\n",
		       xp.nr_mailboxes, xp.trap_cap, xp.ret_cap, XENPROBES_CTL_MAX_PAGES);
		return err;
	}
	xp.ctl_bytes = (size_t)xp.layout.pages * PAGE_SIZE;
	xp.ctl = alloc_pages_exact(xp.ctl_bytes, GFP_KERNEL | __GFP_ZERO);
	if (!xp.ctl)
		return -ENOMEM;
	xp.hdr = xp.ctl;
	xp.mbox = xp.ctl + xp.layout.mailbox_offset;
	xp.traps = xp.ctl + xp.layout.trap_offset;
	xp.rets = xp.ret_cap ? xp.ctl + xp.layout.ret_offset : NULL;
	xp_header_init(xp.hdr, xp.nr_mailboxes, &xp.layout, xp.trap_cap, xp.ret_cap,
		       xp.timeout_ms);
	return 0;
}

/* Kept (not freed) when a Dom0 may still write it (protocol.h "Letting go"). */
static void xp_ctl_free(void)
{
	if (xp.ctl && xp_release_frees(xp_released))
		free_pages_exact(xp.ctl, xp.ctl_bytes);
	xp.ctl = NULL;
	xp.hdr = NULL;
}

/*
 * The async rings: one per mailbox (ring v for the vCPU whose Xen id is v), in one zeroed,
 * page-aligned vmalloc block that stays mapped and writable until unload (Dom0 maps it through
 * the guest's page tables). Nothing with ring_order=0: async entries then count as async_bad.
 */
static int xp_rings_alloc(void)
{
	u64 stride, total;
	u32 v;

	BUILD_BUG_ON(XENPROBES_RING_MIN_ORDER != 12 || XENPROBES_RING_MAX_ORDER != 24);
	BUILD_BUG_ON(XENPROBES_RING_DATA_OFFSET % PAGE_SIZE);
	if (!ring_order)
		return 0;
	if (xp_rings_size(xp.nr_mailboxes, ring_order, &stride, &total))
		return -EINVAL;		/* ring_order was checked at load: not reached */
	xp.rings = kcalloc(xp.nr_mailboxes, sizeof(*xp.rings), GFP_KERNEL);
	xp.ring_mem = vzalloc(total);
	if (!xp.rings || !xp.ring_mem || !PAGE_ALIGNED(xp.ring_mem)) {
		pr_err(XP_NAME ": ring_order=%u: no memory for %u rings of %llu bytes (%llu in all); load with a lower ring_order, or 0 for none\n",
		       ring_order, xp.nr_mailboxes, stride, total);
		return -ENOMEM;
	}
	for (v = 0; v < xp.nr_mailboxes; v++)
		if (xp_ring_init(&xp.rings[v], (u8 *)xp.ring_mem + v * stride, ring_order, v))
			return -EINVAL;	/* the order was checked: not reached */
	xp.ring_stride = stride;
	xp.ring_order = ring_order;
	xp.ring_count = xp.nr_mailboxes;
	return 0;
}

/*
 * Only once no CPU can be in the jump entry any more (the end of xp_teardown()). The ring
 * block is kept (not freed) when a Dom0 may still write it; the private copies always go.
 */
static void xp_rings_free(void)
{
	WRITE_ONCE(xp.ring_count, 0);
	if (xp_release_frees(xp_released))
		vfree(xp.ring_mem);
	xp.ring_mem = NULL;
	kfree(xp.rings);
	xp.rings = NULL;
}

/* The rings' own counters (the private copies), summed for the unload line. */
static void xp_rings_totals(u64 *drops, u64 *nested, u64 *notifies)
{
	u32 v;

	*drops = *nested = *notifies = 0;
	for (v = 0; v < xp.ring_count; v++) {
		*drops += READ_ONCE(xp.rings[v].drops);
		*nested += READ_ONCE(xp.rings[v].nested);
		*notifies += READ_ONCE(xp.rings[v].notifies);
	}
}

static int xp_oea_init(void)
{
	u64 first = PAGE_ALIGN((u64)oea_size), addr;
	enum xp_oea_result r;

	xp.oea.base = (unsigned long)xp_oea_pool;
	xp.oea.size = XP_OEA_POOL_SIZE;
	r = xp_oea_take(&xp.oea, first, &addr);
	if (r != XP_OEA_OK) {
		pr_err(XP_NAME ": oea_size=%u: %s\n", oea_size, xp_oea_reason(r));
		return -EINVAL;
	}
	return 0;
}

/* ---- detach and unload ---- */

/*
 * protocol.h "Letting go": after the restore pass, may the control area and the rings be
 * freed? Waits up to release_wait_ms for a Dom0 that holds them; process context.
 */
static enum xp_release xp_release_wait(void)
{
	struct xp_release_state st = { .held = false };
	unsigned long start = jiffies;
	unsigned long deadline = start + msecs_to_jiffies(min(release_wait_ms, XP_RELEASE_WAIT_MAX_MS));
	enum xp_release r;
	bool bound;

	for (;;) {
		bound = xp_evtchn_bound();	/* first: Dom0 stores RELEASED before it unbinds */
		smp_mb();
		r = xp_release_look(&st, bound, READ_ONCE(xp.hdr->dom0_hold), time_after_eq(jiffies, deadline));
		if (r != XP_RELEASE_WAIT)
			break;
		msleep(XP_RELEASE_POLL_MS);
	}
	xp_release_waited_ms = jiffies_to_msecs(jiffies - start);
	return r;
}

/* Steps 1-5 of detaching (see the top of this file); idempotent, process context. */
static void xp_disarm_all(void)
{
	unsigned int restored, repaired;

	/*
	 * protocol.h "Detaching": closing first, then a full barrier, so that Dom0, which reads it
	 * with the domain paused before it adds a trap, either added it before this store (the
	 * restore pass below sees the entry) or sees the store and adds nothing.
	 */
	WRITE_ONCE(xp.hdr->closing, 1);
	smp_mb();
	WRITE_ONCE(xp.detaching, true);		/* hits stop going to Dom0; waiters give up */
	xenbus_rm(XBT_NIL, XENPROBES_XS_DIR, XENPROBES_XS_STATE);
	xp_watches_unregister();
	flush_workqueue(xp.wq);
	restored = xp_restore_traps();
	repaired = xp_repair_return_slots();
	xp_quiesce();
	restored += xp_restore_islands();	/* after the quiescence (protocol.h) */
	/* closing and its barrier came first: a Dom0 attaching after them stores no MAPPED. */
	xp_released = xp_release_wait();
	pr_info(XP_NAME ": detached: restored %u trap bytes and jump regions, repaired %u return slots; control area and rings: %s (after %u ms)\n",
		restored, repaired, xp_release_name(xp_released), xp_release_waited_ms);
	if (!xp_release_frees(xp_released))
		pr_warn(XP_NAME ": keeping the control area (%u pages at 0x%lx) and the rings (%u of them at 0x%lx) for good: a Dom0 that mapped them did not say it stopped writing (protocol.h \"Letting go\"); they are never freed, so no late write of Dom0 can land in reused memory\n",
			xp.layout.pages, (unsigned long)xp.ctl, xp.ring_count, (unsigned long)xp.ring_mem);
}

/*
 * After the restore pass: waits up to slot_wait_ms for no task to hold a slot's address
 * (xp_slots.c); 0 when none does, -EBUSY (and the module stays) when one still may come back.
 */
static int xp_slots_settle(unsigned int wait_ms)
{
	struct xp_slots_scan *s = &xp_slots_last;

	xp_slots_found = xp_slots_wait(wait_ms, s);
	if (xp_slots_found == XP_SLOTS_CLEAR) {
		pr_info(XP_NAME ": slots: %s (%u tasks looked at, %u with a stale slot address in no frame; %u looks, after %u ms)\n",
			xp_slots_name(xp_slots_found), s->tasks, s->stale, s->looks, s->waited_ms);
		return 0;
	}
	if (s->unknown)
		pr_warn(XP_NAME ": slots: %u of %u tasks may still return into the OEA or the fixup slots [0x%llx, 0x%llx) after %u ms: the first, pid %d (%s), has a stack the module cannot read; the module stays loaded: write 1 to detach again later\n",
			s->busy, s->tasks, s->lo, s->hi, s->waited_ms, s->pid, s->comm);
	else
		pr_warn(XP_NAME ": slots: %u of %u tasks may still return into the OEA or the fixup slots [0x%llx, 0x%llx) after %u ms: the first, pid %d (%s), holds 0x%llx on its stack (sleeping in a fault taken in a slot?); the module stays loaded: write 1 to detach again later\n",
			s->busy, s->tasks, s->lo, s->hi, s->waited_ms, s->pid, s->comm, s->word);
	return -EBUSY;
}

static int xp_detach(void)
{
	int err = 0;

	mutex_lock(&xp_detach_lock);
	if (!xp_detached) {
		if (!xp_disarmed) {
			xp_disarm_all();
			xp_disarmed = true;
		}
		err = xp_slots_settle(slot_wait_ms);
		if (!err) {
			xp_detached = true;
			module_put(THIS_MODULE);
		}
	}
	mutex_unlock(&xp_detach_lock);
	return err;
}

/* Undoes xenprobes_init() from any point of failure (each step checks what exists). */
static void xp_teardown(void)
{
	xp_hook_unregister();
	xp_modules_unwatch();
	xp_resume_watch_unregister();
	xp_evtchn_close();
	xenbus_rm(XBT_NIL, "data", "xenprobes");
	xp_clock_exit();
	if (xp.wq)
		destroy_workqueue(xp.wq);
	xp.wq = NULL;
	xp_ctl_free();
	xp_rings_free();
}

static int __init xenprobes_init(void)
{
	int err;

	if (!xen_domain())
		return -ENODEV;
	if (!timeout_ms || timeout_ms > XP_TIMEOUT_MAX_MS) {
		pr_err(XP_NAME ": timeout_ms must be 1..%u\n", XP_TIMEOUT_MAX_MS);
		return -EINVAL;
	}
	if (wait_budget_ms > XP_WAIT_BUDGET_MAX_MS) {
		pr_err(XP_NAME ": wait_budget_ms must be 0 (no bound) .. %u\n", XP_WAIT_BUDGET_MAX_MS);
		return -EINVAL;
	}
	if (!xp_spin_us_ok(spin_us)) {
		pr_err(XP_NAME ": spin_us must be 0 (never spin) .. %u microseconds (the vCPU spins with interrupts off)\n",
		       (unsigned int)XP_SPIN_MAX_US);
		return -EINVAL;
	}
	if (release_wait_ms > XP_RELEASE_WAIT_MAX_MS) {
		pr_err(XP_NAME ": release_wait_ms must be 0 (never wait) .. %u\n", XP_RELEASE_WAIT_MAX_MS);
		return -EINVAL;
	}
	if (slot_wait_ms > XP_SLOT_WAIT_MAX_MS) {
		pr_err(XP_NAME ": slot_wait_ms must be 0 (one look) .. %u\n", XP_SLOT_WAIT_MAX_MS);
		return -EINVAL;
	}
	if (ring_order && (ring_order < XENPROBES_RING_MIN_ORDER || ring_order > XENPROBES_RING_MAX_ORDER)) {
		pr_err(XP_NAME ": ring_order must be 0 (no async rings) or %u..%u (2^ring_order bytes per vCPU)\n",
		       XENPROBES_RING_MIN_ORDER, XENPROBES_RING_MAX_ORDER);
		return -EINVAL;
	}
	mutex_init(&xp.oea_lock);
	INIT_WORK(&xp.quiesce_work, xp_quiesce_work);
	xp_hook_init();

	err = xp_text_init(kernel_text);
	if (err)
		return err;
	err = xp_oea_init();
	if (err)
		return err;
	xp.wq = alloc_ordered_workqueue(XP_NAME, 0);
	if (!xp.wq)
		return -ENOMEM;
	err = xp_ctl_alloc();
	if (err)
		goto fail;
	err = xp_rings_alloc();
	if (err)
		goto fail;
	xp_clock_init();
	err = xp_evtchn_open();
	if (err)
		goto fail;
	err = xp_modules_watch();
	if (err)
		goto fail;
	err = xp_hook_register();
	if (err)
		goto fail;
	xp_resume_watch_register();
	err = xp_publish();
	if (err)
		goto fail;

	/* Refuse rmmod until detached (see the unload policy above). */
	__module_get(THIS_MODULE);
	WRITE_ONCE(xp_loaded, true);
	pr_info(XP_NAME ": protocol %u: _text 0x%lx, text end 0x%llx, OEA pool %u bytes at 0x%lx, control 0x%lx (%u pages), evtchn %u, %u mailboxes, timeout %u ms (claimed: %llu ms), budget %u ms, spin %u us, clock: %s, %u async rings of 2^%u bytes at 0x%lx\n",
		XENPROBES_PROTOCOL_VERSION, xp.ktext, xp.bounds.ktext.end,
		(unsigned int)XP_OEA_POOL_SIZE,
		(unsigned long)xp_oea_pool, (unsigned long)xp.ctl, xp.layout.pages, xp.port,
		xp.nr_mailboxes, xp.timeout_ms, xp.claim_bound_ms, wait_budget_ms, xp.spin_us, xp_clock_name(),
		xp.ring_count, xp.ring_order, (unsigned long)xp.ring_mem);
	return 0;

fail:
	WRITE_ONCE(xp.detaching, true);
	xp_watches_unregister();
	xp_teardown();
	return err;
}

static void __exit xenprobes_exit(void)
{
	u64 drops, nested, notifies;

	/*
	 * Only reached after detach, or with rmmod --force: then disarm now, and wait for the slots
	 * as long as it takes (the text goes when this returns; a hung rmmod is better than a task
	 * returning into freed text).
	 */
	mutex_lock(&xp_detach_lock);
	if (!xp_detached) {
		if (!xp_disarmed)
			xp_disarm_all();
		xp_disarmed = true;
		while (xp_slots_settle(XP_SLOT_WAIT_MAX_MS))
			;
	}
	mutex_unlock(&xp_detach_lock);
	/* No CPU is in the jump entry any more (the quiescence): the rings hold still. */
	xp_rings_totals(&drops, &nested, &notifies);
	xp_teardown();
	pr_info(XP_NAME ": unloaded (%lld hits, %lld timeouts, %lld of them claims Dom0 never finished, %lld foreign int3s or jump calls, %lld nested jump hits, %lld redirects, %lld refused answers, %lld hits without fallback, %lld stale int3s at restored bytes, the first at 0x%llx; after the restore: %lld hits in text, %lld in the OEA; async: %lld bad hits, %llu records dropped for room, %llu nested, %llu notifications; spinning: %lld notifications skipped while Dom0 polled, %lld answers found spinning, %lld spins ran out; waits for Dom0: %lld us in all, the longest %lld us; %lld hits over budget; return slots: %lld written for Dom0, %lld refused; Dom0's areas: %s; slots: %s)\n",
		(long long)atomic64_read(&xp.hits), (long long)atomic64_read(&xp.timeouts),
		(long long)atomic64_read(&xp.claims_expired),
		(long long)atomic64_read(&xp.foreign), (long long)atomic64_read(&xp.nested),
		(long long)atomic64_read(&xp.redirects), (long long)atomic64_read(&xp.bad_answers),
		(long long)atomic64_read(&xp.no_fallback), (long long)atomic64_read(&xp.stale),
		(unsigned long long)READ_ONCE(xp.stale_first), (long long)atomic64_read(&xp.late_text),
		(long long)atomic64_read(&xp.late_oea), (long long)atomic64_read(&xp.async_bad),
		drops, nested, notifies, (long long)atomic64_read(&xp.notify_skipped),
		(long long)atomic64_read(&xp.spin_answered),
		(long long)atomic64_read(&xp.spin_blocked),
		(long long)atomic64_read(&xp.wait_ns) / 1000, (long long)atomic64_read(&xp.wait_max_ns) / 1000,
		(long long)atomic64_read(&xp.over_budget), (long long)atomic64_read(&xp.ret_written),
		(long long)atomic64_read(&xp.ret_refused), xp_release_name(xp_released),
		xp_slots_name(xp_slots_found));
}

module_init(xenprobes_init);
module_exit(xenprobes_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("xenprobesU: guest side of libxenprobes (Dom0 probes of this kernel)");
