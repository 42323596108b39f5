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
 *
 * After it, the fixup slots (protocol.h, fixup-slots): XP_FIXUP_SLOTS slots of 32 bytes, each
 * with an entry of this module's own exception table. The kernel looks the fixup of a fault
 * up by the faulting address, in the table of the module whose text holds it; Dom0 copies an
 * instruction the kernel's table covers into one of these slots and gives its entry the
 * original entry's fixup and type, so that a fault there goes where it would have gone. An
 * unused entry points, insn and fixup, at its slot's last byte, which no copy reaches (an
 * instruction and a jmp rel32 take at most 20 bytes), so it matches no fault; the entries stay
 * in slot order, so the table stays sorted while Dom0 rewrites them (the loader sorts the
 * module's table once, at load; xp_xenstore.c finds ours in it). The section's name starts with
 * .text. because modpost accepts exception-table targets only in text sections by name.
 */
#include <linux/objtool.h>
#include <asm/extable_fixup_types.h>
#include "xp_fixup.h"

#ifndef XP_OEA_POOL_SIZE
#error "XP_OEA_POOL_SIZE must be defined by the build"
#endif

	.section .text.xenprobes_oea, "ax", @progbits
	.balign 4096
	.globl xp_oea_pool
	.type xp_oea_pool, @object
xp_oea_pool:
	ANNOTATE_NOENDBR
	.fill XP_OEA_POOL_SIZE, 1, 0xcc
	.size xp_oea_pool, XP_OEA_POOL_SIZE

	.balign 4096
	.globl xp_fixup_slots
	.type xp_fixup_slots, @object
xp_fixup_slots:
	ANNOTATE_NOENDBR
	.fill XP_FIXUP_SLOTS * XP_FIXUP_SLOT_BYTES, 1, 0xcc
	.size xp_fixup_slots, XP_FIXUP_SLOTS * XP_FIXUP_SLOT_BYTES
	.previous

	/* struct exception_table_entry { int insn, fixup, data; }, offsets relative to each field. */
	.pushsection __ex_table, "a"
	.balign 4
	.set xp_k, 0
	.rept XP_FIXUP_SLOTS
	.long xp_fixup_slots + xp_k * XP_FIXUP_SLOT_BYTES + XP_FIXUP_SLOT_BYTES - 1 - .
	.long xp_fixup_slots + xp_k * XP_FIXUP_SLOT_BYTES + XP_FIXUP_SLOT_BYTES - 1 - .
	.long EX_TYPE_DEFAULT
	.set xp_k, xp_k + 1
	.endr
	.popsection
