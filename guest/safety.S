/*
 * safety.S - the kernel tables a Linux 6.1 x86-64 kernel keeps in its own image, in the same
 * formats, so that the library's address rules (libxenprobes/kernel/) meet them on the
 * simulated Xen as they meet them in a real guest. Nothing here is called by the workload:
 * these functions are probe targets only, and each is refused by exactly one rule.
 *
 * Formats (Linux 6.1, arch/x86):
 *   __ex_table           { s32 insn; s32 fixup; s32 data; }   each relative to its own field
 *   __jump_table         { s32 code; s32 target; s64 key; }   relative; key bit 0 = branch
 *   .static_call_sites   { s32 addr; s32 key; }               relative; key bit 0 = init, 1 = tail
 *   .smp_locks           { s32 lock_prefix; }                 relative
 *   kprobe_blacklist     list_head of { list_head list; ulong start_addr, end_addr; void *priv; }
 *   .entry.text, .noinstr.text, .kprobes.text: bounded by __<name>_text_start/_end (demo.ld)
 */
#define FTRACE_NOP5 .byte 0x0f, 0x1f, 0x44, 0x00, 0x00

	.text

/* A user copy: its rep movsb may fault, and the exception table sends the fault to 2:. It runs
   in a fixup slot, never in Xen's emulator (which runs rep strings in chunks). */
	.globl demo_uaccess_copy
	.type demo_uaccess_copy, @function
demo_uaccess_copy:
	FTRACE_NOP5
	movq %rdx, %rcx
1:	rep movsb
2:	movq %rcx, %rax
	ret
	.size demo_uaccess_copy, . - demo_uaccess_copy
	.pushsection __ex_table, "a"
	.balign 4
	.long 1b - .
	.long 2b - .
	.long 3			/* EX_TYPE_UACCESS */
	.popsection

/* A get_user: a load the exception table covers. It runs in a fixup slot (or, on the vmevent
   channel in int3 mode, in Xen's emulator where it is). */
	.globl demo_get_user
	.type demo_get_user, @function
demo_get_user:
	FTRACE_NOP5
1:	movq (%rdi), %rax
2:	ret
	.size demo_get_user, . - demo_get_user
	.pushsection __ex_table, "a"
	.balign 4
	.long 1b - .
	.long 2b - .
	.long 3			/* EX_TYPE_UACCESS */
	.popsection

/* A load_unaligned_zeropad(): its fixup handler decodes the instruction at the faulting
   address, which in a slot is the slot's, so no slot may run it. */
	.globl demo_load_zeropad
	.type demo_load_zeropad, @function
demo_load_zeropad:
	FTRACE_NOP5
1:	movq (%rdi), %rax
2:	ret
	.size demo_load_zeropad, . - demo_load_zeropad
	.pushsection __ex_table, "a"
	.balign 4
	.long 1b - .
	.long 2b - .
	.long 20		/* EX_TYPE_ZEROPAD */
	.popsection

/* A 1-byte instruction before one the exception table covers: on the debugger channel the
   neighbour runs out of line with it, so the same rule refuses it there. */
	.globl demo_uaccess_neighbour
	.type demo_uaccess_neighbour, @function
demo_uaccess_neighbour:
	FTRACE_NOP5
	movq %rdx, %rcx
	push %rbx
1:	rep movsb
2:	pop %rbx
	movq %rcx, %rax
	ret
	.size demo_uaccess_neighbour, . - demo_uaccess_neighbour
	.pushsection __ex_table, "a"
	.balign 4
	.long 1b - .
	.long 2b - .
	.long 3			/* EX_TYPE_UACCESS */
	.popsection

/* A static branch: a 5-byte NOP the kernel turns into `jmp 2f` when demo_static_key flips. */
	.globl demo_static_branch
	.type demo_static_branch, @function
demo_static_branch:
	FTRACE_NOP5
1:	FTRACE_NOP5
	xorl %eax, %eax
	ret
2:	movl $1, %eax
	ret
	.size demo_static_branch, . - demo_static_branch
	.pushsection __jump_table, "a"
	.balign 8
	.long 1b - .
	.long 2b - .
	.quad demo_static_key - .
	.popsection

/* A branch from one function into the middle of another, as a compiler's split part
   (foo.cold) or assembly whose labels are symbols of their own do: demo_cross_from jumps to
   demo_cross_into+2. No address rule refuses anything here; the jump rules must see that
   branch (a 5-byte jump at demo_cross_into would cover its target). Never called. */
	.globl demo_cross_into
	.type demo_cross_into, @function
demo_cross_into:
	xorl %eax, %eax
1:	movl $1, %ecx
	ret
	.size demo_cross_into, . - demo_cross_into
	.globl demo_cross_from
	.type demo_cross_from, @function
demo_cross_from:
	movl $2, %eax
	jmp 1b
	.size demo_cross_from, . - demo_cross_from

/* A tail call through a register, as a kernel without retpolines compiles `return op(x)`
   through a function pointer: an indirect jump whose targets nobody can list, so every region
   of the function is refused, unless the kernel image shows that no address inside it is
   formed anywhere (only a function's start is, in demo_tail_ptr): then the jump can only leave
   it (docs/probes.md "Jump probes", tail calls proven). Never called. */
	.globl demo_tail_call
	.type demo_tail_call, @function
demo_tail_call:
	movq demo_tail_ptr(%rip), %rax
	addl $1, %edi
	jmp *%rax
	.size demo_tail_call, . - demo_tail_call

/* A static call: an inline site calling the trampoline __SCT__demo_hook, which jumps to the
   current target. The kernel rewrites both when the call is updated. */
	.globl demo_static_call
	.type demo_static_call, @function
demo_static_call:
	FTRACE_NOP5
1:	call __SCT__demo_hook
	ret
	.size demo_static_call, . - demo_static_call
	.pushsection .static_call_sites, "a"
	.balign 4
	.long 1b - .
	.long __SCK__demo_hook - .
	.popsection

	.globl demo_hook_target
	.type demo_hook_target, @function
demo_hook_target:
	FTRACE_NOP5
	movl $7, %eax
	ret
	.size demo_hook_target, . - demo_hook_target

	.globl __SCT__demo_hook
	.type __SCT__demo_hook, @function
__SCT__demo_hook:
	jmp demo_hook_target
	.size __SCT__demo_hook, . - __SCT__demo_hook

/* An SMP-alternatives site: the lock prefix a uniprocessor kernel would rewrite to 0x3e. */
	.globl demo_locked_inc
	.type demo_locked_inc, @function
demo_locked_inc:
	FTRACE_NOP5
	movq $demo_lock_counter, %rax
1:	lock incq (%rax)
	ret
	.size demo_locked_inc, . - demo_locked_inc
	.pushsection .smp_locks, "a"
	.balign 4
	.long 1b - .
	.popsection

/* A function that ends in a BUG(): after its ud2 only int3 padding up to the next function,
   as Linux 6.1's __pv_queued_spin_unlock_slowpath ends. Before it, a WARN()'s ud2 (the kernel
   goes on with the next instruction) and a ret with its straight-line-speculation int3. The
   padding is refused by the instruction rule for an int3 (as after a ret), not as a foreign
   breakpoint. Never run: postlink.cmake leaves it out of its check for traps the simulated
   Xen cannot run. Offsets are in the comments (tests/engine/safety_test.cpp uses them). */
	.globl demo_bug_end
	.type demo_bug_end, @function
demo_bug_end:
	FTRACE_NOP5			/* +0x00 */
	testq %rsi, %rsi		/* +0x05 */
	je 1f				/* +0x08 */
	ud2				/* +0x0a: WARN() */
1:	testq %rdi, %rdi		/* +0x0c */
	je 2f				/* +0x0f */
	movl $1, %eax			/* +0x11 */
	ret				/* +0x16 */
	int3				/* +0x17: after the ret */
2:	ud2				/* +0x18: BUG() */
	int3				/* +0x1a .. +0x1f: to the function's end */
	int3
	int3
	int3
	int3
	int3
	.size demo_bug_end, . - demo_bug_end

/* On the guest module's int3 path in Linux (the module's die notifier runs RCU readers and
   checks the resume address with lookup_address): the guest channel refuses them by name. */
	.globl __rcu_read_lock
	.type __rcu_read_lock, @function
__rcu_read_lock:
	FTRACE_NOP5
	addl $1, demo_rcu_nesting(%rip)
	ret
	.size __rcu_read_lock, . - __rcu_read_lock

	.globl lookup_address
	.type lookup_address, @function
lookup_address:
	FTRACE_NOP5
	xorl %eax, %eax
	ret
	.size lookup_address, . - lookup_address

/* NOKPROBE_SYMBOL(demo_nokprobe_fn): listed on kprobe_blacklist below. */
	.globl demo_nokprobe_fn
	.type demo_nokprobe_fn, @function
demo_nokprobe_fn:
	FTRACE_NOP5
	movl $3, %eax
	ret
	.size demo_nokprobe_fn, . - demo_nokprobe_fn
demo_nokprobe_fn_end:

	.section .entry.text, "ax"
	.globl demo_entry_stub
	.type demo_entry_stub, @function
demo_entry_stub:
	movq %rsp, %rax
	ret
	.size demo_entry_stub, . - demo_entry_stub

	.section .noinstr.text, "ax"
	.globl demo_noinstr_fn
	.type demo_noinstr_fn, @function
demo_noinstr_fn:
	movl $5, %eax
	ret
	.size demo_noinstr_fn, . - demo_noinstr_fn

	.section .kprobes.text, "ax"
	.globl demo_kprobes_fn
	.type demo_kprobes_fn, @function
demo_kprobes_fn:
	movl $6, %eax
	ret
	.size demo_kprobes_fn, . - demo_kprobes_fn

	.data
	.balign 8
	.globl demo_tail_ptr
demo_tail_ptr:
	.quad demo_cross_into
	.balign 8
	.globl demo_static_key
demo_static_key:
	.quad 0, 0
	.globl __SCK__demo_hook
__SCK__demo_hook:
	.quad demo_hook_target, 0
demo_lock_counter:
	.quad 0
demo_rcu_nesting:
	.long 0, 0
	.globl kprobe_blacklist
	.type kprobe_blacklist, @object
kprobe_blacklist:
	.quad demo_blacklist_entry, demo_blacklist_entry
demo_blacklist_entry:
	.quad kprobe_blacklist, kprobe_blacklist
	.quad demo_nokprobe_fn, demo_nokprobe_fn_end, 0

	.section .note.GNU-stack, "", @progbits
