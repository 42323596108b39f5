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
 * NOBITS keeps the .ko small: the loader zero-fills the space (kernels with an execmem ROX
 * cache fill it with int3 instead). The section name does not start with ".text", so the
 * assembler does not insist on PROGBITS; objtool is off for this object (there is no code
 * in it to validate). The pool is XP_OEA_POOL_SIZE bytes, handed out as areas by
 * xp_oea_take() and never returned while the module is loaded.
 */
#ifndef XP_OEA_POOL_SIZE
#error "XP_OEA_POOL_SIZE must be defined by the build"
#endif

	.section .xenprobes_oea, "ax", @nobits
	.balign 4096
	.globl xp_oea_pool
	.type xp_oea_pool, @object
xp_oea_pool:
	.skip XP_OEA_POOL_SIZE
	.size xp_oea_pool, XP_OEA_POOL_SIZE
	.previous
