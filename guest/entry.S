/*
 * entry.S - vCPU entry of the demo guest kernel.
 *
 * Layout (demo.ld): linked at 0xffffffff81000000 (_text), -mcmodel=kernel, no PIE. This stub is
 * the first thing in .text (section .text.head), so demo_vcpu_entry == _text.
 *
 * Entry protocol (see demo_abi.h): the simulated Xen starts every vCPU here in 64-bit long mode,
 * CPL0, paging off, no IDT, with
 *   RDI = vCPU id (0 .. DEMO_MAX_VCPUS-1)
 *   RSI = iterations (0 = forever)
 *   RSP = don't care (0 is fine): we switch to the top of demo_stacks[id].
 * The stub sets RSP so that the SysV rule holds at demo_main's first instruction
 * ((RSP + 8) % 16 == 0), clears RBP (ends frame-pointer walks) and DF (for rep movs/stos), and
 * calls demo_main(id, iterations). When that returns, the workload is finished and reported; the
 * vCPU then executes `hlt` forever. A bad id reports DEMO_BAD_VCPU on DEMO_PORT_DONE and halts
 * without touching memory.
 */
#include "demo_abi.h"

	.section .text.head, "ax", @progbits
	.globl	demo_vcpu_entry
	.type	demo_vcpu_entry, @function
demo_vcpu_entry:
	cld
	xorl	%ebp, %ebp
	cmpq	$DEMO_MAX_VCPUS, %rdi
	jae	.Lbad_vcpu
	/* RSP = demo_stacks + (id + 1) * DEMO_STACK_SIZE: the stack top, 16-byte aligned. */
	leaq	1(%rdi), %rax
	shlq	$14, %rax			/* * DEMO_STACK_SIZE (16 KiB) */
	leaq	demo_stacks(%rip), %rsp
	addq	%rax, %rsp
	call	demo_main
.Lhalt:
	hlt
	jmp	.Lhalt
.Lbad_vcpu:
	movb	$DEMO_BAD_VCPU, %al
	outb	%al, $DEMO_PORT_DONE
	jmp	.Lhalt
	.size	demo_vcpu_entry, . - demo_vcpu_entry

#if DEMO_STACK_SIZE != (1 << 14)
#error "entry.S assumes DEMO_STACK_SIZE == 16 KiB"
#endif

	.section .note.GNU-stack, "", @progbits
