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
 *
 * Keys are relative to the domain's home (/local/domain/<domid>/): the guest owns data/.
 * xenstore is reached through /dev/xen/xenbus (the kernel's xenbus device, no libraries),
 * speaking xenstored's wire protocol: a 16-byte header, then the payload.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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
	if (argc == 8 && !strcmp(argv[1], "run"))
		return run(argv[2], atof(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]), argv[7]);
	fprintf(stderr, "usage: xpe2e-workload wait|put|get|run ... (see the source)\n");
	return 2;
}
