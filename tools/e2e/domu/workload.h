/*
 * What the sources of xpe2e-workload (the DomU program of the end-to-end scenarios) share.
 * The subcommands are documented at the top of workload.c. Which file holds what:
 *
 *   workload.c          the usage comment and main(): wait, put, get and first directly
 *   workload_xs.c       xenstore through /dev/xen/xenbus, write_all/read_all, now(), wait_key()
 *   workload_run.c      run
 *   workload_bench.c    bench (Table 1 lat_syscall style, the scaled-down Table 2/3, kprobe events)
 *   workload_safety.c   safety: the loop driven by Dom0, one phase per child, the tracefs helpers
 *   workload_phases.c   the phases extable, extable-all, statickey, ftrace and activity
 *   workload_sweep.c    the phases sweep and slotunload
 */
#ifndef XPE2E_WORKLOAD_H
#define XPE2E_WORKLOAD_H

#include <stddef.h>

/* workload_xs.c */
int xs_open(void);
int write_all(int fd, const void *p, size_t n);
int read_all(int fd, void *p, size_t n);
int xs_read(const char *key, char *out, size_t outsz);
int xs_write(const char *key, const char *val);
double now(void);
int wait_key(const char *key, double seconds);

/* Constants of more than one file (each file that uses one has its own copy). The target
 * file's content: run writes it to its path, the safety phases to kTargetPath. */
static const char content[] = "xpe2e-target-content\n";
/* The safety phases' file (the run mode takes its path from the command line). */
static const char kTargetPath[] = "/tmp/xpe2e-target";
static const char tracefs[] = "/sys/kernel/tracing";

/* workload_run.c */
int run(const char *go, double seconds, long n_getppid, long n_openat, long n_unlink, const char *path);

/* workload_bench.c */
int bench(double seconds);

/* workload_safety.c: a phase's result line is built with phase_add. */
void phase_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tfs_write(const char *file, const char *s, int trunc);
long tfs_count(const char *file, const char *needle);
int tfs_step(const char *tag, const char *file, const char *s, int trunc);
int safety(double seconds);

/* workload_phases.c */
int phase_extable(void);
int phase_extable_all(void);
int phase_statickey(void);
int phase_ftrace(void);
int phase_activity(void);

/* workload_loop.c */
int loopctl(const char *dev, long n);

/* workload_sweep.c */
int phase_sweep(void);
int phase_slotunload(void);

#endif
