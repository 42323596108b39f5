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
 *   xpe2e-workload loopctl <device> <n>
 *       exactly <n> LOOP_GET_STATUS64 ioctls on an unbound loop device; prints
 *       "calls=<n> enxio=<m> ok=<0|1>" (stock_pv_jump_module)
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
 *
 * The sources, by subcommand: workload.h says which file holds what.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "workload.h"

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
	if (argc == 4 && !strcmp(argv[1], "loopctl"))
		return loopctl(argv[2], atol(argv[3]));
	if (argc == 8 && !strcmp(argv[1], "run"))
		return run(argv[2], atof(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]), argv[7]);
	fprintf(stderr, "usage: xpe2e-workload wait|put|get|first|run|bench|safety|loopctl ... (see the source)\n");
	return 2;
}
