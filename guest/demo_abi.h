/*
 * demo_abi.h - the contract between the demo guest kernel (guest/) and the simulated Xen, the
 * tests and the examples. Plain C, usable from C, C++ and the guest's assembler (the C parts are
 * hidden from __ASSEMBLER__). No kernel types.
 *
 * Image: guest/vmlinux, a static x86-64 ELF linked at DEMO_KERNEL_TEXT (= _text), with a
 * System.map next to it. PT_LOADs, in order: text (R+X), rodata (R), data+bss (RW; bss is
 * p_memsz - p_filesz and must be zeroed by the loader). Every segment starts on a 4 KiB page.
 * p_paddr = p_vaddr - DEMO_KERNEL_MAP_BASE (as in Linux: _text at physical 16 MiB).
 * Every C function starts with the 5-byte ftrace nop (0f 1f 44 00 00, from -pg -mfentry
 * -mnop-mcount); their addresses are listed between __start_mcount_loc and __stop_mcount_loc.
 *
 * Entry protocol (one call per vCPU, no interrupts, no IDT, paging off):
 *   RIP = demo_vcpu_entry, RDI = vCPU id (< DEMO_MAX_VCPUS), RSI = iterations (0 = forever),
 *   RSP = anything (the stub switches to demo_stacks[id]). Other registers are don't-care.
 *   The vCPU prints "demo: vcpu <id> start\n" on DEMO_PORT_CONSOLE, zeroes demo_stats[id], then
 *   runs the workload. Each finished iteration updates demo_stats[id].checksum and .iterations.
 *   When all iterations are done it prints "demo: vcpu <id> done\n", sets demo_stats[id].done = 1,
 *   writes the id to DEMO_PORT_DONE (outb) and executes `hlt` in a loop (Unicorn returns
 *   UC_ERR_OK at the hlt with RIP just after it; resuming there just halts again). A bad id
 *   (>= DEMO_MAX_VCPUS) writes DEMO_BAD_VCPU to DEMO_PORT_DONE and halts, touching nothing.
 *
 * Per-vCPU state is found from the stack pointer (stack index = (rsp - demo_stacks) /
 * DEMO_STACK_SIZE, like Linux's old current_thread_info()), so the syscall-like functions have
 * their natural signatures. Calls made on a foreign stack are counted in demo_stray_stats.
 *
 * Determinism: no return value depends on addresses, time or other vCPUs, so
 * demo_stats[id].checksum is a pure function of (id, iterations) - a handler that changes a
 * return value or argument changes it. The demo file system is read-only: unlink only reports.
 * DEMO_REF_CHECKSUM_V0_I100 is the value for (vCPU 0, 100 iterations), computed both under
 * Unicorn and by the same C compiled natively; update it whenever the workload changes.
 */
#ifndef XENPROBES_DEMO_ABI_H
#define XENPROBES_DEMO_ABI_H

#define DEMO_KERNEL_TEXT 0xffffffff81000000ULL     /* _text: link address of the image */
#define DEMO_KERNEL_MAP_BASE 0xffffffff80000000ULL /* p_paddr = p_vaddr - this */

#define DEMO_MAX_VCPUS 8
#define DEMO_STACK_SIZE 16384 /* per vCPU, in demo_stacks[DEMO_MAX_VCPUS][DEMO_STACK_SIZE] */

#define DEMO_PORT_CONSOLE 0xe9 /* outb: debug console, one byte per out */
#define DEMO_PORT_DONE 0xf4    /* outb: vCPU id, once, when the workload has finished */
#define DEMO_BAD_VCPU 0xff     /* value written to DEMO_PORT_DONE for an out-of-range id */

/* Workload parameters (fixed so that call counts are exact). */
#define DEMO_RECURSE_DEPTH 8          /* the workload calls demo_recurse(8): 9 entries */
#define DEMO_DISPATCH_RECURSE_DEPTH 3 /* demo_dispatch case 5 calls demo_recurse(3): 4 entries */
#define DEMO_DISPATCH_NCASES \
  10 /* demo_dispatch(nr) has cases 0..9; each iteration calls
                                         it once for every nr in 0..9 */
/* kstack's chain (guest/kstack.S), entered once per iteration (after the calls counted below):
   a hit at demo_kstack_leaf unwinds, with the guest's ORC table, to exactly demo_kstack_leaf+0,
   demo_kstack_middle+DEMO_KSTACK_MIDDLE_OFF, demo_kstack_outer+DEMO_KSTACK_OUTER_OFF,
   demo_kstack_entry+DEMO_KSTACK_ENTRY_RET_OFF (return addresses) and
   demo_kstack_entry+DEMO_KSTACK_ENTRY_IRQ_OFF (the ip of the pt_regs frame it built), then the
   end of the stack. */
#define DEMO_KSTACK_MIDDLE_OFF 9
#define DEMO_KSTACK_OUTER_OFF 13
#define DEMO_KSTACK_ENTRY_RET_OFF 56
#define DEMO_KSTACK_ENTRY_IRQ_OFF 65

/*
 * Exact entries per workload iteration (f = DEMO_FN_*, below): after k completed iterations
 * (demo_stats.iterations == k, read after done or while the vCPU is stopped between two
 * iterations), calls[f] == k * DEMO_CALLS_PER_ITER_<f>.
 * Each function is called once directly by the loop and once through demo_dispatch, except
 * recursion (9 + 4) and demo_dispatch itself (10).
 */
#define DEMO_CALLS_PER_ITER_GETPPID 2
#define DEMO_CALLS_PER_ITER_READ 2
#define DEMO_CALLS_PER_ITER_WRITE 2
#define DEMO_CALLS_PER_ITER_OPEN 2
#define DEMO_CALLS_PER_ITER_UNLINK 2
#define DEMO_CALLS_PER_ITER_RECURSE ((DEMO_RECURSE_DEPTH + 1) + (DEMO_DISPATCH_RECURSE_DEPTH + 1))
#define DEMO_CALLS_PER_ITER_CLASSIFY 2
#define DEMO_CALLS_PER_ITER_DISPATCH DEMO_DISPATCH_NCASES
/* Array initializer in DEMO_FN_* order: uint64_t k[DEMO_NFUNCS] = DEMO_CALLS_PER_ITER_INIT; */
#define DEMO_CALLS_PER_ITER_INIT                                                                                \
  {                                                                                                             \
    DEMO_CALLS_PER_ITER_GETPPID, DEMO_CALLS_PER_ITER_READ, DEMO_CALLS_PER_ITER_WRITE, DEMO_CALLS_PER_ITER_OPEN, \
        DEMO_CALLS_PER_ITER_UNLINK, DEMO_CALLS_PER_ITER_RECURSE, DEMO_CALLS_PER_ITER_CLASSIFY,                  \
        DEMO_CALLS_PER_ITER_DISPATCH                                                                            \
  }

/* Symbol names, for tests that resolve them through System.map. */
#define DEMO_SYM_ENTRY "demo_vcpu_entry"
#define DEMO_SYM_STATS "demo_stats"
#define DEMO_SYM_STRAY_STATS "demo_stray_stats"
#define DEMO_SYM_STACKS "demo_stacks"
#define DEMO_SYM_PPID "demo_ppid" /* int32 in .data returned by sys_getppid (initially 1) */
#define DEMO_SYM_FS_READONLY \
  "demo_fs_readonly" /* int32, 0; nonzero: sys_unlink's success path
                                                   returns -EROFS (-30) instead of 0 */

#define DEMO_REF_CHECKSUM_V0_I100 0x6791c3e27ab16248ULL

#ifndef __ASSEMBLER__
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Function indices into demo_stats.calls[]. Every entry into the function increments its
 * counter, recursive entries included, before anything else the function does.
 *   DEMO_FN_GETPPID  long sys_getppid(void)
 *   DEMO_FN_READ     long sys_read(long fd, char *buf, unsigned long count)
 *   DEMO_FN_WRITE    long sys_write(long fd, const char *buf, unsigned long count)
 *   DEMO_FN_OPEN     long sys_open(const char *path, long flags)
 *   DEMO_FN_UNLINK   long sys_unlink(const char *path)
 *   DEMO_FN_RECURSE  unsigned long demo_recurse(unsigned long n)     (recursive, n+1 entries)
 *   DEMO_FN_CLASSIFY long demo_classify(long x)                       (several early returns)
 *   DEMO_FN_DISPATCH long demo_dispatch(unsigned long nr, long a, long b) (jump table)
 */
enum demo_fn {
  DEMO_FN_GETPPID = 0,
  DEMO_FN_READ = 1,
  DEMO_FN_WRITE = 2,
  DEMO_FN_OPEN = 3,
  DEMO_FN_UNLINK = 4,
  DEMO_FN_RECURSE = 5,
  DEMO_FN_CLASSIFY = 6,
  DEMO_FN_DISPATCH = 7,
  DEMO_NFUNCS = 8
};

/* Byte offsets in struct demo_stats, for raw guest-memory reads. */
#define DEMO_STATS_CALLS_OFF 0
#define DEMO_STATS_ITERATIONS_OFF (8 * DEMO_NFUNCS)
#define DEMO_STATS_CHECKSUM_OFF (8 * DEMO_NFUNCS + 8)
#define DEMO_STATS_DONE_OFF (8 * DEMO_NFUNCS + 16)
#define DEMO_STATS_SIZE (8 * DEMO_NFUNCS + 24) /* array stride of demo_stats[] */

/*
 * demo_stats[DEMO_MAX_VCPUS] (in .bss) holds one of these per vCPU; only that vCPU writes it.
 * checksum folds every return value of the iteration's calls, in call order:
 *   checksum = (rotl64(checksum, 7) ^ (uint64_t)ret) * 0x100000001b3   (starting from 0)
 */
struct demo_stats {
  uint64_t calls[DEMO_NFUNCS]; /* entries per function, indexed by DEMO_FN_* */
  uint64_t iterations;         /* completed workload iterations */
  uint64_t checksum;           /* see above */
  uint64_t done;               /* 1 once the requested iterations have finished */
};

#ifdef __cplusplus
}
static_assert(sizeof(struct demo_stats) == DEMO_STATS_SIZE, "demo_stats layout");
#else
_Static_assert(sizeof(struct demo_stats) == DEMO_STATS_SIZE, "demo_stats layout");
#endif

#endif /* !__ASSEMBLER__ */
#endif /* XENPROBES_DEMO_ABI_H */
