/* xpe2e-workload safety: the phases extable, extable-all, statickey, ftrace and activity. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "workload.h"

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

int phase_extable(void)
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
int phase_extable_all(void)
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

int phase_statickey(void)
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

int phase_ftrace(void)
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

int phase_activity(void)
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
