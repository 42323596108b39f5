/* Shared by the examples (C and C++): like every xenprobes tool, use the simulated Xen only
 * when asked (XENPROBES_BACKEND=sim) or when this machine has no Xen at all, and then say so
 * on the first line. */
#ifndef XENPROBES_EXAMPLE_BACKEND_H
#define XENPROBES_EXAMPLE_BACKEND_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void example_choose_backend(const char *prog) {
  const char *backend = getenv("XENPROBES_BACKEND");
  if (backend && *backend) {
    printf("%s: using XENPROBES_BACKEND=%s\n", prog, backend);
  } else if (access("/dev/xen/privcmd", F_OK) != 0 && access("/proc/xen/privcmd", F_OK) != 0) {
    printf("%s: no Xen here (no /dev/xen/privcmd): using the simulated Xen (XENPROBES_BACKEND=sim)\n", prog);
    setenv("XENPROBES_BACKEND", "sim", 1);
  } else {
    printf("%s: using Xen (XENPROBES_BACKEND=xen)\n", prog);
  }
  fflush(stdout);
}

#endif
