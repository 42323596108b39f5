/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenprobesU: the static OEA pool.
 *
 * module_alloc()/__vmalloc_node_range() are not exported (6.1), and vmalloc() memory is
 * neither executable nor guaranteed within rel32 reach of kernel text. The module's own
 * text is both: it lives in [MODULES_VADDR, MODULES_END), right above the kernel image, and
 * the loader maps every SHF_EXECINSTR|SHF_ALLOC section executable (and read-only: Dom0
 * writes slots through foreign mappings, which guest page permissions do not affect).
 *
 * PROGBITS filled with int3: objtool (6.12's, which checks the linked module) crashes on an
 * executable NOBITS section, and an int3 is the right content for a slot nobody has written
 * (the .ko grows by the pool's size). ANNOTATE_NOENDBR: the module takes the pool's address,
 * which IBT's objtool check would otherwise report as a relocation to a non-ENDBR target;
 * nothing ever calls or jumps there indirectly. The pool is XP_OEA_POOL_SIZE bytes, handed
 * out as areas by xp_oea_take() and never returned while the module is loaded.
 */
#include <linux/objtool.h>

#ifndef XP_OEA_POOL_SIZE
#error "XP_OEA_POOL_SIZE must be defined by the build"
#endif

	.section .xenprobes_oea, "ax", @progbits
	.balign 4096
	.globl xp_oea_pool
	.type xp_oea_pool, @object
xp_oea_pool:
	ANNOTATE_NOENDBR
	.fill XP_OEA_POOL_SIZE, 1, 0xcc
	.size xp_oea_pool, XP_OEA_POOL_SIZE
	.previous
