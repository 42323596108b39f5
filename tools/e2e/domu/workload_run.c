/* xpe2e-workload run: exact numbers of getppid, openat and unlinkat calls (see workload.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "workload.h"

int run(const char *go, double seconds, long n_getppid, long n_openat, long n_unlink, const char *path)
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
