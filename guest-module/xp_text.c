// SPDX-License-Identifier: GPL-2.0
/*
 * xenprobesU: where kernel text is, whether an address is executable, and writing trap bytes
 * back once Dom0 is gone or the module detaches.
 *
 * Neither _text, core_kernel_text(), is_module_text_address() nor text_poke() is exported to
 * modules, so:
 *  - _text is found from an exported core function: walking down in 2 MiB steps while the
 *    page is mapped executable (below _text the kernel zaps the high mapping), then
 *    confirmed with kallsyms (a symbol starts exactly there and nothing resolves just below),
 *    or given as the kernel_text= parameter (e.g. the _text line of /proc/kallsyms), which is
 *    checked for plausibility and against a confirmed guess;
 *  - the end of core text is the first non-executable page above _text (mark_rodata_ro()
 *    makes everything after _etext NX); with rodata=off this over-approximates;
 *  - module text is "inside [MODULES_VADDR, MODULES_END) and mapped executable";
 *  - bytes are written through a vmap() alias of the page (like text_poke()'s temporary
 *    mapping), under stop_machine(), followed by sync_core() on every CPU (like
 *    text_poke_sync()).
 */
#include <linux/kallsyms.h>
#include <linux/kernel.h>
#include <linux/kdebug.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/stop_machine.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/vmalloc.h>
#include <asm/page.h>
#include <asm/pgtable.h>
#include <asm/processor.h>
#include <asm/sync_core.h>

#include "xp_internal.h"

bool xp_is_exec(void *ctx, u64 addr)
{
	unsigned int level;
	pte_t *pte = lookup_address((unsigned long)addr, &level);

	return pte && pte_present(*pte) && pte_exec(*pte);
}

/*
 * xp_is_exec for a nested hit's fallback (xp_hook.c, "Nesting"): kernel text (found by the
 * page walk at load time, up to the first non-executable page) and the OEA pool (this
 * module's own text) are executable by construction, so the walk -- lookup_address(), a
 * kernel function a probe could sit on -- is left for addresses in other modules' text.
 */
bool xp_is_exec_nested(void *ctx, u64 addr)
{
	if (xp_in_range(&xp.bounds.ktext, addr) || xp_in_range(&xp.bounds.oea, addr))
		return true;
	return xp_is_exec(ctx, addr);
}

/*
 * Where the 8 bytes at addr may be accessed without oopsing: kernel half, canonical (a
 * non-canonical address raises #GP, which the nofault fixup WARNs about), and for writes
 * aligned. The checks copy_from_kernel_nofault_allowed() makes on x86.
 */
static bool xp_kernel_u64_ok(u64 addr)
{
	return (s64)addr < 0 && __is_canonical_address(addr, boot_cpu_data.x86_virt_bits);
}

/*
 * Reads 8 bytes of kernel memory without oopsing on a bad address. The nofault accessor is
 * an inline access with an exception-table fixup: unlike copy_from_kernel_nofault(), no
 * kernel function runs, so a nested hit's fallback (a `ret` it emulates) calls nothing a
 * probe could sit on.
 */
bool xp_read_kernel_u64(u64 addr, u64 *val)
{
	bool ok = false;

	if (!xp_kernel_u64_ok(addr))
		return false;
	pagefault_disable();
	__get_kernel_nofault(val, (const void *)(unsigned long)addr, u64, out);
	ok = true;
out:
	pagefault_enable();
	return ok;
}

/*
 * Writes 8 bytes of kernel memory, never user memory, without oopsing on a bad or read-only
 * address (copy_to_kernel_nofault() is not exported; the nofault accessor is a macro, inline
 * like the read above).
 */
bool xp_write_kernel_u64(u64 addr, u64 val)
{
	bool ok = false;

	if (!xp_kernel_u64_ok(addr) || addr & 7)
		return false;
	pagefault_disable();
	__put_kernel_nofault((void *)(unsigned long)addr, &val, u64, out);
	ok = true;
out:
	pagefault_enable();
	return ok;
}

/*
 * This module's core text [start, end), published as module-text for Dom0 to refuse probes
 * there (the int3 hook runs it). It holds the static OEA pool (xp_oea.S is a section of the
 * module's text). 6.4 replaced struct module's core_layout with mem[MOD_TEXT].
 */
void xp_module_text(unsigned long *start, unsigned long *end)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	const struct module_memory *t = &THIS_MODULE->mem[MOD_TEXT];

	*start = (unsigned long)t->base;
	*end = *start + t->size;
#else
	*start = (unsigned long)THIS_MODULE->core_layout.base;
	*end = *start + THIS_MODULE->core_layout.text_size;
#endif
}

/* sprint_symbol() prints "0x<addr>" when nothing resolves, else "name+0xoff/0xsize". */
static int xp_symbol_at(unsigned long addr, bool *resolves, bool *starts)
{
	char *buf = kmalloc(KSYM_SYMBOL_LEN, GFP_KERNEL);

	if (!buf)
		return -ENOMEM;
	sprint_symbol(buf, addr);
	*resolves = strncmp(buf, "0x", 2) != 0;
	*starts = *resolves && strstr(buf, "+0x0/");
	kfree(buf);
	return 0;
}

/* Is addr exactly the start of kernel text: a symbol starts there, nothing just below. */
static int xp_confirm_text_start(unsigned long addr, bool *ok)
{
	bool res, starts, below_res, below_starts;
	int err;

	*ok = false;
	if (!IS_ALIGNED(addr, PAGE_SIZE) || !xp_is_exec(NULL, addr))
		return 0;
	err = xp_symbol_at(addr, &res, &starts);
	if (!err)
		err = xp_symbol_at(addr - 1, &below_res, &below_starts);
	if (err)
		return err;
	*ok = starts && !below_res;
	return 0;
}

static unsigned long xp_guess_text_start(void)
{
	/* Any exported function of the core kernel: it lies in [_text, _etext). */
	unsigned long t = ALIGN_DOWN((unsigned long)&register_die_notifier, PMD_SIZE);

	while (t - PMD_SIZE >= __START_KERNEL_map && xp_is_exec(NULL, t - PMD_SIZE))
		t -= PMD_SIZE;
	return t;
}

static unsigned long xp_find_text_end(unsigned long start)
{
	unsigned long a = start;
	unsigned long limit = min_t(unsigned long, start + KERNEL_IMAGE_SIZE, MODULES_VADDR);

	while (a < limit) {
		unsigned int level;
		pte_t *pte = lookup_address(a, &level);
		unsigned long step;

		if (!pte || !pte_present(*pte) || !pte_exec(*pte))
			break;
		step = page_level_size(level);
		a = ALIGN_DOWN(a, step) + step;
	}
	return a;
}

/*
 * A kernel_text= value is accepted when it is page aligned, mapped executable, at or below
 * the anchor and within the kernel image's reach of it; kallsyms is not asked (its notion of
 * the first symbol may differ from _text on other layouts), but a value that contradicts a
 * confirmed guess is refused.
 */
static bool xp_plausible_text_start(unsigned long addr)
{
	unsigned long anchor = (unsigned long)&register_die_notifier;

	return IS_ALIGNED(addr, PAGE_SIZE) && addr <= anchor &&
	       anchor - addr < KERNEL_IMAGE_SIZE && addr >= __START_KERNEL_map &&
	       xp_is_exec(NULL, addr);
}

int xp_text_init(unsigned long kernel_text_param)
{
	unsigned long guess = xp_guess_text_start();
	bool guess_ok = false;
	int err;

	if (IS_ENABLED(CONFIG_KALLSYMS)) {
		err = xp_confirm_text_start(guess, &guess_ok);
		if (err)
			return err;
	}
	if (kernel_text_param) {
		if (!xp_plausible_text_start(kernel_text_param)) {
			pr_err(XP_NAME ": kernel_text=0x%lx is not the start of kernel text\n",
			       kernel_text_param);
			return -EINVAL;
		}
		if (guess_ok && guess != kernel_text_param) {
			pr_err(XP_NAME ": kernel_text=0x%lx but kernel text starts at 0x%lx\n",
			       kernel_text_param, guess);
			return -EINVAL;
		}
		guess = kernel_text_param;
	} else if (!guess_ok) {
		/* Publishing a wrong _text would make Dom0 patch the wrong bytes: refuse. */
		pr_err(XP_NAME ": cannot confirm _text (best guess 0x%lx); load with kernel_text=0x<the _text line of /proc/kallsyms>\n",
		       guess);
		return -ENOENT;
	}

	xp.ktext = guess;
	xp.bounds.ktext.start = guess;
	xp.bounds.ktext.end = xp_find_text_end(guess);
	xp.bounds.modules.start = MODULES_VADDR;
	xp.bounds.modules.end = MODULES_END;
	xp.bounds.oea.start = (unsigned long)xp_oea_pool;
	/* The fixup slots follow the pool in the same section: fallbacks resume in either. */
	xp.bounds.oea.end = (unsigned long)xp_fixup_slots + XP_FIXUP_SLOTS * XP_FIXUP_SLOT_BYTES;
	xp.bounds.is_exec = xp_is_exec;
	xp.bounds.ctx = NULL;
	xp.nested_bounds = xp.bounds;
	xp.nested_bounds.is_exec = xp_is_exec_nested;
	return 0;
}

/*
 * One place to put back: a trap byte (len 1), a jump's whole region (protocol.h, "Jump
 * probes": a REDIRECT entry, len 2..15), or a short jump's island (an ISLAND entry, len 5),
 * through a writable alias of its page(s).
 */
enum xp_poke_kind { XP_POKE_BYTE, XP_POKE_REGION, XP_POKE_ISLAND };

struct xp_poke {
	u8 *map;		/* vmap() alias of the page(s) holding the bytes */
	u64 addr;		/* where the bytes are (for the re-check) */
	u64 fallback;		/* a region or island: its detour (the jump's target) */
	u64 island;		/* a short region: its island (0: none) */
	unsigned int off;	/* offset of the first byte in the alias */
	u8 len;			/* bytes to write */
	u8 kind;		/* enum xp_poke_kind */
	u8 bytes[15];		/* the original bytes (insn[0..len)) */
};

/* Places restored per stop_machine() (on the stack: the restore allocates nothing). */
#define XP_POKES_PER_STOP 16

struct xp_pokes {
	struct xp_poke p[XP_POKES_PER_STOP];
	unsigned int n;
	unsigned int written;
	unsigned int changed;	/* regions whose bytes changed between the check and the stop */
};

/*
 * A writable alias of the (read-only) text page(s) holding [addr, addr + len), len <= 15, so
 * at most two pages, mapped side by side so that the bytes are contiguous in the alias; NULL
 * when a page is not mapped. The caller adds offset_in_page(addr).
 */
static u8 *xp_text_alias(unsigned long addr, unsigned int len)
{
	struct page *pages[2];
	unsigned int i, n = 1 + (offset_in_page(addr) + len - 1) / PAGE_SIZE;

	for (i = 0; i < n; i++) {
		unsigned long a = (addr & PAGE_MASK) + i * PAGE_SIZE;
		unsigned int level;
		pte_t *pte = lookup_address(a, &level);
		unsigned long pfn;

		if (!pte || !pte_present(*pte))
			return NULL;
		pfn = PHYS_PFN(slow_virt_to_phys((void *)a));
		if (!pfn_valid(pfn))
			return NULL;
		pages[i] = pfn_to_page(pfn);
	}
	return vmap(pages, n, VM_MAP, PAGE_KERNEL);
}

/*
 * Runs on one CPU while every other CPU spins in the stopper with interrupts off: no CPU
 * executes, or fetches, the probed code while its bytes change -- what Dom0's writes get
 * by pausing the domain. A trap byte is written only if it is still an int3; a region only
 * if it still holds the int3 or the jump to its detour, and then all of it (the first byte
 * last), never half.
 */
static int xp_poke_stopped(void *arg)
{
	struct xp_pokes *pk = arg;
	unsigned int i, k;

	for (i = 0; i < pk->n; i++) {
		struct xp_poke *p = &pk->p[i];
		u8 *at = p->map + p->off;

		if (p->kind != XP_POKE_BYTE) {
			struct xenprobes_trap e = { .addr = p->addr, .fallback = p->fallback,
						    .flags = XENPROBES_TRAP_REDIRECT, .len = p->len };
			struct xenprobes_trap isl = { .addr = p->island, .fallback = p->fallback,
						      .flags = XENPROBES_TRAP_ISLAND, .len = XP_ISLAND_LEN };
			u8 cur[sizeof(p->bytes)];
			bool ours;

			for (k = 0; k < p->len; k++)
				cur[k] = READ_ONCE(at[k]);
			if (p->kind == XP_POKE_ISLAND) {
				isl.addr = p->addr;
				ours = xp_island_bytes_ours(&isl, cur, p->len);
			} else {
				ours = xp_region_bytes_ours_island(&e, cur, p->len, p->island ? &isl : NULL);
			}
			if (!ours) {
				pk->changed++;
				continue;
			}
			for (k = p->len; k-- > 0;)
				WRITE_ONCE(at[k], p->bytes[k]);
		} else {
			if (READ_ONCE(at[0]) != XP_INT3)
				continue;
			WRITE_ONCE(at[0], p->bytes[0]);
		}
		pk->written++;
	}
	return 0;
}

/* Writes the collected places with every other CPU stopped, then drops the aliases. */
static void xp_pokes_flush(struct xp_pokes *pk)
{
	unsigned int i;

	if (!pk->n)
		return;
	stop_machine(xp_poke_stopped, pk, NULL);
	for (i = 0; i < pk->n; i++)
		vunmap(pk->p[i].map);
	pk->n = 0;
}

/*
 * Queues the original bytes e->insn[0..len) for writing back at e->addr through its alias map
 * (island: a short region's island, 0 for none); flushes when the batch is full.
 */
static void xp_poke_add(struct xp_pokes *pk, u8 *map, const struct xenprobes_trap *e, unsigned int len,
			u8 kind, u64 island)
{
	struct xp_poke *p = &pk->p[pk->n];

	p->map = map;
	p->addr = e->addr;
	p->fallback = e->fallback;
	p->island = island;
	p->off = offset_in_page(e->addr);
	p->len = len;
	p->kind = kind;
	memcpy(p->bytes, e->insn, len);
	if (++pk->n == XP_POKES_PER_STOP)
		xp_pokes_flush(pk);
}

static void xp_sync_core(void *unused)
{
	sync_core();
}

/* The last batch; then, like text_poke_sync(), no CPU keeps executing stale bytes from its pipeline. */
static void xp_pokes_finish(struct xp_pokes *pk)
{
	xp_pokes_flush(pk);
	if (pk->written)
		on_each_cpu(xp_sync_core, NULL, 1);
}

/* [addr, addr + len) is kernel or module text (outside the OEA), all of one kind. */
static bool xp_text_span_ok(u64 addr, unsigned int len)
{
	enum xp_addr_kind kind = xp_addr_classify(&xp.bounds, addr);

	return (kind == XP_ADDR_KTEXT || kind == XP_ADDR_MODULE) && addr + len - 1 > addr &&
	       xp_addr_classify(&xp.bounds, addr + len - 1) == kind;
}

/*
 * The live ISLAND entry of a short region e whose bytes are cur[0..n) (protocol.h "Short jumps
 * to islands"): the one its eb goes to, or while it holds the int3, the one of its fallback.
 */
static bool xp_island_of(const struct xenprobes_trap *e, const u8 *cur, u32 n,
			 struct xenprobes_trap *isl)
{
	u32 live = xp_live_traps(READ_ONCE(xp.hdr->nr_traps), xp.trap_cap), i;
	u64 to;

	if (xp_short_jump_target(e->addr, cur, n, &to))
		return xp_trap_search(xp.traps, live, xp.trap_cap, to, isl) && xp_island_pairs(e, isl);
	if (cur[0] != XP_INT3)
		return false;
	for (i = 0; i < live; i++) {
		xp_trap_snapshot(isl, &xp.traps[i]);
		if (xp_island_pairs(e, isl))
			return true;
	}
	return false;
}

/*
 * What to put back for entry e (a private snapshot of a live entry), if anything: *len bytes
 * of e->insn. 0 when nothing; *foreign set when e is a jump's region whose bytes are neither
 * Dom0's (the int3, the jump to its detour or to its island) nor the original ones; *island:
 * a short region's island (0: none).
 */
static unsigned int xp_restore_what(const struct xenprobes_trap *e, bool *foreign, u64 *island)
{
	enum xp_addr_kind kind = xp_addr_classify(&xp.bounds, e->addr);
	struct xenprobes_trap isl;
	bool has_isl;
	u8 cur[sizeof(e->insn)];

	*foreign = false;
	*island = 0;
	/* Never even read outside text: a hostile address could be MMIO. */
	if (kind != XP_ADDR_KTEXT && kind != XP_ADDR_MODULE)
		return 0;
	if (e->flags != XENPROBES_TRAP_REDIRECT) {
		if (copy_from_kernel_nofault(cur, (const void *)(unsigned long)e->addr, 1))
			return 0;
		return xp_restore_ok(&xp.bounds, e, cur[0]) ? 1 : 0;
	}
	/* A region's last byte must be text of the same kind before it is read. */
	if (e->len < XP_JUMP_SHORT_MIN || e->len > sizeof(e->insn) ||
	    xp_addr_classify(&xp.bounds, e->addr + e->len - 1) != kind)
		return 0;
	if (copy_from_kernel_nofault(cur, (const void *)(unsigned long)e->addr, e->len))
		return 0;
	has_isl = xp_island_of(e, cur, e->len, &isl);
	if (xp_region_restore_ok_island(&xp.bounds, e, cur, e->len, has_isl ? &isl : NULL)) {
		*island = has_isl ? isl.addr : 0;
		return e->len;
	}
	*foreign = memcmp(cur, e->insn, e->len) != 0 &&
		   !xp_region_bytes_ours_island(e, cur, e->len, has_isl ? &isl : NULL);
	return 0;
}

/*
 * Writes back, at every live trap-table address outside the OEA in kernel or module text
 * (but in modules unloaded since: xp_modules.c), what Dom0 patched: insn[0] where an int3
 * it wrote still is, and a jump's whole region (REDIRECT entries: insn[0..len)) where the
 * int3 or the jump to its detour still is; JUMP entries (keys inside the OEA) are never
 * touched. Process context. Returns how many trap bytes and regions were restored.
 *
 * The writes happen under stop_machine(): with other vCPUs running the probed code (the
 * module restores while the guest runs, unlike Dom0, which pauses the domain), an emulated
 * CPU was seen to keep executing an int3 whose byte another vCPU had restored -- under QEMU's
 * multi-threaded TCG, on Linux 6.12 guests with two vCPUs hammering the probed function --
 * and after the module is gone nobody claims that int3 any more (docs/e2e.md, "kill -9 on the
 * guest channel"). Every vCPU parked in the stopper runs nothing else while the bytes change,
 * and a region's bytes all change in the same stop.
 */
unsigned int xp_restore_traps(void)
{
	u32 n = xp_live_traps(READ_ONCE(xp.hdr->nr_traps), xp.trap_cap);
	struct xp_pokes pk = { .n = 0, .written = 0, .changed = 0 };
	unsigned int unmapped = 0, foreign = 0, went = 0;
	u32 i;

	might_sleep();
	xp_modules_lock();
	for (i = 0; i < n; i++) {
		struct xenprobes_trap e;
		unsigned int len;
		bool other;
		u64 island;
		u8 *map;

		xp_trap_snapshot(&e, &xp.traps[i]);
		/* Its module was unloaded: freed text, or another module's code (xp_modules.c). */
		if (xp_module_went(&e)) {
			went++;
			continue;
		}
		len = xp_restore_what(&e, &other, &island);
		if (other && foreign++ == 0)
			pr_warn(XP_NAME ": the jump region at 0x%llx holds neither its original bytes nor Dom0's: left alone\n",
				e.addr);
		if (!len)
			continue;
		map = xp_text_alias(e.addr, len);
		if (!map) {
			unmapped++;
			continue;
		}
		xp_poke_add(&pk, map, &e, len, e.flags == XENPROBES_TRAP_REDIRECT ? XP_POKE_REGION : XP_POKE_BYTE,
			    island);
		cond_resched();
	}
	xp_pokes_finish(&pk);
	xp_modules_unlock();
	if (went)
		pr_warn(XP_NAME ": %u trap bytes or jump regions were in modules unloaded since Dom0 probed them: left alone\n",
			went);
	if (unmapped)
		pr_warn(XP_NAME ": %u trap bytes or jump regions could not be mapped writable and are still patched\n",
			unmapped);
	if (foreign || pk.changed)
		pr_warn(XP_NAME ": %u jump regions left alone (bytes neither original nor Dom0's), %u changed under the restore\n",
			foreign, pk.changed);
	return pk.written;
}


/* A live region of the island's fallback still jumps there (it was left alone): so is the island. */
static bool xp_island_still_used(const struct xenprobes_trap *isl, u32 live)
{
	struct xenprobes_trap e;
	u8 cur[XP_JMP_REL8_LEN];
	u64 to;
	u32 i;

	for (i = 0; i < live; i++) {
		xp_trap_snapshot(&e, &xp.traps[i]);
		if (e.flags != XENPROBES_TRAP_REDIRECT || e.fallback != isl->fallback ||
		    !xp_text_span_ok(e.addr, XP_JMP_REL8_LEN))
			continue;
		if (copy_from_kernel_nofault(cur, (const void *)(unsigned long)e.addr, sizeof(cur)))
			return true;	/* cannot tell: leave the island */
		if (cur[0] == XP_INT3 || (xp_short_jump_target(e.addr, cur, sizeof(cur), &to) && to == isl->addr))
			return true;
	}
	return false;
}

/*
 * Short jumps' islands (protocol.h, "Short jumps to islands"), after xp_restore_traps() and a
 * quiescence (a task interrupted between a region's eb and its island resumes at the island):
 * insn[0..5) back at every live ISLAND entry whose bytes still hold the jump to its detour and
 * at which no region still jumps. Process context. Returns how many it restored.
 */
unsigned int xp_restore_islands(void)
{
	u32 n = xp_live_traps(READ_ONCE(xp.hdr->nr_traps), xp.trap_cap);
	struct xp_pokes pk = { .n = 0, .written = 0, .changed = 0 };
	unsigned int left = 0, unmapped = 0;
	u32 i;

	might_sleep();
	xp_modules_lock();
	for (i = 0; i < n; i++) {
		struct xenprobes_trap e;
		u8 cur[XP_ISLAND_LEN];
		u8 *map;

		xp_trap_snapshot(&e, &xp.traps[i]);
		/* Never even read outside text: a hostile address could be MMIO. */
		if (e.flags != XENPROBES_TRAP_ISLAND || xp_module_went(&e) || !xp_text_span_ok(e.addr, XP_ISLAND_LEN) ||
		    copy_from_kernel_nofault(cur, (const void *)(unsigned long)e.addr, sizeof(cur)))
			continue;
		if (!xp_island_restore_ok(&xp.bounds, &e, cur, sizeof(cur)) || xp_island_still_used(&e, n)) {
			left += memcmp(cur, e.insn, sizeof(cur)) != 0;
			continue;
		}
		map = xp_text_alias(e.addr, XP_ISLAND_LEN);
		if (!map) {
			unmapped++;
			continue;
		}
		xp_poke_add(&pk, map, &e, XP_ISLAND_LEN, XP_POKE_ISLAND, 0);
		cond_resched();
	}
	xp_pokes_finish(&pk);
	xp_modules_unlock();
	if (left || unmapped || pk.changed)
		pr_warn(XP_NAME ": %u short-jump islands left alone (not Dom0's bytes, or a region still jumps there), %u not mapped writable, %u changed under the restore\n",
			left, unmapped, pk.changed);
	return pk.written;
}
