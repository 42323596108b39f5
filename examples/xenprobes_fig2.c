/*
 * xenprobes-fig2: the Xenprobes paper's Figure 2, in C. Counts sys_open calls in a guest kernel
 * with a pre-handler that prints each call's path (read from guest memory through RDI, the first
 * argument), stops itself after 10 hits, unregisters and prints the total.
 *
 *   xenprobes-fig2 [domid] [system-map]
 *
 * Defaults: domain 1; on the simulated Xen (used when this machine is not a Xen Dom0) the demo
 * guest's System.map is found automatically.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xenprobes/xenprobes.h"
#include "example_backend.h"

#define MAX_HITS 10

static int count;

static void open_pre(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  char path[128];
  if (++count > MAX_HITS) return; /* other vCPUs may trap before the loop has stopped */
  if (xenprobes_read_string(h, regs->rdi, path, sizeof path) < 0 && errno != ERANGE)
    snprintf(path, sizeof path, "<%s>", xenprobes_last_error());
  printf("sys_open #%d: path \"%s\", flags %#lx\n", count, path, (unsigned long)regs->rsi);
  if (count == MAX_HITS) xenprobes_stop();
}

static int fail(const char *what) {
  fprintf(stderr, "xenprobes-fig2: %s: %s (%s)\n", what, xenprobes_last_error(), strerror(errno));
  xenprobes_close();
  return 1;
}

int main(int argc, char **argv) {
  domid_t domid = argc > 1 ? (domid_t)strtoul(argv[1], NULL, 10) : 1;
  struct xenprobe_stats st = {.version = XENPROBE_STATS_VERSION};
  xenprobes_handle_t h;

  example_choose_backend("xenprobes-fig2");

  if (argc > 2 && xenprobes_load_symbols(domid, argv[2]) < 0) return fail("cannot load the symbols");

  h = register_xenprobe_symbol(domid, "sys_open", open_pre, NULL);
  if (h == XENPROBES_HANDLE_ERROR) return fail("cannot probe sys_open");
  printf("probe %d on sys_open in domain %d; waiting for %d calls\n", h, xenprobes_domain_of(h), MAX_HITS);

  if (xenprobes_loop() < 0) return fail("xenprobes_loop");

  if (xenprobes_stats(h, &st) < 0) return fail("xenprobes_stats");
  if (unregister_xenprobe(h) < 0) return fail("unregister_xenprobe");
  printf("total: %d sys_open calls seen (probe counters: %llu hits, %llu unhandled); probe removed\n", count,
         (unsigned long long)st.hits, (unsigned long long)st.unhandled);
  xenprobes_close();
  return count >= MAX_HITS && st.hits >= MAX_HITS ? 0 : 1;
}
