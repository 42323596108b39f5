/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * xenprobesU: the pure decisions of the guest module.
 *
 * Everything here compiles both inside the kernel module and in userspace, where the unit
 * tests (tests/module/) drive it. No kernel header is used beyond what protocol.h pulls in
 * (<linux/types.h>) and <linux/stddef.h> for NULL/true/false; nothing here sleeps, allocates,
 * locks or touches a global: the callers own all state and every side effect (stack reads
 * and writes go through struct xp_mem_ops, "is this page executable" through
 * struct xp_bounds).
 *
 * Everything Dom0 wrote (the trap table, the return table, mailbox answers, xenstore values)
 * is treated as hostile here: every index and count is bounded, every address the guest
 * would resume at is validated, shared memory is read once (volatile loads) into a private
 * snapshot before it is checked and used.
 *
 * Implemented in xp_logic.c, xp_fallback.c (the fallback: branch emulation, return table) and
 * xp_region.c (jump regions and islands, xp_region.h).
 */
#ifndef XENPROBES_XP_LOGIC_H
#define XENPROBES_XP_LOGIC_H

#include <xenprobes/protocol.h>

#ifdef __KERNEL__
#include <linux/stddef.h>
typedef __s64 xp_s64;
typedef __s32 xp_s32;
typedef __u16 xp_u16;
#else
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
typedef int64_t xp_s64;
typedef int32_t xp_s32;
typedef uint16_t xp_u16;
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define XP_PAGE_SIZE 4096u
#define XP_INT3 0xccu

/* errno values (x86-64 Linux numbers), returned negated like the kernel does. */
#define XP_EINVAL 22
#define XP_E2BIG 7
#define XP_ENOSPC 28
#define XP_EFAULT 14

/*
 * The rflags bits taken from Dom0's answer: the arithmetic flags (CF PF AF ZF SF OF) only.
 * IF, DF, IOPL, NT, RF, AC, ... stay what the guest had: Dom0 must not be able to enable
 * interrupts inside an exception handler or change the privilege-related bits. TF stays the
 * guest's too: a kernel resumed with TF set that Linux did not set itself takes a #DB that
 * exc_debug_kernel() WARNs about (no kernel debugger expects it), and an emulated branch
 * never needs it.
 */
#define XP_RFLAGS_CF 0x001ull
#define XP_RFLAGS_PF 0x004ull
#define XP_RFLAGS_AF 0x010ull
#define XP_RFLAGS_ZF 0x040ull
#define XP_RFLAGS_SF 0x080ull
#define XP_RFLAGS_TF 0x100ull
#define XP_RFLAGS_OF 0x800ull
#define XP_RFLAGS_FROM_DOM0 (XP_RFLAGS_CF | XP_RFLAGS_PF | XP_RFLAGS_AF | XP_RFLAGS_ZF | \
			     XP_RFLAGS_SF | XP_RFLAGS_OF)

/*
 * How far Dom0 may move the stack pointer in an answer: a call or ret it emulated moves it
 * by 8, a `ret imm16` by at most 8 + 65535. Anything further is not a branch Dom0 emulated
 * but a corrupt answer.
 */
#define XP_RSP_SLACK (8ull + 0xffffull)

/* Alignment of the arrays inside the control area (a cache line). */
#define XP_CTL_ALIGN 64u

/* ---- shared-memory loads and stores (one access each, never torn for aligned fields) ---- */

static inline xenprobes_u64 xp_ld64(const volatile xenprobes_u64 *p) { return *p; }
static inline xenprobes_u32 xp_ld32(const volatile xenprobes_u32 *p) { return *p; }
static inline xenprobes_u8 xp_ld8(const volatile xenprobes_u8 *p) { return *p; }
static inline void xp_st64(volatile xenprobes_u64 *p, xenprobes_u64 v) { *p = v; }
static inline void xp_st32(volatile xenprobes_u32 *p, xenprobes_u32 v) { *p = v; }

/* ---- the control area ---- */

struct xp_layout {
	xenprobes_u32 mailbox_offset;
	xenprobes_u32 trap_offset;
	xenprobes_u32 ret_offset;
	xenprobes_u32 bytes;	/* end of the last array */
	xenprobes_u32 pages;	/* bytes rounded up to whole pages */
};

/*
 * Lays out header, mailboxes, trap table and return table, each array aligned to
 * XP_CTL_ALIGN. 0, -XP_EINVAL (no mailbox or no trap entry) or -XP_E2BIG (more than
 * XENPROBES_CTL_MAX_PAGES pages).
 */
int xp_layout_compute(xenprobes_u32 nr_mailboxes, xenprobes_u32 trap_capacity,
		      xenprobes_u32 ret_capacity, struct xp_layout *out);

/* Fills the header of a zeroed control area. */
void xp_header_init(struct xenprobes_ctl_header *h, xenprobes_u32 nr_mailboxes,
		    const struct xp_layout *l, xenprobes_u32 trap_capacity,
		    xenprobes_u32 ret_capacity, xenprobes_u32 timeout_ms);

/* ---- the trap table (Dom0 writes it, sorted by addr; nr_traps live entries) ---- */

/* nr_traps as Dom0 wrote it, bounded by the capacity the module allocated. */
static inline xenprobes_u32 xp_live_traps(xenprobes_u32 nr_traps, xenprobes_u32 capacity)
{
	return nr_traps < capacity ? nr_traps : capacity;
}

/* Copies an entry field by field with single loads (Dom0 may be writing it). */
void xp_trap_snapshot(struct xenprobes_trap *dst, const struct xenprobes_trap *src);

/*
 * Binary search of the first xp_live_traps(nr_traps, capacity) entries for `addr`. On a
 * match the entry is copied to *out and true returned. Terminates in O(log n) and reads
 * only inside the table whatever the contents (an unsorted table just misses).
 */
bool xp_trap_search(const struct xenprobes_trap *table, xenprobes_u32 nr_traps,
		    xenprobes_u32 capacity, xenprobes_u64 addr, struct xenprobes_trap *out);

/*
 * Linear scan of the same entries. The int3 hook uses it only when the binary search
 * missed and the byte is still an int3 (the kernel would oops on it otherwise), so an
 * unsorted table from a buggy Dom0 costs time, not the guest.
 */
bool xp_trap_scan(const struct xenprobes_trap *table, xenprobes_u32 nr_traps,
		  xenprobes_u32 capacity, xenprobes_u64 addr, struct xenprobes_trap *out);

/* ---- addresses ---- */

struct xp_range {
	xenprobes_u64 start;	/* first byte */
	xenprobes_u64 end;	/* one past the last byte; start == end: empty */
};

static inline bool xp_in_range(const struct xp_range *r, xenprobes_u64 addr)
{
	return addr >= r->start && addr < r->end;
}

/*
 * Where the guest may resume and what the module may patch. The kernel glue fills it once
 * at load time; is_exec (may be NULL in tests) tells whether the page holding addr is
 * mapped and executable right now.
 */
struct xp_bounds {
	struct xp_range ktext;		/* core kernel text [_text, _etext) */
	struct xp_range modules;	/* the module mapping area */
	struct xp_range oea;		/* the module's whole OEA pool */
	bool (*is_exec)(void *ctx, xenprobes_u64 addr);
	void *ctx;
};

enum xp_addr_kind {
	XP_ADDR_BAD = 0,
	XP_ADDR_KTEXT,
	XP_ADDR_MODULE,
	XP_ADDR_OEA,
};

/* Which kind of code address addr is by range alone (the OEA wins over the module area). */
enum xp_addr_kind xp_addr_classify(const struct xp_bounds *b, xenprobes_u64 addr);

/* May the guest resume at addr: kernel text, module area or OEA, and executable. */
bool xp_resume_ok(const struct xp_bounds *b, xenprobes_u64 addr);

/*
 * May the module write e->insn[0] back at e->addr once Dom0 is gone (e: a private
 * snapshot): the entry is no jump's (REDIRECT regions: xp_region_restore_ok; JUMP entries
 * are keys inside the OEA), has original bytes (len 1..15), the address is kernel or module text
 * outside the OEA and executable, it currently holds an int3 (so only bytes Dom0 patched are
 * touched), and insn[0] is not itself an int3.
 */
bool xp_restore_ok(const struct xp_bounds *b, const struct xenprobes_trap *e,
		   xenprobes_u8 current_byte);

/*
 * Is the int3 a CPU just executed at addr (a trap-table address) stale: addr lies outside
 * the OEA and the byte there now (current_byte) is no longer an int3, so the CPU fetched it
 * before the byte was restored. The hook counts it (the unload line reports it). The OEA's
 * traps are int3 for the module's lifetime.
 */
static inline bool xp_trap_stale(const struct xp_bounds *b, xenprobes_u64 addr,
				 xenprobes_u8 current_byte)
{
	return !xp_in_range(&b->oea, addr) && current_byte != XP_INT3;
}

/* ---- registers ---- */

static inline xenprobes_u64 xp_merge_flags(xenprobes_u64 guest, xenprobes_u64 dom0)
{
	return (guest & ~XP_RFLAGS_FROM_DOM0) | (dom0 & XP_RFLAGS_FROM_DOM0);
}

/* Copies a mailbox's regs field by field with single loads. */
void xp_regs_snapshot(struct xenprobes_regs *dst, const struct xenprobes_regs *src);

enum xp_answer {
	XP_ANSWER_OK = 0,
	XP_ANSWER_BAD_RIP,	/* outside kernel/module text and the OEA, or not executable */
	XP_ANSWER_BAD_RSP,	/* moved further than any emulated branch could */
};

/*
 * Builds the registers to resume with from the registers of the hit and Dom0's answer
 * (a private snapshot): the general registers and rip from Dom0, rflags merged with
 * xp_merge_flags, cs and ss always from the hit. *out is written only when the answer is OK.
 */
enum xp_answer xp_answer_apply(const struct xp_bounds *b, const struct xenprobes_regs *hit,
			       const struct xenprobes_regs *answer, struct xenprobes_regs *out);

/* ---- the mailbox state machine (module side) ---- */

enum xp_route {
	XP_ROUTE_PUBLISH = 0,	/* hand the hit to Dom0 and wait */
	XP_ROUTE_FALLBACK,	/* resume on our own at once, without notifying */
};

/*
 * A found hit goes to Dom0 unless Dom0 was declared gone, the module is detaching, this
 * CPU is already inside the hook (a probe hit from the hook's own path, e.g. an NMI), or
 * the CPU has no mailbox. (The hook itself sends nested hits to the fallback before it gets
 * here, taking as few calls as it can: xp_hook.c, "Nesting".)
 */
enum xp_route xp_route_hit(bool dom0_gone, bool detaching, bool nested,
			   xenprobes_u32 mailbox, xenprobes_u32 nr_mailboxes);

/*
 * The claim bound (protocol.h): how long in all a hit Dom0 claimed may wait, in ms:
 * max(timeout_ms, min(XENPROBES_CLAIM_FACTOR * timeout_ms, XENPROBES_CLAIM_MAX_MS)).
 */
xenprobes_u64 xp_claim_bound_ms(xenprobes_u32 timeout_ms);

enum xp_wait {
	XP_WAIT_AGAIN = 0,	/* poll once more */
	XP_WAIT_DONE,		/* Dom0 answered this hit */
	XP_WAIT_TIMEOUT,	/* give up: try to abandon the mailbox (xp_give_up_step) */
};

/*
 * One check of the waiting loop: the answer counts only when state is DONE and answer_seq is
 * this hit's seq (a late answer to an abandoned hit never does). The wait ends at `deadline`
 * (timeout_ms after the hit), or early when give_up (detaching) -- except while Dom0 holds a
 * claim (CLAIMED): its handlers may be writing this vCPU's stack, so the wait goes on until
 * `claim_deadline` (the claim bound after the hit), whatever give_up says. Times in any
 * monotonic nanoseconds.
 */
enum xp_wait xp_wait_step(xenprobes_u32 state, xenprobes_u32 answer_seq, xenprobes_u32 seq,
			  xenprobes_u64 now, xenprobes_u64 deadline, xenprobes_u64 claim_deadline,
			  bool give_up);

/* Failed swaps after which the module stores ABANDONED without comparing. */
#define XP_GIVE_UP_TRIES 4u

enum xp_give_up {
	XP_GIVE_UP_ANSWERED = 0,	/* DONE with this seq: take the answer after all */
	XP_GIVE_UP_WAIT,	/* CLAIMED within the claim bound: wait on (xp_wait_step) */
	XP_GIVE_UP_SWAP,	/* HIT, or CLAIMED past the bound: swap again, from `seen` */
	XP_GIVE_UP_FORCE,	/* anything else: store ABANDONED, take the fallback */
};

/*
 * After XP_WAIT_TIMEOUT the module compare-and-swaps state to ABANDONED, from HIT first. When
 * that swap fails, `seen` is the state it found and `tries` the number of swaps failed before
 * this one; the result says what next. A Dom0 flipping the state cannot keep the hook
 * looping: it waits on claims only within the claim bound, and past the bound at most
 * XP_GIVE_UP_TRIES swaps fail before the module stores ABANDONED regardless.
 */
enum xp_give_up xp_give_up_step(xenprobes_u32 seen, xenprobes_u32 answer_seq, xenprobes_u32 seq,
				bool past_claim_bound, xenprobes_u32 tries);

/* true when `consecutive` timeouts in a row mean Dom0 is gone. */
static inline bool xp_dead_after(xenprobes_u32 consecutive)
{
	return consecutive >= XENPROBES_DEAD_AFTER;
}

/*
 * ---- spinning instead of notifying (protocol.h, "Spinning instead of notifying") ----
 *
 * Two flags let a hit and its answer go without an event-channel notification while the other
 * side is looking anyway: header.dom0_polling (Dom0 writes it) and mailbox.spinning (the module
 * writes it). Each side stores its own word, then a full barrier, then loads the other's; with
 * both barriers in place at least one of the two loads sees the other side's store, so a
 * skipped notification is always covered by a look the other side still makes. The barriers
 * themselves live in xp_exchange.c (userspace tests cannot check them); the decisions are here.
 */

/* The largest spin_us the module loads with: the spin runs with interrupts off. */
#define XP_SPIN_MAX_US 1000

/* 0 (never spin) .. XP_SPIN_MAX_US; anything else refuses the load. */
static inline bool xp_spin_us_ok(xenprobes_u32 spin_us)
{
	return spin_us <= XP_SPIN_MAX_US;
}

/*
 * Step 1: does the hit notify Dom0, given header.dom0_polling as loaded once after state = HIT
 * and a full barrier. Any nonzero value means "Dom0 is polling the mailboxes": the hit skips
 * the notification (a Dom0 that says so falsely only delays its own hits to the timeout, which
 * it could do by not answering as well).
 */
static inline bool xp_hit_notify(xenprobes_u32 dom0_polling)
{
	return dom0_polling == 0;
}

/*
 * When a spin that starts at `now` (monotonic ns) ends: spin_us microseconds later, saturating
 * at the largest time instead of wrapping around.
 */
xenprobes_u64 xp_spin_until(xenprobes_u64 now, xenprobes_u32 spin_us);

enum xp_spin {
	XP_SPIN_AGAIN = 0,	/* cpu_relax(), then check once more */
	XP_SPIN_ENDED,		/* xp_wait_step ended the wait (DONE or TIMEOUT): its result stands */
	XP_SPIN_BLOCK,		/* the spin bound passed unanswered: stop spinning, wait as before */
};

/*
 * One check of step 2's spin. w is xp_wait_step()'s result for the same check, at `now`: its
 * result always wins, so the spin never extends a deadline or the claim bound (a TIMEOUT ends
 * the spin at once) and never outlives an answer; only while it says XP_WAIT_AGAIN does the
 * spin's own bound, spin_until (xp_spin_until()), decide between checking again and blocking.
 */
enum xp_spin xp_spin_step(enum xp_wait w, xenprobes_u64 now, xenprobes_u64 spin_until);

/* ---- branches the fallback emulates (XENPROBES_TRAP_EMULATE) ---- */

/* The little-endian rel32 at p, sign extended (xp_decode_branch, xp_region_bytes_ours). */
xp_s64 xp_rel32_at(const xenprobes_u8 *p);

enum xp_branch_kind {
	XP_BR_NONE = 0,
	XP_BR_JMP,	/* eb rel8, e9 rel32 */
	XP_BR_JCC,	/* 70+cc rel8, 0f 80+cc rel32 */
	XP_BR_CALL,	/* e8 rel32 */
	XP_BR_LOOP,	/* e2 rel8 */
	XP_BR_LOOPE,	/* e1 rel8 */
	XP_BR_LOOPNE,	/* e0 rel8 */
	XP_BR_JRCXZ,	/* e3 rel8 (67 e3: jecxz) */
	XP_BR_RET,	/* c3, c2 imm16 */
	XP_BR_CALL_REG,	/* ff /2 with mod 3: call *%reg (retpoline sites patched to it) */
	XP_BR_JMP_REG,	/* ff /4 with mod 3: jmp *%reg */
};

/* Register numbers as x86 encodes them (ModRM.rm plus REX.B), for XP_BR_*_REG. */
enum xp_gpr {
	XP_GPR_RAX = 0, XP_GPR_RCX, XP_GPR_RDX, XP_GPR_RBX,
	XP_GPR_RSP, XP_GPR_RBP, XP_GPR_RSI, XP_GPR_RDI,
	XP_GPR_R8, XP_GPR_R9, XP_GPR_R10, XP_GPR_R11,
	XP_GPR_R12, XP_GPR_R13, XP_GPR_R14, XP_GPR_R15,
};

struct xp_branch {
	enum xp_branch_kind kind;
	xenprobes_u32 len;	/* decoded length, prefixes included */
	xenprobes_u32 cc;	/* XP_BR_JCC: the condition code 0..15 */
	xp_s64 disp;		/* relative displacement (sign extended) */
	xenprobes_u32 imm16;	/* XP_BR_RET: bytes popped after the return address */
	xenprobes_u32 reg;	/* XP_BR_*_REG: the target register, an enum xp_gpr */
	bool ecx;		/* XP_BR_JRCXZ with a 67 prefix: tests ecx */
};

/*
 * Decodes one of the branch forms above from bytes[0..len). Allowed prefixes: 2e/3e (branch
 * hints; 3e is also `notrack`), f2 (BND), f3 before a ret (`rep ret`), 67 before jrcxz only,
 * and a REX prefix right before the opcode (REX.B selects r8..r15 for the register forms; the
 * other REX bits change nothing for these forms). Refused: 66 (operand size truncates rip on
 * AMD), 67 on anything but jrcxz, far forms, branches through memory (`jmp/call *mem`: the
 * target is loaded from an address the module would have to compute and read, see
 * xp_is_mem_indirect_branch), anything else. The decoded length must equal len exactly (the
 * entry's len is the instruction's length). false when the bytes are not such a branch.
 *
 * Dom0 (libxenprobes/channel/guest.cpp) runs this very function on every EMULATE entry before
 * it arms the trap: an entry the module could not emulate is refused there, never armed.
 */
bool xp_decode_branch(const xenprobes_u8 *bytes, xenprobes_u32 len, struct xp_branch *out);

/*
 * true when bytes[0..len) is a near jmp/call through memory (ff /2 or ff /4 with a memory
 * operand, e.g. `jmp *table(,%rdi,8)`, `call *0x10(%rax)`), which xp_decode_branch refuses.
 * For Dom0's refusal message only: the module itself never needs to know why.
 */
bool xp_is_mem_indirect_branch(const xenprobes_u8 *bytes, xenprobes_u32 len);

/* Evaluates condition code cc (the low nibble of a jcc opcode) on rflags. */
bool xp_condition(xenprobes_u32 cc, xenprobes_u64 rflags);

/* Stack access for emulation; both return false on a fault. */
struct xp_mem_ops {
	bool (*read_u64)(void *ctx, xenprobes_u64 addr, xenprobes_u64 *val);
	bool (*write_u64)(void *ctx, xenprobes_u64 addr, xenprobes_u64 val);
	void *ctx;
};

enum xp_emul {
	XP_EMUL_OK = 0,
	XP_EMUL_UNSUPPORTED,	/* not a branch form we emulate */
	XP_EMUL_BAD_TARGET,	/* the branch would leave kernel/module text and the OEA */
	XP_EMUL_FAULT,		/* the stack could not be read or written */
};

/*
 * Executes the branch in bytes[0..len) as if it sat at r->rip (the trap address): updates
 * rip, and rsp/rcx and the stack where the instruction does. A call pushes the address after
 * the whole instruction; a register-indirect one jumps to the register's value at the trap
 * (read before the push, as the CPU does: `call *%rsp` targets the old rsp). The target is
 * validated before anything is changed; on failure *r and the stack are left untouched.
 */
enum xp_emul xp_emulate(const xenprobes_u8 *bytes, xenprobes_u32 len, struct xenprobes_regs *r,
			const struct xp_bounds *b, const struct xp_mem_ops *m);

/* ---- the return table ---- */

/*
 * The trampoline's int3 is reached by the probed function's `ret`, which has already
 * popped the return-address slot: the slot is the stack pointer at the trap minus 8.
 */
static inline xenprobes_u64 xp_return_slot(xenprobes_u64 rsp_at_trap)
{
	return rsp_at_trap - 8;
}

/* Index of the entry whose slot is `slot` among the first `capacity`, or -1. Slot 0 = free. */
xp_s32 xp_ret_find(const struct xenprobes_ret *table, xenprobes_u32 capacity,
		   xenprobes_u64 slot);

/* ---- the fallback of a trap entry (Dom0 did not answer) ---- */

enum xp_fallback {
	XP_FB_OK = 0,
	XP_FB_BAD_ENTRY,	/* flags not exactly one known kind (JUMP: a key, never a trap), or len out of range */
	XP_FB_BAD_TARGET,	/* fallback / return address not a valid resume address */
	XP_FB_EMULATE_FAILED,	/* insn is not emulable, or the stack faulted */
	XP_FB_NO_RETURN,	/* no return-table entry for this slot */
};

/*
 * Resumes without Dom0 as the entry `e` (a private snapshot) says: FALLBACK (and REDIRECT: a
 * jump's region, which resumes at its detour) at e->fallback,
 * (len 0..15: protocol.h allows 0 for traps inside the OEA, and len is not used here),
 * EMULATE by emulating e->insn (len 1..15), RETURN (len 0..15) at the return table's
 * address for the popped slot
 * (then that entry is cleared). r->rip is the trap address on entry; *r is changed only on
 * XP_FB_OK.
 */
enum xp_fallback xp_take_fallback(const struct xenprobes_trap *e, struct xenprobes_regs *r,
				  struct xenprobes_ret *rets, xenprobes_u32 ret_capacity,
				  const struct xp_bounds *b, const struct xp_mem_ops *m);

/* ---- jump probes (protocol.h, "Jump probes") ---- */

/* What the int3 hook does with the entry found at its address. */
enum xp_int3_action {
	XP_INT3_HIT = 0,	/* FALLBACK, EMULATE, RETURN (or unknown flags: the fallback refuses) */
	XP_INT3_REDIRECT,	/* a jump's region: resume at the detour at once, no Dom0 */
	XP_INT3_FOREIGN,	/* a JUMP entry is a key, never a trap byte: not ours */
};

enum xp_int3_action xp_int3_action(const struct xenprobes_trap *e);

/* A detour's `call rel32` to the jump entry is 5 bytes: it sits at the return address - 5. */
#define XP_CALL_REL32_LEN 5u

static inline xenprobes_u64 xp_jump_call_addr(xenprobes_u64 ret)
{
	return ret - XP_CALL_REL32_LEN;
}

enum xp_jump_lookup {
	XP_JUMP_HIT = 0,	/* hand the hit to Dom0 */
	XP_JUMP_FOREIGN,	/* no JUMP entry for this call: ++foreign, resume at ret */
	XP_JUMP_ASYNC,		/* an async probe's: a record in the ring (xp_jump_async_key) */
};

/*
 * The jump entry was called with return address `ret`; e is the trap-table entry found at
 * ret - 5 (a private snapshot), or NULL when there is none. A hit needs flags exactly JUMP
 * (JUMP | ASYNC: an async hit), addr == ret - 5 and addr inside the OEA (where every detour
 * lives).
 */
enum xp_jump_lookup xp_jump_lookup(const struct xp_bounds *b, const struct xenprobes_trap *e,
				   xenprobes_u64 ret);

/* An async JUMP entry's key (protocol.h "Async jump probes"). */
struct xp_async_key {
	xenprobes_u32 probe;	/* written into every record */
	xenprobes_u32 ncaps;	/* 0..XENPROBES_RING_CAPS_MAX */
	xenprobes_u64 specs;	/* ncaps specs inside the OEA; 0 when ncaps is 0 */
};

/*
 * Reads the key of an async JUMP entry (e: a private snapshot that xp_jump_lookup called
 * XP_JUMP_ASYNC): 0 with *k filled, or -XP_EINVAL when ncaps is above XENPROBES_RING_CAPS_MAX,
 * insn[5..7] are not zero, or the specs are not 8-byte aligned or not wholly inside the OEA.
 * The caller copies the specs out and checks them with xp_ring_specs_check before using them.
 */
int xp_jump_async_key(const struct xp_bounds *b, const struct xenprobes_trap *e,
		      struct xp_async_key *k);

/* How far above the hit's rsp a jump answer may move the stack pointer (protocol.h). */
#define XP_JUMP_RSP_MAX 4096ull

/*
 * Builds the registers a jump hit resumes with from the hit (hit->rip = the probed address,
 * hit->rsp = the stack pointer before the detour's call) and Dom0's answer (a private
 * snapshot); ret is call + 5. The general registers from the answer, rflags merged with
 * xp_merge_flags, cs and ss from the hit; rsp from the answer, which must lie in [hit->rsp,
 * hit->rsp + XP_JUMP_RSP_MAX] and differ from hit->rsp by a multiple of 8 (else
 * XP_ANSWER_BAD_RSP); rip = ret when the answer's rip is the probed address (its copy in the
 * detour runs), else the answer's rip (the pre-handler skipped the instruction), which must
 * pass xp_resume_ok (else XP_ANSWER_BAD_RIP). *out is written only on XP_ANSWER_OK.
 */
enum xp_answer xp_jump_answer_apply(const struct xp_bounds *b, const struct xenprobes_regs *hit,
				    const struct xenprobes_regs *answer, xenprobes_u64 ret,
				    struct xenprobes_regs *out);

/* ---- xenstore values ---- */

/*
 * Strict decimal: 1..20 digits of s[0..n) (n = the string's length without the NUL), no
 * sign, no blanks, no leading zeros ("0" itself is fine), value <= max.
 */
bool xp_parse_decimal(const char *s, size_t n, xenprobes_u64 max, xenprobes_u64 *out);

/* ---- the OEA pool (static memory in the module's text, carved into areas) ---- */

struct xp_oea_pool {
	xenprobes_u64 base;	/* page aligned */
	xenprobes_u64 size;	/* whole pages */
	xenprobes_u64 used;	/* bytes handed out, from base */
	xenprobes_u32 count;	/* areas handed out */
	struct xp_range areas[XENPROBES_OEA_MAX_AREAS];
};

enum xp_oea_result {
	XP_OEA_OK = 0,
	XP_OEA_BAD_REQUEST,	/* 0, not whole pages, or more than XENPROBES_OEA_MAX_SIZE */
	XP_OEA_LIMIT,		/* XENPROBES_OEA_MAX_AREAS areas already */
	XP_OEA_EXHAUSTED,	/* not enough of the static pool left */
};

/* The next area of exactly `bytes` from the pool; *addr is its start. */
enum xp_oea_result xp_oea_take(struct xp_oea_pool *p, xenprobes_u64 bytes,
			       xenprobes_u64 *addr);

/* Gives the last area back (its publication failed, so Dom0 never saw it). */
void xp_oea_undo_last(struct xp_oea_pool *p);

/* A one-line reason for oea-error. */
const char *xp_oea_reason(enum xp_oea_result r);

#ifdef __cplusplus
}
#endif

/* A jump's region and a short jump's island: what the module's own restore writes back. */
#include "xp_region.h"

#endif /* XENPROBES_XP_LOGIC_H */
