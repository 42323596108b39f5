/*
 * kstack.S - a call chain the demo guest's ORC table describes, so that `kstack` (Dom0's ORC
 * unwinder, libxenprobes/kernel/orc.hpp) meets on the simulated Xen what it meets in a Linux
 * guest. The compiler-built C code has no table (objtool is not run here); these four functions
 * are written by hand with one, in Linux 6.1's format (v1 in orc.hpp: sp_offset s16,
 * bp_offset s16, then sp_reg:4 bp_reg:4 type:2 end:1, the type CALL 0 / REGS 1; registers
 * SP 5, BP 4, PREV_SP 1, UNDEFINED 0), bounded by __start_orc_unwind_ip ... __stop_orc_unwind
 * (demo.ld). Each ORC row describes the code from its label to the next row's.
 *
 * The chain, called once per workload iteration (demo.c):
 *   demo_kstack_entry   builds a struct pt_regs on its stack as an interrupt entry would (ip =
 *                       .Ldemo_kstack_irq_ip, cs = kernel), then calls demo_kstack_outer: its
 *                       call site's row says REGS (the pt_regs at the stack pointer); the row
 *                       of .Ldemo_kstack_irq_ip says end of stack (as Linux marks the first
 *                       frame of a kernel thread)
 *   demo_kstack_outer   push rbx; sub $16: rows based on SP
 *   demo_kstack_middle  a frame-pointer frame: rows based on BP
 *   demo_kstack_leaf    returns its argument + 1
 * So a hit at demo_kstack_leaf unwinds to exactly: demo_kstack_leaf, demo_kstack_middle+N,
 * demo_kstack_outer+M, demo_kstack_entry+R (the return address), demo_kstack_entry+I (the
 * pt_regs frame's ip), then the end of the stack, with N, M, R, I the DEMO_KSTACK_* offsets of
 * demo_abi.h (checked here when assembled).
 */
#include "demo_abi.h"

#define SP 5
#define BP 4
#define PREV_SP 1
#define UNDEF 0
#define CALL 0
#define REGS 1

.macro ORC ip:req, sp_reg:req, sp_off:req, bp_reg:req, bp_off:req, type:req, end=0
	.pushsection .orc_unwind_ip, "a"
	.balign 4
	.long \ip - .
	.popsection
	.pushsection .orc_unwind, "a"
	.short \sp_off
	.short \bp_off
	.short \sp_reg | (\bp_reg << 4) | (\type << 8) | (\end << 10)
	.popsection
.endm

	.text

	.globl demo_kstack_entry
	.type demo_kstack_entry, @function
demo_kstack_entry:
	push %rbp
1:	mov %rsp, %rbp
2:	sub $168, %rsp			/* struct pt_regs: 168 bytes */
	mov %rbp, 32(%rsp)		/* bp */
	lea .Ldemo_kstack_irq_ip(%rip), %rax
	mov %rax, 128(%rsp)		/* ip: where the "interrupt" came */
	movq $0x10, 136(%rsp)		/* cs: kernel mode */
	mov %rbp, 152(%rsp)		/* sp: the stack above the frame */
3:	call demo_kstack_outer
.Ldemo_kstack_entry_ret:
	add $168, %rsp
	pop %rbp
4:	ret
.Ldemo_kstack_irq_ip:			/* never runs: the address the pt_regs names */
	nop
	.size demo_kstack_entry, . - demo_kstack_entry
	.if .Ldemo_kstack_entry_ret - demo_kstack_entry != DEMO_KSTACK_ENTRY_RET_OFF
	.error "DEMO_KSTACK_ENTRY_RET_OFF does not match the code"
	.endif
	.if .Ldemo_kstack_irq_ip - demo_kstack_entry != DEMO_KSTACK_ENTRY_IRQ_OFF
	.error "DEMO_KSTACK_ENTRY_IRQ_OFF does not match the code"
	.endif
	ORC demo_kstack_entry, SP, 8, UNDEF, 0, CALL
	ORC 1b, SP, 16, PREV_SP, -16, CALL
	ORC 2b, BP, 16, PREV_SP, -16, CALL
	ORC 3b, SP, 0, UNDEF, 0, REGS
	ORC .Ldemo_kstack_entry_ret, BP, 16, PREV_SP, -16, CALL
	ORC 4b, SP, 8, UNDEF, 0, CALL
	ORC .Ldemo_kstack_irq_ip, UNDEF, 0, UNDEF, 0, CALL, 1	/* end of stack */

	.globl demo_kstack_outer
	.type demo_kstack_outer, @function
demo_kstack_outer:
	push %rbx
1:	sub $16, %rsp
2:	mov %rdi, %rbx
	call demo_kstack_middle
.Ldemo_kstack_outer_ret:
	add $16, %rsp
3:	pop %rbx
4:	ret
	.size demo_kstack_outer, . - demo_kstack_outer
	.if .Ldemo_kstack_outer_ret - demo_kstack_outer != DEMO_KSTACK_OUTER_OFF
	.error "DEMO_KSTACK_OUTER_OFF does not match the code"
	.endif
	ORC demo_kstack_outer, SP, 8, UNDEF, 0, CALL
	ORC 1b, SP, 16, UNDEF, 0, CALL
	ORC 2b, SP, 32, UNDEF, 0, CALL
	ORC 3b, SP, 16, UNDEF, 0, CALL
	ORC 4b, SP, 8, UNDEF, 0, CALL

	.globl demo_kstack_middle
	.type demo_kstack_middle, @function
demo_kstack_middle:
	push %rbp
1:	mov %rsp, %rbp
2:	call demo_kstack_leaf
.Ldemo_kstack_middle_ret:
	pop %rbp
3:	ret
	.size demo_kstack_middle, . - demo_kstack_middle
	.if .Ldemo_kstack_middle_ret - demo_kstack_middle != DEMO_KSTACK_MIDDLE_OFF
	.error "DEMO_KSTACK_MIDDLE_OFF does not match the code"
	.endif
	ORC demo_kstack_middle, SP, 8, UNDEF, 0, CALL
	ORC 1b, SP, 16, PREV_SP, -16, CALL
	ORC 2b, BP, 16, PREV_SP, -16, CALL
	ORC 3b, SP, 8, UNDEF, 0, CALL

	.globl demo_kstack_leaf
	.type demo_kstack_leaf, @function
demo_kstack_leaf:
	lea 1(%rdi), %rax
	ret
	.size demo_kstack_leaf, . - demo_kstack_leaf
	ORC demo_kstack_leaf, SP, 8, UNDEF, 0, CALL
1:	/* the table's end: nothing after this is described */
	ORC 1b, UNDEF, 0, UNDEF, 0, CALL
