/*
 * ibt.S - functions as a kernel built with indirect branch tracking (IBT, Linux 6.12 as Debian 13
 * builds it) starts them: `endbr64` first, then the 5-byte ftrace nop, whose address
 * __mcount_loc lists. Also one without the ftrace nop (a notrace function of such a kernel).
 *
 * The workload never calls them. demo_ibt_entry is a second vCPU entry a test may start vCPU 0
 * at instead of demo_vcpu_entry (same registers: RDI = vCPU id, RSI = iterations): it calls each
 * function DEMO_IBT_CALLS times through a register, as an IBT kernel's indirect calls reach an
 * endbr64, then goes on to demo_vcpu_entry with RDI and RSI unchanged, so the ordinary
 * workload runs and reports as usual. Each function counts its own entries in
 * demo_ibt_calls / demo_ibt_bare_calls (8-byte counters in .data).
 */
#define DEMO_IBT_CALLS 7
#define FTRACE_NOP5 .byte 0x0f, 0x1f, 0x44, 0x00, 0x00

	.text

/* endbr64, nop5, then the body: the first instruction a probe at the entry may take. */
	.globl demo_ibt_fn
	.type demo_ibt_fn, @function
demo_ibt_fn:
	endbr64
1:	FTRACE_NOP5
	movq demo_ibt_calls(%rip), %rax
	addq $1, %rax
	movq %rax, demo_ibt_calls(%rip)
	ret
	.size demo_ibt_fn, . - demo_ibt_fn
	.pushsection __mcount_loc, "a"
	.balign 8
	.quad 1b
	.popsection

/* endbr64 without the ftrace nop. */
	.globl demo_ibt_bare
	.type demo_ibt_bare, @function
demo_ibt_bare:
	endbr64
	addq $1, demo_ibt_bare_calls(%rip)
	movl $DEMO_IBT_CALLS, %eax
	ret
	.size demo_ibt_bare, . - demo_ibt_bare

	.globl demo_ibt_entry
	.type demo_ibt_entry, @function
demo_ibt_entry:
	movq $demo_ibt_stack + 4096, %rsp
	movq %rdi, %r12
	movq %rsi, %r13
	movl $DEMO_IBT_CALLS, %ebx
2:	movq $demo_ibt_fn, %rax
	call *%rax
	movq $demo_ibt_bare, %rax
	call *%rax
	subl $1, %ebx
	jnz 2b
	movq %r12, %rdi
	movq %r13, %rsi
	jmp demo_vcpu_entry
	.size demo_ibt_entry, . - demo_ibt_entry

	.data
	.balign 8
	.globl demo_ibt_calls
	.type demo_ibt_calls, @object
demo_ibt_calls:
	.quad 0
	.size demo_ibt_calls, 8
	.globl demo_ibt_bare_calls
	.type demo_ibt_bare_calls, @object
demo_ibt_bare_calls:
	.quad 0
	.size demo_ibt_bare_calls, 8

	.bss
	.balign 16
demo_ibt_stack:
	.skip 4096
	.size demo_ibt_stack, 4096

	.section .note.GNU-stack, "", @progbits
