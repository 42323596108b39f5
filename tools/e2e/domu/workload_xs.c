/* xpe2e-workload: xenstore through /dev/xen/xenbus, whole reads and writes, the clock. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "workload.h"

enum { XS_READ = 2, XS_WRITE = 11, XS_ERROR = 16 };

struct xs_hdr {
	uint32_t type, req_id, tx_id, len;
};

static int xs_fd = -1;
static uint32_t xs_req;

int xs_open(void)
{
	if (xs_fd < 0)
		xs_fd = open("/dev/xen/xenbus", O_RDWR | O_CLOEXEC);
	if (xs_fd < 0)
		fprintf(stderr, "xpe2e-workload: open /dev/xen/xenbus: %s\n", strerror(errno));
	return xs_fd;
}

int write_all(int fd, const void *p, size_t n)
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

int read_all(int fd, void *p, size_t n)
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

int xs_read(const char *key, char *out, size_t outsz)
{
	return xs_request(XS_READ, key, strlen(key) + 1, NULL, 0, out, outsz);
}

int xs_write(const char *key, const char *val)
{
	char out[64];
	return xs_request(XS_WRITE, key, strlen(key) + 1, val, strlen(val), out, sizeof out);
}

double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int wait_key(const char *key, double seconds)
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
