/*
 * demo.c - the demo guest's "syscalls" (the probe targets) and the per-vCPU workload.
 *
 * Everything here is deterministic: return values depend only on the arguments and read-only
 * tables, never on addresses or on other vCPUs. Per-vCPU state (demo_stats, the write rings) is
 * indexed by demo_this_vcpu(), so no atomics are needed; the one shared counter
 * (demo_bytes_written) is a lock-prefixed add that feeds no return value.
 */
#include "arch.h"

/* ---- data ------------------------------------------------------------------------------- */

struct demo_stats demo_stats[DEMO_MAX_VCPUS];
struct demo_stats demo_stray_stats;
char demo_stacks[DEMO_MAX_VCPUS][DEMO_STACK_SIZE] __attribute__((aligned(4096)));

int demo_ppid = 1;                /* returned by sys_getppid; writable by tests */
unsigned long demo_bytes_written; /* all vCPUs, lock add; informational only */
long demo_last_open;              /* all vCPUs, last sys_open result; informational only */
int demo_fs_readonly;             /* tests may set it: sys_unlink then fails with -EROFS */

#define DEMO_RING_SIZE 256
struct demo_ring {
  char buf[DEMO_RING_SIZE];
  uint32_t head;
  uint32_t pad;
  uint64_t bytes;
  uint64_t sum;
};
struct demo_ring demo_rings[DEMO_MAX_VCPUS + 1]; /* [DEMO_MAX_VCPUS]: foreign stacks */

/* The read-only "file system". fd = DEMO_FD_BASE + index. */
#define DEMO_F_DIR 1u
#define DEMO_F_IMMUTABLE 2u
#define DEMO_F_WRITABLE 4u
#define DEMO_FD_BASE 3
#define DEMO_NFILES 7

struct demo_file {
  const char *path;
  const char *data;
  uint32_t size;
  uint32_t mode;
};

static const char demo_hostname[] = "demo-guest\n";
static const char demo_passwd[] =
    "root:x:0:0:root:/root:/bin/sh\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "xen:x:1000:1000:Xen Probe,,,:/home/xen:/bin/sh\n";
static const char demo_version[] = "Linux version 6.1.0-xenprobes-demo (gcc) #1 SMP PREEMPT_DYNAMIC\n";
static const char demo_log[] = "boot ok\nprobe me\n";

const struct demo_file demo_files[DEMO_NFILES] = {
    {"/", 0, 0, DEMO_F_DIR | DEMO_F_IMMUTABLE},
    {"/etc", 0, 0, DEMO_F_DIR},
    {"/etc/hostname", demo_hostname, sizeof demo_hostname - 1, DEMO_F_WRITABLE},
    {"/etc/passwd", demo_passwd, sizeof demo_passwd - 1, DEMO_F_IMMUTABLE},
    {"/proc/version", demo_version, sizeof demo_version - 1, DEMO_F_IMMUTABLE},
    {"/tmp", 0, 0, DEMO_F_DIR},
    {"/tmp/demo.log", demo_log, sizeof demo_log - 1, DEMO_F_WRITABLE},
};

/* Paths the workload uses: every unlink/open outcome appears. */
#define DEMO_NPATHS 8
const char *const demo_paths[DEMO_NPATHS] = {
    "/etc/hostname", "/etc/passwd", "/tmp", "/nonexistent", "/proc/version", "/tmp/demo.log", "relative/path", "/etc",
};

static const char demo_banner[] = "xenprobes demo guest: dispatch write\n";

/* ---- helpers ---------------------------------------------------------------------------- */

static inline struct demo_stats *demo_current_stats(void) {
  unsigned long n = demo_this_vcpu();
  return n < DEMO_MAX_VCPUS ? &demo_stats[n] : &demo_stray_stats;
}

static inline void demo_count(enum demo_fn fn) { demo_current_stats()->calls[fn]++; }

/* Index of path in demo_files, or -1 (a hand-written strcmp loop per entry). */
static inline __attribute__((always_inline)) long demo_lookup(const char *path) {
  for (long i = 0; i < DEMO_NFILES; i++) {
    const char *a = demo_files[i].path;
    const char *b = path;
    while (*a && *a == *b) {
      a++;
      b++;
    }
    if (*a == *b) return i;
  }
  return -1;
}

static inline uint64_t demo_fold(uint64_t cs, uint64_t v) { return (((cs << 7) | (cs >> 57)) ^ v) * 0x100000001b3ULL; }

/* ---- the probe targets ------------------------------------------------------------------ */

DEMO_FUNC long sys_getppid(void) {
  demo_count(DEMO_FN_GETPPID);
  return demo_ppid;
}

DEMO_FUNC long sys_read(long fd, char *buf, unsigned long count) {
  const struct demo_file *f;
  unsigned long n;

  demo_count(DEMO_FN_READ);
  if (fd < DEMO_FD_BASE || fd >= DEMO_FD_BASE + DEMO_NFILES) return -DEMO_EBADF;
  f = &demo_files[fd - DEMO_FD_BASE];
  if (f->mode & DEMO_F_DIR) return -DEMO_EISDIR;
  if (!buf) return -DEMO_EFAULT;
  n = count < f->size ? count : f->size;
  memcpy(buf, f->data, n);
  return (long)n;
}

DEMO_FUNC long sys_write(long fd, const char *buf, unsigned long count) {
  struct demo_ring *r;
  uint32_t head;
  uint64_t sum = 0;

  demo_count(DEMO_FN_WRITE);
  if (fd != 1 && fd != 2) return -DEMO_EBADF;
  if (!buf && count) return -DEMO_EFAULT;
  r = &demo_rings[demo_this_vcpu()];
  head = r->head;
  for (unsigned long i = 0; i < count; i++) {
    r->buf[head] = buf[i];
    sum += (unsigned char)buf[i];
    if (++head == DEMO_RING_SIZE) head = 0;
  }
  r->head = head;
  r->bytes += count;
  r->sum += sum;
  __atomic_fetch_add(&demo_bytes_written, count, __ATOMIC_RELAXED);
  return (long)count;
}

DEMO_FUNC long sys_open(const char *path, long flags) {
  const struct demo_file *f;
  long i;

  demo_count(DEMO_FN_OPEN);
  if (!path) return -DEMO_EFAULT;
  i = demo_lookup(path);
  if (i < 0) return -DEMO_ENOENT;
  f = &demo_files[i];
  if ((flags & DEMO_O_DIRECTORY) && !(f->mode & DEMO_F_DIR)) return -DEMO_ENOTDIR;
  if ((flags & DEMO_O_ACCMODE) != DEMO_O_RDONLY) {
    if (f->mode & DEMO_F_DIR) return -DEMO_EISDIR;
    if (!(f->mode & DEMO_F_WRITABLE)) return -DEMO_EACCES;
  }
  demo_last_open = DEMO_FD_BASE + i;
  return DEMO_FD_BASE + i;
}

/* Several return paths; the file system is read-only, so success changes nothing. */
DEMO_FUNC long sys_unlink(const char *path) {
  long i;

  demo_count(DEMO_FN_UNLINK);
  if (!path) return -DEMO_EFAULT;
  if (path[0] != '/') return -DEMO_EINVAL;
  i = demo_lookup(path);
  if (i < 0) return -DEMO_ENOENT;
  if (demo_files[i].mode & DEMO_F_DIR) return -DEMO_EISDIR;
  if (demo_files[i].mode & DEMO_F_IMMUTABLE) return -DEMO_EPERM;
  if (demo_fs_readonly) return -DEMO_EROFS;
  return 0;
}

/* n+1 entries; the non-linear combination keeps GCC from turning it into a loop. */
DEMO_FUNC unsigned long demo_recurse(unsigned long n) {
  unsigned long r;

  demo_count(DEMO_FN_RECURSE);
  if (n == 0) return 1;
  r = demo_recurse(n - 1);
  return (r ^ (r >> 7)) * 0x9e3779b97f4a7c15ULL + n;
}

DEMO_FUNC long demo_classify(long x) {
  demo_count(DEMO_FN_CLASSIFY);
  if (x < 0) return -1;
  if (x == 0) return 0;
  if ((x & (x - 1)) == 0) return 1; /* power of two */
  if (x % 2 == 0) return 2;
  if (x % 3 == 0) return 3;
  if (x < 100) return 4;
  return 5;
}

/* A syscall table: a dense switch that GCC compiles to `jmp *table(,%reg,8)`. */
DEMO_FUNC long demo_dispatch(unsigned long nr, long a, long b) {
  char buf[32];

  demo_count(DEMO_FN_DISPATCH);
  switch (nr) {
    case 0: return sys_getppid();
    case 1: return sys_read((unsigned long)a % 12, buf, (unsigned long)b % sizeof buf);
    case 2: return sys_write(2, demo_banner, (unsigned long)b % sizeof demo_banner);
    case 3: return sys_open(demo_paths[(unsigned long)a % DEMO_NPATHS], b & DEMO_O_ACCMODE);
    case 4: return sys_unlink(demo_paths[(unsigned long)(a + b) % DEMO_NPATHS]);
    case 5: return (long)demo_recurse(DEMO_DISPATCH_RECURSE_DEPTH);
    case 6: return demo_classify(a - b);
    case 7: return a + b;
    case 8: return a * b;
    case 9: return (a ^ b) >> 3;
    default: return -DEMO_ENOSYS;
  }
}

/* ---- the workload ----------------------------------------------------------------------- */

/* One iteration: every probe target at least once; DEMO_CALLS_PER_ITER_* entries each. */
static uint64_t demo_iteration(uint64_t vcpu, uint64_t i, uint64_t cs) {
  static const long open_flags[4] = {DEMO_O_RDONLY, DEMO_O_RDONLY, DEMO_O_WRONLY, DEMO_O_DIRECTORY};
  char buf[48];
  long fd, n;

  cs = demo_fold(cs, (uint64_t)sys_getppid());
  fd = sys_open(demo_paths[(i + vcpu) % DEMO_NPATHS], open_flags[(i >> 3) & 3]);
  cs = demo_fold(cs, (uint64_t)fd);
  n = sys_read(fd, buf, 1 + (i * 13 + vcpu) % sizeof buf);
  cs = demo_fold(cs, (uint64_t)n);
  cs = demo_fold(cs, (uint64_t)sys_write(i % 5 == 4 ? 0 : 1, buf, n > 0 ? (unsigned long)n : 0));
  cs = demo_fold(cs, (uint64_t)sys_unlink(demo_paths[(i * 3 + vcpu) % DEMO_NPATHS]));
  cs = demo_fold(cs, demo_recurse(DEMO_RECURSE_DEPTH));
  cs = demo_fold(cs, (uint64_t)demo_classify((long)(i * 37 + vcpu) - 50));
  for (unsigned long nr = 0; nr < DEMO_DISPATCH_NCASES; nr++)
    cs = demo_fold(cs, (uint64_t)demo_dispatch(nr, (long)(i * 7 + vcpu + nr), (long)i));
  (void)demo_kstack_entry(i); /* kstack's chain (kstack.S): not in the checksum */
  return cs;
}

void demo_main(uint64_t vcpu, uint64_t iterations) {
  struct demo_stats *st = &demo_stats[vcpu];

  demo_puts("demo: vcpu ");
  demo_putu(vcpu);
  demo_puts(" start\n");
  memset(st, 0, sizeof *st);
  for (uint64_t i = 0; iterations == 0 || i < iterations; i++) {
    st->checksum = demo_iteration(vcpu, i, st->checksum);
    st->iterations = i + 1;
  }
  demo_puts("demo: vcpu ");
  demo_putu(vcpu);
  demo_puts(" done\n");
  st->done = 1;
  demo_outb(DEMO_PORT_DONE, (uint8_t)vcpu);
}
