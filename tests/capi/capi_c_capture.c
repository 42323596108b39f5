/* Async captures through the C API, from C (C11, -Wall -Wextra -pedantic): by address
 * (XENPROBE_CAPTURE_BY_ADDRESS) against the simulated Xen's module, whose no-fault reads refuse
 * a user read of a kernel address and a kernel read of a user one, as the kernel's do. The
 * domain maps its image a second time as user memory (DomainConfig::user_image_va), so a path
 * sys_open gets in rdi is also at rdi + user_offset, in the lower half, with the same bytes. */
#include "capi_c_part.h"
#include "capi_c_check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *const paths[] = {"/etc/hostname", "/etc/passwd",   "/tmp",          "/nonexistent",
                                    "/proc/version", "/tmp/demo.log", "relative/path", "/etc"};

static struct {
  int records, stop_at;
  int kernel_ok; /* by address at rdi: a known path */
  int user_ok;   /* by address at rdi + user_offset: the same path */
  int kernel_read_of_user_faults, user_read_of_kernel_faults;
  char first_kernel[64], first_user[64];
} by;

static int known(const struct xenprobe_capture_value *v) {
  size_t i;
  if (v->status != XENPROBE_CAPTURE_OK || v->length == 0 || v->data[v->length - 1] != '\0') return 0;
  for (i = 0; i < sizeof paths / sizeof paths[0]; i++)
    if (strcmp((const char *)v->data, paths[i]) == 0) return 1;
  return 0;
}

static int faulted(const struct xenprobe_capture_value *v) {
  return v->status == XENPROBE_CAPTURE_FAULT && v->length == 0 && v->data == NULL;
}

static void by_address_handler(const struct xenprobe_async_hit *hit, void *arg) {
  const struct xenprobe_capture_value *c = hit->captures;
  (void)arg;
  if (hit->ncaptures == 4) {
    if (by.records == 0) {
      snprintf(by.first_kernel, sizeof by.first_kernel, "%s", c[0].data ? (const char *)c[0].data : "(none)");
      snprintf(by.first_user, sizeof by.first_user, "%s", c[1].data ? (const char *)c[1].data : "(none)");
    }
    by.kernel_ok += known(&c[0]);
    by.user_ok += known(&c[1]) && c[1].length == c[0].length && memcmp(c[0].data, c[1].data, c[0].length) == 0;
    by.kernel_read_of_user_faults += faulted(&c[2]);
    by.user_read_of_kernel_faults += faulted(&c[3]);
  }
  if (++by.records == by.stop_at) xenprobes_stop();
}

static void string_at(struct xenprobe_capture *c, int32_t offset, uint8_t user, uint8_t flags) {
  memset(c, 0, sizeof *c);
  c->kind = XENPROBE_CAPTURE_STRING;
  c->base = XENPROBE_REG_RDI;
  c->offset = offset;
  c->user = user;
  c->flags = flags;
  c->max = 64;
}

int capi_c_async_by_address(domid_t dom, int32_t user_offset, int target, char *msg, size_t n) {
  struct xenprobe_capture caps[4];
  xenprobes_handle_t h;
  int dummy = 0;

  memset(&by, 0, sizeof by);
  by.stop_at = target;
  /* Refused before anything reaches the guest: a flag bit nobody knows, and `user` beside
   * BY_ADDRESS (the address decides). */
  string_at(&caps[0], 0, 0, 0x02);
  EXPECT_ERR(register_xenprobe_async(dom, "sys_open", 0, caps, 1, by_address_handler, &dummy), EINVAL,
             "capture 0: flags 2");
  string_at(&caps[0], 0, 1, XENPROBE_CAPTURE_BY_ADDRESS);
  EXPECT_ERR(register_xenprobe_async(dom, "sys_open", 0, caps, 1, by_address_handler, &dummy), EINVAL,
             "the address decides");

  string_at(&caps[0], 0, 0, XENPROBE_CAPTURE_BY_ADDRESS);           /* kernel address: kernel read */
  string_at(&caps[1], user_offset, 0, XENPROBE_CAPTURE_BY_ADDRESS); /* user address: user read */
  string_at(&caps[2], user_offset, 0, 0);                           /* a kernel read of it faults */
  string_at(&caps[3], 0, 1, 0);                                     /* a user read of rdi faults */
  h = register_xenprobe_async(dom, "sys_open", 0, caps, 4, by_address_handler, NULL);
  CHECK(h > 0, "register_xenprobe_async: %s", xenprobes_last_error());
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(h) == 0, "unregister: %s", xenprobes_last_error());
  CHECK(by.records >= target, "%d records", by.records);
  CHECK(by.kernel_ok == by.records, "%d of %d kernel paths read by address (first '%s')", by.kernel_ok, by.records,
        by.first_kernel);
  CHECK(by.user_ok == by.records, "%d of %d user paths read by address (first '%s')", by.user_ok, by.records,
        by.first_user);
  CHECK(by.kernel_read_of_user_faults == by.records, "%d of %d kernel reads of the user address faulted",
        by.kernel_read_of_user_faults, by.records);
  CHECK(by.user_read_of_kernel_faults == by.records, "%d of %d user reads of the kernel address faulted",
        by.user_read_of_kernel_faults, by.records);
  return 0;
}

int capi_c_async_by_address_refused(domid_t dom, char *msg, size_t n) {
  struct xenprobe_capture cap;
  xenprobes_handle_t h;
  string_at(&cap, 0, 0, XENPROBE_CAPTURE_BY_ADDRESS);
  EXPECT_ERR(register_xenprobe_async(dom, "sys_open", 0, &cap, 1, by_address_handler, NULL), EOPNOTSUPP,
             "rings/cap-flags");
  CHECK(strstr(xenprobes_last_error(), "XENPROBE_CAPTURE_BY_ADDRESS") != NULL, "'%s' names no C flag",
        xenprobes_last_error());
  /* The same capture without the flag is one this module reads. */
  string_at(&cap, 0, 0, 0);
  h = register_xenprobe_async(dom, "sys_open", 0, &cap, 1, by_address_handler, NULL);
  CHECK(h > 0, "register_xenprobe_async without BY_ADDRESS: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(h) == 0, "unregister: %s", xenprobes_last_error());
  return 0;
}
