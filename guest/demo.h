/*
 * demo.h - internal declarations of the demo guest kernel (not part of the ABI; see demo_abi.h).
 */
#ifndef DEMO_GUEST_DEMO_H
#define DEMO_GUEST_DEMO_H

#include <stddef.h>
#include <stdint.h>

#include "demo_abi.h"

/*
 * A probe target: never inlined, cloned or specialised, so every call goes through its own
 * symbol with the plain SysV ABI and its return value is really computed.
 */
#if defined(__GNUC__) && !defined(__clang__)
#define DEMO_FUNC __attribute__((noipa))
#else
#define DEMO_FUNC __attribute__((noinline))
#endif

/* errno values, as Linux x86-64 numbers them. */
#define DEMO_EPERM 1
#define DEMO_ENOENT 2
#define DEMO_EBADF 9
#define DEMO_EACCES 13
#define DEMO_EFAULT 14
#define DEMO_ENOTDIR 20
#define DEMO_EISDIR 21
#define DEMO_EINVAL 22
#define DEMO_EROFS 30
#define DEMO_ENOSYS 38

/* open() flags, as Linux x86-64 numbers them. */
#define DEMO_O_RDONLY 00
#define DEMO_O_WRONLY 01
#define DEMO_O_RDWR 02
#define DEMO_O_ACCMODE 03
#define DEMO_O_DIRECTORY 0200000

/* Per-vCPU state, one extra slot for calls made on a foreign stack. */
extern char demo_stacks[DEMO_MAX_VCPUS][DEMO_STACK_SIZE];
extern struct demo_stats demo_stats[DEMO_MAX_VCPUS];
extern struct demo_stats demo_stray_stats;

/* lib.c */
void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
void demo_puts(const char *s);
void demo_putu(uint64_t v);

/* demo.c: the probe targets (indices in demo_abi.h) and the workload. */
long sys_getppid(void);
long sys_read(long fd, char *buf, unsigned long count);
long sys_write(long fd, const char *buf, unsigned long count);
long sys_open(const char *path, long flags);
long sys_unlink(const char *path);
unsigned long demo_recurse(unsigned long n);
long demo_classify(long x);
long demo_dispatch(unsigned long nr, long a, long b);
uint64_t demo_kstack_entry(uint64_t x);             /* kstack.S: a call chain with an ORC table */
void demo_main(uint64_t vcpu, uint64_t iterations); /* called by entry.S */

#endif /* DEMO_GUEST_DEMO_H */
