/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenprobesU: the jump entry (protocol.h, "Jump probes"; published as jump-entry).
 *
 * A jump probe's detour, in an OEA area, calls xp_jump_entry with `call rel32`, so on entry
 * 0(%rsp) holds R = the call + 5 and the stack pointer of the probed instruction (the hit's
 * rsp) is %rsp + 8. Nothing else is known about the context: any flags (the probed
 * instruction may read them), interrupts on or off, any stack alignment, any register live.
 *
 * The frame, from the top down:
 *      hit rsp - 8    R                  (the call)
 *      hit rsp - 16   rflags at the hit  (pushfq, before any instruction that changes them)
 *      below          a struct pt_regs (asm/ptrace-abi.h's offsets): every general
 *                     register, orig_ax = -1, ip = R, flags = the pushed rflags, sp = the
 *                     hit's rsp, cs and ss as they are
 * xp_jump_hit(regs, R) (xp_hook.c) handles the hit and leaves in the frame the general
 * registers to resume with and in its sp field new_rsp - 16, having written the final rflags
 * at new_rsp - 16 and the address to resume at at new_rsp - 8 (new_rsp is the hit's rsp, or
 * up to 4 KiB above it: never below, so those two words are never in this frame). This code
 * restores the general registers, moves %rsp there, pops the flags and returns: into the
 * detour at R normally, elsewhere when Dom0's pre-handler skipped the probed instruction.
 *
 * The return is the kernel's RET (a return thunk under CONFIG_RETHUNK), which must leave the
 * flags popfq restored alone. Every thunk does but the call-depth-tracking one (retbleed=stuff,
 * X86_FEATURE_CALL_DEPTH, 6.2 and later), which shifts a per-CPU counter: on such a kernel
 * the module does not publish jump-entry (xp_xenstore.c), so Dom0 makes no jump probes.
 *
 * Unwinding: the detour that called us has no ORC data (it is Dom0's code in the OEA), so the
 * entry tells objtool the stack is undefined from here: an unwind that reaches it stops (6.4
 * and later: as an error, UNWIND_HINT_UNDEFINED; before, UNWIND_HINT_EMPTY, as the end of the
 * stack). SYM_CODE: no function, so objtool does not check the stack pointer's moves.
 * ANNOTATE_NOENDBR: the module publishes the entry's address, which IBT's objtool check would
 * otherwise report as a relocation to a non-ENDBR target; the detours call it directly.
 */
#include <linux/linkage.h>
#include <linux/objtool.h>
#include <linux/version.h>
#include <asm/ptrace-abi.h>
#include <asm/unwind_hints.h>

/* Above the frame: the pushed rflags, then R. */
#define XP_J_FLAGS	FRAME_SIZE
#define XP_J_RET	(FRAME_SIZE + 8)
#define XP_J_HIT_RSP	(FRAME_SIZE + 16)

	.text
SYM_CODE_START(xp_jump_entry)
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	UNWIND_HINT_UNDEFINED
#else
	UNWIND_HINT_EMPTY
#endif
	ANNOTATE_NOENDBR
	pushfq
	lea	-FRAME_SIZE(%rsp), %rsp		/* lea: the flags stay as pushed */
	movq	%rdi, RDI(%rsp)
	movq	%rsi, RSI(%rsp)
	movq	%rdx, RDX(%rsp)
	movq	%rcx, RCX(%rsp)
	movq	%rax, RAX(%rsp)
	movq	%r8, R8(%rsp)
	movq	%r9, R9(%rsp)
	movq	%r10, R10(%rsp)
	movq	%r11, R11(%rsp)
	movq	%rbx, RBX(%rsp)
	movq	%rbp, RBP(%rsp)
	movq	%r12, R12(%rsp)
	movq	%r13, R13(%rsp)
	movq	%r14, R14(%rsp)
	movq	%r15, R15(%rsp)
	movq	$-1, ORIG_RAX(%rsp)
	movq	XP_J_FLAGS(%rsp), %rax
	movq	%rax, EFLAGS(%rsp)
	movq	XP_J_RET(%rsp), %rsi		/* second argument: R */
	movq	%rsi, RIP(%rsp)
	leaq	XP_J_HIT_RSP(%rsp), %rax
	movq	%rax, RSP(%rsp)
	movq	%cs, %rax
	movq	%rax, CS(%rsp)
	movq	%ss, %rax
	movq	%rax, SS(%rsp)
	cld					/* the C calling convention's DF = 0 */
	movq	%rsp, %rdi			/* first argument: the frame */
	call	xp_jump_hit
	movq	R15(%rsp), %r15
	movq	R14(%rsp), %r14
	movq	R13(%rsp), %r13
	movq	R12(%rsp), %r12
	movq	RBP(%rsp), %rbp
	movq	RBX(%rsp), %rbx
	movq	R11(%rsp), %r11
	movq	R10(%rsp), %r10
	movq	R9(%rsp), %r9
	movq	R8(%rsp), %r8
	movq	RAX(%rsp), %rax
	movq	RCX(%rsp), %rcx
	movq	RDX(%rsp), %rdx
	movq	RSI(%rsp), %rsi
	movq	RDI(%rsp), %rdi
	movq	RSP(%rsp), %rsp			/* new_rsp - 16: the final rflags, then rip */
	popfq
	RET
SYM_CODE_END(xp_jump_entry)
