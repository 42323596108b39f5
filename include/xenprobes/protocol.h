/*
 * The protocol between the libxenprobes guest module (xenprobesU) and Dom0.
 *
 * One header, shared by the library (C++), the guest module (Linux, C) and the simulated
 * Xen, so the constants exist exactly once. Everything the guest writes here is hostile
 * input to Dom0: Dom0 validates every value before using it.
 *
 * The module publishes under /local/domain/<domid>/XENPROBES_XS_DIR (relative to the
 * guest's home, i.e. xenbus_write(XBT_NIL, "data/xenprobes", key, value)):
 *
 *   version       decimal, XENPROBES_PROTOCOL_VERSION; Dom0 refuses other versions
 *   kernel-text   hex, 0x-prefixed: the running kernel's _text (gives the KASLR slide)
 *   release       the guest's `uname -r`
 *   nr-cpus       decimal, number of possible CPUs
 *   oea/count     decimal, number of out-of-line execution areas published
 *   oea/<i>/addr  hex: guest-virtual start of area i (page aligned, executable,
 *                 within +-2 GiB of kernel text)
 *   oea/<i>/size  decimal bytes, a multiple of the page size
 *   module-text/start, module-text/end
 *                 optional, together: hex, the module's own core text [start, end) (end: one
 *                 past the last byte). Its int3 hook runs that code (and the kernel's int3
 *                 path), so Dom0 must never put a trap there: the hook would recurse into
 *                 itself. The real module's range holds its static OEA pool (a section of its
 *                 text), so it contains the OEA areas, where Dom0 does write slot traps. A
 *                 module that does not publish them (older ones) is still valid: Dom0 then
 *                 knows no range to refuse. They came with the EMULATE fallback of jmp/call
 *                 through a register (below): Dom0 arms such an EMULATE trap only on a module
 *                 that publishes them, as an older one could not run it.
 *   fixup-slots/addr, fixup-slots/count, fixup-slots/table
 *                 optional, together: out-of-line slots for instructions the guest kernel's
 *                 exception table covers (a user copy, a get_user, an *_safe MSR access). The
 *                 kernel looks the fixup of a fault up by the faulting address; in an ordinary
 *                 slot that address is the slot's, which no table lists, and the kernel oopses.
 *                 These slots have entries of their own in the module's own exception table,
 *                 which the kernel searches for faults in the module's text.
 *                 addr: hex, the first slot (page aligned, inside module-text, in no oea/<i>
 *                 area); count: decimal, 1..XENPROBES_FIXUP_SLOTS_MAX slots of
 *                 XENPROBES_FIXUP_SLOT_SIZE bytes each, back to back; table: hex, the entry
 *                 {s32 insn; s32 fixup; s32 data} (each offset relative to its own field, as in
 *                 Linux's struct exception_table_entry) of slot 0; the entry of slot k is at
 *                 table + 12 k (Dom0 writes them through its own mapping; the guest may map
 *                 them read-only; they overlap no oea/<i> area, the slots or the control area). An unused slot holds int3 bytes and its
 *                 entry's insn and fixup both point at the slot's last byte, which is never
 *                 executed. Dom0 takes an unused slot for one instruction: it writes the copy
 *                 (the instruction and a jmp back), then the entry's data and fixup (the original
 *                 entry's), then its insn (the slot's first byte; the entries stay sorted), and
 *                 only then arms a trap that sends a vCPU there. A slot so taken stays as it is
 *                 for as long as the module is loaded: a task may sleep in a fault taken there
 *                 (userfaultfd, a contended mmap lock) for any time, and must come back to the same
 *                 copy. Dom0 uses it again only for the same instruction, finding it by its bytes
 *                 and its entry (a later session too).
 *   jump-entry    optional: hex, the module's jump entry, a function in module-text that a
 *                 jump probe's detour calls (see "Jump probes" below). Dom0 makes jump probes
 *                 only on a module that publishes it; a module publishing it handles the
 *                 XENPROBES_TRAP_JUMP and XENPROBES_TRAP_REDIRECT trap entries.
 *   hook-path/count, hook-path/<i>
 *                 optional: the kernel functions the module's own hit path calls out to (the
 *                 int3 hook, the mailbox exchange and its wait, the fallback, the jump hit):
 *                 its clock, the event-channel poll and clear, lookup_address(), the no-fault
 *                 copies, irq_work_queue(), the paravirt irq operations, the return thunk;
 *                 and of what those call in turn, what the module can name (the irq lookup,
 *                 hardened usercopy's checks, the paravirt page-table reads).
 *                 count: decimal, 0..XENPROBES_HOOK_PATH_MAX; <i> for i in [0, count): hex,
 *                 an address the module took of such a function itself (`&function`, or the
 *                 function pointer it calls through), so each is the running kernel's, KASLR
 *                 and all. A trap in such a function on the guest channel is hit again inside
 *                 the hook (a nested hit: its fallback, or for a jump, header.nested; Dom0
 *                 never sees it) or, before the hook's depth guard, recurses; Dom0 refuses a
 *                 probe on the guest channel whose function contains a published address.
 *                 What the module cannot name (the kernel's int3 entry and its notifier chain,
 *                 static helpers of the event-channel code) Dom0 knows by name. Dom0 checks:
 *                 count strict decimal within the bound, every entry strict hex in the
 *                 canonical upper half, duplicates allowed; a count without every entry, or
 *                 any value malformed, and Dom0 refuses every probe on the guest channel (it
 *                 cannot tell the hook's path from other code), as for an unreadable kprobe
 *                 blacklist. Absent (an older module): Dom0's names alone.
 *   features      optional: hex, 0x-prefixed, the protocol additions this module implements,
 *                 an or of XENPROBES_FEATURE_* (Dom0 ignores bits it does not know). Absent (an
 *                 older module): none. Dom0 checks it as strictly as the other numbers and
 *                 refuses the guest channel on a malformed value.
 *                 XENPROBES_FEATURE_RET_WRITE: the module writes a return probe's return slot
 *                 itself (see "Return slots written by the module" below).
 *                 XENPROBES_FEATURE_JUMP_ISLAND: the module knows short jumps to islands (see
 *                 "Short jumps to islands" below); published only with jump-entry.
 *   state         "ready" once every other key is written (Dom0 watches this key)
 *
 * Written last so Dom0 never sees a half-published set: `state`. Removed first when the
 * module detaches or unloads: from then on Dom0 must not write the control area or the OEA
 * (the module writes the trap bytes back itself, and frees both only as "Letting go"
 * below says).
 *
 * Detaching. Dom0 learns of the removal through its xenstore watch, some time later; a
 * registration under way meanwhile could add a trap the module's restore pass never sees, an
 * int3 left in the guest after the module (and its die notifier) is gone. So the module's
 * first step, before it removes `state`, is header.closing = 1 and a full barrier, and its
 * restore pass reads the trap table only after that. Dom0, with the domain paused, reads
 * `closing` before it adds or changes a trap-table entry and refuses the trap when it is
 * set; the trap byte (or jump) is written in the same pause. Either Dom0's pause came first,
 * and the restore pass sees the entry and restores the byte, or the module's store did (a
 * paused vCPU's stores are visible to Dom0), and Dom0 refuses. `closing` is never cleared.
 *
 * Letting go (header.dom0_hold). Dom0 maps the control area and the async rings, and writes
 * the OEA (the module's text, beside its fixup slots); the module frees the control area and
 * the rings at rmmod, and the kernel frees its text. A write of Dom0 landing after that lands
 * in a page the guest may have reused. So the module frees them only once Dom0 said it will
 * never write them again:
 *   Dom0, attaching (after it bound `evtchn`, before its first write to any of the areas):
 *     with the domain paused, reads `state` (must be "ready"), control/addr (must be the
 *     address it mapped) and header.closing (must be 0), then stores dom0_hold = MAPPED and
 *     unpauses. Anything else: it writes nothing, unbinds and gives up.
 *   Dom0, letting go (the module removed `state`, Dom0 detaches the domain, or its session
 *     ends): it first drops its mappings of the rings and the OEA and every write it had
 *     planned there (the engine forgets the domain), then writes what it still has to into
 *     the control area (a clean detach empties the tables; nothing once `state` is gone or
 *     closing is set), then, last, stores dom0_hold = RELEASED with a full barrier, and only
 *     then unbinds `evtchn` and unmaps the control area. Every other write comes before that
 *     store in program order, and no mapping is left after it to write with.
 *   A Dom0 killed (or an older Dom0) never stores RELEASED.
 *   Module, detaching, after its restore pass and its quiescence: it reads whether `evtchn` is
 *     bound to a Dom0 process (EVTCHNOP_status says interdomain: an older Dom0 binds it too,
 *     and never writes dom0_hold), then, after a full barrier, dom0_hold
 *     (guest-module/xp_release.h decides):
 *       RELEASED: Dom0 let go: free.
 *       0 and the port not bound: no Dom0 holds the areas: free.
 *       otherwise a Dom0 holds them (MAPPED, or an older Dom0's bound port): the module waits,
 *         reading both again every few milliseconds, up to the module parameter
 *         release_wait_ms. RELEASED meanwhile: free. The port found unbound without
 *         RELEASED (the process was killed, or an older Dom0 let go the only way it knows), or
 *         the time up: keep.
 *     Keep: the control area and the rings are never freed (they stay the guest's own memory,
 *     unused from then on), and the unload line says so. The order of the two reads matters:
 *     Dom0 stores RELEASED before it unbinds, so a port read unbound and dom0_hold read after
 *     it not RELEASED means no RELEASED came before the unbind, nor will after it.
 *   Why no write of Dom0 can follow a free: the module frees only once it read RELEASED
 *   (Dom0's last write, after every other) or found no Dom0 holding the areas. Dom0's MAPPED
 *   store is made with the domain paused and after it read closing == 0: either its pause
 *   came before the module's store of closing, and the module, reading dom0_hold after
 *   closing and a full barrier, sees MAPPED and waits; or the store of closing came first,
 *   and Dom0 sees it and writes nothing. A Dom0 that attaches again later stores MAPPED
 *   again, so one session's RELEASED never speaks for the next (one Dom0 process at a time
 *   binds the port, and a session writes nothing before its MAPPED).
 *   The tasks of the guest: a task may be on its way through a slot when the module detaches
 *   (asleep in a fault a copy in a fixup slot took, preempted in an OEA copy). The module lets
 *   itself be unloaded only once no task's stack holds a slot's address (its detach fails
 *   with EBUSY otherwise and it stays loaded; guest-module/xp_slots.h); Dom0 has no part in it.
 *   What stays open: the OEA and the fixup slots are in the module's text, which the kernel
 *   frees at rmmod whatever the module decided about Dom0. Dom0 writes there only while it registers,
 *   removes or moves a probe, with the domain paused, so only a Dom0 stopped in such a step
 *   for longer than release_wait_ms and continued after the rmmod writes freed text. A Dom0
 *   that uses the OEA without the guest channel (the vmevent channel's slots, and the guardian
 *   restoring their trap bytes) maps no control area and takes no part in this.
 *
 * What Dom0 checks (libxenprobes/probe/module_info.hpp): numbers are strict (decimal without
 * sign, blanks or leading zeros; hex with a 0x prefix; no trailing junk, no overflow); at
 * least one and at most XENPROBES_OEA_MAX_AREAS areas; each area page aligned, size a nonzero
 * multiple of 4096 and at most XENPROBES_OEA_MAX_SIZE, no wrap-around, in the canonical upper
 * half, every byte within rel32 reach (+-2 GiB) of kernel-text, outside the first 16 MiB of
 * the kernel image, disjoint from the other areas, and every page mapped and executable.
 * module-text: both keys or neither, each a canonical upper-half address, start < end, at most
 * XENPROBES_MODULE_TEXT_MAX_SIZE bytes, outside the first 16 MiB of the kernel image (the
 * pages are not checked: Dom0 only refuses to probe there).
 *
 * Growing the OEA (Dom0 asks, the module answers):
 *
 *   oea-request   written by Dom0: decimal bytes wanted (a nonzero multiple of the page
 *                 size, at most XENPROBES_OEA_MAX_SIZE). The module watches this key. For
 *                 every new value it allocates one more area of at least that size, writes
 *                 oea/<n>/addr and oea/<n>/size for n = the current count, and only then
 *                 bumps oea/count to n + 1 (Dom0 watches oea/count). Published areas never
 *                 change or disappear while the module is loaded: Dom0 refuses a re-read in
 *                 which a known area moved. At XENPROBES_OEA_MAX_AREAS areas, or when the
 *                 allocation fails, the module leaves oea/count alone and writes
 *   oea-error     a one-line reason (e.g. "vmalloc failed", "area limit reached"); Dom0 then
 *                 stops asking. Dom0 removes oea-error before writing a new oea-request.
 *
 * The guest channel (module version 1; published with the keys above, before `state`):
 *
 *   control/addr  hex: guest-virtual start of the control area (page aligned, mapped,
 *                 writable, disjoint from kernel text, from every OEA area and from the
 *                 fixup slots and their entries)
 *   control/pages decimal: its size in pages (at most XENPROBES_CTL_MAX_PAGES)
 *   evtchn        decimal: an unbound event-channel port allocated for Dom0 (remote domid 0)
 *
 * The control area is laid out as struct xenprobes_ctl_header at offset 0, then
 * `nr_mailboxes` struct xenprobes_mailbox at mailbox_offset, then `trap_capacity` struct
 * xenprobes_trap at trap_offset, then `ret_capacity` struct xenprobes_ret at ret_offset. The
 * module fills in the header once; Dom0 checks that every array lies inside control/pages,
 * that nothing overlaps (the header included), that every offset is a multiple of 8 (both
 * sides access the fields with single aligned loads and stores), that trap_capacity is not 0,
 * and that nr_mailboxes equals the domain's vCPU count.
 *
 * Who writes what:
 *   - the trap table (Dom0 writes, the module reads): one entry per trap byte Dom0 has
 *     patched (probe points, trap bytes inside slots, the return trampoline). Dom0 writes an
 *     entry before it patches the byte and clears it only after the byte is restored and the
 *     domain was quiesced, all with the domain paused. `nr_traps` entries, sorted by `addr`,
 *     are live; the module searches them (binary search) from its int3 hook.
 *   - the return table (Dom0 writes, the module reads only when Dom0 is gone): one entry per
 *     live return-probe instance: the stack slot holding the trampoline address and the real
 *     return address, so the module can finish a return on its own.
 *   - mailbox v (one per vCPU, written by both under the state protocol below).
 *   - the header's counters (the module writes, Dom0 only reports them).
 *   - the header's nr_traps, dom0_polling and dom0_hold (Dom0 writes; see "Spinning" and
 *     "Letting go" for the last two).
 *
 * A hit on vCPU v (module side, int3 hook, address found in the trap table):
 *   1. mailbox.seq += 1; copy pt_regs into mailbox.regs (regs.rip = the address of the trap
 *      byte, not the byte after it); mailbox.trap = that address; write barrier;
 *      mailbox.state = XENPROBES_MBOX_HIT; notify `evtchn`.
 *   2. wait (SCHEDOP_poll on the port with a timeout, re-checking state) until state ==
 *      XENPROBES_MBOX_DONE and answer_seq == seq: for at most `timeout_ms` (header) while the
 *      hit is unclaimed, and while state == XENPROBES_MBOX_CLAIMED (Dom0 is running the
 *      handlers) up to the claim bound, both counted from step 1.
 *   3. DONE: read barrier; copy mailbox.regs back into pt_regs (the general registers and
 *      rflags' arithmetic flags CF PF AF ZF SF OF only: not TF, whose unexpected #DB the
 *      kernel warns about, and cs/ss are never taken from Dom0); resume at
 *      mailbox.regs.rip; state = XENPROBES_MBOX_IDLE.
 *   4. timeout (timeout_ms passed and the hit is not claimed, or the claim bound passed):
 *      compare-and-swap state from HIT (or, past the claim bound, from CLAIMED) to
 *      XENPROBES_MBOX_ABANDONED. The swap finding DONE with answer_seq == seq: step 3 after
 *      all. Finding CLAIMED before the claim bound: back to step 2 (Dom0 claimed it at the last
 *      moment). Finding HIT (Dom0 gave the hit back), or CLAIMED past the bound: swap again
 *      from that (a few times at most). Finding anything else: state = ABANDONED.
 *      Then ++timeouts (a claim that outlived its bound counts too: Dom0 died or hung in a
 *      handler) and resume without the handler as the trap entry's flags say:
 *      XENPROBES_TRAP_FALLBACK: at `fallback` (a slot holding the original instruction, or
 *        the instruction after a slot's trap byte); XENPROBES_TRAP_EMULATE: by emulating the
 *      `len` original bytes in `insn`: a relative jmp/jcc/call/loop/jrcxz, a jmp/call through
 *      a register (`ff /4`, `ff /2` with a register operand; a call pushes the address after
 *      the instruction) or a near ret; never a jmp/call through memory, so Dom0 arms no
 *      EMULATE trap on one (the module's decoder, guest-module/xp_fallback.c, decides);
 *      XENPROBES_TRAP_RETURN: the return trampoline, by the return table entry whose `slot`
 *        equals the stack pointer minus 8 (then the entry is cleared). "The stack pointer"
 *        is rsp at the trampoline's trap: the probed function's `ret` already popped the
 *        slot, so slot = rsp - 8 (a `ret imm16` is not supported there).
 *      After `XENPROBES_DEAD_AFTER` consecutive timeouts the module declares Dom0 gone: it
 *      writes insn[0] back at every trap-table address outside the OEA (but those of modules
 *      that went, below), from process context, sets `dom0_gone` and stops publishing hits
 *      (every later hit takes the fallback).
 *   Dom0 side: on an event, for every mailbox in state HIT:
 *   a. validate what it read (trap in the table, regs.rip == trap, a seq neither answered
 *      yet nor excluded by e.); a hit that fails is left alone (no write at all): the
 *      module's timeout resumes it. One exception: a trap in text (outside the OEA) that Dom0
 *      removed lately, its byte restored. A vCPU the domain's pause caught in the hook after
 *      its table lookup and before step 1 publishes such a hit after the pause; Dom0 claims
 *      it and answers at once with the hit's own registers (rip = the trap: the original
 *      instruction runs), with no handler, rather than leave the vCPU to its timeout.
 *   b. claim it: compare-and-swap state HIT -> CLAIMED. A failed swap means the module
 *      abandoned the hit: Dom0 runs no handler for it. Under the claim the module changes
 *      nothing in the mailbox, so Dom0 reads seq, trap and regs again and validates those (a
 *      newer hit may have replaced the one read in a.); failing, it gives the hit back with
 *      a compare-and-swap CLAIMED -> HIT (the module's timeout then resumes it).
 *   c. run the handlers; they may write guest memory (a pushed return address, the
 *      trampoline address over a return address): the module is still waiting.
 *   d. if state is still CLAIMED with the same seq: write regs (rip = where to resume),
 *      answer_seq = seq, then compare-and-swap CLAIMED -> DONE with release order. Notify
 *      once per round.
 *   e. a failed check or swap in d. means the module gave up after the claim bound: the
 *      answer is dropped ("late"). The module may already have published its next hits on
 *      that mailbox, and Dom0's regs write may have landed on them: Dom0 claims none of the
 *      hits with a seq in (its seq, the seq it reads after the failed swap] (the module
 *      writes seq before regs, so later hits were written after Dom0's write).
 *   Dom0 writes a mailbox only in these steps: HIT -> CLAIMED, and while it holds the claim.
 *
 * Spinning instead of notifying (issue 14, "no hypercall per hit"). Two flags, each written by
 * one side and read by the other, let a hit and its answer go without an event-channel
 * notification while the other side is looking anyway (each side's full barrier between its
 * own store and its load of the other's flag means one of the two always sees the other):
 *   header.dom0_polling (Dom0 writes, nonzero while it polls the mailboxes in a loop).
 *     Module, step 1: after state = HIT, a full barrier, then notify only if dom0_polling is 0;
 *     a hit that skips its notification so counts in header.notify_skipped.
 *     Dom0, when it stops polling: dom0_polling = 0, a full barrier, then one more look at
 *     every mailbox (a hit that skipped its notification before the clear is found there).
 *   mailbox.spinning (module writes, nonzero while the waiting vCPU spins on its mailbox
 *     instead of blocking). Module, step 2: spinning = 1, a full barrier, then it checks
 *     state in a loop for up to its spin bound (module parameter spin_us; 0: never spins),
 *     then spinning = 0, a full barrier, one more check, and it waits as before. Dom0, step
 *     d: after state = DONE, a full barrier, then it notifies the round's answers only if
 *     one of the answered mailboxes does not say spinning.
 * Only a hit's first wait spins (not the wait after a claim taken at the last moment, step 4),
 * and dom0_polling concerns mailbox hits only (an async ring notifies as "Async rings" says).
 * A Dom0 that sets dom0_polling and then does not look at the mailboxes leaves its hits to
 * time out like any Dom0 that does not answer (and to the module's Dom0-gone rule).
 * An older peer leaves its flag 0 and ignores the other's: every notification is sent as before.
 *
 * The claim bound: max(timeout_ms, min(XENPROBES_CLAIM_FACTOR * timeout_ms,
 * XENPROBES_CLAIM_MAX_MS)) milliseconds from the hit (10 s with the real module's default
 * timeout_ms of 500). The factor leaves a handler an order of magnitude more than the time
 * Dom0 has to start on a hit, so only a dead or stopped Dom0 reaches it; the cap keeps the
 * vCPU's wait, which runs with interrupts off, well under the guest kernel's soft-lockup
 * (20 s) and RCU-stall (21 s) reports. A handler still running past the bound is the one case
 * left in which Dom0 writes guest memory for a hit the guest has moved on from.
 *
 * Waiting budget (guest-module/xp_budget.h). The bounds above hold per hit; hits that follow
 * one another on a CPU that does not schedule in between (inside one lock-held region, or a
 * kernel loop with no preemption point) add up. Each CPU sums its waits for Dom0 since its
 * last context switch; once the sum reaches the budget (module parameter wait_budget_ms,
 * 5000 by default; 0: none), its hits take the fallback without a mailbox write, as after a
 * timeout, and count in header.over_budget (not in timeouts: they say nothing about Dom0)
 * until the CPU switches. So between two context switches a CPU waits at most the budget
 * plus one hit's bound: 15 s with the defaults, under the watchdogs' 20 s. Dom0 sees no
 * such hit: its handlers miss them, and it reports the counter.
 *
 * Peers that predate the claim (the protocol version stayed 1: nothing was released before
 * it). An older module treats CLAIMED as "not answered yet": after timeout_ms its swap from
 * HIT fails, it writes ABANDONED and takes the fallback; Dom0's final swap then fails and the
 * answer is dropped as late, but memory its handlers wrote stays written (the behaviour
 * without the claim). An older Dom0 never claims: it answers HIT -> DONE, and the module
 * abandons unclaimed hits after timeout_ms as before.
 *
 * Dom0 never trusts the control area: every index, count, offset and address in it is
 * bounds-checked, and Dom0 writes only into the mailboxes, the tables and its own header
 * words above, inside control/pages.
 *
 * Quiescence (before Dom0 reuses a slot or removes a trap entry a vCPU may still be using):
 *   quiesce-request  written by Dom0: a decimal token. The module watches it, waits until
 *                    every CPU has left the trap hook and any slot (synchronize_rcu_tasks()
 *                    or equivalent), then writes the same token to
 *   quiesce-done     (Dom0 watches this key).
 *
 * Jump probes (synchronous delivery, issue 14). Instead of a trap byte, Dom0 replaces the
 * whole instructions of a region [start, start + len) (5 <= len <= 15, see
 * libxenprobes/x86/jump_safety.hpp) with `jmp rel32` (e9) to a detour it writes into an OEA
 * area:
 *     detour      copies of the region's instructions before the probed one (relocated)
 *     call:       e8 <rel32 -> jump-entry>
 *     call + 5:   copies of the probed instruction and the rest of the region (relocated)
 *                 e9 <rel32 -> start + len>       (unless the last copy never falls through)
 * Two trap-table entries serve it:
 *   XENPROBES_TRAP_JUMP      addr = the detour's `call` (a key: never a trap byte, len 0),
 *                            fallback = the probed address.
 *   XENPROBES_TRAP_REDIRECT  addr = start (the region), fallback = the detour's first byte,
 *                            len = the region's length, insn = its original bytes. An int3 at
 *                            addr (the jump being put in place) sends the vCPU to fallback at
 *                            once: no mailbox, no Dom0; the detour then makes the hit.
 * A hit (module side, the jump entry, called with the return address call + 5 on the stack):
 *   interrupts off; the depth guard of the int3 hook first (a nested hit resumes at call + 5 at
 *   once, counted in the header's `nested`); the entry is the JUMP entry whose addr is the
 *   return address - 5 (none: the same, counted in `foreign`). Then steps 1-4 of "A hit on vCPU v" with
 *   mailbox.trap = the entry's addr, regs.rip = its fallback (the probed address) and regs.rsp
 *   = the stack pointer before the call (the probed instruction's). Dom0 validates
 *   regs.rip == fallback instead of regs.rip == trap. On DONE the module takes the general
 *   registers, the arithmetic flags, rip and rsp from the answer: rip == the probed address
 *   resumes in the detour at call + 5 (the probed instruction's copy); another rip resumes
 *   there instead (the pre-handler skipped the instruction), with rsp from the answer, which
 *   must be >= the hit's rsp, at most 4 KiB above it and a multiple of 8 away from it (the
 *   entry writes the final rflags and rip in the two words below it), else the answer is
 *   unusable: the hit resumes as if unanswered. A JUMP entry counts only inside the module's
 *   OEA pool, where Dom0 puts every detour. On a timeout, with Dom0 gone or while detaching the hit resumes
 *   in the detour at call + 5 unanswered: the copies run, nothing is emulated.
 * Putting a jump in place (Dom0; "paused": with the domain paused):
 *   1. paused: the detour's bytes and its JUMP entry (entry first); the REDIRECT entry, then an
 *      int3 at start (over the original byte, checked).
 *   2. running: a quiescence (quiesce-request): no task may still be preempted, or sleep in a
 *      call, at an instruction boundary inside (start, start + len) that it reached before
 *      the int3; new arrivals at start take the detour.
 *   3. paused: no vCPU's rip in (start, start + len) (else the jump is abandoned: the int3
 *      stays a redirect until step 3 succeeds); the rel32 (bytes 1-4, the rest of the region
 *      kept), then e9 over the int3.
 * Taking it down (Dom0, paused): the original bytes over the jump (checked: e9 with the rel32
 * to this detour, or the int3), then, after a quiescence (a task preempted in the detour
 * comes back to it), the entries go and the detour's slot is reused.
 * The module's own restore (Dom0 gone, unload) writes a REDIRECT entry's insn[0..len) back
 * when addr holds the int3 or the jump to the entry's fallback, in one stop_machine() (never
 * half a region); it leaves anything else alone.
 *
 * Short jumps to islands (XENPROBES_FEATURE_JUMP_ISLAND; Dom0 makes them only on a module that
 * publishes it). Where no 5-byte region fits, a region of 2..15 bytes starts with `eb rel8` to
 * an island: 5 bytes of dead padding (int3s and nops after a function's last ret or jmp,
 * which nothing executes) within rel8 reach, which hold `e9 <rel32 -> the detour>`. Entries:
 *   XENPROBES_TRAP_REDIRECT  as above, with len 2..15; its bytes are Dom0's when they hold the
 *                            int3 or `eb rel8` to the island of the same detour (below); e9
 *                            only when len >= 5.
 *   XENPROBES_TRAP_ISLAND    addr = the island, fallback = the detour's first byte (the same
 *                            as its REDIRECT entry's), len = 5, insn = the padding's original
 *                            bytes. Never a trap byte (an int3 there is foreign).
 * Putting it in (Dom0, paused): the detour and its JUMP entry; the ISLAND entry, then the
 * island's 5 bytes (over the padding, checked); the REDIRECT entry and the int3; after the
 * quiescence, paused and with no vCPU's rip in (start, start + len): the rel8, then eb over
 * the int3. Taking it down (paused): the region's original bytes over the eb (or the int3),
 * and only after a later quiescence (a task interrupted between the eb and the island resumes
 * at the island), paused and with no vCPU's rip in the island, its padding back, then the
 * ISLAND entry goes.
 * The module's own restore (Dom0 gone, unload), in two steps: first the regions, as above, a
 * short one only when its eb goes to a live ISLAND entry of the same fallback (then its island
 * is left as it is); then, after its quiescence, every ISLAND entry whose 5 bytes still hold
 * `e9 <rel32 -> fallback>` and at which no live REDIRECT entry of the same fallback still
 * jumps gets insn[0..5) back. Anything else is left alone and counted.
 *
 * Modules that go. An entry whose addr lies in a loaded module's text carries that module's
 * identity (`module`, xenprobes_module_id()); Dom0 writes it with the entry. The module
 * watches the kernel's module notifier: when a module goes (MODULE_STATE_GOING) while a live
 * entry names it, its identity joins a set of gone modules (at most XP_GONE_MAX, then every
 * entry with an identity counts as gone); when a module with that very name and text base
 * comes (MODULE_STATE_COMING), the identity leaves the set. The module's own restore leaves
 * an entry whose module is in the set alone: its text was freed, or another module's code is
 * there now, whose own bytes may equal the int3 (the int3 padding after every `ret`). An
 * entry with `module` 0 (a peer that predates the field wrote 0 there) is restored as before.
 *
 * Return slots written by the module (XENPROBES_FEATURE_RET_WRITE, issue 14). A return
 * probe's entry hit replaces the return address at the top of the stack (the slot at the
 * hit's rsp) with the return trampoline. On a PV guest Dom0 would map the stack's frame
 * writable for that and unmap it at once (a frame Dom0 holds writable cannot become a page
 * table), per call; a module publishing the feature makes that write itself, in the guest,
 * with the mailbox fields after regs:
 *   Step 1 (module): mailbox.stack_top = the u64 at regs.rsp (read with a no-fault load; 0
 *     when it cannot be read: Dom0 then reads the stack itself), and mailbox.ret_slot = 0,
 *     both before state = HIT.
 *   Step d (Dom0): for a return probe's entry, instead of writing guest memory, ret_slot =
 *     the slot (regs.rsp of the hit), ret_expect = the return address Dom0 recorded (the
 *     stack_top it read), ret_value = the trampoline; before answer_seq and the swap to DONE.
 *     ret_slot stays 0 for every other answer.
 *   Step 3 (module), with the answer taken: it takes the request by an atomic exchange of
 *     ret_slot with 0 (ret_expect and ret_value read with the answer's registers); when what
 *     it took is not 0, it writes ret_value there (one aligned 8-byte store to its own stack)
 *     only if ret_slot is this hit's regs.rsp (8-byte aligned), ret_value is the address of a
 *     XENPROBES_TRAP_RETURN entry of the trap table, ret_expect is not ret_value, and the
 *     slot holds ret_expect now (guest-module/xp_fallback.c, xp_ret_write()). Anything else:
 *     nothing is written, the registers are still taken, and header.ret_refused counts it.
 *     After the write the module looks the trampoline's entry up again: Dom0 may have paused
 *     the domain between the check and the write to put its return slots back and remove the
 *     trampoline (a detach), so with the entry gone the slot gets ret_expect back (unless it no
 *     longer holds ret_value), counted as refused too.
 *   Cancelling (Dom0, with the domain paused, before it puts return slots back: an unregister
 *     or a detach): a request the vCPU has not taken yet is withdrawn by a compare-and-swap of
 *     ret_slot from the slot to 0; the module then never writes it. A swap that fails means
 *     the module took it (the slot written, refused, or about to be written by a vCPU the
 *     pause caught right after its exchange): Dom0 treats that slot as it treats any slot that
 *     does not hold the trampoline (it remembers where the call returns while attached).
 *   Dom0's bookkeeping is what it was (the return table entry, the instance): a refused write
 *   leaves Dom0 an instance whose slot never holds the trampoline, which it reclaims as any
 *   instance whose frame went away (when it needs the instance, or when the slot is used
 *   again); an instance whose request the vCPU has not taken yet (ret_slot still holds it) is
 *   never reclaimed. After a late answer (Dom0 side e.) Dom0's ret_* stores may land on a later hit:
 *   the module zeroes ret_slot in each hit's step 1 and only takes it with a DONE for that
 *   hit's seq, which Dom0 never gives a hit whose registers it may have overwritten.
 * Older peers: an older module leaves stack_top 0 and never reads ret_*; an older Dom0
 * never reads stack_top nor writes ret_slot, which the module zeroed.
 *
 * Async jump probes. A JUMP entry with flags JUMP | ASYNC makes the hit a record in the hit
 * vCPU's async ring (below) instead of a mailbox hit: no Dom0, no wait, no hypercall (one
 * notification when Dom0 asked for it). The entry is a JUMP entry in every other way (addr the
 * detour's call inside the OEA pool, fallback the probed address, len 0) and its insn bytes
 * carry the record's key, little-endian:
 *     insn[0..3]   the probe's id (Dom0's choice; written into every record)
 *     insn[4]      ncaps, the capture specs (0..XENPROBES_RING_CAPS_MAX)
 *     insn[5..7]   zero
 *     insn[8..11]  specs - addr as a signed 32-bit value: ncaps struct xenprobes_capture_spec
 *                  at an 8-byte aligned address, all inside the OEA pool (Dom0 writes them
 *                  into the detour's slots, after the detour)
 * The module, with interrupts off and under the depth guard as for a synchronous jump hit:
 * checks the key and copies the specs (a key or spec that breaks a rule, or no ring for this
 * vCPU: no record, ++async_bad in the control header); builds the registers as for a synchronous hit (rip the probed
 * address, rsp the probed instruction's); writes the record with the guest's monotonic clock
 * into the ring of the vCPU it runs on; notifies the event channel when the ring says so (not
 * after the domain was saved and restored or migrated: the port may be another's then);
 * resumes in the detour at call + 5. A module without rings never sees such an entry: Dom0
 * makes async probes only where rings are published (an older module would count the entry's
 * hits as foreign and resume, delivering nothing).
 * The rings are published with the other keys, before state = ready:
 *   rings/addr   the first ring's address (page aligned, canonical upper half); ring v, for
 *                the vCPU whose Xen id is v (as the mailboxes are indexed), at addr + v *
 *                (XENPROBES_RING_DATA_OFFSET + 2^order)
 *   rings/count  how many (one per mailbox, 1..nr-cpus)
 *   rings/order  data_order of every ring, XENPROBES_RING_MIN_ORDER..XENPROBES_RING_MAX_ORDER
 *   rings/cap-flags  optional: hex, the flags or-ed into a capture spec's kind that the
 *                module reads besides XENPROBES_CAP_USER (today XENPROBES_CAP_AUTO). A module
 *                that publishes no such key knows only XENPROBES_CAP_USER and counts a hit
 *                whose specs carry another flag as async_bad (no record): Dom0 makes no probe
 *                with a flag the module does not publish.
 * They live until the module unloads, after its own restore has taken every jump out.
 *
 * Async rings (the layout and the logic of both ends: guest-module/xp_ring.c produces,
 * libxenprobes/guestmod/ring.cpp consumes). One ring per vCPU. The module is its only producer:
 * the vCPU's own hits, written with preemption off. Dom0 is its only consumer. A ring is
 * struct xenprobes_ring_header at offset 0 (alone in its page), then the data area at
 * XENPROBES_RING_DATA_OFFSET: 2^data_order bytes. head and tail count the bytes written and
 * consumed since the ring was made (64 bits never wrap in practice); position p lives at
 * data[p mod 2^data_order]. A record (struct xenprobes_rec, then its capture items) is a
 * multiple of 8 bytes and never wraps: when fewer bytes are left before the end of the data
 * area than a record needs, a pad record (its first 8 bytes: len, type PAD) fills them first.
 *
 * Producer, for one hit (guest-module/xp_ring.h):
 *   1. The ring is busy on this vCPU (the hit interrupted a record being written: a probed
 *      interrupt or NMI handler): ++nested, the hit is dropped.
 *   2. tail = load-acquire(tail). Room is the data size minus (head - tail) and must hold the
 *      pad (if one is needed) and the record at its largest (every capture at its maximum):
 *      no room, ++drops, the hit is dropped (records already written stay for Dom0).
 *   3. Write the pad and the record, then store-release head (pad and record included). seq
 *      counts the records written (from 0): dropped hits and pads take none.
 *   4. If wakeup is 1 and head - tail >= watermark: exchange wakeup with 0; the vCPU that
 *      found 1 notifies `evtchn` (once per arming).
 * Dom0 (the consumer): head = load-acquire(head); each record between tail and head is copied
 * out of the ring and checked in the copy (the guest can write the ring at any time); then
 * store-release tail. Before it waits for an event it stores wakeup = 1 with the watermark,
 * then looks at head once more (a record published between its drain and the arming would
 * otherwise wait for the next one). A ring whose head is more than the data size past tail,
 * or whose record at tail fails a check, is resynchronised: tail jumps to head and the bytes
 * skipped are counted as corrupt; Dom0 never reads outside the data area whatever the ring
 * holds.
 *
 * Captures: a probe registers at most XENPROBES_RING_CAPS_MAX struct xenprobes_capture_spec
 * ("N bytes at [reg + offset]", "a string at reg + offset"); each is one struct
 * xenprobes_cap item in every record of the probe, in the order registered, read with the
 * kernel's no-fault helpers (a fault gives status FAULT and no bytes), followed by its bytes
 * padded with zeros to a multiple of 8. A string of max bytes is at most max - 1 characters
 * and its NUL, read as a synchronous read of max - 1 characters reads it: up to its NUL, never
 * from a page past the one holding the NUL; only when none of the first max - 1 bytes is the
 * NUL is the byte after them read, to tell OK (it is the NUL) from TRUNCATED (it is not, or
 * cannot be read: the max - 1 characters read stay, terminated). A fault within the first
 * max - 1 bytes (or on the only byte when max is 1) is FAULT.
 */
#ifndef XENPROBES_PROTOCOL_H
#define XENPROBES_PROTOCOL_H

#define XENPROBES_PROTOCOL_VERSION 1

#define XENPROBES_XS_DIR "data/xenprobes"
#define XENPROBES_XS_VERSION "version"
#define XENPROBES_XS_KERNEL_TEXT "kernel-text"
#define XENPROBES_XS_RELEASE "release"
#define XENPROBES_XS_NR_CPUS "nr-cpus"
#define XENPROBES_XS_OEA_COUNT "oea/count"
#define XENPROBES_XS_OEA_ADDR_FMT "oea/%u/addr"
#define XENPROBES_XS_OEA_SIZE_FMT "oea/%u/size"
#define XENPROBES_XS_STATE "state"
#define XENPROBES_XS_STATE_READY "ready"
#define XENPROBES_XS_OEA_REQUEST "oea-request"
#define XENPROBES_XS_OEA_ERROR "oea-error"

#define XENPROBES_XS_CONTROL_ADDR "control/addr"
#define XENPROBES_XS_CONTROL_PAGES "control/pages"
#define XENPROBES_XS_EVTCHN "evtchn"
#define XENPROBES_XS_QUIESCE_REQUEST "quiesce-request"
#define XENPROBES_XS_QUIESCE_DONE "quiesce-done"
#define XENPROBES_XS_MODULE_TEXT_START "module-text/start"
#define XENPROBES_XS_MODULE_TEXT_END "module-text/end"
#define XENPROBES_XS_FIXUP_SLOTS_ADDR "fixup-slots/addr"
#define XENPROBES_XS_FIXUP_SLOTS_COUNT "fixup-slots/count"
#define XENPROBES_XS_FIXUP_SLOTS_TABLE "fixup-slots/table"
#define XENPROBES_XS_JUMP_ENTRY "jump-entry"
#define XENPROBES_XS_RINGS_ADDR "rings/addr"
#define XENPROBES_XS_RINGS_COUNT "rings/count"
#define XENPROBES_XS_RINGS_ORDER "rings/order"
#define XENPROBES_XS_RINGS_CAP_FLAGS "rings/cap-flags"
#define XENPROBES_XS_HOOK_PATH_COUNT "hook-path/count"
#define XENPROBES_XS_HOOK_PATH_FMT "hook-path/%u"
#define XENPROBES_XS_FEATURES "features"

/* Bits of the features key (see "Return slots written by the module"). */
#define XENPROBES_FEATURE_RET_WRITE 1u
#define XENPROBES_FEATURE_JUMP_ISLAND 2u

/* Bounds Dom0 enforces on published values. */
#define XENPROBES_OEA_MAX_AREAS 16
#define XENPROBES_OEA_MAX_SIZE (16u << 20)
#define XENPROBES_CTL_MAX_PAGES 64
#define XENPROBES_MODULE_TEXT_MAX_SIZE (64u << 20)
#define XENPROBES_FIXUP_SLOT_SIZE 32
#define XENPROBES_FIXUP_SLOTS_MAX 4096
#define XENPROBES_FIXUP_ENTRY_SIZE 12
#define XENPROBES_HOOK_PATH_MAX 64

#ifdef __KERNEL__
#include <linux/types.h>
typedef __u8 xenprobes_u8;
typedef __u16 xenprobes_u16;
typedef __u32 xenprobes_u32;
typedef __u64 xenprobes_u64;
#else
#include <stdint.h>
typedef uint8_t xenprobes_u8;
typedef uint16_t xenprobes_u16;
typedef uint32_t xenprobes_u32;
typedef uint64_t xenprobes_u64;
#endif

#define XENPROBES_CTL_MAGIC 0x54435058u /* "XPCT" little-endian */

struct xenprobes_ctl_header {
	xenprobes_u32 magic;          /* XENPROBES_CTL_MAGIC */
	xenprobes_u32 version;        /* XENPROBES_PROTOCOL_VERSION */
	xenprobes_u32 nr_mailboxes;   /* one per vCPU, indexed by vCPU id */
	xenprobes_u32 mailbox_offset; /* bytes from the start of the area */
	xenprobes_u32 trap_capacity;
	xenprobes_u32 trap_offset;
	xenprobes_u32 ret_capacity;
	xenprobes_u32 ret_offset;
	xenprobes_u32 nr_traps;       /* Dom0 writes: live entries at the start of the table */
	xenprobes_u32 timeout_ms;     /* module's wait bound per hit */
	xenprobes_u32 dom0_gone;      /* module writes: 1 once it disarmed on its own */
	xenprobes_u32 dom0_polling;   /* Dom0 writes: nonzero while it polls the mailboxes (see "Spinning") */
	/* Module-written counters (Dom0 reports them, never relies on them). */
	xenprobes_u64 hits;           /* hits handed to Dom0 */
	xenprobes_u64 timeouts;       /* hits resumed without Dom0's answer */
	xenprobes_u64 foreign;        /* int3s not in the table, left to the kernel */
	xenprobes_u64 nested;         /* jump hits inside the module's own hook: no Dom0 */
	xenprobes_u64 async_bad;      /* async jump hits with a bad key or specs, or no ring: no record */
	xenprobes_u64 notify_skipped; /* hits not notified because dom0_polling was set (see "Spinning") */
	/*
	 * How long vCPUs waited for Dom0 in the hook, with interrupts off: from a hit's mailbox
	 * write (step 1) to its answer taken or its abandon (step 3 or 4), in nanoseconds of the
	 * module's clock: the sum over every hit handed to Dom0, and the longest one.
	 */
	xenprobes_u64 wait_ns;
	xenprobes_u64 wait_max_ns;
	xenprobes_u64 over_budget;    /* hits resumed without Dom0: their CPU's waiting budget was spent */
	xenprobes_u64 closing;        /* module writes 1 when it begins detaching (see "Detaching") */
	xenprobes_u32 dom0_hold;      /* Dom0 writes: XENPROBES_DOM0_* (see "Letting go") */
	/*
	 * Module-written (XENPROBES_FEATURE_RET_WRITE): answers whose return-slot write it
	 * refused (see "Return slots written by the module"); wraps. It took the header's last
	 * reserved word, which an older module leaves 0, so the header keeps its size and every
	 * offset (the static_asserts below).
	 */
	xenprobes_u32 ret_refused;
};

/* header.dom0_hold (see "Letting go"): 0 is what the module wrote (no Dom0 said anything). */
#define XENPROBES_DOM0_MAPPED 1u   /* a Dom0 session maps the module's areas and may write them */
#define XENPROBES_DOM0_RELEASED 2u /* that session's last write to them: it never writes again */

#define XENPROBES_MBOX_IDLE 0u
#define XENPROBES_MBOX_HIT 1u       /* module: regs valid, waiting for Dom0 */
#define XENPROBES_MBOX_DONE 2u      /* Dom0: answer written */
#define XENPROBES_MBOX_ABANDONED 3u /* module: gave up waiting; Dom0 must not answer */
#define XENPROBES_MBOX_CLAIMED 4u   /* Dom0: running the handlers; the module waits on */

struct xenprobes_regs {
	xenprobes_u64 rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp;
	xenprobes_u64 r8, r9, r10, r11, r12, r13, r14, r15;
	xenprobes_u64 rip, rflags, cs, ss;
};

struct xenprobes_mailbox {
	xenprobes_u32 state;      /* XENPROBES_MBOX_* */
	xenprobes_u32 seq;        /* module: bumped for every hit */
	xenprobes_u32 answer_seq; /* Dom0: the seq it answers */
	xenprobes_u32 spinning;   /* module: nonzero while the waiting vCPU spins (see "Spinning") */
	xenprobes_u64 trap;       /* address of the trap byte */
	struct xenprobes_regs regs;
	/* See "Return slots written by the module" (XENPROBES_FEATURE_RET_WRITE); 0 otherwise. */
	xenprobes_u64 stack_top;  /* module: the u64 at regs.rsp at the hit; 0: not read */
	xenprobes_u64 ret_slot;   /* Dom0: write ret_value there (the hit's regs.rsp); 0: no write */
	xenprobes_u64 ret_expect; /* Dom0: what the slot must hold for the write */
	xenprobes_u64 ret_value;  /* Dom0: what to write (the return trampoline) */
	xenprobes_u64 reserved[1];
};

#define XENPROBES_TRAP_FALLBACK 1u /* resume at `fallback` */
#define XENPROBES_TRAP_EMULATE 2u  /* emulate `insn` (relative or register branch, near ret) */
#define XENPROBES_TRAP_RETURN 4u   /* the return trampoline: use the return table */
#define XENPROBES_TRAP_JUMP 8u     /* a jump probe's detour call (key only; see "Jump probes") */
#define XENPROBES_TRAP_REDIRECT 16u /* int3 at a jump's region: resume at `fallback`, no hit */
#define XENPROBES_TRAP_ASYNC 32u    /* with JUMP: the hit is a record in the vCPU's async ring */
#define XENPROBES_TRAP_ISLAND 64u   /* a short jump's island (see "Short jumps to islands") */
/* An async JUMP entry's key in insn (see "Async jump probes"). */
#define XENPROBES_ASYNC_KEY_PROBE 0u  /* u32 */
#define XENPROBES_ASYNC_KEY_NCAPS 4u  /* u8 */
#define XENPROBES_ASYNC_KEY_SPECS 8u  /* s32: specs - addr */

struct xenprobes_trap {
	xenprobes_u64 addr;       /* the trap byte */
	xenprobes_u64 fallback;   /* XENPROBES_TRAP_FALLBACK: where to resume */
	xenprobes_u32 flags;      /* one of XENPROBES_TRAP_* */
	xenprobes_u8 len;         /* bytes of insn in use (1..15; 0 only for a trap inside an OEA
	                             area with FALLBACK or RETURN: never emulated nor restored) */
	xenprobes_u8 insn[15];    /* the original bytes at addr (insn[0] restores the byte) */
	xenprobes_u32 module;     /* addr in a loaded module's text: xenprobes_module_id() of that
	                             module; 0: core kernel text, the OEA, or not known */
};

/*
 * A loaded module's identity in a trap entry: 32-bit FNV-1a over the bytes of its name (up to
 * the NUL, at most `max`), then the 8 bytes of its text base (struct module's
 * core_layout.base up to Linux 6.3, mem[MOD_TEXT].base since 6.4), least significant first;
 * 0 becomes 1, so 0 always means "no module". Both sides compute it: Dom0 from the module list
 * it walks, the module from its module notifier (see "Modules that go" above).
 */
static inline xenprobes_u32 xenprobes_module_id(const char *name, unsigned long max, xenprobes_u64 text_base)
{
	xenprobes_u32 h = 2166136261u;
	unsigned long i;

	for (i = 0; i < max && name[i]; i++)
		h = (h ^ (xenprobes_u8)name[i]) * 16777619u;
	for (i = 0; i < 8; i++)
		h = (h ^ (xenprobes_u8)(text_base >> (8 * i))) * 16777619u;
	return h ? h : 1;
}

struct xenprobes_ret {
	xenprobes_u64 slot;       /* stack address holding the trampoline address; 0 = free */
	xenprobes_u64 ret;        /* the real return address */
};

/* ---- async rings (see "Async rings" above) ---- */

#define XENPROBES_RING_MAGIC 0x4e525058u /* "XPRN" little-endian */
#define XENPROBES_RING_DATA_OFFSET 4096u
#define XENPROBES_RING_MIN_ORDER 12u     /* 4 KiB of data */
#define XENPROBES_RING_MAX_ORDER 24u     /* 16 MiB of data */
#define XENPROBES_RING_REC_MAX 4096u     /* one record at most, pad excluded */
#define XENPROBES_RING_CAPS_MAX 8u       /* capture items per record */

struct xenprobes_ring_header {
	/* Written once by the module before the ring is published. */
	xenprobes_u32 magic;      /* XENPROBES_RING_MAGIC */
	xenprobes_u32 version;    /* XENPROBES_PROTOCOL_VERSION */
	xenprobes_u32 vcpu;       /* whose hits it carries */
	xenprobes_u32 data_order; /* the data area holds 2^data_order bytes */
	xenprobes_u64 reserved0[6];
	/* The producer's cache line. */
	xenprobes_u64 head;       /* bytes written (records and pads) */
	xenprobes_u64 drops;      /* hits dropped for want of room */
	xenprobes_u64 nested;     /* hits dropped because the ring was busy on its vCPU */
	xenprobes_u64 notifies;   /* event-channel notifications sent */
	xenprobes_u64 reserved1[4];
	/* Dom0's cache line. */
	xenprobes_u64 tail;       /* bytes consumed */
	xenprobes_u32 wakeup;     /* 1: notify once head - tail >= watermark (the producer clears it) */
	xenprobes_u32 watermark;  /* bytes */
	xenprobes_u64 reserved2[6];
};

#define XENPROBES_REC_PAD 1u /* fills the data area up to its end; only len and type are used */
#define XENPROBES_REC_HIT 2u

struct xenprobes_rec {
	xenprobes_u32 len;        /* bytes, this header and the capture items included; a multiple of 8 */
	xenprobes_u16 type;       /* XENPROBES_REC_* */
	xenprobes_u16 ncap;       /* capture items after regs */
	xenprobes_u32 probe;      /* the probe's id, as Dom0 gave it at registration */
	xenprobes_u32 seq;        /* the ring's record number, from 0 */
	xenprobes_u64 time;       /* the guest's clock at the hit, ns */
	struct xenprobes_regs regs; /* at the probe point: rip is the probed address */
};

#define XENPROBES_CAP_BYTES 1u   /* max bytes at reg + offset */
#define XENPROBES_CAP_STRING 2u  /* a NUL-terminated string at reg + offset, at most max bytes */
#define XENPROBES_CAP_USER 0x80u /* or-ed into kind: the address is a user one */
/* Or-ed into kind: the address decides, as x86-64 splits them: below XENPROBES_CAP_USER_TOP
 * (the lower half) a user one, else a kernel one; XENPROBES_CAP_USER is then ignored. Only
 * for a module that publishes it in rings/cap-flags. */
#define XENPROBES_CAP_AUTO 0x40u
#define XENPROBES_CAP_USER_TOP 0x8000000000000000ull
#define XENPROBES_CAP_REG_MAX 16u /* reg: 0 rax .. 15 r15 in struct xenprobes_regs order, 16 rip */
#define XENPROBES_CAP_MAX_BYTES 1024u

struct xenprobes_capture_spec {
	xenprobes_u8 kind;        /* XENPROBES_CAP_BYTES or _STRING, maybe with XENPROBES_CAP_USER or _AUTO */
	xenprobes_u8 reg;         /* the base register, 0..XENPROBES_CAP_REG_MAX */
	xenprobes_u16 max;        /* bytes at most, 1..XENPROBES_CAP_MAX_BYTES (a string: its NUL included) */
	xenprobes_u32 offset;     /* added to the register (two's complement: may be negative) */
};

#define XENPROBES_CAP_OK 0u
#define XENPROBES_CAP_FAULT 1u     /* the address could not be read: no bytes */
#define XENPROBES_CAP_TRUNCATED 2u /* a string longer than max - 1 characters: max - 1 bytes and a NUL */

struct xenprobes_cap {
	xenprobes_u16 len;        /* bytes that follow (a string: its NUL included) */
	xenprobes_u8 index;       /* which of the probe's specs */
	xenprobes_u8 status;      /* XENPROBES_CAP_* status */
	xenprobes_u32 pad0;
};

/* Consecutive timeouts after which the module disarms every trap on its own. */
#define XENPROBES_DEAD_AFTER 3

/* The claim bound (see "The claim bound" above): how long a claimed hit may wait in all. */
#define XENPROBES_CLAIM_FACTOR 20u
#define XENPROBES_CLAIM_MAX_MS 10000u

#ifdef __cplusplus
static_assert(sizeof(struct xenprobes_ctl_header) == 136, "xenprobes_ctl_header layout");
static_assert(sizeof(struct xenprobes_regs) == 160, "xenprobes_regs layout");
static_assert(sizeof(struct xenprobes_mailbox) == 224, "xenprobes_mailbox layout");
static_assert(sizeof(struct xenprobes_trap) == 40, "xenprobes_trap layout");
static_assert(sizeof(struct xenprobes_ret) == 16, "xenprobes_ret layout");
static_assert(sizeof(struct xenprobes_ring_header) == 192, "xenprobes_ring_header layout");
static_assert(sizeof(struct xenprobes_rec) == 184, "xenprobes_rec layout");
static_assert(sizeof(struct xenprobes_capture_spec) == 8, "xenprobes_capture_spec layout");
static_assert(sizeof(struct xenprobes_cap) == 8, "xenprobes_cap layout");
#else
_Static_assert(sizeof(struct xenprobes_ctl_header) == 136, "xenprobes_ctl_header layout");
_Static_assert(sizeof(struct xenprobes_regs) == 160, "xenprobes_regs layout");
_Static_assert(sizeof(struct xenprobes_mailbox) == 224, "xenprobes_mailbox layout");
_Static_assert(sizeof(struct xenprobes_trap) == 40, "xenprobes_trap layout");
_Static_assert(sizeof(struct xenprobes_ret) == 16, "xenprobes_ret layout");
_Static_assert(sizeof(struct xenprobes_ring_header) == 192, "xenprobes_ring_header layout");
_Static_assert(sizeof(struct xenprobes_rec) == 184, "xenprobes_rec layout");
_Static_assert(sizeof(struct xenprobes_capture_spec) == 8, "xenprobes_capture_spec layout");
_Static_assert(sizeof(struct xenprobes_cap) == 8, "xenprobes_cap layout");
#endif

#endif /* XENPROBES_PROTOCOL_H */
