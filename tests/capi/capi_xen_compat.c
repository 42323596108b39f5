/* A program that includes Xen's public headers before xenprobes.h gets Xen's struct
 * cpu_user_regs (with its alias unions) and Xen's domid_t; both headers compile together. */
#include <stddef.h>
#include <stdint.h>
#if defined(__has_include)
#if __has_include(<xen/xen.h>)
#include <xen/xen.h>
#define CAPI_HAVE_XEN_H 1
#endif
#endif
#include "xenprobes/xenprobes.h"

#include "capi_c_part.h"

_Static_assert(sizeof(domid_t) == 2, "domid_t is Xen's uint16_t");
_Static_assert(sizeof(struct cpu_user_regs) == 200, "Xen's x86_64 frame is 200 bytes");
_Static_assert(offsetof(struct cpu_user_regs, rip) == 128, "rip where Xen has it");
_Static_assert(offsetof(struct cpu_user_regs, rsp) == 152, "rsp where Xen has it");

size_t capi_c_xen_regs_size(void) { return sizeof(struct cpu_user_regs); }
size_t capi_c_xen_regs_rip_offset(void) { return offsetof(struct cpu_user_regs, rip); }
