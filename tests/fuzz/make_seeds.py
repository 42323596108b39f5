#!/usr/bin/env python3
"""Writes the binary seeds of tests/fuzz/corpus/ (the text ones are written by hand).

Each seed follows its target's input format (the comment at the top of <target>_fuzz.cpp) and
models a unit test's situation: the demo guest's layouts, a Debian 6.1 kernel's tables, real
instruction bytes. Run it from anywhere; it overwrites only the files named here:
    python3 tests/fuzz/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


u8 = lambda v: struct.pack("<B", v & 0xFF)
u16 = lambda v: struct.pack("<H", v & 0xFFFF)
u32 = lambda v: struct.pack("<I", v & 0xFFFFFFFF)
u64 = lambda v: struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)
s32 = lambda v: struct.pack("<i", ((v + (1 << 31)) % (1 << 32)) - (1 << 31))
s64 = lambda v: struct.pack("<q", ((v + (1 << 63)) % (1 << 64)) - (1 << 63))


# ---- guest_channel ---------------------------------------------------------------------------
def gc_entry(pick, k, resume_off, length, form, extra=b""):
    """entry(): pick_addr, fallback byte, [resume_at], len, form, extra bytes."""
    out = pick + u8(k)
    if not (k & 0x80):
        out += u16(resume_off)
    return out + u8(length) + u8(form) + u8(len(extra)) + extra


def gc_text(off16):  # pick_addr case 4: kText + range(0, 0xff) * 0x10 (a u16)
    return u8(4) + u16(off16)


def gc_existing(i=0):  # pick_addr case 2: a trap of the table (range over 1 entry: one u8)
    return u8(2) + u8(i)


def gc_hit(v, seq, trap_pick, state_byte=1, rip_byte=1):
    return (u8(0) + u8(v) + u8(state_byte) + u32(seq) + u8(1) + trap_pick + u8(rip_byte) +
            u64(0x10) + u64(0x18) + u64(0))


def guest_channel():
    hdr = lambda b0, b1, b2, cap, rets, mode: u8(b0) + u8(b1) + u8(b2) + u8(cap) + u8(rets) + u8(mode)
    # 2 vCPUs, HVM, 2 pages, a module with register branches and port 6, the module's layout.
    s = hdr(0x03, 0x01, 0x51, 7, 4, 0)
    s += u8(6) + gc_entry(gc_text(0x10), 0, 0x20, 5, 5)          # ResumeAt, the ftrace nop5
    s += u8(6) + gc_entry(gc_text(0x20), 0x82, 0, 1, 0)      # Emulate: ret
    s += u8(6) + gc_entry(gc_text(0x30), 0x82, 0, 2, 3)      # Emulate: jmp *%rax
    s += gc_hit(0, 41, gc_existing(0)) + u8(3) + u8(0) + u8(6)    # a hit, process, handler: rip+1
    s += gc_hit(1, 42, gc_existing(1)) + u8(5) + u8(0) + u8(0)    # flush, handler: NotOurs
    s += u8(8) + u8(1) + u8(3) + u64(0xFFFFFFFFA0000040)         # return_added
    s += u8(9) + u8(0)                                            # return_removed
    s += u8(7) + gc_existing(0)                                   # trap_removed
    s += u8(10) + u8(0) + u8(11)                                  # detach, attach again
    put("guest_channel", "module_layout_hits", s)
    # 1 vCPU, PV, 1 page, an old module (no register branches): hits on traps it does not own.
    s = hdr(0x00, 0x00, 0x20, 3, 1, 0)
    s += u8(12) + gc_text(0x40)                                   # the engine owns a disarmed trap
    s += u8(6) + gc_entry(gc_text(0x50), 0x82, 0, 2, 3)       # jmp *%rax: refused (old module)
    s += gc_hit(0, 7, u8(3)) + u8(4) + u8(1) + u8(3)              # hit on the owned one; handler detaches
    s += gc_hit(0, 8, u8(0) + u64(0x4141414141414141)) + u8(3) + u8(0)
    s += u8(2) + u16(0x80) + u8(8) + b"\xff" * 8                  # noise over the mailbox
    s += u8(10) + u8(1)                                           # the module leaves, then detach
    put("guest_channel", "old_module_owned_trap", s)
    # A mutated header (trap table over the mailboxes), then raw bytes.
    put("guest_channel", "mutated_header", hdr(0x05, 0x02, 0x31, 4, 2, 4) + u8(1) + u8(5) + u8(12) + u8(3) + u8(14) + u32(200))
    put("guest_channel", "raw_header", hdr(0x01, 0x00, 0x10, 1, 1, 7) + u32(0x54435058) + u32(1) + u32(1) + u32(192))


# ---- vmevent ---------------------------------------------------------------------------------
SW_BP, DEBUG_EXC, SINGLESTEP, CPUID = 0, 1, 3, 4  # indices into push_request's reasons[]


def ve_own_text(k=0):
    return u8(8) + u8(1) + u8(2) + u8(k)


def ve_push(vcpu, reason_idx, gfn_idx=0, type_idx=0, length=1, rip=u8(1), kind=1, rax=0x11):
    return u8(0) + u8(vcpu) + u8(kind) + rip + u64(rax) + u8(reason_idx) + u8(gfn_idx) + u8(type_idx) + u8(length)


def vmevent():
    # int3 mode, HVM, 2 vCPUs, a journal: agentless emulation, with and without edited registers.
    s = u8(0x07) + ve_own_text()
    s += ve_push(0, SW_BP) + u8(3) + u8(2) + u8(1) + b"\x55" + u8(0) + u8(1)                 # EMULATE push %rbp
    s += ve_push(1, SW_BP) + u8(3) + u8(2) + u8(3) + b"\x48\x89\xe5" + u8(1) + u64(7) + u8(1)  # regs first
    s += u8(6) + u8(3)                                                                          # re-trap: EMULATE
    s += ve_push(0, SW_BP, rip=u8(3) + u8(5)) + u8(4)                                           # a guest int3: handed back
    s += u8(10)
    put("vmevent", "int3_agentless_emulation", s)
    # ICEBP mode, 1 vCPU: our ICEBP, the guest's int3 and #DB, a reason Dom0 never enables, a bad version.
    s = u8(0x00) + ve_own_text(1)
    s += ve_push(0, DEBUG_EXC, type_idx=1, rip=u8(1)) + u8(3) + u8(1) + u8(4)                    # resume past it
    s += ve_push(0, SW_BP, rip=u8(3) + u8(2)) + ve_push(0, DEBUG_EXC, type_idx=2) + ve_push(0, CPUID)
    s += ve_push(0, SINGLESTEP) + ve_push(0, DEBUG_EXC, length=16) + u8(5)
    s += u8(7) + u8(1) + u8(0x10) + u8(9) + u8(1) + u8(5) + u8(10)                             # byte gone, removed
    put("vmevent", "icebp_foreign_traps", s)
    # Not paused, a full ring, then a hostile producer index.
    s = u8(0x03) + ve_own_text() + ve_push(0, SW_BP, kind=0) + u8(11) + u8(1) + u8(0) + ve_push(0, SW_BP) + u8(3)
    s += u8(11) + u8(0) + u8(0xFF) + u32(0x7FFFFFFF) + u8(3) + u8(10)
    put("vmevent", "unpaused_full_hostile_index", s)


# ---- walker -----------------------------------------------------------------------------------
NONE, LEGACY32, PAE, LONG4, LONG5 = range(5)
PSE, NXE, MIRROR = 0x08, 0x10, 0x20


def wk(mode_flags, maxphys, pages, vas, legacy=False, cr3_low=0):
    """pages: list of {index: value}; page i is frame 0x100 + i, the root is page 0."""
    out = u8(mode_flags) + u8(maxphys) + u8(0) + u8(cr3_low) + u8(len(pages) - 1)
    for p in pages:
        out += u8(len(p))
        for idx, val in sorted(p.items()):
            out += u16(idx) + (u32(val) if legacy else u64(val))
    out += u8(0)                                        # no failing frame
    out += u8(1) + u8(8) + u32(0x80050033) + u32(0x3706F0) + u32(0xD01)  # paging_context: HVM long mode
    out += u8(7)                                        # MapCache of 8 frames
    for va in vas:
        out += u64(va) + (u8(0) if mode_flags % 8 in (LEGACY32, PAE) else b"")
    return out


def fr(i):
    return (0x100 + i) << 12


def walker():
    NX = 1 << 63
    # Long4: the kernel mapping 0xffffffff81000000 (PML4 511, PDPT 510, PD 8, PT 0), a 2 MiB NX page
    # next to it, a 1 GiB page in PDPT 511, a reserved bit, a not-present entry.
    pml4 = {511: fr(1) | 0x67, 0: fr(1) | 0x67}
    pdpt = {510: fr(2) | 0x67, 511: 0x40000000 | 0x83, 0: fr(2) | 0x67}
    pd = {8: fr(3) | 0x63, 9: 0x200000 | 0x83 | NX, 10: 0x400000 | 0x83 | (1 << 13), 11: fr(3) | 0x63 | (1 << 51)}
    pt = {0: fr(4) | 0x63, 1: fr(4) | 0x61 | NX, 2: 0}
    vas = [0xFFFFFFFF81000000, 0xFFFFFFFF81001ABC, 0xFFFFFFFF81200010, 0xFFFFFFFF81400000, 0xFFFFFFFF81600000,
           0xFFFFFFFFC0001234, 0xFFFFFFFF81002000, 0x0000800000000000, 0x1000000]
    put("walker", "long4_kernel_mapping", wk(LONG4 | NXE, 46, [pml4, pdpt, pd, pt, {0: 0x9090}], vas))
    # Long5: the same one level deeper (PML5 511), and LA57 canonical addresses.
    put("walker", "long5_kernel_mapping",
        wk(LONG5 | NXE, 52, [{511: fr(1) | 0x67}, pml4, pdpt, pd, pt], [0xFFFFFFFF81000000, 0xFF00000000000000, 0x00FF000000000000]))
    # Legacy32 with PSE: PD 0 -> PT 0x101, PD 1 a 4 MiB page, PD 2 a PSE-36 page above 4 GiB, PD 3 bit 21 set.
    put("walker", "legacy32_pse36",
        wk(LEGACY32 | PSE, 36, [{0: fr(1) | 7, 1: 0x400083, 2: 0x800083 | (0x12 << 13), 3: 0xC00083 | (1 << 21)},
                                {5: 0x200003, 6: 0}], [0x5123, 0x400ABC, 0x800000, 0xC00000, 0x6000, 0x100000000], legacy=True))
    # PAE: PDPT at cr3 (4 entries), PD with a 2 MiB page, a PT; NX without EFER.NXE is reserved.
    put("walker", "pae_nx_reserved",
        wk(PAE, 40, [{0: fr(1) | 1, 1: fr(1) | 1 | (1 << 5)}, {0: fr(2) | 7, 1: 0x200083, 2: 0x400083 | NX},
                     {3: 0x5003, 4: 0x6003 | NX}], [0x3000, 0x200123, 0x400000, 0x4000, 0x40000000]))
    # Mirror mode: any frame number is one of two pages, so every entry leads somewhere.
    put("walker", "mirror_long4",
        wk(LONG4 | MIRROR | NXE, 39, [{i: (i << 12) | 0x67 for i in range(0, 512, 37)}, {7: 0x83, 9: 0x7003}],
           [0xFFFFFFFF81000000, 0x7FFFFFFFF000, 0x1234567]))


# ---- x86 ----------------------------------------------------------------------------------------
def x86_seed(code, b0=0, addr_off=0x2F0, slot_off=0x40, resume=5, regs=(), rflags=0x246, loaded=0xFFFFFFFF81000100):
    out = u8(b0)
    out += u64(addr_off) if b0 & 1 else u16(addr_off)
    out += u64(slot_off) if b0 & 2 else u16(slot_off)
    out += u64(resume) if b0 & 4 else u8(resume)
    out += u8(len(regs)) + b"".join(u8(r) + u64(v) for r, v in regs)
    out += u16(rflags) + u64(0) + u64(0xFFFF888000000000) + u64(loaded)
    return out + bytes(code)


def x86():
    # The demo guest's sys_open, from its first byte (the ftrace nop5) on: a real function.
    sys_open = bytes.fromhex(
        "0f1f440000 4889e0 482d00400081 4989f9 4989f2 48c7c200400281 4889c1 48c1e90e 483dffff0100 7710"
        "488d0489 488d0441 488d14c560400281 4883421801 4d85c9 0f84e4000000 49c7c000110081 450fb619"
        "31c0 4c89c9 ba2f000000 498b30 84d2 751f eb3f 662e0f1f840000000000".replace(" ", ""))
    put("x86", "demo_sys_open", x86_seed(sys_open))
    put("x86", "endbr_then_ftrace_nop", x86_seed(bytes.fromhex("f30f1efa0f1f44000055"), b0=8 | 16))
    # RIP-relative loads (boosted with the disp32 rewritten), near and out of rel32 reach.
    put("x86", "rip_relative_mov", x86_seed(bytes.fromhex("488b05e90f0000c3")))
    put("x86", "rip_relative_far_slot", x86_seed(bytes.fromhex("8b0d00000080"), b0=2, slot_off=0xFFFFC90000000000))
    # Branches the Dom0 side emulates, and the module's register forms.
    put("x86", "jcc_rel32", x86_seed(bytes.fromhex("0f84e4000000"), rflags=0x40))
    put("x86", "call_rel32", x86_seed(bytes.fromhex("e8fbffffff")))
    put("x86", "jmp_table_indirect", x86_seed(bytes.fromhex("ff24fd00100081"), regs=((7, 3),)))
    put("x86", "notrack_jmp_r11", x86_seed(bytes.fromhex("3e41ffe3"), regs=((11, 0xFFFFFFFF81000500),)))
    put("x86", "loop_jrcxz_ret", x86_seed(bytes.fromhex("e2fe67e3fcc20800"), regs=((1, 1),)))
    # Refusals: int3, swapgs, sti, lock/rep forms, a 66-prefixed jmp.
    put("x86", "refusals", x86_seed(bytes.fromhex("cc0f01f8fbf0480fb10ff3a466e90000")))


# ---- journal ------------------------------------------------------------------------------------
KTEXT, KSTACK, KOEA = 0xFFFFFFFF81000000, 0xFFFFC90000010000, 0xFFFFFFFFA0000000


def journal_image(domains, patches, returns, max_d=2, max_p=4, max_r=4, clean=0, refused=0):
    """As Journal::create lays it out (version 2); records: dicts, `seq` defaulting to 2
    (consistent), a domain's `handle` to 16 zero bytes."""
    a64 = lambda v: (v + 63) // 64 * 64
    doff = a64(128)
    poff = a64(doff + max_d * 64)
    roff = a64(poff + max_p * 64)
    total = (roff + max_r * 48 + 4095) // 4096 * 4096
    img = bytearray(total)
    img[0:84] = (u64(0x314C4E524A505830) + u32(2) + u32(128) + u32(4242) + u32(clean) + u32(max_d) + u32(max_p) +
                 u32(max_r) + u32(64) + u32(64) + u32(48) + u64(doff) + u64(poff) + u64(roff) + u64(total) + u32(refused))
    for i, d in enumerate(domains):
        rec = (u32(d.get("seq", 2)) + u32(1) + u32(d["domid"]) + u8(d["channel"]) + u8(d["trap"]) + u8(d.get("monitor", 0)) +
               u8(0) + u32(d["vcpus"]) + u32(d.get("held", 0)) + u32(d.get("owed", 0)) +
               bytes(d.get("handle", bytes(16))))
        img[doff + 64 * i: doff + 64 * i + len(rec)] = rec
    for i, p in enumerate(patches):
        w, r = bytes(p["written"]), bytes(p["restore"])
        rec = (u32(p.get("seq", 2)) + u32(1) + u32(p["domid"]) + u8(p["kind"]) + u8(len(w)) + b"\0\0" + u64(p["gva"]) +
               u64(p["resume"]) + w.ljust(8, b"\0") + r.ljust(8, b"\0"))
        img[poff + 64 * i: poff + 64 * i + len(rec)] = rec
    for i, r in enumerate(returns):
        rec = u32(r.get("seq", 2)) + u32(1) + u32(r["domid"]) + u32(0) + u64(r["slot"]) + u64(r["ret"]) + u64(r["tramp"])
        img[roff + 48 * i: roff + 48 * i + len(rec)] = rec
    return bytes(img)


def journal():
    DEBUGGER, VMEVENT = 1, 2
    TEXT, SLOT_TRAP, TRAMPOLINE = 1, 2, 3
    jmp_back = [0xE9] + list(struct.pack("<i", (KTEXT + 0x11) - (KOEA + 0x45)))
    # Debugger channel, 2 vCPUs: one stopped after our ICEBP at a text probe, one on the return
    # trampoline of a live return probe; the text, a slot trap and the stack still as written.
    img = journal_image(
        [dict(domid=3, channel=DEBUGGER, trap=0xF1, vcpus=2, held=1, owed=1)],
        [dict(domid=3, kind=TEXT, gva=KTEXT + 0x10, resume=KTEXT + 0x10, written=[0xF1], restore=[0x55]),
         dict(domid=3, kind=SLOT_TRAP, gva=KOEA + 0x40, resume=KTEXT + 0x11, written=[0xF1] + [0xCC] * 4, restore=jmp_back),
         dict(domid=3, kind=TRAMPOLINE, gva=KOEA + 0x80, resume=KOEA + 0x80, written=[0xF1], restore=[0xF1])],
        [dict(domid=3, slot=KSTACK + 0x1F8, ret=KTEXT + 0x100, tramp=KOEA + 0x80)])
    env = u8(0x12) + u8(1) + u8(2) + u8(13) + u8(0) + u8(0) + u8(0) + u8(0) + u8(1)
    put("journal", "debugger_stop_and_trampoline", u8(0) + env.ljust(64, b"\0") + img)
    # The same journal, its domid now held by another domain (another handle): left alone.
    put("journal", "reused_domid", u8(0) + (u8(0x13) + env[1:]).ljust(64, b"\0") + img)
    # vm_event channel, HVM: a held pause, one patch already restored, one changed since (left alone).
    img = journal_image(
        [dict(domid=5, channel=VMEVENT, trap=0xCC, vcpus=1, monitor=2, held=1)],
        [dict(domid=5, kind=TEXT, gva=KTEXT + 0x2F0, resume=KTEXT + 0x2F0, written=[0xCC], restore=[0x0F]),
         dict(domid=5, kind=TEXT, gva=KTEXT + 0x300, resume=KTEXT + 0x300, written=[0xCC], restore=[0x48])], [])
    env = u8(0x0A) + u8(2) + u8(1) + u8(1) + u8(2)
    put("journal", "vmevent_held_pause", u8(0) + env.ljust(64, b"\0") + img)
    # A torn patch record, an invalid one (len 9), a return of an unknown domain, a second domain gone.
    img = journal_image(
        [dict(domid=7, channel=VMEVENT, trap=0xCC, vcpus=4), dict(domid=8, channel=DEBUGGER, trap=0xF1, vcpus=1)],
        [dict(domid=7, kind=TEXT, gva=KTEXT, resume=KTEXT, written=[0xCC], restore=[0x90], seq=3),
         dict(domid=7, kind=TEXT, gva=KTEXT + 8, resume=KTEXT, written=[0xCC] * 8 + [1], restore=[0x90] * 9)],
        [dict(domid=9, slot=KSTACK, ret=1, tramp=2)], refused=3)
    put("journal", "torn_and_invalid", u8(0) + (u8(0x3B) + u8(0) + u8(4) * 4 + u8(0)).ljust(64, b"\0") + img)
    put("journal", "clean", u8(0) + b"\x12".ljust(64, b"\0") +
        journal_image([dict(domid=3, channel=DEBUGGER, trap=0xF1, vcpus=1)], [], [], clean=1))
    # The writer: add a domain, two patches, a return, hold a pause, tear a record, remove them.
    w = u8(1) + u8(1) + u8(3) + u8(3)
    w += u8(2) + u8(0) + u8(1) + u8(0xF1) + u16(2)                      # add_domain 3, debugger, 2 vCPUs
    w += u8(2) + u8(2) + u8(1) + u8(0) + u64(KTEXT + 0x10) + u8(0xF1) + u8(0x55) + u8(0) + u8(1)  # add_patch Text
    w += u8(2) + u8(2) + u8(5) + u8(1) + u64(KTEXT) + bytes([0xF1, 0xE9, 0xCC, 0, 0xCC, 0, 0xCC, 0, 0xCC, 0]) + u8(0) + u8(2)
    w += u8(2) + u8(4) + u8(2) + u64(KTEXT + 0x100) + u8(0x80)          # add_return
    w += u8(2) + u8(6) + u8(1) + u8(2) + u8(7) + u8(3) + u8(2) + u8(9) + u8(0)  # held, owed, torn
    w += u8(2) + u8(3) + u8(1) + u8(2) + u8(5) + u8(0) + u8(2) + u8(1)      # remove patch, return, domain
    put("journal", "writer_lifecycle", w)


# ---- kernel_tables -------------------------------------------------------------------------------
KT_TEXT, KT_TEXT_END = 0xFFFFFFFF81000000, 0xFFFFFFFF81100000
KT_INIT, KT_INIT_END = 0xFFFFFFFF82000000, 0xFFFFFFFF82010000
KT_RODATA, KT_DATA = 0xFFFFFFFF81200000, 0xFFFFFFFF81300000


def kt_map(lines):
    return "".join("%016x %s %s\n" % (a, t, n) for a, t, n in sorted(lines, key=lambda x: x[0])).encode()


def kt_seed(map_lines, rodata, data, probes, limits=b"\0", module=b"\0"):
    out = kt_map(map_lines) + b"\0" + limits
    regions = [(0, rodata), (1, data)]
    out += u8(len(regions))
    for where, blob in regions:
        out += u8(where) + u16(len(blob)) + blob
    out += module
    for how, addr, code in probes:
        out += u8(how) + (u64(addr) if how % 4 == 0 else u32(addr - KT_TEXT)) + bytes(code).ljust(15, b"\x90")
    return out


def kernel_tables():
    lines = [(KT_TEXT, "T", "_stext"), (KT_TEXT, "T", "_text"), (KT_TEXT_END, "T", "_etext"),
             (KT_INIT, "T", "_sinittext"), (KT_INIT_END, "T", "_einittext"),
             (KT_TEXT + 0x2F0, "T", "sys_open"), (KT_TEXT + 0x430, "T", "sys_unlink"),
             (KT_TEXT + 0x1000, "T", "__noinstr_text_start"), (KT_TEXT + 0x1000, "T", "exc_int3"),
             (KT_TEXT + 0x1100, "T", "__noinstr_text_end"), (KT_TEXT + 0x1100, "t", "__SCT__preempt_schedule"),
             (KT_TEXT + 0x1200, "T", "__entry_text_start"), (KT_TEXT + 0x1200, "T", "entry_SYSCALL_64"),
             (KT_TEXT + 0x1300, "T", "__entry_text_end"), (KT_TEXT + 0x1300, "T", "__kprobes_text_start"),
             (KT_TEXT + 0x1300, "t", "kprobe_int3_handler"), (KT_TEXT + 0x1400, "T", "__kprobes_text_end"),
             (KT_TEXT + 0x1400, "T", "copy_from_user_fixup"), (KT_DATA, "d", "kprobe_blacklist")]
    rodata = bytearray(0x3010)
    # __ex_table: {insn, fixup, data} relative to each field.
    ex = [(KT_TEXT + 0x1410, KT_TEXT + 0x1480, 3), (KT_INIT + 0x20, KT_INIT + 0x40, 1), (0x1000, 0x2000, 0)]
    for k, (insn, fix, d) in enumerate(ex):
        e = KT_RODATA + 12 * k
        rodata[12 * k:12 * k + 12] = s32(insn - e) + s32(fix - (e + 4)) + s32(d)
    lines += [(KT_RODATA, "R", "__start___ex_table"), (KT_RODATA + 12 * len(ex), "R", "__stop___ex_table")]
    # __jump_table: {code, target, key | flags}; the nop5 at sys_unlink+0x10.
    jt = [(KT_TEXT + 0x440, KT_TEXT + 0x460, KT_DATA + 0x800 | 1)]
    for k, (code, tgt, key) in enumerate(jt):
        e = KT_RODATA + 0x1000 + 16 * k
        rodata[0x1000 + 16 * k:0x1010 + 16 * k] = s32(code - e) + s32(tgt - (e + 4)) + s64(key - (e + 8))
    lines += [(KT_RODATA + 0x1000, "R", "__start___jump_table"), (KT_RODATA + 0x1000 + 16 * len(jt), "R", "__stop___jump_table")]
    # .static_call_sites: {addr, key | flags}.
    sc = [(KT_TEXT + 0x450, KT_DATA + 0x900 | 2)]
    for k, (addr, key) in enumerate(sc):
        e = KT_RODATA + 0x2000 + 8 * k
        rodata[0x2000 + 8 * k:0x2008 + 8 * k] = s32(addr - e) + s32(key - (e + 4))
    lines += [(KT_RODATA + 0x2000, "R", "__start_static_call_sites"), (KT_RODATA + 0x2000 + 8, "R", "__stop_static_call_sites")]
    # .smp_locks: two lock prefixes in sys_open, then zero padding.
    for k, site in enumerate([KT_TEXT + 0x300, KT_TEXT + 0x310]):
        rodata[0x3000 + 4 * k:0x3004 + 4 * k] = s32(site - (KT_RODATA + 0x3000 + 4 * k))
    lines += [(KT_RODATA + 0x3000, "R", "__smp_locks"), (KT_RODATA + 0x3010, "R", "__smp_locks_end")]
    # kprobe_blacklist: head -> node (exc_int3's range) -> node (an init range) -> head.
    data = bytearray(0x200)
    n1, n2 = KT_DATA + 0x100, KT_DATA + 0x140
    data[0:16] = u64(n1) + u64(n2)
    data[0x100:0x128] = u64(n2) + u64(KT_DATA) + u64(KT_TEXT + 0x1000) + u64(KT_TEXT + 0x1100) + u64(0)
    data[0x140:0x168] = u64(KT_DATA) + u64(n1) + u64(KT_INIT) + u64(KT_INIT + 0x10) + u64(0)
    probes = [
        (3, KT_TEXT + 0x2F0, bytes.fromhex("0f1f440000")),          # sys_open's ftrace nop5
        (3, KT_TEXT + 0x2F5, bytes.fromhex("4889e0")),              # a plain instruction
        (3, KT_TEXT + 0x300, bytes.fromhex("f00fb10f")),            # lock cmpxchg on a lock site
        (3, KT_TEXT + 0x1410, bytes.fromhex("8b07")),               # a user access with a fixup
        (3, KT_TEXT + 0x440, bytes.fromhex("0f1f440000")),          # a static key's nop5
        (3, KT_TEXT + 0x450, bytes.fromhex("e8aabbccdd")),          # a static call
        (3, KT_TEXT + 0x1000, bytes.fromhex("55")),                 # exc_int3: guest channel only
        (3, KT_TEXT + 0x1210, bytes.fromhex("0f01f8")),             # entry text
        (3, KT_TEXT + 0x1100, bytes.fromhex("e9aabbccdd")),         # a static-call trampoline
        (0, KT_INIT + 0x20, bytes.fromhex("55")),                   # freed init text
    ]
    put("kernel_tables", "debian_like_tables", kt_seed(lines, bytes(rodata), bytes(data), probes))
    put("kernel_tables", "module_text_and_faults",
        kt_seed(lines, bytes(rodata[:0x2000]), bytes(data[:0x120]), probes[:3], limits=u8(8 | 1) + u16(2),
                module=u8(1) + u16(0x2F0) + u16(0x400)))
    # The demo guest's own map (no tables): every table refused, rules at their strictest.
    demo = [(KT_TEXT, "T", "_stext"), (KT_TEXT, "T", "_text"), (KT_TEXT + 0x2F0, "T", "sys_open"),
            (KT_TEXT + 0x430, "T", "sys_unlink"), (KT_TEXT + 0xA6A, "T", "_etext")]
    put("kernel_tables", "demo_no_tables", kt_seed(demo, b"", b"", probes[:3]))
    # A blacklist that loops, and a table whose stop is below its start.
    loop = bytearray(data)
    loop[0x140:0x148] = u64(n1)
    bad = [l for l in lines if l[2] != "__stop___jump_table"] + [(KT_RODATA + 0x800, "R", "__stop___jump_table")]
    put("kernel_tables", "looping_blacklist", kt_seed(bad, bytes(rodata), bytes(loop), probes[6:8]))
    # Loaded modules (limits byte 0x10): "ext4" live with one entry of each kind in its text and
    # one outside, "going" GOING, then probes in ext4's text; in 6.1's and 6.12's layouts.
    def module(state, name, sel, size, entries, evil=0):
        out = u8(state) + name.ljust(8, b"\0") + u8(sel) + u16(size) + u16(0x800) + u8(0x40)
        for kind, offs in enumerate(entries):  # __ex_table, __jump_table, .static_call_sites
            out += u8(len(offs))
            for off in offs:
                out += u8(0) + u16(off) + u8(0x10) + (u8(3) if kind == 0 else b"")
        return out + u8(evil)
    mods = module(0, b"ext4", 0, 0x1000, [[0x20, 0x3000], [0x40], [0x60]]) + module(2, b"going", 1, 0x1000, [[], [], []])
    KT_MOD = 0xFFFFFFFFC0000000
    mprobes = [(0, KT_MOD + 0x10, bytes.fromhex("4889e5")), (0, KT_MOD + 0x20, bytes.fromhex("8b07")),
               (0, KT_MOD + 0x40, bytes.fromhex("0f1f440000")), (0, KT_MOD + 0x10010, bytes.fromhex("4889e5"))]
    for mem in (0, 1):
        put("kernel_tables", "modules_61" if mem == 0 else "modules_612",
            kt_seed(lines + [(KT_MOD + 0x10, "t", "ext4_fn"), (KT_MOD + 0x10000, "t", "going_fn")], bytes(rodata),
                    bytes(data), mprobes, limits=u8(0x10), module=u8(mem) + u8(2) + mods + u8(0)))


# ---- ring ------------------------------------------------------------------------------------
def ring_regs(addr_regs):
    """20 registers: those named in addr_regs point into the fuzzed page (offset), the rest are
    plain values."""
    out = b""
    for i in range(20):
        if i in addr_regs:
            out += u8(1) + u16(addr_regs[i])
        else:
            out += u8(0) + u64(0x1111 * (i + 1))
    return out


def ring_hit(specs=(), regs=None, probe=7):
    out = u8(0) + ring_regs(regs or {}) + u8(len(specs))
    for kind_idx, reg, mx, off in specs:  # kind_idx: 0 bytes, 1 string, 2 user bytes, 3 user string
        out += u8(kind_idx) + u8(reg) + u16(mx) + u8(off + 32)
    return out + u32(probe)


def ring():
    # Page edits (count, then offset u16, length u8, bytes): a path, 64 binary bytes, and 255
    # bytes without a NUL (a string longer than any max below: truncated).
    edits = [(0x100, b"/etc/passwd\0"), (0x200, bytes(range(0x40))), (0x300, b"x" * 0xFF)]
    page = u8(len(edits)) + b"".join(u16(off) + u8(len(b)) + b for off, b in edits)
    drain = lambda k=40: u8(1) + u8(k)
    head = u8(0) + u8(1) + page  # order 12, honest
    caps = [(0, 5, 16, 0), (1, 4, 64, 0), (1, 3, 32, 0), (2, 7, 8, 8)]
    regs = {5: 0x200, 4: 0x100, 3: 0x300, 7: 0x200}
    put("ring", "honest_wrap", head + b"".join(ring_hit(probe=n) + (drain(3) if n % 5 == 4 else b"") for n in range(60)))
    put("ring", "honest_captures", head + b"".join(ring_hit(caps, regs, n) + drain(1) for n in range(12)))
    put("ring", "honest_full", head + u8(2) + u32(600) + b"".join(ring_hit(probe=n) for n in range(30)) + drain())
    hostile = u8(0) + u8(0) + page
    ops = b""
    for n in range(8):
        ops += ring_hit(caps, regs, n)
    ops += u8(3) + u16(184) + u64(0xFFFFFFFF00000008)  # the second record's len and type rewritten
    ops += drain() + ring_hit() + u8(4) + u8(1) + u16(9000) + drain()  # head past the data size
    ops += u8(5) + u32(30) + u32(0) + u8(6) + ring_hit() + drain()
    put("ring", "hostile_scribble", hostile + ops)


# ---- orc -------------------------------------------------------------------------------------
ORC_TEXT, ORC_STACK, ORC_IP_BASE = 0xFFFFFFFF81000000, 0xFFFFC90000100000, 0xFFFFFFFF81200000


def orc_flags3(sp, bp, typ, signal=0):  # v3: sp_reg:4 bp_reg:4 type:3 signal:1
    return sp | bp << 4 | typ << 8 | signal << 11


def orc_seed(flags, rows, regions, walks, limit=2047):
    """orc_fuzz.cpp's input: sorted steps (flags bit 3 clear) from the text's start."""
    out = u8(flags) + u16(limit) + u16(len(rows))
    at = 0
    for off, _, _, _ in rows:
        out += u16(off - at)
        at = off
    for _, sp, bp, fl in rows:
        out += struct.pack("<hhH", sp, bp, fl)
    out += u8(len(regions))
    for word_off, words in regions:
        out += u16(word_off) + u8(len(words)) + b"".join(u64(w) for w in words)
    for rip, rsp, rbp, mx in walks:
        out += u16(rip) + u16(rsp) + u16(rbp) + u16(0) + u64(0) + u8(0) + u64(0) + u8(0) + u8(mx)
    return out


def orc():
    T = ORC_TEXT
    SP, BP, PREV_SP, UNDEF = 5, 4, 1, 0
    CALL, END, REGS, UNDEFT = 2, 1, 3, 0
    rows = [(0x100, 8, 0, orc_flags3(SP, UNDEF, CALL)),           # leaf
            (0x200, 8, 0, orc_flags3(SP, UNDEF, CALL)),           # mid: push rbp
            (0x201, 16, -16, orc_flags3(SP, PREV_SP, CALL)),
            (0x204, 16, -16, orc_flags3(BP, PREV_SP, CALL)),      # mid's body: frame pointer
            (0x220, 8, 0, orc_flags3(SP, UNDEF, CALL)),
            (0x300, 8, 0, orc_flags3(SP, UNDEF, CALL)),           # out
            (0x305, 40, 0, orc_flags3(SP, UNDEF, CALL)),
            (0x400, 0, 0, orc_flags3(SP, UNDEF, REGS, 1)),        # entry: pt_regs at sp
            (0x500, 8, 0, orc_flags3(SP, UNDEF, CALL)),           # the interrupted function
            (0x600, 0, 0, orc_flags3(UNDEF, UNDEF, END)),         # end of stack
            (0x700, 0, 0, orc_flags3(UNDEF, UNDEF, UNDEFT))]      # undefined
    S = 0x1000  # the stack pointer at the leaf, from the stack's base
    regions = [(S // 8, [T + 0x210, 0x5A5A, T + 0x310]),
               (S // 8 + 7, [T + 0x410]),
               (S // 8 + 8 + 4, [0xB0B0]),
               (S // 8 + 8 + 16, [T + 0x520, 0x10, 0, ORC_STACK + 0x2000]),
               (0x2000 // 8, [T + 0x604])]
    walks = [(0x100, S, S + 8, 127), (0x100, S, S + 8, 3), (0x210, S + 0x100, S + 0x100, 127)]
    put("orc", "chain_v3", orc_seed(3, rows, regions, walks))
    put("orc", "chain_auto_zeros", orc_seed(4, rows, regions, walks))
    # A frame pointer pointing at itself: a loop.
    put("orc", "bp_loop", orc_seed(3, rows, [(0x1100 // 8, [ORC_STACK + 0x1100, T + 0x210])],
                                   [(0x210, 0x1000, 0x1100, 127)]))
    # The same table with its second half a module's, and raw (mostly unsorted) offsets.
    put("orc", "module_half", orc_seed(3 | 16, rows, regions, walks))
    raw = u8(3 | 8) + u16(2047) + u16(4) + s32(-0x200000 + 0x100) + s32(-0x200000 + 0x50) + s32(0) + s32(-1)
    raw += b"".join(struct.pack("<hhH", 8, 0, orc_flags3(SP, UNDEF, CALL)) for _ in range(4))
    put("orc", "unsorted", raw + u8(0))


if __name__ == "__main__":
    guest_channel()
    vmevent()
    walker()
    x86()
    journal()
    kernel_tables()
    ring()
    orc()
