#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "workload.h"

/* ---- safety: the probe-safety phases (issue 12) ---------------------------------------- */

/*
 * Each phase runs in a child: a kernel oops in a syscall kills only the calling task, and a
 * BUG() taken with a mutex held leaves later writes of the same child hanging; the parent
 * stays, reports what happened and can serve the next phase. Results travel through a pipe:
 * only the parent talks to xenstore (one request at a time on the xenbus device).
 */
static char phase_out[1024];

void phase_add(const char *fmt, ...)
{
	size_t len = strlen(phase_out);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(phase_out + len, sizeof phase_out - len, fmt, ap);
	va_end(ap);
}

/* Writes s to a tracefs file; 0 or the errno. */
int tfs_write(const char *file, const char *s, int trunc)
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
long tfs_count(const char *file, const char *needle)
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
int tfs_step(const char *tag, const char *file, const char *s, int trunc)
{
	int e = tfs_write(file, s, trunc);
	phase_add(" %s=%s", tag, e ? strerror(e) : "ok");
	/* Printed as it happens: if the next step hangs (a BUG with a mutex held), the console
	 * still says how far the phase got. */
	printf("XPE2E-SAFETY: %s -> %s: %s\n", s[0] ? s : "(empty)", file, e ? strerror(e) : "ok");
	return !e;
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

int safety(double seconds)
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
