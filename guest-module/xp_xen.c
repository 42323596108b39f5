// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: the event channel to Dom0 and the bounded wait for its answer.
 *
 * The wait runs inside the int3 handler (irqentry_nmi_enter(): interrupts off, may have
 * interrupted anything), so it blocks the vCPU in Xen with SCHEDOP_poll on our port, never in
 * a pure busy loop, and for bounded slices: SCHEDOP_poll's timeout is an *absolute Xen system
 * time*, and no exported kernel interface returns Xen system time to a module. Sources, best
 * first:
 *  - pvti0: the kernel's own secondary vcpu_time_info of vCPU 0 (pvclock_get_pvti_cpu0_va(),
 *    the vDSO's clock), usable from any vCPU while Xen sets PVCLOCK_TSC_STABLE_BIT;
 *  - own: when the kernel registered none, one secondary vcpu_time_info per vCPU of our own
 *    (VCPUOP_register_vcpu_time_memory_area; Linux registers one only for vCPU 0 and only
 *    with a stable TSC), read on the vCPU it belongs to;
 *  - none: the vCPU's runstate entry time (never later than now) plus the slice, so a stale
 *    value costs an early return, never a late one; SCHEDOP_yield if even that fails.
 * Deadlines are measured with ktime_get_mono_fast_ns() (NMI safe) in every case.
 */
#include <linux/gfp.h>
#include <linux/interrupt.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/notifier.h>
#include <linux/slab.h>
#include <asm/msr.h>
#include <asm/pvclock.h>
#include <asm/xen/hypercall.h>
#include <xen/events.h>
#include <xen/xen-ops.h>
#include <xen/interface/sched.h>
#include <xen/interface/vcpu.h>
#include <xen/interface/xen.h>

#include "xp_internal.h"

/* ---- the event channel ---- */

static irqreturn_t xp_evtchn_interrupt(int irq, void *dev_id)
{
	/* Dom0's notifications are consumed by the waiting hook through SCHEDOP_poll. */
	return IRQ_HANDLED;
}

int xp_evtchn_open(void)
{
	struct evtchn_alloc_unbound alloc = { .dom = DOMID_SELF, .remote_dom = 0 };
	struct evtchn_close close;
	int err, irq;

	err = HYPERVISOR_event_channel_op(EVTCHNOP_alloc_unbound, &alloc);
	if (err)
		return err;
	irq = bind_evtchn_to_irqhandler(alloc.port, xp_evtchn_interrupt, 0, XP_NAME, &xp);
	if (irq < 0) {
		close.port = alloc.port;
		HYPERVISOR_event_channel_op(EVTCHNOP_close, &close);
		return irq;
	}
	xp.port = alloc.port;
	xp.irq = irq;
	return 0;
}

void xp_evtchn_close(void)
{
	if (xp.irq > 0)
		unbind_from_irqhandler(xp.irq, &xp);	/* also closes the port */
	xp.irq = 0;
	xp.port = 0;
}

/*
 * Whether a Dom0 process has the port bound (protocol.h "Letting go"): EVTCHNOP_status says
 * interdomain. A failed look counts as bound: the pages are then kept rather than freed.
 */
bool xp_evtchn_bound(void)
{
	struct evtchn_status status = { .dom = DOMID_SELF, .port = xp.port };

	if (HYPERVISOR_event_channel_op(EVTCHNOP_status, &status))
		return true;
	return status.status == EVTCHNSTAT_interdomain;
}

void xp_notify_dom0(void)
{
	notify_remote_via_evtchn(xp.port);
}

/* ---- Xen system time ---- */

enum xp_clock_mode { XP_CLOCK_NONE, XP_CLOCK_PVTI0, XP_CLOCK_OWN };

/* One slot per vCPU id; 64 bytes so that no vcpu_time_info crosses a page. */
#define XP_CLOCK_STRIDE 64

static enum xp_clock_mode xp_clock_mode;
static struct pvclock_vsyscall_time_info *xp_pvti0;
static u8 *xp_clock_area;
static size_t xp_clock_bytes;
static bool *xp_clock_registered;	/* by vCPU id */
static unsigned int xp_clock_nr;	/* vCPU ids covered */

static int xp_clock_register(unsigned int vcpu, void *area)
{
	struct vcpu_register_time_memory_area a = { .addr.v = area };

	return HYPERVISOR_vcpu_op(VCPUOP_register_vcpu_time_memory_area, vcpu, &a);
}

void xp_clock_init(void)
{
	unsigned int registered = 0, cpu;

	xp_clock_mode = XP_CLOCK_NONE;
	xp_pvti0 = pvclock_get_pvti_cpu0_va();
	if (xp_pvti0) {
		/* Never touch the kernel's registration (the vDSO reads it). */
		if (READ_ONCE(xp_pvti0->pvti.flags) & PVCLOCK_TSC_STABLE_BIT)
			xp_clock_mode = XP_CLOCK_PVTI0;
		return;
	}

	xp_clock_nr = nr_cpu_ids;
	xp_clock_bytes = PAGE_ALIGN(xp_clock_nr * XP_CLOCK_STRIDE);
	xp_clock_area = alloc_pages_exact(xp_clock_bytes, GFP_KERNEL | __GFP_ZERO);
	xp_clock_registered = kcalloc(xp_clock_nr, sizeof(bool), GFP_KERNEL);
	if (!xp_clock_area || !xp_clock_registered)
		goto fail;
	for_each_possible_cpu(cpu) {
		unsigned int v = xen_vcpu_nr(cpu);

		if (v >= xp_clock_nr || xp_clock_registered[v])
			continue;
		if (xp_clock_register(v, xp_clock_area + v * XP_CLOCK_STRIDE))
			continue;
		xp_clock_registered[v] = true;
		registered++;
	}
	if (registered) {
		xp_clock_mode = XP_CLOCK_OWN;
		return;
	}
fail:
	if (xp_clock_area)
		free_pages_exact(xp_clock_area, xp_clock_bytes);
	kfree(xp_clock_registered);
	xp_clock_area = NULL;
	xp_clock_registered = NULL;
}

void xp_clock_exit(void)
{
	unsigned int v;

	if (xp_clock_mode == XP_CLOCK_OWN) {
		xp_clock_mode = XP_CLOCK_NONE;
		for (v = 0; v < xp_clock_nr; v++)
			if (xp_clock_registered[v])
				xp_clock_register(v, NULL);
		free_pages_exact(xp_clock_area, xp_clock_bytes);
		kfree(xp_clock_registered);
		xp_clock_area = NULL;
		xp_clock_registered = NULL;
	}
	xp_clock_mode = XP_CLOCK_NONE;
}

const char *xp_clock_name(void)
{
	switch (xp_clock_mode) {
	case XP_CLOCK_PVTI0:
		return "the kernel's stable pvclock";
	case XP_CLOCK_OWN:
		return "per-vCPU secondary vcpu_time_info";
	default:
		return "runstate entry time (degraded)";
	}
}

/* pvclock's seqcount: bounded retries, the hook must not spin on a stuck writer. */
static bool xp_pvclock_read(const struct pvclock_vcpu_time_info *src, u64 *now)
{
	unsigned int version, tries;
	u64 t;

	for (tries = 0; tries < 16; tries++) {
		version = pvclock_read_begin(src);
		if (!version)
			return false;	/* never written by Xen yet */
		t = __pvclock_read_cycles(src, rdtsc_ordered());
		if (!pvclock_read_retry(src, version)) {
			*now = t;
			return true;
		}
	}
	return false;
}

/* Xen system time in ns on this vCPU; false when no source is usable. IRQs off. */
static bool xp_xen_now(u64 *now)
{
	const struct pvclock_vcpu_time_info *src;
	unsigned int v;

	switch (xp_clock_mode) {
	case XP_CLOCK_PVTI0:
		src = &xp_pvti0->pvti;
		if (!(READ_ONCE(src->flags) & PVCLOCK_TSC_STABLE_BIT))
			return false;
		break;
	case XP_CLOCK_OWN:
		v = xen_vcpu_nr(smp_processor_id());
		if (v >= xp_clock_nr || !xp_clock_registered[v])
			return false;
		src = (const void *)(xp_clock_area + v * XP_CLOCK_STRIDE);
		break;
	default:
		return false;
	}
	return xp_pvclock_read(src, now);
}

/*
 * Blocks this vCPU until our port is pending or about ns have passed. Never passes a zero
 * timeout (that would mean "no timeout" to Xen).
 */
void xp_poll_for(u64 ns)
{
	struct vcpu_runstate_info rs;
	u64 now;

	if (xp_xen_now(&now)) {
		xen_poll_irq_timeout(xp.irq, now + ns);
		return;
	}
	if (!HYPERVISOR_vcpu_op(VCPUOP_get_runstate_info, xen_vcpu_nr(smp_processor_id()), &rs) &&
	    rs.state_entry_time) {
		xen_poll_irq_timeout(xp.irq, rs.state_entry_time + ns);
		return;
	}
	HYPERVISOR_sched_op(SCHEDOP_yield, NULL);
}

/* ---- save/restore and migration ---- */

static int xp_resume_event(struct notifier_block *nb, unsigned long action, void *data)
{
	/*
	 * Event channels and secondary time areas do not survive, and the Dom0 that armed
	 * the traps is on another host (or restarted): resume every hit on our own.
	 */
	xp_declare_dom0_gone(XP_GONE_RESUMED);
	return NOTIFY_OK;
}

static struct notifier_block xp_resume_nb = { .notifier_call = xp_resume_event };

int xp_resume_watch_register(void)
{
	xen_resume_notifier_register(&xp_resume_nb);
	return 0;
}

void xp_resume_watch_unregister(void)
{
	xen_resume_notifier_unregister(&xp_resume_nb);
}
