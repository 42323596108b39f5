/* Scenarios of the C API written in C (capi_c_part.c, compiled as C11), driven by capi_test.cpp.
 * Each returns 0, or the failing line with a message in msg. */
#ifndef XENPROBES_TESTS_CAPI_C_PART_H
#define XENPROBES_TESTS_CAPI_C_PART_H
#include <stddef.h>
#include <stdint.h>

#include "xenprobes/xenprobes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Figure 2: sys_open by symbol, paths read through RDI, stop from the handler after `target`
 * hits, counters, unregister. */
int capi_c_fig2(int target, int exact, char *msg, size_t n);
/* Every documented error: -1/handle error, errno, a useful xenprobes_last_error(). */
int capi_c_errors(char *msg, size_t n);
/* sys_getppid returns 42 without running: the pre-handler sets rip to the return address read
 * from the stack, rsp += 8, rax = 42; a probe at that return site sees rax == 42. Leaves both
 * probes registered (handles in *redirect and *site) for the caller to inspect the guest. */
int capi_c_redirect_getppid(xenprobes_handle_t *redirect, xenprobes_handle_t *site, char *msg, size_t n);
/* Runs xenprobes_loop() until the return-site probe of capi_c_redirect_getppid has `more` more
 * hits, all with rax == 42. */
int capi_c_redirect_more(int more, char *msg, size_t n);
/* A return probe with per-call data on demo_recurse: the entry saves the argument and the return
 * address (declining the innermost call), the return handler checks them; stops after `target`
 * returns; counters (version 2 and 1), unregister rules. */
int capi_c_retprobe(int target, char *msg, size_t n);
/* capi_c_probes.c. A jump probe on sys_getppid: info (jump, detour, moved past the ftrace
 * site), hits through the trap byte until the jump is written, then `target` more; the
 * guest's own call counter at `getppid_counter` (vCPU 0's) advances by one from hit to hit. */
int capi_c_jump(unsigned long getppid_counter, int target, char *msg, size_t n);
/* JUMP with a post-handler refused with EOPNOTSUPP and a message holding `channel_word`;
 * FASTEST falls back to a trap saying the same in not_jump_because; info's errors. */
int capi_c_jump_refusals(const char *channel_word, char *msg, size_t n);
/* An async probe on sys_open capturing the path, the guest's counter at `open_counter`
 * (rip-relative) and an unmapped address, until `target` records: every record's fields,
 * seq consecutive, every call the counter skips a counted drop, the fault, and stats and ring
 * statistics agreeing exactly with the records handled. */
int capi_c_async(unsigned long open_counter, int target, char *msg, size_t n);
/* Every refusal of register_xenprobe_async() and xenprobes_ring_stats(), errno and message. */
int capi_c_async_refusals(char *msg, size_t n);
/* An async probe on sys_getppid whose C handler unregisters it at its `nth` record (and once more:
 * EINVAL), with an async probe on sys_open (its handle in *other, left registered) that stops
 * the loop `more` of its records later, twice, then a read of the rings: exactly nth handler
 * calls, the handle gone. */
int capi_c_async_unregister_self(int nth, int more, xenprobes_handle_t *other, char *msg, size_t n);
/* An async probe on sys_getppid whose C handler calls xenprobes_close(): at its `nth` record in
 * xenprobes_loop() (in_loop), or at the first record a xenprobes_ring_stats() outside the loop
 * reads. The call returns, the handle is gone with the session, no handler call follows, and
 * the next call opens a new session. */
int capi_c_async_close_in_handler(int nth, int in_loop, char *msg, size_t n);
/* capi_c_capture.c. An async probe on sys_open in `dom` (a domain whose image is also mapped as
 * user memory, so rdi + user_offset is a user address holding the same path) with string
 * captures XENPROBE_CAPTURE_BY_ADDRESS at rdi and at rdi + user_offset, a kernel read of the
 * user address and a user read of rdi, for `target` records: both by-address captures read the
 * path, the other two fault. First the refusals of bad flags. */
int capi_c_async_by_address(domid_t dom, int32_t user_offset, int target, char *msg, size_t n);
/* On a domain whose module does not publish XENPROBE_CAP_AUTO in rings/cap-flags: a BY_ADDRESS
 * capture refused with EOPNOTSUPP saying why, the same capture without it accepted. */
int capi_c_async_by_address_refused(domid_t dom, char *msg, size_t n);
/* sizeof/offsetof of struct cpu_user_regs as C sees it (with or without Xen's header). */
size_t capi_c_regs_size(void);
size_t capi_c_regs_rip_offset(void);
size_t capi_c_xen_regs_size(void);
size_t capi_c_xen_regs_rip_offset(void);

#ifdef __cplusplus
}
#endif
#endif
