/*
 * The DomU side of the end-to-end scenarios: a static program in the guest's initramfs.
 *
 *   xpe2e-workload wait <key> <seconds>       exit 0 once xenstore key <key> exists, 1 on timeout
 *   xpe2e-workload put <key> <value>          write a xenstore key
 *   xpe2e-workload get <key>                  print a key's value (exit 1 if absent)
 *   xpe2e-workload first <key1> <key2> <seconds>
 *       print whichever key exists first (key1 wins a tie); exit 1 on timeout
 *   xpe2e-workload run <go-key> <seconds> <getppid> <openat> <unlink> <path>
 *       waits for <go-key>, then makes exactly <getppid> getppid() calls, <openat> openat()
 *       calls on <path> (each read back and checked), <unlink> successful unlinkat() calls
 *       plus one that fails with ENOENT; prints the counts on the console and writes them to
 *       data/xpe2e/done, then stays until Dom0 writes data/xpe2e/exercise or data/xpe2e/unload.
 *       Each call is a raw syscall, so nothing in libc caches or adds calls.
 *   xpe2e-workload bench <seconds>
 *       The paper's Table 1 (and a scaled-down Table 2/3), driven by Dom0: for i = 1, 2, ...
 *       waits up to <seconds> for data/xpe2e/bench/go-<i> ("<config> <round-seconds> <rounds>
 *       <untar-rounds>") or data/xpe2e/bench/end; measures the latency of getppid, read (1 byte
 *       of /dev/zero), write (1 byte to /dev/null) and open (openat + close of a tmpfs file),
 *       lat_syscall style, and the time to extract a small file tree with busybox tar; writes
 *       the numbers to data/xpe2e/bench/result-<i>. Configs "kprobe" and "kretprobe" arm
 *       in-guest kprobe events (tracefs) on the same functions first and disarm them after.
 *   xpe2e-workload safety <seconds>
 *       The probe-safety phases (issue 12, docs/e2e.md "Probe safety"), driven by Dom0 like
 *       bench: for i = 1, 2, ... waits up to <seconds> for data/xpe2e/safety/go-<i> (a phase
 *       name) or data/xpe2e/safety/end, runs the phase in a child process and writes
 *       "phase=<name> ok=0|1 ..." to data/xpe2e/safety/result-<i>. Phases: extable (kernel
 *       accesses to user memory that fault and must be fixed up through __ex_table),
 *       extable-all (extable's, then a fault in copy_to/from_user, put_user, strnlen_user and
 *       clear_user each), statickey
 *       (a tracepoint's static key and static call toggled through tracefs), ftrace (the
 *       function tracer and a kprobe event on __x64_sys_getppid, exactly 20 getppid calls),
 *       activity (fork/exec, opens, getppid: the kernel paths the guest module's int3 hook
 *       shares), sweep (one round of the real-kernel sweep's mixed load: exact numbers of
 *       getppid, getsid, fsync and listen calls, fork+exec churn, file I/O on tmpfs and on the
 *       initramfs root, TCP echo and UDP over 127.0.0.1, the function tracer and two tracepoints
 *       turned on and off), slotunload (the guest module detached and unloaded while a read()
 *       sleeps in a page fault taken by a copy in one of its fixup slots -- a userfaultfd page --
 *       and a process keeps calling getppid: the first detach must fail with EBUSY and rmmod
 *       with it; once the fault is resolved the read completes with the file's bytes and the
 *       module detaches and unloads; stock_pv_slot_unload). At the end prints
 *       "XPE2E-WORKLOAD: done ... ok=<all phases ok>".
 *
 * Keys are relative to the domain's home (/local/domain/<domid>/): the guest owns data/.
 * xenstore is reached through /dev/xen/xenbus (the kernel's xenbus device, no libraries),
 * speaking xenstored's wire protocol: a 16-byte header, then the payload.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <linux/userfaultfd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { XS_READ = 2, XS_WRITE = 11, XS_ERROR = 16 };

struct xs_hdr {
	uint32_t type, req_id, tx_id, len;
};

static int xs_fd = -1;
static uint32_t xs_req;

static int xs_open(void)
{
	if (xs_fd < 0)
		xs_fd = open("/dev/xen/xenbus", O_RDWR | O_CLOEXEC);
	if (xs_fd < 0)
		fprintf(stderr, "xpe2e-workload: open /dev/xen/xenbus: %s\n", strerror(errno));
	return xs_fd;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n) {
		ssize_t r = read(fd, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

/* One request; the reply body (NUL-terminated) in out. Returns 0, or -1 (out holds the error). */
static int xs_request(uint32_t type, const char *a, size_t alen, const char *b, size_t blen, char *out,
		      size_t outsz)
{
	struct xs_hdr h = { type, ++xs_req, 0, (uint32_t)(alen + blen) };
	char body[4096];
	if (xs_open() < 0)
		return -1;
	if (write_all(xs_fd, &h, sizeof h) || write_all(xs_fd, a, alen) || (blen && write_all(xs_fd, b, blen)))
		return -1;
	/* The device answers requests in order; watch events are not used here. */
	if (read_all(xs_fd, &h, sizeof h) || h.len >= sizeof body || read_all(xs_fd, body, h.len))
		return -1;
	body[h.len] = 0;
	snprintf(out, outsz, "%s", body);
	return h.type == XS_ERROR ? -1 : 0;
}

static int xs_read(const char *key, char *out, size_t outsz)
{
	return xs_request(XS_READ, key, strlen(key) + 1, NULL, 0, out, outsz);
}

static int xs_write(const char *key, const char *val)
{
	char out[64];
	return xs_request(XS_WRITE, key, strlen(key) + 1, val, strlen(val), out, sizeof out);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int wait_key(const char *key, double seconds)
{
	char v[256];
	double end = now() + seconds;
	while (now() < end) {
		if (xs_read(key, v, sizeof v) == 0)
			return 0;
		usleep(100 * 1000);
	}
	return 1;
}

static const char content[] = "xpe2e-target-content\n";
/* The safety phases' file (the run mode takes its path from the command line). */
static const char kTargetPath[] = "/tmp/xpe2e-target";

static int run(const char *go, double seconds, long n_getppid, long n_openat, long n_unlink, const char *path)
{
	long ppid_first = -1, ppid_mismatch = 0, opened = 0, open_errors = 0, content_errors = 0;
	long unlinked = 0, unlink_errors = 0, enoent = 0;
	char summary[512], buf[64];
	int fd;

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write_all(fd, content, sizeof content - 1) || close(fd)) {
		fprintf(stderr, "xpe2e-workload: cannot create %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (xs_open() < 0)
		return 1;
	printf("XPE2E-WORKLOAD: waiting for %s (at most %.0f s)\n", go, seconds);
	fflush(stdout);
	if (wait_key(go, seconds)) {
		printf("XPE2E-WORKLOAD: timeout waiting for %s\n", go);
		xs_write("data/xpe2e/done", "timeout");
		return 1;
	}
	double t0 = now();

	for (long i = 0; i < n_getppid; i++) {
		long p = syscall(SYS_getppid);
		if (ppid_first < 0)
			ppid_first = p;
		else if (p != ppid_first)
			ppid_mismatch++;
	}
	for (long i = 0; i < n_openat; i++) {
		int f = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
		if (f < 0) {
			open_errors++;
			continue;
		}
		opened++;
		ssize_t r = read(f, buf, sizeof buf);
		if (r != (ssize_t)(sizeof content - 1) || memcmp(buf, content, sizeof content - 1))
			content_errors++;
		close(f);
	}
	for (long i = 0; i < n_unlink; i++) {
		char name[128];
		snprintf(name, sizeof name, "%s.unlink-%ld", path, i);
		int f = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (f >= 0)
			close(f);
		if (syscall(SYS_unlinkat, AT_FDCWD, name, 0) == 0)
			unlinked++;
		else
			unlink_errors++;
	}
	/* One more that must fail: the file is gone. */
	char missing[128];
	snprintf(missing, sizeof missing, "%s.does-not-exist", path);
	if (syscall(SYS_unlinkat, AT_FDCWD, missing, 0) < 0 && errno == ENOENT)
		enoent++;
	else
		unlink_errors++;

	double dt = now() - t0;
	int ok = ppid_mismatch == 0 && opened == n_openat && !open_errors && !content_errors &&
		 unlinked == n_unlink && !unlink_errors && enoent == 1;
	snprintf(summary, sizeof summary,
		 "getppid=%ld ppid=%ld ppid_mismatch=%ld openat=%ld open_errors=%ld content_errors=%ld "
		 "unlink_ok=%ld unlink_enoent=%ld unlink_errors=%ld ok=%d seconds=%.3f",
		 n_getppid, ppid_first, ppid_mismatch, opened, open_errors, content_errors, unlinked, enoent,
		 unlink_errors, ok, dt);
	printf("XPE2E-WORKLOAD: done %s\n", summary);
	fflush(stdout);
	if (xs_write("data/xpe2e/done", summary))
		fprintf(stderr, "xpe2e-workload: cannot write data/xpe2e/done\n");
	/*
	 * Stay until Dom0 is done probing: the shell's next commands (fork, exec, open) would
	 * otherwise hit the probes still armed and make the counts inexact. Only read, write and
	 * nanosleep on the xenbus device happen meanwhile.
	 */
	for (double end = now() + 600; now() < end; usleep(100 * 1000))
		if (xs_read("data/xpe2e/exercise", buf, sizeof buf) == 0 || xs_read("data/xpe2e/unload", buf, sizeof buf) == 0)
			break;
	return ok ? 0 : 1;
}


/* ---- bench: the paper's Table 1, lat_syscall style --------------------------------------- */

enum { B_NULL, B_READ, B_WRITE, B_OPEN, B_KINDS };
static const char *const bench_name[B_KINDS] = { "null", "read", "write", "open" };
/* The kernel functions the in-guest kprobes (and Dom0's probes) sit on, per kind. */
static const char *const bench_fn[B_KINDS] = { "__x64_sys_getppid", "__x64_sys_read", "__x64_sys_write",
					       "__x64_sys_openat" };
static const char bench_file[] = "/tmp/xpe2e-bench";
static const char tracefs[] = "/sys/kernel/tracing";
static int zero_fd = -1, null_fd = -1;
static long bench_errors;

/* n calls of one kind; returns the elapsed seconds. Raw syscalls: what lat_syscall measures. */
static double bench_run(int kind, long n)
{
	char c = 'x';
	double t0 = now();
	for (long i = 0; i < n; i++) {
		switch (kind) {
		case B_NULL:
			syscall(SYS_getppid);
			break;
		case B_READ:
			if (syscall(SYS_read, zero_fd, &c, 1) != 1)
				bench_errors++;
			break;
		case B_WRITE:
			if (syscall(SYS_write, null_fd, &c, 1) != 1)
				bench_errors++;
			break;
		case B_OPEN: {
			long fd = syscall(SYS_openat, AT_FDCWD, bench_file, O_RDONLY, 0);
			if (fd < 0)
				bench_errors++;
			else
				syscall(SYS_close, fd);
			break;
		}
		}
	}
	return now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/*
 * One kind: batches doubling until one takes an eighth of a round (calibration: the chunk
 * size, about a twentieth of a round), then <rounds> rounds, each as many chunks as fit in
 * <round_s>; appends "<kind>_us=<median> <kind>_min=... <kind>_max=... <kind>_calls=<every
 * call made, calibration included>" to out. A stall during calibration only makes the chunks
 * smaller, never a round shorter.
 */
static void bench_kind(int kind, double round_s, int rounds, char *out, size_t outsz)
{
	long calls = 0, batch = 1;
	double per_call, us[16];
	for (;;) {
		double t = bench_run(kind, batch);
		calls += batch;
		if (t >= round_s / 8 || batch >= (1L << 30)) {
			per_call = t / (double)batch;
			break;
		}
		batch *= 2;
	}
	long chunk = (long)(round_s / 20 / (per_call > 1e-9 ? per_call : 1e-9));
	if (chunk < 1)
		chunk = 1;
	if (rounds > 16)
		rounds = 16;
	for (int r = 0; r < rounds; r++) {
		long n = 0;
		double t = 0;
		while (t < round_s) {
			t += bench_run(kind, chunk);
			n += chunk;
		}
		us[r] = t / (double)n * 1e6;
		calls += n;
	}
	qsort(us, (size_t)rounds, sizeof us[0], cmp_double);
	size_t len = strlen(out);
	snprintf(out + len, outsz - len, " %s_us=%.3f %s_min=%.3f %s_max=%.3f %s_calls=%ld", bench_name[kind],
		 us[rounds / 2], bench_name[kind], us[0], bench_name[kind], us[rounds - 1], bench_name[kind], calls);
}

/* Writes s to a tracefs file (append unless trunc). */
static int tracefs_write(const char *file, const char *s, int trunc)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", tracefs, file);
	int fd = open(path, O_WRONLY | (trunc ? O_TRUNC : O_APPEND));
	if (fd < 0) {
		printf("XPE2E-BENCH-GUEST: open %s: %s\n", path, strerror(errno));
		return -1;
	}
	int r = write_all(fd, s, strlen(s));
	if (r)
		printf("XPE2E-BENCH-GUEST: write '%s' to %s: %s\n", s, path, strerror(errno));
	close(fd);
	return r;
}

/* In-guest kprobe events on the four functions ('p' = kprobe, 'r' = kretprobe). */
static int kprobes_arm(char type)
{
	char def[128];
	if (tracefs_write("kprobe_events", "", 1))
		return -1;
	for (int k = 0; k < B_KINDS; k++) {
		snprintf(def, sizeof def, "%c:xpe2e/%s %s\n", type, bench_name[k], bench_fn[k]);
		if (tracefs_write("kprobe_events", def, 0))
			return -1;
	}
	/* Only the tar extraction reaches these two (the scaled-down Table 2/3); not fatal. */
	static const char *const extra[][2] = { { "mkdir", "do_mkdirat" }, { "chmod", "chmod_common" } };
	for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
		snprintf(def, sizeof def, "%c:xpe2e/%s %s\n", type, extra[k][0], extra[k][1]);
		tracefs_write("kprobe_events", def, 0);
	}
	int r = tracefs_write("events/xpe2e/enable", "1", 0);
	/* How the kernel implemented them ([FTRACE]: through the function's fentry pad, no int3). */
	FILE *f = fopen("/sys/kernel/debug/kprobes/list", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f))
		printf("XPE2E-BENCH-GUEST: kprobes/list: %s", line);
	if (f)
		fclose(f);
	return r;
}

/* " kp_<kind>=<hits>" per event from kprobe_profile, then removes the events. */
static void kprobes_disarm(char *out, size_t outsz)
{
	char path[256], line[256], name[128];
	unsigned long hits, missed;
	snprintf(path, sizeof path, "%s/kprobe_profile", tracefs);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "%127s %lu %lu", name, &hits, &missed) == 3) {
			size_t len = strlen(out);
			snprintf(out + len, outsz - len, " kp_%s=%lu kp_%s_missed=%lu", name, hits, name, missed);
		}
	if (f)
		fclose(f);
	tracefs_write("events/xpe2e/enable", "0", 0);
	tracefs_write("kprobe_events", "", 1);
}

/* The scaled-down Table 2/3: a tree of 8 directories x 8 files x 4 KiB, extracted by tar. */
static int sh(const char *cmd)
{
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int untar_prepare(void)
{
	char buf[4096];
	memset(buf, 'u', sizeof buf);
	if (sh("rm -rf /tmp/xpb-src && mkdir -p /tmp/xpb-src"))
		return -1;
	for (int d = 0; d < 8; d++) {
		char dir[64];
		snprintf(dir, sizeof dir, "/tmp/xpb-src/d%d", d);
		if (mkdir(dir, 0755))
			return -1;
		for (int i = 0; i < 8; i++) {
			char file[96];
			snprintf(file, sizeof file, "%s/f%d", dir, i);
			int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0640);
			if (fd < 0 || write_all(fd, buf, sizeof buf) || close(fd))
				return -1;
		}
	}
	return sh("cd /tmp && tar -cf /tmp/xpb.tar xpb-src");
}

/* " untar_s=<median> untar_min=... untar_max=... untar_rounds=<n>" (failures in bench_errors). */
static void untar_rounds(int rounds, char *out, size_t outsz)
{
	double s[16];
	if (rounds > 16)
		rounds = 16;
	for (int r = 0; r < rounds; r++) {
		sh("rm -rf /tmp/xpb-out");
		mkdir("/tmp/xpb-out", 0755);
		double t0 = now();
		if (sh("tar -xf /tmp/xpb.tar -C /tmp/xpb-out"))
			bench_errors++;
		s[r] = now() - t0;
		if (sh("cmp /tmp/xpb-src/d7/f7 /tmp/xpb-out/xpb-src/d7/f7"))
			bench_errors++;
	}
	qsort(s, (size_t)rounds, sizeof s[0], cmp_double);
	size_t len = strlen(out);
	snprintf(out + len, outsz - len, " untar_s=%.3f untar_min=%.3f untar_max=%.3f untar_rounds=%d", s[rounds / 2], s[0],
		 s[rounds - 1], rounds);
}

static int bench(double seconds)
{
	char key[64], end_key[] = "data/xpe2e/bench/end", v[256], out[2048];
	zero_fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	int fd = open(bench_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (zero_fd < 0 || null_fd < 0 || fd < 0 || close(fd) || untar_prepare()) {
		printf("XPE2E-BENCH-GUEST: setup failed: %s\n", strerror(errno));
		xs_write("data/xpe2e/bench/ready", "setup-failed");
		return 1;
	}
	xs_write("data/xpe2e/bench/ready", "1");
	for (int i = 1;; i++) {
		snprintf(key, sizeof key, "data/xpe2e/bench/go-%d", i);
		int got = 0;
		for (double end = now() + seconds; !got && now() < end; usleep(100 * 1000)) {
			if (xs_read(key, v, sizeof v) == 0)
				got = 1;
			else if (xs_read(end_key, out, sizeof out) == 0)
				return 0;
		}
		if (!got) {
			printf("XPE2E-BENCH-GUEST: timeout waiting for %s\n", key);
			return 1;
		}
		char config[64];
		double round_s = 1;
		int rounds = 3, untar = 0;
		if (sscanf(v, "%63s %lf %d %d", config, &round_s, &rounds, &untar) < 1 || rounds < 1) {
			printf("XPE2E-BENCH-GUEST: bad go value '%s'\n", v);
			return 1;
		}
		bench_errors = 0;
		snprintf(out, sizeof out, "config=%s", config);
		char kp = !strcmp(config, "kprobe") ? 'p' : !strcmp(config, "kretprobe") ? 'r' : 0;
		if (kp && kprobes_arm(kp)) {
			snprintf(out + strlen(out), sizeof out - strlen(out), " error=kprobe-events");
		} else {
			for (int k = 0; k < B_KINDS; k++)
				bench_kind(k, round_s, rounds, out, sizeof out);
			if (untar > 0)
				untar_rounds(untar, out, sizeof out);
			if (kp)
				kprobes_disarm(out, sizeof out);
		}
		snprintf(out + strlen(out), sizeof out - strlen(out), " errors=%ld", bench_errors);
		printf("XPE2E-BENCH-GUEST: %s\n", out);
		snprintf(key, sizeof key, "data/xpe2e/bench/result-%d", i);
		if (xs_write(key, out))
			printf("XPE2E-BENCH-GUEST: cannot write %s\n", key);
	}
}

/* ---- safety: the probe-safety phases (issue 12) ---------------------------------------- */

/*
 * Each phase runs in a child: a kernel oops in a syscall kills only the calling task, and a
 * BUG() taken with a mutex held leaves later writes of the same child hanging; the parent
 * stays, reports what happened and can serve the next phase. Results travel through a pipe:
 * only the parent talks to xenstore (one request at a time on the xenbus device).
 */
static char phase_out[1024];

static void phase_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void phase_add(const char *fmt, ...)
{
	size_t len = strlen(phase_out);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(phase_out + len, sizeof phase_out - len, fmt, ap);
	va_end(ap);
}

/* Writes s to a tracefs file; 0 or the errno. */
static int tfs_write(const char *file, const char *s, int trunc)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", tracefs, file);
	int fd = open(path, O_WRONLY | O_CLOEXEC | (trunc ? O_TRUNC : O_APPEND));
	if (fd < 0)
		return errno;
	ssize_t w = write(fd, s, strlen(s));
	int e = w == (ssize_t)strlen(s) ? 0 : w < 0 ? errno : EIO;
	close(fd);
	return e;
}

/* Lines of a tracefs file containing needle (-1 if it cannot be read). */
static long tfs_count(const char *file, const char *needle)
{
	char path[256], line[512];
	snprintf(path, sizeof path, "%s/%s", tracefs, file);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long n = 0;
	while (fgets(line, sizeof line, f))
		if (line[0] != '#' && strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

/* One tracefs write, recorded as " <tag>=ok" or " <tag>=<errno name>"; returns 1 when ok. */
static int tfs_step(const char *tag, const char *file, const char *s, int trunc)
{
	int e = tfs_write(file, s, trunc);
	phase_add(" %s=%s", tag, e ? strerror(e) : "ok");
	/* Printed as it happens: if the next step hangs (a BUG with a mutex held), the console
	 * still says how far the phase got. */
	printf("XPE2E-SAFETY: %s -> %s: %s\n", s[0] ? s : "(empty)", file, e ? strerror(e) : "ok");
	return !e;
}

/* A string that ends in the last bytes of a page followed by an unmapped page: the kernel's
 * word-at-a-time copies read past its NUL into the hole and must fall back (an exception
 * table fixup), not fail. Returns the string's address, or NULL. */
static char *at_page_end(const char *s)
{
	long pg = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (munmap(p + pg, (size_t)pg))
		return NULL;
	size_t n = strlen(s) + 1;
	memcpy(p + pg - n, s, n);
	return p + pg - n;
}

static int phase_extable(void)
{
	int ok = 1;
	long pg = sysconf(_SC_PAGESIZE);
	/* 1. A filename at user address 16: strncpy_from_user faults, the fixup returns -EFAULT. */
	long r = syscall(SYS_openat, AT_FDCWD, (char *)16, O_RDONLY, 0);
	int e = errno;
	phase_add(" openat_bad_ptr=%s", r == -1 && e == EFAULT ? "EFAULT" : r >= 0 ? "opened" : strerror(e));
	ok &= r == -1 && e == EFAULT;
	if (r >= 0)
		close((int)r);
	printf("XPE2E-SAFETY: extable: openat((char *)16) done\n");

	/* 2. read() of 2 pages into a buffer whose second page is PROT_NONE: copy_to_user
	 * faults on the second page, the fixup makes it a short read of one page. */
	static const char big[] = "/tmp/xpe2e-8k";
	char *page = malloc((size_t)pg);
	memset(page, 'k', (size_t)pg);
	int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int made = fd >= 0 && !write_all(fd, page, (size_t)pg) && !write_all(fd, page, (size_t)pg);
	if (fd >= 0)
		close(fd);
	char *buf = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!made || buf == MAP_FAILED || mprotect(buf + pg, (size_t)pg, PROT_NONE)) {
		phase_add(" short_read=setup-failed");
		ok = 0;
	} else {
		fd = open(big, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, buf, (size_t)pg * 2) : -1;
		e = errno;
		int same = n == pg && !memcmp(buf, page, (size_t)pg);
		phase_add(" short_read=%zd%s", n, n < 0 ? strerror(e) : same ? "" : "-wrong-bytes");
		ok &= same;
		if (fd >= 0)
			close(fd);
	}
	free(page);
	printf("XPE2E-SAFETY: extable: short read done\n");

	/* 3. open() of a path that ends at a page's end, the next page unmapped. */
	char *path = at_page_end(kTargetPath);
	fd = path ? (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0) : -1;
	e = errno;
	char got[64];
	ssize_t n = fd >= 0 ? read(fd, got, sizeof got) : -1;
	int open_ok = fd >= 0 && n == (ssize_t)(sizeof content - 1) && !memcmp(got, content, sizeof content - 1);
	phase_add(" open_page_end=%s", open_ok ? "ok" : fd < 0 ? strerror(e) : "wrong-content");
	ok &= open_ok;
	if (fd >= 0)
		close(fd);
	printf("XPE2E-SAFETY: extable: open at a page end done\n");

	/* 4. execve() of a path at a page's end; 5. execve() with argv at user address 16 (the
	 * first get_user of an argv pointer faults: __get_user_8's fixup, -EFAULT). */
	for (int k = 0; k < 2; k++) {
		char *exe = k == 0 ? at_page_end("/bin/true") : (char *)"/bin/true";
		char *argv_ok[] = { (char *)"true", NULL }, *envp[] = { NULL };
		pid_t pid = fork();
		if (pid == 0) {
			if (!exe)
				_exit(3);
			syscall(SYS_execve, exe, k == 0 ? argv_ok : (char **)16, envp);
			_exit(errno == EFAULT ? 42 : 4);
		}
		int st = 0;
		if (pid < 0 || waitpid(pid, &st, 0) != pid)
			st = -1;
		int want = k == 0 ? 0 : 42;
		int good = pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == want;
		if (k == 0)
			phase_add(" exec_page_end=%s", good ? "ok" : "failed");
		else
			phase_add(" exec_bad_argv=%s", good ? "EFAULT" : "wrong");
		if (!good)
			phase_add("(status %#x)", st);
		ok &= good;
	}
	printf("XPE2E-SAFETY: extable: execs done\n");
	return ok;
}

/* A child that runs execve("/bin/true", argv, {NULL}) and exits 42 when it failed with EFAULT;
 * 1 when that is what happened. */
static int exec_efault(char **argv)
{
	pid_t pid = fork();
	if (pid == 0) {
		char *envp[] = { NULL };
		syscall(SYS_execve, "/bin/true", argv, envp);
		_exit(errno == EFAULT ? 42 : 4);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 0;
	return WIFEXITED(st) && WEXITSTATUS(st) == 42;
}

/* extable's accesses, then a fault in each other kind of user access (Dom0 probes every
 * instruction of the kernel's uaccess routines meanwhile, xpe2e_extable_all.cpp): uname() and
 * nanosleep() on a bad pointer (copy_to_user, copy_from_user), wait4() with a bad status pointer
 * (put_user; the child is reaped all the same), execve() with argv[0] at user address 16
 * (strnlen_user), a read() of /dev/zero cut short at a PROT_NONE page (clear_user). */
static int phase_extable_all(void)
{
	int ok = phase_extable();
	long pg = sysconf(_SC_PAGESIZE);
	long r = syscall(SYS_uname, (void *)16);
	int e = errno;
	phase_add(" uname_bad_ptr=%s", r == -1 && e == EFAULT ? "EFAULT" : r == 0 ? "ok" : strerror(e));
	ok &= r == -1 && e == EFAULT;
	r = syscall(SYS_nanosleep, (void *)16, NULL);
	e = errno;
	phase_add(" nanosleep_bad_ptr=%s", r == -1 && e == EFAULT ? "EFAULT" : r == 0 ? "ok" : strerror(e));
	ok &= r == -1 && e == EFAULT;

	pid_t pid = fork();
	if (pid == 0)
		_exit(7);
	r = pid > 0 ? syscall(SYS_wait4, pid, (int *)16, 0, NULL) : -1;
	e = errno;
	phase_add(" wait4_bad_status=%s", r == -1 && e == EFAULT ? "EFAULT" : r == pid ? "no-fault" : strerror(e));
	ok &= r == -1 && e == EFAULT;
	if (pid > 0)
		waitpid(pid, NULL, WNOHANG); /* reaped by the wait4 already: ECHILD */

	char *argv_bad[] = { (char *)16, NULL };
	int good = exec_efault(argv_bad);
	phase_add(" exec_bad_argv0=%s", good ? "EFAULT" : "wrong");
	ok &= good;

	char *buf = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	if (buf == MAP_FAILED || fd < 0 || mprotect(buf + pg, (size_t)pg, PROT_NONE)) {
		phase_add(" zero_short_read=setup-failed");
		ok = 0;
	} else {
		memset(buf, 'z', (size_t)pg);
		ssize_t n = read(fd, buf, (size_t)pg * 2);
		e = errno;
		int zeros = n == pg && buf[0] == 0 && buf[pg - 1] == 0 && !memcmp(buf, buf + 1, (size_t)pg - 1);
		phase_add(" zero_short_read=%zd%s", n, n < 0 ? strerror(e) : zeros ? "" : "-wrong-bytes");
		ok &= zeros;
	}
	if (fd >= 0)
		close(fd);
	printf("XPE2E-SAFETY: extable-all: done\n");
	return ok;
}

static int phase_statickey(void)
{
	/* Enabling sched_process_fork patches its static call sites and trampoline
	 * (static_call_update) and its static key's jump sites (jump_label_update), under
	 * text_mutex: kernel_clone's sites among them. */
	int ok = tfs_step("fork_on", "events/sched/sched_process_fork/enable", "1", 0);
	int forks = 0;
	for (int i = 0; i < 5; i++) {
		pid_t pid = fork();
		if (pid == 0)
			_exit(0);
		int st;
		if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			forks++;
	}
	ok &= tfs_step("fork_off", "events/sched/sched_process_fork/enable", "0", 0);
	long ev = tfs_count("trace", "sched_process_fork:");
	phase_add(" forks=%d fork_events=%ld", forks, ev);
	ok &= forks == 5 && ev >= 5;
	/* Another tracepoint: takes the same mutexes again (a BUG() with them held hangs here). */
	ok &= tfs_step("exec_on", "events/sched/sched_process_exec/enable", "1", 0);
	ok &= tfs_step("exec_off", "events/sched/sched_process_exec/enable", "0", 0);
	ok &= tfs_step("trace_clear", "trace", "", 1);
	return ok;
}

static int phase_ftrace(void)
{
	/* Exactly 20 getppid calls (10 under the function tracer, 10 under a kprobe event): Dom0's
	 * probe on __x64_sys_getppid must count exactly these. */
	long calls = 0;
	/*
	 * The filter must name the function as ftrace does: by the first of its aliases in
	 * kallsyms, which on 6.1.0-50 is __do_sys_getppid (at the same address as
	 * __x64_sys_getppid, which ftrace does not know). Each name ends with a newline: only
	 * then is it matched by the write itself, which fails (EINVAL) when nothing matches.
	 * Without it the name is matched at close(), whose error nobody sees, the filter stays
	 * empty, and the function tracer then patches every function of the kernel (40,432
	 * sites: minutes under TCG, with soft lockups on the way; run 20261125-043322-24959).
	 */
	static const char *const names[] = { "__x64_sys_getppid", "__do_sys_getppid" };
	const char *traced_name = NULL;
	for (size_t k = 0; k < sizeof names / sizeof names[0] && !traced_name; k++) {
		char line[64];
		snprintf(line, sizeof line, "%s\n", names[k]);
		int e = tfs_write("set_ftrace_filter", line, 1);
		phase_add(" filter.%s=%s", names[k], e ? strerror(e) : "ok");
		printf("XPE2E-SAFETY: %s -> set_ftrace_filter: %s\n", names[k], e ? strerror(e) : "ok");
		if (!e)
			traced_name = names[k];
	}
	/* Never the function tracer on more than this one function. */
	long filtered = tfs_count("set_ftrace_filter", "");
	phase_add(" filter_lines=%ld", filtered);
	if (!traced_name || filtered != 1) {
		tfs_write("set_ftrace_filter", "", 1);
		phase_add(" error=no-single-function-filter");
		return 0;
	}
	int ok = tfs_step("tracer_on", "current_tracer", "function", 1);
	/* The sites ftrace now calls out of: this function's only. */
	long enabled = tfs_count("enabled_functions", "");
	phase_add(" enabled_functions=%ld", enabled);
	ok &= enabled == 1;
	for (int i = 0; i < 10; i++, calls++)
		syscall(SYS_getppid);
	/* Before the tracer goes: switching tracers resets the buffer. The trace may name the
	 * function by its alias at the same address (__do_sys_getppid, as ftrace's own messages
	 * do): match both. */
	long fn = tfs_count("trace", "sys_getppid <-");
	ok &= tfs_step("tracer_off", "current_tracer", "nop", 1);
	ok &= tfs_step("filter_clear", "set_ftrace_filter", "", 1);
	phase_add(" traced=%ld", fn);
	ok &= fn >= 10;
	ok &= tfs_step("kprobe_add", "kprobe_events", "p:xpsafety/getppid __x64_sys_getppid\n", 1);
	ok &= tfs_step("kprobe_on", "events/xpsafety/getppid/enable", "1", 0);
	for (int i = 0; i < 10; i++, calls++)
		syscall(SYS_getppid);
	ok &= tfs_step("kprobe_off", "events/xpsafety/getppid/enable", "0", 0);
	char path[256], line[256], name[128];
	unsigned long hits = 0, missed = 0, kp = 0;
	snprintf(path, sizeof path, "%s/kprobe_profile", tracefs);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "%127s %lu %lu", name, &hits, &missed) == 3 && !strcmp(name, "getppid"))
			kp = hits;
	if (f)
		fclose(f);
	ok &= tfs_step("kprobe_del", "kprobe_events", "", 1);
	phase_add(" kprobe_hits=%lu getppid=%ld", kp, calls);
	ok &= kp >= 10;
	ok &= tfs_step("trace_clear", "trace", "", 1);
	return ok;
}

static void on_sigtrap(int sig)
{
	(void)sig;
	_exit(42);
}

static int phase_activity(void)
{
	/* The paths the guest module's int3 hook shares with everything else: RCU read sides,
	 * notifier chains, page-table lookups; reached by forks, execs, opens and int3s. */
	int ok = 1, execs = 0, opens = 0;
	for (int i = 0; i < 20; i++)
		syscall(SYS_getppid);
	for (int i = 0; i < 5; i++) {
		char got[64];
		int fd = open(kTargetPath, O_RDONLY | O_CLOEXEC);
		if (fd >= 0 && read(fd, got, sizeof got) == (ssize_t)(sizeof content - 1))
			opens++;
		if (fd >= 0)
			close(fd);
	}
	for (int i = 0; i < 3; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			execl("/bin/true", "true", (char *)NULL);
			_exit(127);
		}
		int st;
		if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			execs++;
	}
	/* User-mode int3s: each one goes through the kernel's int3 handling (do_int3 ->
	 * notify_die -> the die notifier chain, the guest module's hook among them) before the
	 * SIGTRAP; Dom0 counts notify_die at least this often. The child handles its SIGTRAP: an
	 * unhandled one makes the kernel log a "traps:" line, which the guest's verdict counts as
	 * a crashed process. */
	int traps = 0;
	for (int i = 0; i < 3; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			struct sigaction sa;
			memset(&sa, 0, sizeof sa);
			sa.sa_handler = on_sigtrap;
			sigaction(SIGTRAP, &sa, NULL);
			__asm__ volatile("int3");
			_exit(0);
		}
		int st;
		if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 42)
			traps++;
	}
	phase_add(" opens=%d execs=%d sigtraps=%d", opens, execs, traps);
	ok &= opens == 5 && execs == 3 && traps == 3;
	return ok;
}

/* ---- sweep: one round of the real-kernel sweep's workload (issue 12) ----------------------
 *
 * Dom0 probes every instruction the library accepts in a few hundred kernel functions, batch
 * by batch, and runs one round per batch. The counted calls are made by this child alone and
 * by nothing else in the guest (the churn execs busybox applets, never a shell: ash calls
 * getppid at start-up), so Dom0's probes on their entries must count exactly these numbers.
 */
enum { SW_GETPPID = 20, SW_GETSID = 10, SW_EXECS = 6, SW_TCP = 2, SW_BYTES = 16 * 1024 };

/* 127.0.0.1 needs lo up; the initramfs's init does not bring it up. 1 when it is up. */
static int sweep_lo_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return 0;
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
	int ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
	if (ok && !(ifr.ifr_flags & IFF_UP)) {
		ifr.ifr_flags |= IFF_UP;
		ok = ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
	}
	close(s);
	return ok;
}

/* fork + exec of a busybox applet; 1 when it exited 0. */
static int sweep_exec(const char *path, char *const argv[])
{
	pid_t pid = fork();
	if (pid == 0) {
		int nul = open("/dev/null", O_WRONLY);
		if (nul >= 0) {
			dup2(nul, 1);
			dup2(nul, 2);
		}
		char *envp[] = { NULL };
		execve(path, argv, envp);
		_exit(127);
	}
	int st;
	return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Write SW_BYTES, fsync, read back, compare, rename, unlink; *fsyncs counts the fsync calls. */
static int sweep_file(const char *dir, int k, long *fsyncs)
{
	static char out[SW_BYTES], in[SW_BYTES];
	char a[128], b[128];
	snprintf(a, sizeof a, "%s/xpe2e-sweep-%d", dir, k);
	snprintf(b, sizeof b, "%s/xpe2e-sweep-%d.renamed", dir, k);
	for (size_t i = 0; i < sizeof out; i++)
		out[i] = (char)(i * 7 + (size_t)k);
	int fd = open(a, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return 0;
	int ok = !write_all(fd, out, sizeof out);
	ok &= syscall(SYS_fsync, fd) == 0;
	(*fsyncs)++;
	ok &= lseek(fd, 0, SEEK_SET) == 0 && !read_all(fd, in, sizeof in) && !memcmp(in, out, sizeof in);
	struct stat st;
	ok &= fstat(fd, &st) == 0 && st.st_size == (off_t)sizeof out;
	close(fd);
	ok &= rename(a, b) == 0 && stat(b, &st) == 0 && unlink(b) == 0 && access(b, F_OK) != 0;
	return ok;
}

/* TCP over 127.0.0.1: one listening socket (one listen call), `conns` connections from a child
 * that sends SW_BYTES each and expects them echoed; then one UDP datagram to itself. */
static int sweep_net(long *listens, int *tcp_ok, int *udp_ok)
{
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa;
	socklen_t sl = sizeof sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa))
		return 0;
	int lr = (int)syscall(SYS_listen, ls, 4);
	(*listens)++;
	if (lr || getsockname(ls, (struct sockaddr *)&sa, &sl)) {
		close(ls);
		return 0;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		static char out[SW_BYTES], in[SW_BYTES];
		int good = 0;
		for (int c = 0; c < SW_TCP; c++) {
			for (size_t i = 0; i < sizeof out; i++)
				out[i] = (char)(i * 13 + (size_t)c);
			int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa))
				_exit(10 + c);
			/* Ping-pong in 4 KiB pieces: neither side ever waits on a full buffer. */
			for (size_t off = 0; off < sizeof out; off += 4096)
				if (write_all(s, out + off, 4096) || read_all(s, in + off, 4096))
					_exit(20 + c);
			if (shutdown(s, SHUT_WR))
				_exit(25 + c);
			char extra;
			if (read(s, &extra, 1) != 0)
				_exit(30 + c);
			close(s);
			good += !memcmp(in, out, sizeof in);
		}
		_exit(good == SW_TCP ? 0 : 40);
	}
	for (int c = 0; pid > 0 && c < SW_TCP; c++) {
		int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
		if (s < 0)
			break;
		char buf[4096];
		ssize_t n;
		while ((n = read(s, buf, sizeof buf)) > 0)
			if (write_all(s, buf, (size_t)n))
				break;
		close(s);
	}
	close(ls);
	int st;
	*tcp_ok = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!*tcp_ok)
		phase_add(" tcp_status=%#x", st);

	int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sl = sizeof sa;
	char msg[] = "xpe2e-sweep-udp", got[64];
	*udp_ok = u >= 0 && !bind(u, (struct sockaddr *)&sa, sizeof sa) && !getsockname(u, (struct sockaddr *)&sa, &sl) &&
		  sendto(u, msg, sizeof msg, 0, (struct sockaddr *)&sa, sizeof sa) == (ssize_t)sizeof msg &&
		  recv(u, got, sizeof got, 0) == (ssize_t)sizeof msg && !memcmp(got, msg, sizeof msg);
	if (u >= 0)
		close(u);
	return 1;
}

/* The function tracer on a few functions of the fs and syscall paths, and two tracepoints
 * (static keys and static calls flip under text_mutex while Dom0's probes are armed). The
 * filter is checked before the tracer goes on: an empty one would patch every function of
 * the kernel (minutes under TCG; docs/e2e.md "The ftrace filter"). */
static int sweep_tracing_on(long *filter_lines)
{
	static const char *const fns[] = { "vfs_read", "vfs_write", "do_sys_openat2", "ksys_read", "ksys_write" };
	int ok = 1, named = 0;
	for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
		char line[64];
		snprintf(line, sizeof line, "%s\n", fns[k]);
		named += tfs_write("set_ftrace_filter", line, k == 0) == 0;
	}
	*filter_lines = tfs_count("set_ftrace_filter", "");
	if (named == 0 || *filter_lines < 1 || *filter_lines > 5) {
		tfs_write("set_ftrace_filter", "", 1);
		phase_add(" error=ftrace-filter(%d named, %ld lines)", named, *filter_lines);
		return 0;
	}
	ok &= tfs_write("current_tracer", "function", 1) == 0;
	ok &= tfs_write("events/sched/sched_switch/enable", "1", 0) == 0;
	ok &= tfs_write("events/sched/sched_process_fork/enable", "1", 0) == 0;
	return ok;
}

/* 1 when the trace holds a line with needle: read only up to the first one (the whole buffer,
 * sched_switch events included, takes long to format under TCG). */
static int tfs_has(const char *file, const char *needle)
{
	char path[256], line[512];
	snprintf(path, sizeof path, "%s/%s", tracefs, file);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	int found = 0;
	while (!found && fgets(line, sizeof line, f))
		found = line[0] != '#' && strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

static int sweep_tracing_off(long *traced)
{
	printf("XPE2E-SWEEP-ROUND: reading the trace\n");
	*traced = tfs_has("trace", "vfs_");
	printf("XPE2E-SWEEP-ROUND: trace read (%ld), tracer off\n", *traced);
	int ok = tfs_write("current_tracer", "nop", 1) == 0;
	ok &= tfs_write("set_ftrace_filter", "", 1) == 0;
	printf("XPE2E-SWEEP-ROUND: tracer off=%d, events off\n", ok);
	ok &= tfs_write("events/sched/sched_switch/enable", "0", 0) == 0;
	ok &= tfs_write("events/sched/sched_process_fork/enable", "0", 0) == 0;
	ok &= tfs_write("trace", "", 1) == 0;
	return ok;
}

static int phase_sweep(void)
{
	long getppids = 0, getsids = 0, fsyncs = 0, listens = 0, filter = 0, traced = 0;
	int execs = 0, files = 0, tcp_ok = 0, udp_ok = 0;
	double t0 = now();
	int lo = sweep_lo_up();
	for (int i = 0; i < SW_GETPPID; i++, getppids++)
		syscall(SYS_getppid);
	for (int i = 0; i < SW_GETSID; i++, getsids++)
		syscall(SYS_getsid, 0);
	printf("XPE2E-SWEEP-ROUND: counted calls done, lo=%d\n", lo);
	int tr_on = sweep_tracing_on(&filter);
	printf("XPE2E-SWEEP-ROUND: tracing on=%d (filter %ld)\n", tr_on, filter);
	static char *const a_true[] = { (char *)"true", NULL };
	static char *const a_ls[] = { (char *)"ls", (char *)"-l", (char *)"/", NULL };
	static char *const a_md5[] = { (char *)"md5sum", (char *)"/init", NULL };
	static char *const a_cat[] = { (char *)"cat", (char *)"/proc/meminfo", NULL };
	static char *const *const progs[] = { a_true, a_ls, a_md5, a_cat, a_true, a_ls };
	for (int i = 0; i < SW_EXECS; i++) {
		char path[64];
		snprintf(path, sizeof path, "/bin/%s", progs[i][0]);
		execs += sweep_exec(path, progs[i]);
	}
	printf("XPE2E-SWEEP-ROUND: execs %d\n", execs);
	mkdir("/xpe2e-sweep", 0755);
	for (int k = 0; k < 2; k++) {
		files += sweep_file("/tmp", k, &fsyncs);	   /* tmpfs */
		files += sweep_file("/xpe2e-sweep", k, &fsyncs); /* the initramfs root (rootfs) */
	}
	printf("XPE2E-SWEEP-ROUND: files %d\n", files);
	int tr_off = sweep_tracing_off(&traced);
	printf("XPE2E-SWEEP-ROUND: tracing off=%d (a traced vfs_ call: %ld)\n", tr_off, traced);
	int net = lo && sweep_net(&listens, &tcp_ok, &udp_ok);
	printf("XPE2E-SWEEP-ROUND: net tcp=%d udp=%d\n", tcp_ok, udp_ok);
	phase_add(" getppid=%ld getsid=%ld fsync=%ld listen=%ld execs=%d files=%d lo=%d tcp=%d udp=%d tracing_on=%d "
		  "tracing_off=%d filter_lines=%ld traced=%ld seconds=%.1f",
		  getppids, getsids, fsyncs, listens, execs, files, lo, tcp_ok, udp_ok, tr_on, tr_off, filter, traced,
		  now() - t0);
	return lo && net && tcp_ok && udp_ok && execs == SW_EXECS && files == 4 && tr_on && tr_off && traced >= 1;
}

/* slotunload: a pread() whose user copy faults on a userfaultfd page and sleeps until the
 * phase resolves the fault; Dom0 probes every instruction of the user copies the exception
 * table covers, so the copy that faults runs in one of the module's fixup slots. */
struct slot_reader {
	int fd;
	char *buf;
	size_t len;
	ssize_t got;
	int err;
};

static void *slot_reader_run(void *arg)
{
	struct slot_reader *r = arg;
	r->got = pread(r->fd, r->buf, r->len, 0);
	r->err = errno;
	return NULL;
}

/* Writes v to a sysfs file: 0, or the errno of the open or the write. */
static int sysfs_put(const char *path, const char *v)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	ssize_t n = write(fd, v, strlen(v));
	int e = n < 0 ? errno : 0;
	close(fd);
	return e;
}

static int phase_slotunload(void)
{
	static const char file[] = "/tmp/xpe2e-slot", detach[] = "/sys/module/xenprobes/parameters/detach";
	long pg = sysconf(_SC_PAGESIZE);
	char *want = malloc((size_t)pg);
	memset(want, 's', (size_t)pg);
	int fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write_all(fd, want, (size_t)pg)) {
		phase_add(" setup=file");
		return 0;
	}
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	struct uffdio_api api = { .api = UFFD_API };
	char *buf = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdio_register reg = { .range = { (unsigned long)buf, (unsigned long)pg },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) || buf == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		phase_add(" setup=userfaultfd-%s", strerror(errno));
		return 0;
	}
	/* A process that keeps hitting the getppid probe (OEA copies) through both detaches. */
	pid_t spin = fork();
	if (spin == 0)
		for (;;)
			syscall(SYS_getppid);
	struct slot_reader rd = { fd, buf, (size_t)pg, -2, 0 };
	pthread_t th;
	if (spin < 0 || pthread_create(&th, NULL, slot_reader_run, &rd)) {
		if (spin > 0)
			kill(spin, SIGKILL);
		phase_add(" setup=fork-or-thread");
		return 0;
	}
	/* The reader's copy faulted: it sleeps in the fault until the page is supplied. */
	struct pollfd pf = { uffd, POLLIN, 0 };
	struct uffd_msg msg;
	int faulted = poll(&pf, 1, 20000) == 1 && read(uffd, &msg, sizeof msg) == (ssize_t)sizeof msg &&
		      msg.event == UFFD_EVENT_PAGEFAULT && msg.arg.pagefault.address - (unsigned long)buf < (unsigned long)pg;
	printf("XPE2E-SAFETY: slotunload: reader asleep in its fault: %d\n", faulted);
	int e1 = faulted ? sysfs_put(detach, "1") : -1;
	printf("XPE2E-SAFETY: slotunload: first detach: %s\n", e1 > 0 ? strerror(e1) : e1 ? "not tried" : "ok");
	long rm1 = syscall(SYS_delete_module, "xenprobes", O_NONBLOCK);
	int erm1 = errno;
	printf("XPE2E-SAFETY: slotunload: rmmod while the reader sleeps: %s\n", rm1 ? strerror(erm1) : "unloaded");
	/* Supply the page: the reader returns into the slot, finishes its copy, leaves. */
	struct uffdio_zeropage zp = { .range = { (unsigned long)buf, (unsigned long)pg }, .mode = 0 };
	int woke = faulted && !ioctl(uffd, UFFDIO_ZEROPAGE, &zp);
	pthread_join(th, NULL);
	int read_ok = rd.got == pg && !memcmp(buf, want, (size_t)pg);
	printf("XPE2E-SAFETY: slotunload: read %zd bytes (%s)\n", rd.got, read_ok ? "the file's" : "wrong");
	int e2 = sysfs_put(detach, "1");
	long rm2 = syscall(SYS_delete_module, "xenprobes", O_NONBLOCK);
	int erm2 = errno;
	printf("XPE2E-SAFETY: slotunload: second detach: %s, rmmod: %s\n", e2 ? strerror(e2) : "ok",
	       rm2 ? strerror(erm2) : "unloaded");
	kill(spin, SIGKILL);
	waitpid(spin, NULL, 0);
	close(fd);
	close(uffd);
	phase_add(" faulted=%d first_detach=%s held_rmmod=%s woke=%d read=%zd read_ok=%d second_detach=%s rmmod=%s",
		  faulted, e1 > 0 ? (e1 == EBUSY ? "EBUSY" : strerror(e1)) : e1 ? "none" : "ok",
		  rm1 ? (erm1 == EWOULDBLOCK ? "EWOULDBLOCK" : strerror(erm1)) : "unloaded", woke, rd.got, read_ok,
		  e2 ? strerror(e2) : "ok", rm2 ? strerror(erm2) : "unloaded");
	free(want);
	return faulted && e1 == EBUSY && rm1 && woke && read_ok && !e2 && !rm2;
}

/* Runs one phase in a child; its one-line result in out. A child killed by an oops, or stuck
 * for <limit> s (a BUG() with a mutex held), is reported as such. */
static int safety_phase(const char *phase, double limit, char *out, size_t outsz)
{
	int (*fn)(void) = !strcmp(phase, "extable")	? phase_extable
			  : !strcmp(phase, "extable-all") ? phase_extable_all
			  : !strcmp(phase, "statickey") ? phase_statickey
			  : !strcmp(phase, "ftrace")	? phase_ftrace
			  : !strcmp(phase, "activity")	? phase_activity
			  : !strcmp(phase, "sweep")	? phase_sweep
			  : !strcmp(phase, "slotunload") ? phase_slotunload
							: NULL;
	if (!fn) {
		snprintf(out, outsz, "phase=%s ok=0 error=unknown-phase", phase);
		return 0;
	}
	int p[2];
	if (pipe(p)) {
		snprintf(out, outsz, "phase=%s ok=0 error=pipe", phase);
		return 0;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		phase_out[0] = 0;
		int ok = fn();
		char line[1200];
		int n = snprintf(line, sizeof line, "ok=%d%s", ok, phase_out);
		write_all(p[1], line, (size_t)n);
		_exit(0);
	}
	close(p[1]);
	char got[1200] = "";
	size_t have = 0;
	int status = -1, done = 0;
	/* Until EOF (the child exited or died) or the limit: a child stuck in the kernel keeps
	 * the pipe open, hence poll. */
	for (double end = now() + limit; now() < end && have < sizeof got - 1;) {
		struct pollfd pf = { p[0], POLLIN, 0 };
		int left = (int)((end - now()) * 1000) + 1;
		if (poll(&pf, 1, left > 1000 ? 1000 : left) <= 0)
			continue;
		ssize_t r = read(p[0], got + have, sizeof got - 1 - have);
		if (r > 0)
			have += (size_t)r;
		else if (r == 0 || errno != EINTR)
			break;
	}
	got[have] = 0;
	close(p[0]);
	for (double end = now() + 5; now() < end; usleep(50 * 1000))
		if (waitpid(pid, &status, WNOHANG) == pid) {
			done = 1;
			break;
		}
	if (!done) {
		/* Stuck in the kernel (D state); kill what can be killed and go on. */
		kill(pid, SIGKILL);
		snprintf(out, outsz, "phase=%s ok=0 child=stuck-after-%.0fs %s", phase, limit, got);
	} else if (WIFSIGNALED(status)) {
		snprintf(out, outsz, "phase=%s ok=0 child=killed-by-signal-%d %s", phase, WTERMSIG(status), got);
	} else if (!have) {
		snprintf(out, outsz, "phase=%s ok=0 child=exit-%d-no-result", phase, WEXITSTATUS(status));
	} else {
		snprintf(out, outsz, "phase=%s %s", phase, got);
	}
	return strstr(out, " ok=1") != NULL;
}

static int safety(double seconds)
{
	char key[64], v[256], out[1400];
	int phases = 0, good = 0, fd = open(kTargetPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write_all(fd, content, sizeof content - 1) || close(fd) || xs_open() < 0) {
		printf("XPE2E-SAFETY: setup failed: %s\n", strerror(errno));
		xs_write("data/xpe2e/safety/ready", "setup-failed");
		return 1;
	}
	xs_write("data/xpe2e/safety/ready", "1");
	printf("XPE2E-WORKLOAD: waiting for data/xpe2e/safety/go-1 (at most %.0f s)\n", seconds);
	for (int i = 1;; i++) {
		snprintf(key, sizeof key, "data/xpe2e/safety/go-%d", i);
		int got = 0, ended = 0;
		for (double end = now() + seconds; !got && !ended && now() < end; usleep(100 * 1000)) {
			if (xs_read(key, v, sizeof v) == 0)
				got = 1;
			else if (xs_read("data/xpe2e/safety/end", out, sizeof out) == 0)
				ended = 1;
		}
		if (!got)
			break;
		char phase[64];
		double limit = 90;
		if (sscanf(v, "%63s %lf", phase, &limit) < 1)
			snprintf(phase, sizeof phase, "?");
		printf("XPE2E-SAFETY: phase %d: %s\n", i, phase);
		phases++;
		good += safety_phase(phase, limit, out, sizeof out);
		printf("XPE2E-SAFETY: result %d: %s\n", i, out);
		snprintf(key, sizeof key, "data/xpe2e/safety/result-%d", i);
		if (xs_write(key, out))
			printf("XPE2E-SAFETY: cannot write %s\n", key);
	}
	snprintf(out, sizeof out, "safety phases=%d phases_ok=%d ok=%d", phases, good, phases > 0 && good == phases);
	printf("XPE2E-WORKLOAD: done %s\n", out);
	xs_write("data/xpe2e/done", out);
	return phases > 0 && good == phases ? 0 : 1;
}

int main(int argc, char **argv)
{
	char v[4096];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "wait"))
		return wait_key(argv[2], atof(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "put"))
		return xs_write(argv[2], argv[3]) ? 1 : 0;
	if (argc == 3 && !strcmp(argv[1], "get")) {
		if (xs_read(argv[2], v, sizeof v))
			return 1;
		puts(v);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "first")) {
		double end = now() + atof(argv[4]);
		while (now() < end) {
			for (int k = 2; k <= 3; k++)
				if (xs_read(argv[k], v, sizeof v) == 0) {
					puts(argv[k]);
					return 0;
				}
			usleep(100 * 1000);
		}
		return 1;
	}
	if (argc == 3 && !strcmp(argv[1], "bench"))
		return bench(atof(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "safety"))
		return safety(atof(argv[2]));
	if (argc == 8 && !strcmp(argv[1], "run"))
		return run(argv[2], atof(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]), argv[7]);
	fprintf(stderr, "usage: xpe2e-workload wait|put|get|first|run|bench|safety ... (see the source)\n");
	return 2;
}
