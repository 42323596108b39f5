// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * xenprobesU: the pure fallback of a trap entry (see xp_logic.h), what a hit runs when Dom0
 * does not answer: the branch decoder and emulator (EMULATE entries; Dom0 checks each with the
 * same decoder), the return table and the fallback itself. Like xp_logic.c, compiled into the
 * module, into libxenprobes and into the userspace unit tests; keep it free of kernel and libc
 * calls.
 */
#include "xp_logic.h"
#include "xp_ret_write.h"

/* ---- branches the fallback emulates ---- */

static xp_s64 xp_rel8(const xenprobes_u8 *p)
{
	return p[0] < 0x80 ? (xp_s64)p[0] : (xp_s64)p[0] - 0x100;
}

/* The prefixes xp_decode_branch looks past, and where the opcode is. */
struct xp_prefixes {
	xenprobes_u32 op;	/* index of the opcode byte (len when there is none) */
	xenprobes_u8 rex;	/* the REX byte right before the opcode, 0 if none */
	bool rep;		/* f3 */
	bool addr32;		/* 67 */
};

/*
 * Skips branch hints (2e/3e), BND (f2), f3 and 67 in any order, then at most one REX right
 * before the opcode. Stops at anything else (66 included: it is then taken for the opcode
 * and refused there).
 */
static void xp_skip_prefixes(const xenprobes_u8 *bytes, xenprobes_u32 len, struct xp_prefixes *p)
{
	xenprobes_u32 i = 0;

	p->rex = 0;
	p->rep = false;
	p->addr32 = false;
	for (; i < len; i++) {
		xenprobes_u8 b = bytes[i];

		if (b == 0x2e || b == 0x3e || b == 0xf2)
			continue;		/* branch hints / notrack, BND */
		if (b == 0xf3)
			p->rep = true;
		else if (b == 0x67)
			p->addr32 = true;
		else
			break;
	}
	if (i < len && (bytes[i] & 0xf0) == 0x40)
		p->rex = bytes[i++];
	p->op = i;
}

bool xp_decode_branch(const xenprobes_u8 *bytes, xenprobes_u32 len, struct xp_branch *out)
{
	struct xp_branch br = { .kind = XP_BR_NONE };
	struct xp_prefixes px;
	xenprobes_u32 i, imm = 0;
	xenprobes_u8 op;

	if (!bytes || len == 0 || len > 15)
		return false;
	xp_skip_prefixes(bytes, len, &px);
	i = px.op;
	if (i >= len)
		return false;
	op = bytes[i++];

	if (op == 0xc3 || op == 0xc2) {
		br.kind = XP_BR_RET;
		imm = op == 0xc2 ? 2 : 0;
		if (i + imm != len)
			return false;
		if (imm)
			br.imm16 = (xenprobes_u32)bytes[i] | (xenprobes_u32)bytes[i + 1] << 8;
	} else if (op == 0xeb || (op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3)) {
		if (i + 1 != len)
			return false;
		br.disp = xp_rel8(&bytes[i]);
		if (op == 0xeb) {
			br.kind = XP_BR_JMP;
		} else if (op <= 0x7f) {
			br.kind = XP_BR_JCC;
			br.cc = op & 0xf;
		} else if (op == 0xe0) {
			br.kind = XP_BR_LOOPNE;
		} else if (op == 0xe1) {
			br.kind = XP_BR_LOOPE;
		} else if (op == 0xe2) {
			br.kind = XP_BR_LOOP;
		} else {
			br.kind = XP_BR_JRCXZ;
			br.ecx = px.addr32;
		}
	} else if (op == 0xe9 || op == 0xe8) {
		if (i + 4 != len)
			return false;
		br.kind = op == 0xe9 ? XP_BR_JMP : XP_BR_CALL;
		br.disp = xp_rel32_at(&bytes[i]);
	} else if (op == 0x0f) {
		if (i + 5 != len || (bytes[i] & 0xf0) != 0x80)
			return false;
		br.kind = XP_BR_JCC;
		br.cc = bytes[i] & 0xf;
		br.disp = xp_rel32_at(&bytes[i + 1]);
	} else if (op == 0xff) {
		xenprobes_u8 modrm;

		/* Only the register forms: ModRM and nothing after it (no SIB, no displacement). */
		if (i + 1 != len)
			return false;
		modrm = bytes[i];
		if ((modrm & 0xc0) != 0xc0)
			return false;		/* through memory */
		if (((modrm >> 3) & 7) == 2)
			br.kind = XP_BR_CALL_REG;
		else if (((modrm >> 3) & 7) == 4)
			br.kind = XP_BR_JMP_REG;
		else
			return false;		/* inc, dec, push; /3 and /5 are far and need memory */
		br.reg = (modrm & 7) | ((px.rex & 1) ? 8 : 0);
	} else {
		return false;
	}
	/* 66 was refused above by ending the prefix loop on it; rep/67 only where harmless. */
	if (px.rep && br.kind != XP_BR_RET)
		return false;
	if (px.addr32 && br.kind != XP_BR_JRCXZ)
		return false;
	br.len = len;
	*out = br;
	return true;
}

bool xp_is_mem_indirect_branch(const xenprobes_u8 *bytes, xenprobes_u32 len)
{
	struct xp_prefixes px;
	xenprobes_u8 reg;

	if (!bytes || len == 0 || len > 15)
		return false;
	xp_skip_prefixes(bytes, len, &px);
	if (px.op + 1 >= len || bytes[px.op] != 0xff)
		return false;
	reg = (bytes[px.op + 1] >> 3) & 7;
	return (bytes[px.op + 1] & 0xc0) != 0xc0 && (reg == 2 || reg == 4);
}

bool xp_condition(xenprobes_u32 cc, xenprobes_u64 rflags)
{
	bool of = rflags & XP_RFLAGS_OF, cf = rflags & XP_RFLAGS_CF;
	bool zf = rflags & XP_RFLAGS_ZF, sf = rflags & XP_RFLAGS_SF;
	bool pf = rflags & XP_RFLAGS_PF;
	bool r;

	switch ((cc & 0xf) >> 1) {
	case 0:
		r = of;			/* jo */
		break;
	case 1:
		r = cf;			/* jb */
		break;
	case 2:
		r = zf;			/* je */
		break;
	case 3:
		r = cf || zf;		/* jbe */
		break;
	case 4:
		r = sf;			/* js */
		break;
	case 5:
		r = pf;			/* jp */
		break;
	case 6:
		r = sf != of;		/* jl */
		break;
	default:
		r = zf || sf != of;	/* jle */
		break;
	}
	return (cc & 1) ? !r : r;
}

/* The value of register n (an enum xp_gpr) in r, whose fields are in another order. */
static xenprobes_u64 xp_gpr_value(const struct xenprobes_regs *r, xenprobes_u32 n)
{
	switch (n) {
	case XP_GPR_RAX: return r->rax;
	case XP_GPR_RCX: return r->rcx;
	case XP_GPR_RDX: return r->rdx;
	case XP_GPR_RBX: return r->rbx;
	case XP_GPR_RSP: return r->rsp;
	case XP_GPR_RBP: return r->rbp;
	case XP_GPR_RSI: return r->rsi;
	case XP_GPR_RDI: return r->rdi;
	case XP_GPR_R8: return r->r8;
	case XP_GPR_R9: return r->r9;
	case XP_GPR_R10: return r->r10;
	case XP_GPR_R11: return r->r11;
	case XP_GPR_R12: return r->r12;
	case XP_GPR_R13: return r->r13;
	case XP_GPR_R14: return r->r14;
	default: return r->r15;
	}
}

enum xp_emul xp_emulate(const xenprobes_u8 *bytes, xenprobes_u32 len, struct xenprobes_regs *r,
			const struct xp_bounds *b, const struct xp_mem_ops *m)
{
	struct xp_branch br;
	xenprobes_u64 next, target, rcx = r->rcx, ret = 0;
	bool taken, zf = r->rflags & XP_RFLAGS_ZF;

	if (!xp_decode_branch(bytes, len, &br))
		return XP_EMUL_UNSUPPORTED;
	next = r->rip + br.len;
	target = next + (xenprobes_u64)br.disp;

	switch (br.kind) {
	case XP_BR_JMP:
	case XP_BR_CALL:
		taken = true;
		break;
	case XP_BR_JMP_REG:
	case XP_BR_CALL_REG:
		taken = true;
		target = xp_gpr_value(r, br.reg);
		break;
	case XP_BR_JCC:
		taken = xp_condition(br.cc, r->rflags);
		break;
	case XP_BR_LOOP:
	case XP_BR_LOOPE:
	case XP_BR_LOOPNE:
		rcx -= 1;
		taken = rcx != 0 && (br.kind == XP_BR_LOOP ||
				     (br.kind == XP_BR_LOOPE) == zf);
		break;
	case XP_BR_JRCXZ:
		taken = (br.ecx ? (rcx & 0xffffffffull) : rcx) == 0;
		break;
	case XP_BR_RET:
		if (!m || !m->read_u64(m->ctx, r->rsp, &ret))
			return XP_EMUL_FAULT;
		taken = true;
		target = ret;
		break;
	default:
		return XP_EMUL_UNSUPPORTED;
	}
	if (!taken)
		target = next;
	if (!xp_resume_ok(b, target))
		return XP_EMUL_BAD_TARGET;

	if (br.kind == XP_BR_CALL || br.kind == XP_BR_CALL_REG) {
		/* The kernel's int3 entry leaves a gap below the frame for exactly this push. */
		if (!m || !m->write_u64(m->ctx, r->rsp - 8, next))
			return XP_EMUL_FAULT;
		r->rsp -= 8;
	} else if (br.kind == XP_BR_RET) {
		r->rsp += 8 + br.imm16;
	}
	r->rcx = rcx;
	r->rip = target;
	return XP_EMUL_OK;
}

/* ---- the return table ---- */

xp_s32 xp_ret_find(const struct xenprobes_ret *table, xenprobes_u32 capacity,
		   xenprobes_u64 slot)
{
	xenprobes_u32 i;

	if (slot == 0)
		return -1;
	for (i = 0; i < capacity; i++)
		if (xp_ld64(&table[i].slot) == slot)
			return (xp_s32)i;
	return -1;
}

/* Is addr a RETURN entry among the live ones (the hook's own lookups: search, then scan)? */
static bool xp_is_return_trap(const struct xenprobes_trap *table, xenprobes_u32 nr_traps,
			      xenprobes_u32 capacity, xenprobes_u64 addr)
{
	struct xenprobes_trap e;

	return (xp_trap_search(table, nr_traps, capacity, addr, &e) ||
		xp_trap_scan(table, nr_traps, capacity, addr, &e)) &&
	       e.flags == XENPROBES_TRAP_RETURN;
}

enum xp_ret_result xp_ret_write(const struct xp_ret_request *q, xenprobes_u64 hit_rsp,
			       const struct xenprobes_trap *table, const xenprobes_u32 *nr_traps,
			       xenprobes_u32 capacity, const struct xp_mem_ops *m)
{
	xenprobes_u64 cur;

	if (q->slot == 0)
		return XP_RET_NONE;
	if (q->slot != hit_rsp || (q->slot & 7))
		return XP_RET_BAD_SLOT;
	/* Only ever the trampoline Dom0 published: a RETURN entry of the table. */
	if (q->value == q->expect || !xp_is_return_trap(table, xp_ld32(nr_traps), capacity, q->value))
		return XP_RET_BAD_VALUE;
	if (!m->read_u64(m->ctx, q->slot, &cur))
		return XP_RET_FAULT;
	if (cur != q->expect)
		return XP_RET_MISMATCH;
	if (!m->write_u64(m->ctx, q->slot, q->value))
		return XP_RET_FAULT;
	/*
	 * Dom0 may have paused the domain between the check and the write, put its return slots
	 * back and removed the trampoline (a detach): a slot written now would return to an int3
	 * no entry claims. Looked up again after the write: gone, the slot is put back unless
	 * Dom0 already did.
	 */
	if (!xp_is_return_trap(table, xp_ld32(nr_traps), capacity, q->value)) {
		if (m->read_u64(m->ctx, q->slot, &cur) && cur == q->value)
			m->write_u64(m->ctx, q->slot, q->expect);
		return XP_RET_UNDONE;
	}
	return XP_RET_WRITTEN;
}

/* ---- the fallback ---- */

enum xp_fallback xp_take_fallback(const struct xenprobes_trap *e, struct xenprobes_regs *r,
				  struct xenprobes_ret *rets, xenprobes_u32 ret_capacity,
				  const struct xp_bounds *b, const struct xp_mem_ops *m)
{
	xenprobes_u64 to;
	xp_s32 i;

	if (e->len > sizeof(e->insn))
		return XP_FB_BAD_ENTRY;

	switch (e->flags) {
	case XENPROBES_TRAP_FALLBACK:
	case XENPROBES_TRAP_REDIRECT:	/* a jump's region: straight to its detour */
		if (!xp_resume_ok(b, e->fallback))
			return XP_FB_BAD_TARGET;
		r->rip = e->fallback;
		return XP_FB_OK;

	case XENPROBES_TRAP_EMULATE:
		if (e->len < 1)
			return XP_FB_BAD_ENTRY;
		switch (xp_emulate(e->insn, e->len, r, b, m)) {
		case XP_EMUL_OK:
			return XP_FB_OK;
		case XP_EMUL_BAD_TARGET:
			return XP_FB_BAD_TARGET;
		default:
			return XP_FB_EMULATE_FAILED;
		}

	case XENPROBES_TRAP_RETURN:
		if (!rets)
			return XP_FB_NO_RETURN;
		i = xp_ret_find(rets, ret_capacity, xp_return_slot(r->rsp));
		if (i < 0)
			return XP_FB_NO_RETURN;
		to = xp_ld64(&rets[i].ret);
		if (!xp_resume_ok(b, to))
			return XP_FB_BAD_TARGET;
		xp_st64(&rets[i].slot, 0);	/* this instance has returned */
		r->rip = to;
		return XP_FB_OK;

	default:
		return XP_FB_BAD_ENTRY;
	}
}
