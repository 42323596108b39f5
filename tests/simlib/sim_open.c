/*
 * xp-sim-open (tests/simlib): opens the C API's session on the backend XENPROBES_BACKEND names
 * and says, before and after, whether this process has Unicorn and libxenprobes-sim mapped (and
 * from where). A program linked with libxenprobes.so only: what every Dom0 program is.
 *
 * Exit status: 0 the session opened, 1 it did not (the library's message and errno on stderr),
 * 2 Unicorn or the simulation was mapped before anything asked for it.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "xenprobes/xenprobes.h"

/* The path of the first mapping whose file name contains `name`, or "" if none. */
static const char *mapped(const char *name, char *path, size_t size) {
  char line[4096];
  FILE *f = fopen("/proc/self/maps", "r");
  path[0] = '\0';
  if (!f) return path;
  while (fgets(line, sizeof line, f)) {
    const char *slash = strchr(line, '/');
    if (slash && strstr(slash, name)) {
      snprintf(path, size, "%s", slash);
      path[strcspn(path, "\n")] = '\0';
      break;
    }
  }
  fclose(f);
  return path;
}

static int report(const char *when) {
  char x[4096], u[4096], s[4096];
  mapped("libxenprobes.so", x, sizeof x);
  mapped("libunicorn", u, sizeof u);
  mapped("libxenprobes-sim", s, sizeof s);
  printf("%s: libxenprobes %s, unicorn %s, libxenprobes-sim %s\n", when, x, u[0] ? u : "no", s[0] ? s : "no");
  return u[0] || s[0];
}

int main(void) {
  if (report("before open")) return 2;
  int rc = xenprobes_open(NULL);
  int err = errno;
  report("after open");
  fflush(stdout);
  if (rc != 0) {
    fprintf(stderr, "xp-sim-open: xenprobes_open: %s (errno %s)\n", xenprobes_last_error(),
            err == EOPNOTSUPP ? "EOPNOTSUPP" : strerror(err));
    return 1;
  }
  xenprobes_close();
  return 0;
}
