/*
 * xpe2e-workload loopctl <device> <n>: exactly <n> LOOP_GET_STATUS64 ioctls on <device> (a
 * loop device of Debian's loop.ko, unbound), each one call of the module's lo_ioctl, which
 * answers ENXIO for a device with no file; prints "calls=<n> enxio=<m> ok=<0|1>" (ok: every
 * call answered ENXIO) on stdout. stock_pv_jump_module probes loop.ko with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "workload.h"

int loopctl(const char *dev, long n)
{
	struct loop_info64 info;
	long k, enxio = 0;
	int fd = open(dev, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		printf("calls=0 enxio=0 ok=0 open-errno=%d\n", errno);
		return 1;
	}
	for (k = 0; k < n; k++)
		if (ioctl(fd, LOOP_GET_STATUS64, &info) < 0 && errno == ENXIO)
			enxio++;
	close(fd);
	printf("calls=%ld enxio=%ld ok=%d\n", n, enxio, enxio == n);
	return enxio == n ? 0 : 1;
}
