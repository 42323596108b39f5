// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: the module's xenstore side (protocol.h; README.md, "What it publishes"): the keys
 * it publishes under data/xenprobes (state last), the watches on Dom0's requests, oea-request
 * (one more OEA area) and quiesce-request (the grace periods, xp_quiesce(), which detach runs
 * too). xp_main.c calls xp_publish() at load and xp_watches_unregister() at detach.
 */
#include <linux/err.h>
#include <linux/extable.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/rcupdate_wait.h>
#include <linux/radix-tree.h>
#include <linux/maple_tree.h>
#include <linux/irq.h>
#include <linux/mm.h>
#include <linux/version.h>
#include <linux/slab.h>
#include <linux/utsname.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <asm/cpufeature.h>
#include <asm/nospec-branch.h>
#include <asm/paravirt.h>
#include <asm/pgtable_types.h>
#include <xen/events.h>
#include <xen/xenbus.h>

#include "xp_internal.h"

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
void xp_quiesce(void)
{
	synchronize_rcu();
#ifdef CONFIG_TASKS_RUDE_RCU
	synchronize_rcu_tasks_rude();
#endif
	synchronize_rcu_tasks();
}

void xp_quiesce_work(struct work_struct *w)
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

void xp_watches_unregister(void)
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
static bool xp_jump_published;	/* jump-entry published: short jumps to islands too */

static int xp_publish_jump_entry(void)
{
#ifdef X86_FEATURE_CALL_DEPTH
	if (cpu_feature_enabled(X86_FEATURE_CALL_DEPTH)) {
		pr_info(XP_NAME ": call depth tracking is on: jump-entry not published (Dom0 makes no jump probes)\n");
		return 0;
	}
#endif
	xp_jump_published = true;
	return xp_xs_printf(XENPROBES_XS_JUMP_ENTRY, "0x%lx", (unsigned long)xp_jump_entry);
}

/* rings/addr, rings/count, rings/order, rings/cap-flags (protocol.h, "Async jump probes"): only with rings. */
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
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_RINGS_CAP_FLAGS, "0x%x", XENPROBES_CAP_AUTO);
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

/*
 * hook-path (protocol.h): the kernel functions this module's hit path calls out to (the int3
 * hook, the exchange and its wait, the fallback, the jump hit), so that Dom0 refuses probes in
 * them on the guest channel: a trap there is hit again inside the hook, a nested hit Dom0
 * never sees. Each address is taken here, of what a module may name: the exported functions
 * it calls, the return thunk every one of its rets jumps to, and the paravirt irq operations
 * local_irq_save() and local_irq_restore() call through (on a PV guest, Xen's). What no module
 * can name -- the kernel's int3 path up to the die notifiers, the static event-channel helpers
 * xen_poll_irq_timeout() and xen_clear_irq_pending() call, the hypercall page -- Dom0 knows
 * by name. Inline helpers (the pvclock read, per-CPU and atomic operations, xen_vcpu_nr())
 * call nothing out of line.
 */
static int xp_publish_hook_path(void)
{
	const unsigned long fns[] = {
		(unsigned long)ktime_get_mono_fast_ns,	/* the waits' and async hits' clock */
		(unsigned long)xen_clear_irq_pending,	/* xp_wait() */
		(unsigned long)xen_poll_irq_timeout,	/* xp_poll_for() */
		(unsigned long)lookup_address,	/* a fallback's target in another module */
		(unsigned long)copy_from_kernel_nofault,	/* async captures */
		(unsigned long)copy_from_user_nofault,	/* async captures */
		(unsigned long)irq_work_queue,	/* xp_declare_dom0_gone() */
#ifdef CONFIG_DEBUG_PREEMPT
		(unsigned long)debug_smp_processor_id,	/* smp_processor_id() */
#endif
#if defined(CONFIG_RETHUNK) || defined(CONFIG_MITIGATION_RETHUNK)
		(unsigned long)__x86_return_thunk,
#endif
#ifdef CONFIG_PARAVIRT_XXL
		(unsigned long)pv_ops.irq.save_fl.func,	/* xp_jump_hit() */
		(unsigned long)pv_ops.irq.irq_disable.func,
		(unsigned long)pv_ops.irq.irq_enable.func,
#endif
		/*
		 * What those call in turn, out of line, that the module can name (README.md "The hook
		 * path"; what it cannot name Dom0 knows by name). Both event-channel calls find the
		 * port by the irq: info_for_irq() -> irq_get_chip_data() -> irq_get_irq_data() ->
		 * irq_to_desc(), a radix tree lookup on 6.1, a maple tree one from 6.5 on.
		 */
		(unsigned long)irq_get_irq_data,
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 5, 0)
		(unsigned long)radix_tree_lookup,
#else
		(unsigned long)mtree_load,
#endif
#ifdef CONFIG_HARDENED_USERCOPY
		/* copy_from_user_nofault() -> check_object_size() -> check_heap_object() */
		(unsigned long)__check_object_size,
		(unsigned long)is_vmalloc_addr,
		(unsigned long)__virt_addr_valid,
#endif
#ifdef CONFIG_PARAVIRT_XXL
		/* lookup_address()'s page walk reads entries through these (Xen's on a PV guest) */
		(unsigned long)pv_ops.mmu.pgd_val.func,
#if CONFIG_PGTABLE_LEVELS >= 5
		(unsigned long)pv_ops.mmu.p4d_val.func,
#endif
		(unsigned long)pv_ops.mmu.pud_val.func,
		(unsigned long)pv_ops.mmu.pmd_val.func,
		(unsigned long)pv_ops.mmu.pte_val.func,
#endif
	};
	unsigned int i, n = 0;
	char node[32];
	int err;

	BUILD_BUG_ON(ARRAY_SIZE(fns) > XENPROBES_HOOK_PATH_MAX);
	for (i = 0; i < ARRAY_SIZE(fns); i++) {
		if (!fns[i])
			continue;
		snprintf(node, sizeof(node), XENPROBES_XS_HOOK_PATH_FMT, n);
		err = xp_xs_printf(node, "0x%lx", fns[i]);
		if (err)
			return err;
		n++;
	}
	/* After its entries: a count is never there without them. */
	return xp_xs_printf(XENPROBES_XS_HOOK_PATH_COUNT, "%u", n);
}

int xp_publish(void)
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
		err = xp_publish_hook_path();
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
	/* protocol.h, "Return slots written by the module" (xp_hook.c, xp_ret_apply()). */
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_FEATURES, "0x%x",
				   XENPROBES_FEATURE_RET_WRITE | (xp_jump_published ? XENPROBES_FEATURE_JUMP_ISLAND : 0));
	if (!err)
		err = xp_watches_register();
	/* Last: Dom0 watches `state` and must never see a half-published set. */
	if (!err)
		err = xp_xs_printf(XENPROBES_XS_STATE, "%s", XENPROBES_XS_STATE_READY);
	return err;
}
