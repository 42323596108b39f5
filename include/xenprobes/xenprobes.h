/*
 * libxenprobes, the C API: the Xenprobes paper's Figure 1 interface, plus what a real user needs.
 *
 *   static void pre(xenprobes_handle_t h, struct cpu_user_regs *regs) {
 *     char path[256];
 *     if (xenprobes_read_string(h, regs->rdi, path, sizeof path) >= 0) printf("open(%s)\n", path);
 *   }
 *   ...
 *   xenprobes_handle_t h = register_xenprobe_symbol(1, "sys_open", pre, NULL);
 *   if (h == XENPROBES_HANDLE_ERROR) { perror(xenprobes_last_error()); ... }
 *   xenprobes_loop();                    // handlers run here, until xenprobes_stop()
 *   unregister_xenprobe(h);
 *   xenprobes_close();
 *
 * Error contract (Xen's): functions returning int give 0 (or a documented non-negative value) on
 * success and -1 with errno set on failure; handle-returning functions give a positive handle or
 * XENPROBES_HANDLE_ERROR (-1) with errno set. Either way xenprobes_last_error() then holds a
 * one-sentence, thread-local explanation. The errno values are those of the C++ API's Errc
 * (xenprobes/result.hpp):
 *   EINVAL     bad argument, unknown handle, wrong struct version, not inside a handler
 *   ESRCH      the domain does not exist or is gone
 *   ENOENT     symbol, System.map or key not found
 *   EFAULT     guest address not mapped / page not present
 *   EILSEQ     the address is not an instruction boundary (or does not decode)
 *   EBUSY      the instruction cannot be probed there (foreign breakpoint, reserved), or the call
 *              is not allowed now (a loop runs in another thread, a session is already open)
 *   ERANGE     relocated instruction out of rel32 reach; a string longer than the buffer
 *   ENOSPC     no out-of-line slot left in the guest's area
 *   EOPNOTSUPP the backend/hypervisor lacks the feature, or it is not implemented yet; a jump or
 *              async probe where the point, channel or guest module allows none (the message says why)
 *   EPERM, EIO, ENOMEM, ETIMEDOUT, ENOSYS as reported by the hypervisor
 * No C++ exception ever leaves this API.
 *
 * Sessions: there is one implicit, process-wide session. The first call that needs it opens it
 * with the backend named by the XENPROBES_BACKEND environment variable (xen | sim; default xen)
 * and the trap channel named by XENPROBES_CHANNEL (auto | guest | vmevent | debugger; default
 * auto: per domain the first that works of guest, vmevent, debugger);
 * xenprobes_open() chooses explicitly; xenprobes_close() ends it (every probe is unregistered and
 * every guest byte restored), after which the next call opens a new one lazily.
 *
 * Threads: handlers run in the thread calling xenprobes_loop(), one hit at a time, while the hit
 * vCPU waits. Every function may be called from a handler except xenprobes_loop(). While a loop
 * runs, other threads may only call xenprobes_stop() and xenprobes_last_error(); anything else
 * fails with EBUSY.
 */
#ifndef XENPROBES_XENPROBES_H
#define XENPROBES_XENPROBES_H

#include <stddef.h>
#include <stdint.h>

#include "xenprobes/export.h"

/* Entry points never throw: C++ callers see them noexcept. */
#ifdef __cplusplus
#define XENPROBES_NOEXCEPT noexcept
#else
#define XENPROBES_NOEXCEPT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Xen's domain id type (xen/xen.h). Defined here only when Xen's header did not define it. */
#if !defined(__XEN_PUBLIC_XEN_H__) && !defined(XENPROBES_HAVE_DOMID_T)
#define XENPROBES_HAVE_DOMID_T 1
typedef uint16_t domid_t;
#endif

/*
 * The register frame handlers receive: Xen's x86_64 struct cpu_user_regs
 * (xen/arch-x86/xen-x86_64.h), the same layout and 64-bit member names. When that header was
 * included before this one, its definition (with its 32/16/8-bit alias unions) is used; include
 * Xen's headers first if a program needs both. Handlers may change the 16 general registers,
 * rip and rflags' arithmetic flags (CF PF AF ZF SF OF): those are written back when the vCPU
 * resumes, on every channel. Changing rip in a pre-handler makes the vCPU continue there
 * without running the probed instruction (kprobes' "return 1"). cs, ss and rflags' other bits
 * are for reading (a change is put back); error_code, entry_vector, saved_upcall_mask and
 * es/ds/fs/gs are not provided (0) and writes to them are ignored.
 */
#ifndef __XEN_PUBLIC_ARCH_X86_XEN_X86_64_H__
struct cpu_user_regs {
  uint64_t r15;
  uint64_t r14;
  uint64_t r13;
  uint64_t r12;
  uint64_t rbp;
  uint64_t rbx;
  uint64_t r11;
  uint64_t r10;
  uint64_t r9;
  uint64_t r8;
  uint64_t rax;
  uint64_t rcx;
  uint64_t rdx;
  uint64_t rsi;
  uint64_t rdi;
  uint32_t error_code;   /* private */
  uint32_t entry_vector; /* private */
  uint64_t rip;
  uint16_t cs, _pad0[1];
  uint8_t saved_upcall_mask;
  uint8_t _pad1[3];
  uint64_t rflags;
  uint64_t rsp;
  uint16_t ss, _pad2[3];
  uint16_t es, _pad3[3];
  uint16_t ds, _pad4[3];
  uint16_t fs, _pad5[3];
  uint16_t gs, _pad6[3];
};
#endif

/* A probe handle: positive; XENPROBES_HANDLE_ERROR (with errno set) on failure. */
typedef int xenprobes_handle_t;
#define XENPROBES_HANDLE_ERROR (-1)

/* A handler: the probe that hit and the hit vCPU's registers (valid only during the call). */
typedef void (*xenprobe_handler_t)(xenprobes_handle_t, struct cpu_user_regs *);

/* ---- The paper's Figure 1 ------------------------------------------------------------------ */

/*
 * Puts a probe on the instruction at guest-virtual `address` of domain `domid`'s kernel.
 * pre_handler runs before the instruction, post_handler after it (each may be NULL; with a
 * post_handler the instruction always traps after its out-of-line copy). Several probes on one
 * address run in registration order. Opens the implicit session if needed.
 * Returns a positive handle, or XENPROBES_HANDLE_ERROR with errno:
 *   ESRCH no such domain · EFAULT address not mapped · EILSEQ not an instruction boundary
 *   (known when the guest's symbols are loaded) or undecodable · EBUSY a breakpoint that is not
 *   ours / a refused instruction · EINVAL an instruction that can never be probed (hlt, iret…)
 *   · ERANGE out of rel32 reach · ENOSPC no slot left · EOPNOTSUPP channel unavailable (e.g. no
 *   GDBSX in the hypervisor) · EBUSY a loop runs in another thread.
 */
XENPROBES_API xenprobes_handle_t register_xenprobe(domid_t domid, unsigned long address, xenprobe_handler_t pre_handler,
                                                   xenprobe_handler_t post_handler) XENPROBES_NOEXCEPT;

/*
 * Removes a probe: the guest's original bytes are restored exactly and its slot is released
 * once no vCPU can be executing in it. From a handler, removal happens when the hit has been
 * handled. Returns 0, or -1 with errno: EINVAL unknown handle (never registered, already
 * unregistered, or its session was closed); others from the hypervisor (the handle then stays
 * valid, so the call can be retried).
 */
XENPROBES_API int unregister_xenprobe(xenprobes_handle_t handle) XENPROBES_NOEXCEPT;

/*
 * The paper's return probe: entry_handler runs at the first instruction of the function at
 * `address` (it must be a function's first instruction; with the guest's symbols loaded
 * anything else is refused with EINVAL), return_handler when that call returns, with the return
 * value in regs->rax (a change is written back) and regs->rip the real return address. Calls
 * are found by the stack slot holding their return address, so recursion, several vCPUs and
 * calls that sleep or migrate all pair up. At most `maxactive` calls are tracked at once;
 * maxactive <= 0 picks max(10, 2 * the domain's vCPUs) (kretprobes' rule with NR_CPUS). A call
 * made while all are in flight is not tracked and counts in untracked_calls (xenretprobe_untracked_calls(),
 * xenprobes_stats()). Either handler may be NULL. Errors as register_xenprobe(), and EINVAL
 * for maxactive above 4096.
 */
XENPROBES_API xenprobes_handle_t register_xenretprobe(domid_t domid, unsigned long address,
                                                      xenprobe_handler_t entry_handler,
                                                      xenprobe_handler_t return_handler,
                                                      int maxactive) XENPROBES_NOEXCEPT;

/* The same on a function named by symbol (see register_xenprobe_symbol()). */
XENPROBES_API xenprobes_handle_t register_xenretprobe_symbol(domid_t domid, const char *symbol,
                                                             xenprobe_handler_t entry_handler,
                                                             xenprobe_handler_t return_handler,
                                                             int maxactive) XENPROBES_NOEXCEPT;

/*
 * A return-probe handler with per-call data: `data` points to the call's own data_size bytes
 * (zeroed at entry, NULL when data_size is 0), shared by its entry and return handler, e.g. to
 * keep an entry timestamp. An entry handler returning nonzero declines to track the call (its
 * return handler will not run); the return handler's result is ignored.
 */
typedef int (*xenretprobe_handler_t)(xenprobes_handle_t, struct cpu_user_regs *, void *data);

/* register_xenretprobe() with per-call data; `symbol` (when not NULL) or else `address`. */
XENPROBES_API xenprobes_handle_t register_xenretprobe_data(domid_t domid, const char *symbol, unsigned long address,
                                                           xenretprobe_handler_t entry_handler,
                                                           xenretprobe_handler_t return_handler, int maxactive,
                                                           size_t data_size) XENPROBES_NOEXCEPT;

/*
 * Removes a return probe. Calls still in flight get their real return address back on their
 * stack first (the domain paused), so no stack is left pointing at the trampoline. Returns 0,
 * or -1 with errno EINVAL for an unknown handle or one that is not a return probe.
 */
XENPROBES_API int unregister_xenretprobe(xenprobes_handle_t handle) XENPROBES_NOEXCEPT;

/*
 * Calls a return probe did not track for want of a free instance (>= 0: kretprobes calls it
 * nmissed), or -1 with errno EINVAL for an unknown handle or one that is not a return probe.
 */
XENPROBES_API long xenretprobe_untracked_calls(xenprobes_handle_t handle) XENPROBES_NOEXCEPT;

/*
 * Handles probe hits, calling the handlers, until xenprobes_stop(). Opens the implicit session
 * if needed. Returns 0 after xenprobes_stop(), or -1 with errno: EBUSY called from a handler or
 * while another thread runs the loop; other errno values for a fatal channel error (the session
 * stays open; probes stay registered).
 */
XENPROBES_API int xenprobes_loop(void) XENPROBES_NOEXCEPT;

/*
 * Arms (enable != 0) or disarms (enable == 0) one probe without losing its slot; a disarmed
 * probe's original byte is back in the guest and it counts no hits. (The paper names this
 * function without defining it; this is our reading.) Returns 0, or -1 with errno: EINVAL
 * unknown handle; others from the hypervisor.
 */
XENPROBES_API int xenprobes_enable(xenprobes_handle_t handle, int enable) XENPROBES_NOEXCEPT;

/*
 * Makes xenprobes_loop() return once the current hit has been handled. Callable from a handler
 * or from another thread (not from a signal handler: it is not async-signal-safe). A stop while
 * no loop runs is remembered by the next xenprobes_loop(). Never fails.
 */
XENPROBES_API void xenprobes_stop(void) XENPROBES_NOEXCEPT;

/* ---- Sessions -------------------------------------------------------------------------------- */

/*
 * Opens the implicit session on `backend` ("xen" or "sim"; NULL or "" = XENPROBES_BACKEND, default
 * xen; the channel from XENPROBES_CHANNEL). Returns 0, or -1 with errno: EBUSY a session is
 * already open (xenprobes_close() first); EINVAL unknown backend or channel; EOPNOTSUPP backend
 * not built in or not loadable (sim: libxenprobes-sim), not a Xen Dom0, the debugger channel
 * unavailable (the message says why); EPERM not privileged.
 */
XENPROBES_API int xenprobes_open(const char *backend) XENPROBES_NOEXCEPT;

/*
 * Ends the implicit session: unregisters every probe (restoring every guest byte) and
 * invalidates every handle. A no-op when nothing is open. Called from a handler, it happens when
 * xenprobes_loop() returns (the loop is stopped); from an async handler that
 * xenprobes_ring_stats() or unregister_xenprobe() ran outside the loop, when that call returns.
 * Until then the session is as it was: the handler runs to its end and the records already read
 * in that round still reach their handlers. Never fails.
 */
XENPROBES_API void xenprobes_close(void) XENPROBES_NOEXCEPT;

/* ---- Symbols --------------------------------------------------------------------------------- */

/*
 * Loads the guest kernel's symbols (a System.map or a /proc/kallsyms copy) for domain `domid`,
 * for register_xenprobe_symbol() and for instruction-boundary checks. KASLR is handled with the
 * kernel-text address the guest module publishes. With the simulated Xen the demo guest's
 * System.map is loaded automatically on the first register_xenprobe_symbol(). Returns 0, or -1
 * with errno: EINVAL NULL path; ENOENT no such file; EIO unreadable or malformed; ESRCH no such
 * domain.
 */
XENPROBES_API int xenprobes_load_symbols(domid_t domid, const char *system_map) XENPROBES_NOEXCEPT;

/*
 * register_xenprobe() at "symbol" or "symbol+offset" (offset in hex with 0x, or decimal), e.g.
 * "sys_open+0x4" ("0x<address>+offset" works too). Same errors as register_xenprobe(), plus:
 * EINVAL NULL, malformed or ambiguous symbol; ENOENT no symbols loaded for the domain, or no such
 * symbol; ERANGE offset beyond the symbol's end.
 */
XENPROBES_API xenprobes_handle_t register_xenprobe_symbol(domid_t domid, const char *symbol,
                                                          xenprobe_handler_t pre_handler,
                                                          xenprobe_handler_t post_handler) XENPROBES_NOEXCEPT;

/* ---- Per-probe information ------------------------------------------------------------------- */

#define XENPROBE_STATS_VERSION 2u

/* Counters of one probe. The caller sets version to XENPROBE_STATS_VERSION. */
struct xenprobe_stats {
  uint32_t version;
  uint64_t hits;      /* handler invocations (hits while enabled; return probes: entries) */
  uint64_t unhandled; /* hits the guest went through without the handlers */
  /* Version 2: return probes. */
  uint64_t returns;         /* return-handler invocations */
  uint64_t untracked_calls; /* calls not tracked for want of a free instance: raise maxactive */
  uint64_t declined;        /* calls the entry handler declined */
  uint64_t reclaimed;       /* instances found stale (the call left by another way) */
  uint32_t maxactive;
  uint32_t active; /* calls in flight now */
};

/*
 * Fills *out with the probe's counters. Returns 0, or -1 with errno: EINVAL unknown handle, NULL
 * out, or out->version != XENPROBE_STATS_VERSION.
 */
XENPROBES_API int xenprobes_stats(xenprobes_handle_t handle, struct xenprobe_stats *out) XENPROBES_NOEXCEPT;

/* The domain a probe is in (>= 0), or -1 with errno EINVAL for an unknown handle. */
XENPROBES_API int xenprobes_domain_of(xenprobes_handle_t handle) XENPROBES_NOEXCEPT;

/*
 * The detail of the last failure in this thread ("" if none yet). The pointer stays valid until
 * the next libxenprobes call in this thread.
 */
XENPROBES_API const char *xenprobes_last_error(void) XENPROBES_NOEXCEPT;

/* ---- Guest memory, from inside a handler ----------------------------------------------------- */

/*
 * Copies `len` bytes of the hit guest's virtual memory at `gva` into `buf`, through the hit vCPU's
 * domain page tables. Only inside a handler, with the handle it was called with. Returns 0, or -1
 * with errno: EINVAL not inside a handler of `handle`, or NULL buf with len > 0; EFAULT not
 * mapped (buf contents then unspecified).
 */
XENPROBES_API int xenprobes_read(xenprobes_handle_t handle, unsigned long gva, void *buf,
                                 size_t len) XENPROBES_NOEXCEPT;

/*
 * Writes `len` bytes from `buf` into the hit guest's virtual memory at `gva` (the guest sees
 * them when the vCPU resumes). Only inside a handler of `handle`. Errors as xenprobes_read().
 */
XENPROBES_API int xenprobes_write(xenprobes_handle_t handle, unsigned long gva, const void *buf,
                                  size_t len) XENPROBES_NOEXCEPT;

/*
 * Reads a NUL-terminated string at `gva` into `buf` (`size` bytes, always NUL-terminated when
 * size > 0). Only inside a handler of `handle`. It reads up to the NUL and at most size - 1
 * characters, then, only when none of them is the NUL, the one byte after them. Returns its
 * length, or -1 with errno: EINVAL not inside a handler of `handle`, NULL buf or size 0; EFAULT
 * one of the first size - 1 characters not mapped; ERANGE the string does not fit: the byte
 * after size - 1 characters is not the NUL or cannot be read (buf then holds those size-1
 * bytes, terminated).
 */
XENPROBES_API int xenprobes_read_string(xenprobes_handle_t handle, unsigned long gva, char *buf,
                                        size_t size) XENPROBES_NOEXCEPT;

/* ---- Jump probes, and what a probe became ---------------------------------------------------- */

/*
 * How a probe is put into the guest (docs/probes.md "Jump probes"). A trap probe puts a trap
 * byte over the instruction: every channel, every instruction the probing rules accept. A jump
 * probe replaces at least 5 bytes of whole instructions with a jump to a detour that calls the
 * guest module, which hands the hit to Dom0 without a trap: only on the guest channel, with a
 * guest module that publishes its jump entry, with a pre-handler only, and where the jump rules
 * accept the point. FASTEST gives a jump where the point can be one and a trap elsewhere;
 * xenprobes_info() then says which, and why not a jump.
 */
enum xenprobe_method { XENPROBE_METHOD_TRAP = 0, XENPROBE_METHOD_JUMP = 1, XENPROBE_METHOD_FASTEST = 2 };

/*
 * register_xenprobe() with a method: at `symbol` ("symbol" or "symbol+offset", as
 * register_xenprobe_symbol()) when it is not NULL, else at `address`. TRAP is exactly
 * register_xenprobe(). Errors as register_xenprobe() and register_xenprobe_symbol(), plus:
 * EINVAL an unknown method; EOPNOTSUPP a JUMP the point, the channel or the guest module cannot
 * have (a post-handler, another channel, no jump entry, a region the jump rules refuse; the
 * message says which); EBUSY a JUMP where another probe's point is in the way, or any probe
 * where an async probe sits.
 */
XENPROBES_API xenprobes_handle_t register_xenprobe_method(domid_t domid, const char *symbol, unsigned long address,
                                                          xenprobe_handler_t pre_handler,
                                                          xenprobe_handler_t post_handler,
                                                          enum xenprobe_method method) XENPROBES_NOEXCEPT;

/* How a probe's instruction runs after the pre-handlers (xenprobe_info.mode). */
enum xenprobe_mode {
  XENPROBE_MODE_BOOSTED = 0,    /* its copy in an out-of-line slot, then a jump back */
  XENPROBE_MODE_EMULATED = 1,   /* Dom0 computes its effect (relative branches, calls...) */
  XENPROBE_MODE_SKIPPED = 2,    /* nothing to run (a nop) */
  XENPROBE_MODE_TRAP_AFTER = 3, /* its copy, then a trap for the post-handlers */
  XENPROBE_MODE_DETOUR = 4      /* a jump probe's: in its detour, with no trap at all */
};

#define XENPROBE_INFO_VERSION 1u

/*
 * What a probe became. The caller sets version to XENPROBE_INFO_VERSION. The three strings
 * belong to the library: they stay valid until this thread calls xenprobes_info() again, and
 * are "" when there is nothing to say.
 */
struct xenprobe_info {
  uint32_t version;
  uint32_t method;           /* XENPROBE_METHOD_TRAP or XENPROBE_METHOD_JUMP (never FASTEST) */
  uint32_t mode;             /* enum xenprobe_mode */
  uint32_t jump_pending;     /* 1: a jump probe whose jump is not written yet (the guest module has
                             not yet confirmed that no task is stopped inside the bytes it covers);
                             meanwhile a trap byte sends every hit to the detour, so it fires */
  uint32_t async;            /* 1: an async probe (register_xenprobe_async()) */
  uint32_t ret;              /* 1: a return probe */
  uint64_t address;          /* where the probe sits */
  uint64_t requested;        /* the address asked for (see moved_because) */
  uint64_t slot;             /* its out-of-line slot, a jump probe's detour (0: none) */
  uint64_t trampoline;       /* a return probe's return trampoline (else 0) */
  const char *instruction;   /* e.g. "0xffffffff81000123: 48 89 e5 (mov rbp, rsp)" */
  const char *moved_because; /* why address != requested: a function's first byte is past
                                   its endbr64 and its ftrace site, which are the kernel's */
  const char *
      not_jump_because; /* FASTEST that became a trap: why the point cannot be a jump; a short jump to an island: "a short jump ..." */
};

/*
 * Fills *out with what the probe became. Returns 0, or -1 with errno: EINVAL unknown handle,
 * NULL out, or out->version != XENPROBE_INFO_VERSION (nothing is written then).
 */
XENPROBES_API int xenprobes_info(xenprobes_handle_t handle, struct xenprobe_info *out) XENPROBES_NOEXCEPT;

/* ---- Async probes ---------------------------------------------------------------------------- */

/*
 * An async probe is a jump probe whose hits do not stop the vCPU: the guest module writes each
 * hit as a record (registers and captures) into the hit vCPU's ring, in memory it shares with
 * Dom0, and the guest goes on at once. xenprobes_loop() reads the rings between events (and at
 * least every 20 ms) and calls the probe's handler once per record, after the hit: the handler
 * sees what the hit was and can change nothing in the guest (xenprobes_read() and friends are
 * not available there). Records of one vCPU arrive in order (seq counts up by one).
 */

/* What a capture is read relative to: a general register at the hit, or rip (the probe point). */
enum xenprobe_reg {
  XENPROBE_REG_RAX = 0,
  XENPROBE_REG_RBX,
  XENPROBE_REG_RCX,
  XENPROBE_REG_RDX,
  XENPROBE_REG_RSI,
  XENPROBE_REG_RDI,
  XENPROBE_REG_RBP,
  XENPROBE_REG_RSP,
  XENPROBE_REG_R8,
  XENPROBE_REG_R9,
  XENPROBE_REG_R10,
  XENPROBE_REG_R11,
  XENPROBE_REG_R12,
  XENPROBE_REG_R13,
  XENPROBE_REG_R14,
  XENPROBE_REG_R15,
  XENPROBE_REG_RIP
};

enum xenprobe_capture_kind {
  XENPROBE_CAPTURE_BYTES = 0, /* exactly `max` bytes */
  XENPROBE_CAPTURE_STRING = 1 /* a NUL-terminated string of at most `max` bytes, its NUL included */
};

#define XENPROBE_MAX_CAPTURES 8         /* per async probe */
#define XENPROBE_CAPTURE_MAX_BYTES 1024 /* per capture */

/*
 * xenprobe_capture.flags. BY_ADDRESS: the address at the hit decides the space instead of
 * `user` (which must then be 0): below 2^63 (x86-64's lower half) it is read as the hit task's
 * user memory, else as kernel memory, as bpftrace's str() reads either. It needs a guest module
 * that publishes it (rings/cap-flags, include/xenprobes/protocol.h): on an older one
 * register_xenprobe_async() refuses the probe with EOPNOTSUPP, saying why.
 */
#define XENPROBE_CAPTURE_BY_ADDRESS 0x01u

/*
 * One thing an async probe copies out of guest memory at every hit, at base register + offset,
 * with the guest kernel's no-fault reads: an address that cannot be read gives
 * XENPROBE_CAPTURE_FAULT, never a fault in the guest. E.g. the 8 bytes at [rsp + 8]:
 * { XENPROBE_CAPTURE_BYTES, XENPROBE_REG_RSP, 0, 0, 8, 8 }. (flags was a reserved byte that
 * had to be 0; 0 still means no flags.)
 */
struct xenprobe_capture {
  uint8_t kind;   /* enum xenprobe_capture_kind */
  uint8_t base;   /* enum xenprobe_reg */
  uint8_t user;   /* nonzero: a user-space address, read as the hit task's; 0: a kernel one */
  uint8_t flags;  /* 0 or XENPROBE_CAPTURE_BY_ADDRESS; any other bit is refused (EINVAL) */
  int32_t offset; /* added to the register */
  uint32_t max;   /* 1 .. XENPROBE_CAPTURE_MAX_BYTES */
};

enum xenprobe_capture_status {
  XENPROBE_CAPTURE_OK = 0,
  XENPROBE_CAPTURE_FAULT = 1,    /* the address could not be read: no bytes */
  XENPROBE_CAPTURE_TRUNCATED = 2 /* a string longer than max: its first max - 1 bytes and a NUL */
};

/* What one capture read at a hit. A string's data ends with its NUL (a C string). */
struct xenprobe_capture_value {
  uint32_t status;           /* enum xenprobe_capture_status */
  uint32_t length;           /* bytes at data; 0 after a fault */
  const unsigned char *data; /* NULL when length is 0 */
};

/*
 * One hit of an async probe, as the guest module recorded it. Everything it points to is valid
 * only during the handler call. The library fills it; later versions may add members at its end.
 */
struct xenprobe_async_hit {
  xenprobes_handle_t handle; /* the probe */
  domid_t domid;
  uint16_t reserved;
  uint32_t vcpu;
  uint32_t seq;     /* the record's number in its vCPU's ring */
  uint64_t address; /* the probe point (regs.rip) */
  uint64_t time_ns; /* the guest's monotonic clock at the hit */
  /* The registers at the probe point: the 16 general registers, rip, rsp and rflags are the
     hit's; cs and ss too; the rest is 0. */
  struct cpu_user_regs regs;
  uint32_t ncaptures; /* as registered */
  uint32_t reserved2;
  const struct xenprobe_capture_value *captures; /* one per capture, in the order registered */
};

/* An async probe's handler; `arg` is the one given at registration. */
typedef void (*xenprobe_async_handler_t)(const struct xenprobe_async_hit *hit, void *arg);

/*
 * Puts an async probe at `symbol` ("symbol" or "symbol+offset") when it is not NULL, else at
 * `address`, copying the `ncaptures` items of `captures` (at most XENPROBE_MAX_CAPTURES; may be
 * NULL when ncaptures is 0) at every hit. An async probe is always a jump and has its point to
 * itself. unregister_xenprobe() removes it (the records of hits before that still reach the
 * handler), xenprobes_stats() counts its records in hits, xenprobes_info() says async = 1.
 * Errors as register_xenprobe_method() with XENPROBE_METHOD_JUMP, plus: EINVAL NULL handler, too
 * many captures, a capture whose kind, base, max or flags are out of range (or BY_ADDRESS with
 * `user` set), or captures that make a record larger than a ring takes; EOPNOTSUPP the guest
 * module publishes no async rings, or a BY_ADDRESS capture on a module that cannot read one
 * (the message says why); EBUSY another probe at the point.
 */
XENPROBES_API xenprobes_handle_t register_xenprobe_async(domid_t domid, const char *symbol, unsigned long address,
                                                         const struct xenprobe_capture *captures, unsigned ncaptures,
                                                         xenprobe_async_handler_t handler,
                                                         void *arg) XENPROBES_NOEXCEPT;

#define XENPROBE_RING_STATS_VERSION 2u

/*
 * A domain's async rings, as Dom0 read them, and the guest module's counts. The caller sets
 * version to XENPROBE_RING_STATS_VERSION (2); a program built against version 1 (the struct
 * up to bad_keys) still works: the library fills only the members its version has.
 */
struct xenprobe_ring_stats {
  uint32_t version;
  uint32_t rings;         /* mapped, one per vCPU; 0 until the domain's first async probe */
  uint64_t records;       /* records read and handed to a probe's handler */
  uint64_t orphans;       /* records of a probe unregistered since (no handler ran) */
  uint64_t missed;        /* records missing by their sequence numbers */
  uint64_t resyncs;       /* times a ring broke a rule and Dom0 skipped to its head */
  uint64_t corrupt_bytes; /* bytes skipped so */
  /* The guest module's own counts (reported as read, never relied on): */
  uint64_t drops;    /* hits that found no room in their ring (Dom0 did not read in time) */
  uint64_t nested;   /* hits inside a hit on the same vCPU */
  uint64_t bad_keys; /* hits whose probe entry the module refused */
  /* Version 2: */
  uint64_t bad_records;    /* records whose captures their probe's specs cannot give (a count,
                              an order, a length, a string without its NUL): written wrongly by
                              the guest, not handed to a handler */
  uint64_t notify_skipped; /* synchronous hits (on the guest channel, any probe but an async
                              one) the module did not notify because Dom0 said it was polling
                              the mailboxes (docs/probes.md "Spinning instead of notifying");
                              0 off the guest channel; filled with or without rings */
};

/*
 * Reads the domain's rings now (handing their records to the handlers, in this thread) and
 * fills *out up to its version's last member. Returns 0, or -1 with errno: EINVAL NULL out or
 * out->version neither 1 nor XENPROBE_RING_STATS_VERSION; ESRCH a domain the session does not
 * probe.
 */
XENPROBES_API int xenprobes_ring_stats(domid_t domid, struct xenprobe_ring_stats *out) XENPROBES_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* XENPROBES_XENPROBES_H */
