/*
 * xenprobes-fig3: the Xenprobes paper's Figure 3, in C. A return probe on sys_unlink: the entry
 * handler prints the path being removed (read from guest memory through RDI), the return
 * handler prints what the call returned (RAX). At most 8 calls are tracked at once; after 5
 * returns the program stops itself, unregisters the probe and prints its counters, with a
 * warning when calls went untracked (untracked_calls: raise maxactive).
 *
 *   xenprobes-fig3 [domid] [system-map]
 *
 * Defaults: domain 1; on the simulated Xen (used when this machine is not a Xen Dom0) the demo
 * guest's System.map is found automatically.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xenprobes/xenprobes.h"
#include "example_backend.h"

#define MAX_ACTIVE 8
#define MAX_RETURNS 5

static int entries, returns;

static void unlink_entry(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  char path[128];
  ++entries;
  if (xenprobes_read_string(h, regs->rdi, path, sizeof path) < 0 && errno != ERANGE)
    snprintf(path, sizeof path, "<%s>", xenprobes_last_error());
  printf("sys_unlink(\"%s\") entered\n", path);
}

static void unlink_return(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  (void)h;
  if (++returns > MAX_RETURNS) return; /* other vCPUs may return before the loop has stopped */
  printf("sys_unlink returned %ld to %#lx\n", (long)regs->rax, (unsigned long)regs->rip);
  if (returns == MAX_RETURNS) xenprobes_stop();
}

static int fail(const char *what) {
  fprintf(stderr, "xenprobes-fig3: %s: %s (%s)\n", what, xenprobes_last_error(), strerror(errno));
  xenprobes_close();
  return 1;
}

int main(int argc, char **argv) {
  domid_t domid = argc > 1 ? (domid_t)strtoul(argv[1], NULL, 10) : 1;
  struct xenprobe_stats st = {.version = XENPROBE_STATS_VERSION};
  xenprobes_handle_t h;

  example_choose_backend("xenprobes-fig3");

  if (argc > 2 && xenprobes_load_symbols(domid, argv[2]) < 0) return fail("cannot load the symbols");

  h = register_xenretprobe_symbol(domid, "sys_unlink", unlink_entry, unlink_return, MAX_ACTIVE);
  if (h == XENPROBES_HANDLE_ERROR) return fail("cannot put a return probe on sys_unlink");
  printf("return probe %d on sys_unlink in domain %d (maxactive %d); waiting for %d returns\n", h,
         xenprobes_domain_of(h), MAX_ACTIVE, MAX_RETURNS);

  if (xenprobes_loop() < 0) return fail("xenprobes_loop");

  if (xenprobes_stats(h, &st) < 0) return fail("xenprobes_stats");
  if (unregister_xenretprobe(h) < 0) return fail("unregister_xenretprobe");
  printf(
      "total: %d entries, %d returns (probe counters: %llu entries, %llu returns, %llu not tracked); "
      "probe removed\n",
      entries, returns, (unsigned long long)st.hits, (unsigned long long)st.returns,
      (unsigned long long)st.untracked_calls);
  if (st.untracked_calls > 0)
    fprintf(stderr,
            "xenprobes-fig3: warning: %llu calls were not tracked because %d were already in flight; "
            "raise maxactive\n",
            (unsigned long long)st.untracked_calls, MAX_ACTIVE);
  xenprobes_close();
  return returns >= MAX_RETURNS && st.returns >= MAX_RETURNS ? 0 : 1;
}
