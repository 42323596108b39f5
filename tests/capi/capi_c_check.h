/* The checks the C scenarios (capi_c_*.c) share. Each scenario function takes `char *msg,
 * size_t n` and returns 0, or the failing line with a message in msg. */
#ifndef XENPROBES_TESTS_CAPI_C_CHECK_H
#define XENPROBES_TESTS_CAPI_C_CHECK_H
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "xenprobes/xenprobes.h"

/* "file.c:LINE: " and the formatted message, into msg (n bytes, always NUL-terminated). */
static inline void capi_c_report(char *msg, size_t n, const char *file, int line, const char *fmt, ...) {
  const char *base = strrchr(file, '/');
  va_list ap;
  int k = snprintf(msg, n, "%s:%d: ", base ? base + 1 : file, line);
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < n) vsnprintf(msg + k, n - (size_t)k, fmt, ap);
  va_end(ap);
}

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      capi_c_report(msg, n, __FILE__, __LINE__, __VA_ARGS__); \
      return __LINE__;                                        \
    }                                                         \
  } while (0)

/* A call that must fail with errno `err` and a xenprobes_last_error() holding `needle`. */
#define EXPECT_ERR(call, err, needle)                                                                           \
  do {                                                                                                          \
    errno = 0;                                                                                                  \
    CHECK((call) == -1, "%s succeeded", #call);                                                                 \
    CHECK(errno == (err), "%s: errno %d (%s), wanted %s; last error '%s'", #call, errno, strerror(errno), #err, \
          xenprobes_last_error());                                                                              \
    CHECK(strstr(xenprobes_last_error(), needle) != NULL, "%s: last error '%s' does not mention '%s'", #call,   \
          xenprobes_last_error(), needle);                                                                      \
  } while (0)

#endif
