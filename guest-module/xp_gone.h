/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobesU: the modules that went while a trap entry named them (protocol.h "Modules that
 * go"), a pure part of the guest module like xp_logic.h (implemented in xp_logic.c; the
 * module's glue is xp_modules.c, the simulated module's SimHost::module_state).
 */
#ifndef XENPROBES_XP_GONE_H
#define XENPROBES_XP_GONE_H

#include <xenprobes/protocol.h>

#ifndef __KERNEL__
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Modules that went while a trap entry named them (protocol.h "Modules that go"): the
 * identities (xenprobes_module_id()) the module's restore must leave alone. Bounded; once a
 * module goes with no room left, `full` makes every entry with an identity count as gone (a
 * byte left patched in a live module is found by Dom0; one written into another module's
 * code is not found by anybody).
 */
#define XP_GONE_MAX 64
struct xp_gone {
	xenprobes_u32 id[XP_GONE_MAX];
	xenprobes_u32 n;
	bool full;
};

/*
 * MODULE_STATE_GOING of the module whose identity is `id`: it joins the set when one of the
 * first xp_live_traps(nr_traps, capacity) entries names it (a module nobody probed leaves no
 * trace). Returns whether it did (or `full` was set).
 */
bool xp_gone_going(struct xp_gone *g, xenprobes_u32 id, const struct xenprobes_trap *table,
		   xenprobes_u32 nr_traps, xenprobes_u32 capacity);

/* MODULE_STATE_COMING of a module whose identity is `id`: the same module is back. */
void xp_gone_coming(struct xp_gone *g, xenprobes_u32 id);

/* Is e's module (e: a private snapshot) one that went: the restore leaves e alone. */
bool xp_gone_has(const struct xp_gone *g, const struct xenprobes_trap *e);

#ifdef __cplusplus
}
#endif

#endif /* XENPROBES_XP_GONE_H */
