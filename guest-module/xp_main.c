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
 * get their real return addresses back; every CPU is out of the hook and the jump entry, every
 * task out of every slot and detour), then drops the reference; `rmmod` then succeeds. See
 * README.md.
 */
#include <linux/err.h>
#include <linux/extable.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/rcupdate_wait.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/utsname.h>
#include <linux/vmalloc.h>
#include <asm/cpufeature.h>
#include <xen/xen.h>
#include <xen/xenbus.h>

#include "xp_internal.h"

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

static unsigned long kernel_text;
module_param(kernel_text, ulong, 0444);
MODULE_PARM_DESC(kernel_text, "The kernel's _text (0 = find it, else it is checked)");

static DEFINE_MUTEX(xp_detach_lock);
static bool xp_detached;	/* the self reference was dropped */
static bool xp_loaded;		/* module_init completed */

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

/* ---- xenstore ---- */

#define xp_xs_printf(node, fmt, ...) \
	xenbus_printf(XBT_NIL, XENPROBES_XS_DIR, node, fmt, ##__VA_ARGS__)

static int xp_publish_area(unsigned int n, u64 addr, u64 size)
{
	char node[32];
	int err;

	snprintf(node, sizeof(node), XENPROBES_XS_OEA_ADDR_FMT, n);
	err = xp_xs_printf(node, "0x%llx", addr);
	if (err)
		return err;
	snprintf(node, sizeof(node), XENPROBES_XS_OEA_SIZE_FMT, n);
	err = xp_xs_printf(node, "%llu", size);
	if (err)
		return err;
	/* Only now: Dom0 watches oea/count and must find the area complete. */
	return xp_xs_printf(XENPROBES_XS_OEA_COUNT, "%u", n + 1);
}

/*
 * oea-request: one more area for every value Dom0 writes. Runs in the xenwatch thread;
 * the initial event of register_xenbus_watch() finds no key (the directory was removed at
 * load) and does nothing.
 */
static void xp_oea_request(struct xenbus_watch *w, const char *path, const char *token)
{
	enum xp_oea_result r;
	unsigned int len;
	u64 bytes, addr;
	char *val;
	int err;

	val = xenbus_read(XBT_NIL, XENPROBES_XS_DIR, XENPROBES_XS_OEA_REQUEST, &len);
	if (IS_ERR(val))
		return;
	mutex_lock(&xp.oea_lock);
	if (READ_ONCE(xp.detaching))
		goto out;
	if (!xp_parse_decimal(val, len, XENPROBES_OEA_MAX_SIZE, &bytes))
		r = XP_OEA_BAD_REQUEST;
	else
		r = xp_oea_take(&xp.oea, bytes, &addr);
	if (r != XP_OEA_OK) {
		xp_xs_printf(XENPROBES_XS_OEA_ERROR, "%s", xp_oea_reason(r));
		goto out;
	}
	err = xp_publish_area(xp.oea.count - 1, addr, bytes);
	if (err) {
		/* oea/count was not bumped: Dom0 never saw the area, the next one reuses it. */
		xp_oea_undo_last(&xp.oea);
		pr_warn(XP_NAME ": publishing OEA area %u failed (%d)\n", xp.oea.count, err);
		xp_xs_printf(XENPROBES_XS_OEA_ERROR, "xenstore write failed (%d)", err);
	}
out:
	mutex_unlock(&xp.oea_lock);
	kfree(val);
}

/*
 * Waits until no CPU is in the int3 hook or the jump entry and no task is inside any slot or
 * detour (a task preempted there, or in the jump entry with interrupts on, was preempted
 * involuntarily: synchronize_rcu_tasks() waits for it to run on and leave):
 *  - synchronize_rcu(): the hook runs with interrupts off (irqentry_nmi_enter()), and every
 *    irq/NMI handler or preempt-disabled region that might be in a slot ends;
 *  - synchronize_rcu_tasks_rude(): also code where RCU is not watching (idle, entry), which
 *    Dom0 may have probed too;
 *  - synchronize_rcu_tasks(): every task preempted inside a slot or the trampoline has
 *    left it (a voluntary switch, user mode or idle), like optprobes and ftrace do before
 *    they free trampolines.
 * All three are exported GPL in 6.1 (CONFIG_TASKS_RCU and CONFIG_TASKS_RUDE_RCU are on in
 * Debian's config); without CONFIG_TASKS_RCU synchronize_rcu_tasks() is synchronize_rcu(),
 * which is enough when tasks cannot be preempted.
 */
static void xp_quiesce(void)
{
	synchronize_rcu();
#ifdef CONFIG_TASKS_RUDE_RCU
	synchronize_rcu_tasks_rude();
#endif
	synchronize_rcu_tasks();
}

static void xp_quiesce_work(struct work_struct *w)
{
	unsigned int len;
	u64 token;
	char *val;

	val = xenbus_read(XBT_NIL, XENPROBES_XS_DIR, XENPROBES_XS_QUIESCE_REQUEST, &len);
	if (IS_ERR(val))
		return;
	if (!xp_parse_decimal(val, len, U64_MAX, &token)) {
		pr_warn_ratelimited(XP_NAME ": ignoring a quiesce-request that is not a decimal token\n");
		goto out;
	}
	xp_quiesce();
	/* The same token: it was validated, so it is plain digits. */
	xp_xs_printf(XENPROBES_XS_QUIESCE_DONE, "%llu", token);
out:
	kfree(val);
}

static void xp_quiesce_request(struct xenbus_watch *w, const char *path, const char *token)
{
	/* The grace periods can take long: not in the xenwatch thread every driver shares. */
	queue_work(xp.wq, &xp.quiesce_work);
}

static struct xenbus_watch xp_oea_watch = {
	.node = XENPROBES_XS_DIR "/" XENPROBES_XS_OEA_REQUEST,
	.callback = xp_oea_request,
};

static struct xenbus_watch xp_quiesce_watch = {
	.node = XENPROBES_XS_DIR "/" XENPROBES_XS_QUIESCE_REQUEST,
	.callback = xp_quiesce_request,
};

static bool xp_watches_on;

static int xp_watches_register(void)
{
	int err = register_xenbus_watch(&xp_oea_watch);

	if (err)
		return err;
	err = register_xenbus_watch(&xp_quiesce_watch);
	if (err) {
		unregister_xenbus_watch(&xp_oea_watch);
		return err;
	}
	xp_watches_on = true;
	return 0;
}

static void xp_watches_unregister(void)
{
	if (!xp_watches_on)
		return;
	/* Each waits for a callback that is running. */
	unregister_xenbus_watch(&xp_quiesce_watch);
	unregister_xenbus_watch(&xp_oea_watch);
	xp_watches_on = false;
}

/*
 * fixup-slots (protocol.h): the entries xp_oea.S gave the fixup slots, in this module's own
 * exception table as the loader sorted it, slot 0's first and the others after it in slot
 * order (no other entry of this module points into the slots). Published only when all of
 * them are found so, and only with module-text, which holds the slots.
 */
static unsigned long xp_fixup_table(void)
{
	const struct exception_table_entry *e = THIS_MODULE->extable;
	unsigned int n = THIS_MODULE->num_exentries, i, k;
	unsigned long base = (unsigned long)xp_fixup_slots, last;

	/* Computed, not a relocation into the slots (objtool's IBT check wants those at ENDBR). */
	OPTIMIZER_HIDE_VAR(base);
	last = base + XP_FIXUP_SLOT_BYTES - 1;

	for (i = 0; e && i < n; i++)
		if ((unsigned long)&e[i].insn + e[i].insn == last)
			break;
	if (!e || n - i < XP_FIXUP_SLOTS)
		return 0;
	for (k = 0; k < XP_FIXUP_SLOTS; k++)
		if ((unsigned long)&e[i + k].insn + e[i + k].insn != last + k * XP_FIXUP_SLOT_BYTES)
			return 0;
	return (unsigned long)&e[i];
}

static int xp_publish_fixup_slots(void)
{
	unsigned long table = xp_fixup_table();
	int err;

	BUILD_BUG_ON(XP_FIXUP_SLOT_BYTES != XENPROBES_FIXUP_SLOT_SIZE);
	BUILD_BUG_ON(XP_FIXUP_SLOTS > XENPROBES_FIXUP_SLOTS_MAX);
	BUILD_BUG_ON(sizeof(struct exception_table_entry) != XENPROBES_FIXUP_ENTRY_SIZE);
	if (!table) {
		pr_warn(XP_NAME ": the fixup slots' entries are not in this module's exception table in order: fixup-slots not published (Dom0 refuses instructions the kernel's exception table covers)\n");
		return 0;
	}
	err = xp_xs_printf(XENPROBES_XS_FIXUP_SLOTS_ADDR, "0x%lx", (unsigned long)xp_fixup_slots);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_FIXUP_SLOTS_COUNT, "%u", XP_FIXUP_SLOTS);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_FIXUP_SLOTS_TABLE, "0x%lx", table);
	return err;
}

/*
 * jump-entry (protocol.h, "Jump probes"): xp_jump_entry (xp_jump.S), which a jump probe's
 * detour calls; Dom0 makes jump probes only when it is published, so not when the entry
 * cannot run correctly: under call depth tracking (retbleed=stuff, 6.2 and later) the return
 * thunk its final RET goes through shifts a per-CPU counter and so changes the flags the
 * entry just restored for the probed instruction. Only with module-text, which holds it.
 */
static int xp_publish_jump_entry(void)
{
#ifdef X86_FEATURE_CALL_DEPTH
	if (cpu_feature_enabled(X86_FEATURE_CALL_DEPTH)) {
		pr_info(XP_NAME ": call depth tracking is on: jump-entry not published (Dom0 makes no jump probes)\n");
		return 0;
	}
#endif
	return xp_xs_printf(XENPROBES_XS_JUMP_ENTRY, "0x%lx", (unsigned long)xp_jump_entry);
}

/* rings/addr, rings/count, rings/order (protocol.h, "Async jump probes"): only with rings. */
static int xp_publish_rings(void)
{
	int err;

	if (!xp.ring_count)
		return 0;
	err = xp_xs_printf(XENPROBES_XS_RINGS_ADDR, "0x%lx", (unsigned long)xp.ring_mem);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_RINGS_COUNT, "%u", xp.ring_count);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_RINGS_ORDER, "%u", xp.ring_order);
	return err;
}

/*
 * module-text (protocol.h): this module's core text, where Dom0 must put no trap (the int3
 * hook runs it and would recurse). Optional keys: a range Dom0 would refuse is not published
 * at all, so that the module still loads (Dom0 then has no range to refuse, as with a module
 * that predates the keys).
 */
static int xp_publish_module_text(void)
{
	unsigned long start, end;
	int err;

	xp_module_text(&start, &end);
	if (!start || end <= start || end - start > XENPROBES_MODULE_TEXT_MAX_SIZE) {
		pr_warn(XP_NAME ": own text [0x%lx, 0x%lx) is not a plausible range: module-text not published (Dom0 cannot refuse probes on this module's code)\n",
			start, end);
		return 0;
	}
	err = xp_xs_printf(XENPROBES_XS_MODULE_TEXT_START, "0x%lx", start);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_MODULE_TEXT_END, "0x%lx", end);
	if (!err && (unsigned long)xp_fixup_slots >= start &&
	    (unsigned long)xp_fixup_slots + XP_FIXUP_SLOTS * XP_FIXUP_SLOT_BYTES <= end)
		err = xp_publish_fixup_slots();
	if (!err && (unsigned long)xp_jump_entry >= start && (unsigned long)xp_jump_entry < end)
		err = xp_publish_jump_entry();
	return err;
}

static int xp_publish(void)
{
	const struct xp_range *a0 = &xp.oea.areas[0];
	int err;

	/* Keys of an earlier load, Dom0 requests included, must not be mistaken for ours. */
	xenbus_rm(XBT_NIL, "data", "xenprobes");

	err = xp_xs_printf(XENPROBES_XS_VERSION, "%u", XENPROBES_PROTOCOL_VERSION);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_KERNEL_TEXT, "0x%lx", xp.ktext);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_RELEASE, "%s", init_utsname()->release);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_NR_CPUS, "%u", num_possible_cpus());
	if (!err)
		err = xp_publish_module_text();
	if (!err)
		err = xp_publish_area(0, a0->start, a0->end - a0->start);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_CONTROL_ADDR, "0x%lx", (unsigned long)xp.ctl);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_CONTROL_PAGES, "%u", xp.layout.pages);
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_EVTCHN, "%u", xp.port);
	if (!err)
		err = xp_publish_rings();
	if (!err)
		err = xp_watches_register();
	/* Last: Dom0 watches `state` and must never see a half-published set. */
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_STATE, "%s", XENPROBES_XS_STATE_READY);
	return err;
}

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

static void xp_ctl_free(void)
{
	if (xp.ctl)
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

/* Only once no CPU can be in the jump entry any more (the end of xp_teardown()). */
static void xp_rings_free(void)
{
	WRITE_ONCE(xp.ring_count, 0);
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

/* Steps 1-5 of detaching (see the top of this file); idempotent, process context. */
static void xp_disarm_all(void)
{
	unsigned int restored, repaired;

	WRITE_ONCE(xp.detaching, true);		/* hits stop going to Dom0; waiters give up */
	xenbus_rm(XBT_NIL, XENPROBES_XS_DIR, XENPROBES_XS_STATE);
	xp_watches_unregister();
	flush_workqueue(xp.wq);
	restored = xp_restore_traps();
	repaired = xp_repair_return_slots();
	xp_quiesce();
	pr_info(XP_NAME ": detached: restored %u trap bytes and jump regions, repaired %u return slots\n",
		restored, repaired);
}

static int xp_detach(void)
{
	mutex_lock(&xp_detach_lock);
	if (!xp_detached) {
		xp_disarm_all();
		xp_detached = true;
		module_put(THIS_MODULE);
	}
	mutex_unlock(&xp_detach_lock);
	return 0;
}

/* Undoes xenprobes_init() from any point of failure (each step checks what exists). */
static void xp_teardown(void)
{
	xp_hook_unregister();
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
	if (!xp_spin_us_ok(spin_us)) {
		pr_err(XP_NAME ": spin_us must be 0 (never spin) .. %u microseconds (the vCPU spins with interrupts off)\n",
		       (unsigned int)XP_SPIN_MAX_US);
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
	pr_info(XP_NAME ": protocol %u: _text 0x%lx, text end 0x%llx, OEA pool %u bytes at 0x%lx, control 0x%lx (%u pages), evtchn %u, %u mailboxes, timeout %u ms (claimed: %llu ms), spin %u us, clock: %s, %u async rings of 2^%u bytes at 0x%lx\n",
		XENPROBES_PROTOCOL_VERSION, xp.ktext, xp.bounds.ktext.end,
		(unsigned int)XP_OEA_POOL_SIZE,
		(unsigned long)xp_oea_pool, (unsigned long)xp.ctl, xp.layout.pages, xp.port,
		xp.nr_mailboxes, xp.timeout_ms, xp.claim_bound_ms, xp.spin_us, xp_clock_name(),
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

	/* Only reached after detach, or with rmmod --force: then disarm now. */
	mutex_lock(&xp_detach_lock);
	if (!xp_detached)
		xp_disarm_all();
	mutex_unlock(&xp_detach_lock);
	/* No CPU is in the jump entry any more (the quiescence): the rings hold still. */
	xp_rings_totals(&drops, &nested, &notifies);
	xp_teardown();
	pr_info(XP_NAME ": unloaded (%lld hits, %lld timeouts, %lld of them claims Dom0 never finished, %lld foreign int3s or jump calls, %lld nested jump hits, %lld redirects, %lld refused answers, %lld hits without fallback, %lld stale int3s at restored bytes, the first at 0x%llx; after the restore: %lld hits in text, %lld in the OEA; async: %lld bad hits, %llu records dropped for room, %llu nested, %llu notifications; spinning: %lld notifications skipped while Dom0 polled, %lld answers found spinning, %lld spins ran out)\n",
		(long long)atomic64_read(&xp.hits), (long long)atomic64_read(&xp.timeouts),
		(long long)atomic64_read(&xp.claims_expired),
		(long long)atomic64_read(&xp.foreign), (long long)atomic64_read(&xp.nested),
		(long long)atomic64_read(&xp.redirects), (long long)atomic64_read(&xp.bad_answers),
		(long long)atomic64_read(&xp.no_fallback), (long long)atomic64_read(&xp.stale),
		(unsigned long long)READ_ONCE(xp.stale_first), (long long)atomic64_read(&xp.late_text),
		(long long)atomic64_read(&xp.late_oea), (long long)atomic64_read(&xp.async_bad),
		drops, nested, notifies, (long long)atomic64_read(&xp.notify_skipped),
		(long long)atomic64_read(&xp.spin_answered),
		(long long)atomic64_read(&xp.spin_blocked));
}

module_init(xenprobes_init);
module_exit(xenprobes_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("xenprobesU: guest side of libxenprobes (Dom0 probes of this kernel)");
