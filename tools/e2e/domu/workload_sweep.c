#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
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
#include <unistd.h>
#include "workload.h"

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

int phase_sweep(void)
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

int phase_slotunload(void)
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
