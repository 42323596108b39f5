// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: modules that go while Dom0's trap entries name them (protocol.h "Modules that
 * go").
 *
 * The module's own restore (Dom0 gone, or detach) writes a trap entry's original byte back
 * where an int3 still is. In a module's text that is only right while that very module is
 * loaded: once it is unloaded its text is freed, and another module loaded at the same
 * address may hold 0xcc there itself (Linux 6.1 and later put an int3 after every `ret`).
 * Dom0 writes each entry in module text with the module's identity (name and text base,
 * xenprobes_module_id()); the kernel's module notifier tells us which modules went and which
 * came back, and the restore leaves the entries of those that went alone.
 *
 * __module_address() is not exported to modules (Debian's 6.1 does not list it in
 * Module.symvers), so the module never asks "whose text is this?"; it only listens.
 */
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/notifier.h>
#include <linux/version.h>

#include "xp_gone.h"
#include "xp_internal.h"

static DEFINE_MUTEX(xp_gone_lock);
static struct xp_gone xp_gone;	/* under xp_gone_lock */
static bool xp_gone_registered;

static u64 xp_module_text_base(const struct module *mod)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	return (u64)(unsigned long)mod->mem[MOD_TEXT].base;
#else
	return (u64)(unsigned long)mod->core_layout.base;
#endif
}

static int xp_module_event(struct notifier_block *nb, unsigned long state, void *data)
{
	struct module *mod = data;
	u32 id;

	if (state != MODULE_STATE_GOING && state != MODULE_STATE_COMING)
		return NOTIFY_DONE;
	if (!xp.hdr || mod == THIS_MODULE)
		return NOTIFY_DONE;
	id = xenprobes_module_id(mod->name, sizeof(mod->name), xp_module_text_base(mod));
	mutex_lock(&xp_gone_lock);
	if (state == MODULE_STATE_COMING)
		xp_gone_coming(&xp_gone, id);
	else if (xp_gone_going(&xp_gone, id, xp.traps, READ_ONCE(xp.hdr->nr_traps), xp.trap_cap))
		pr_info(XP_NAME ": module %.*s went while probed: its trap bytes will not be restored by this module\n",
			(int)sizeof(mod->name), mod->name);
	mutex_unlock(&xp_gone_lock);
	return NOTIFY_DONE;
}

static struct notifier_block xp_module_nb = {
	.notifier_call = xp_module_event,
};

int xp_modules_watch(void)
{
	int err = register_module_notifier(&xp_module_nb);

	if (!err)
		xp_gone_registered = true;
	return err;
}

void xp_modules_unwatch(void)
{
	if (xp_gone_registered)
		unregister_module_notifier(&xp_module_nb);
	xp_gone_registered = false;
}

/*
 * The restore holds the lock from its first look at the set to its last write: a module
 * going meanwhile waits in its notifier, so its text is still there while we write.
 */
void xp_modules_lock(void)
{
	mutex_lock(&xp_gone_lock);
}

void xp_modules_unlock(void)
{
	mutex_unlock(&xp_gone_lock);
}

/* Under xp_modules_lock(): does e (a private snapshot) name a module that went? */
bool xp_module_went(const struct xenprobes_trap *e)
{
	lockdep_assert_held(&xp_gone_lock);
	return xp_gone_has(&xp_gone, e);
}
