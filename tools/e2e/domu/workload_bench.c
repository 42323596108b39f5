#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "workload.h"

/* ---- bench: the paper's Table 1, lat_syscall style --------------------------------------- */

enum { B_NULL, B_READ, B_WRITE, B_OPEN, B_KINDS };
static const char *const bench_name[B_KINDS] = { "null", "read", "write", "open" };
/* The kernel functions the in-guest kprobes (and Dom0's probes) sit on, per kind. */
static const char *const bench_fn[B_KINDS] = { "__x64_sys_getppid", "__x64_sys_read", "__x64_sys_write",
					       "__x64_sys_openat" };
static const char bench_file[] = "/tmp/xpe2e-bench";
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

int bench(double seconds)
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
