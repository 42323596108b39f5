/* The C API used from C (compiled as C11 with -Wall -Wextra -pedantic): proves the header is
 * C-clean and that a C program can do what the paper's Figure 2 does. */
#include "capi_c_part.h"
#include "capi_c_check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

size_t capi_c_regs_size(void) { return sizeof(struct cpu_user_regs); }
size_t capi_c_regs_rip_offset(void) { return offsetof(struct cpu_user_regs, rip); }

/* ---- Figure 2 ---- */

static struct {
  xenprobes_handle_t handle;
  int target, hits, wrong_handle, bad_paths, loop_errno, read_string_errno;
  char first_path[64];
} fig2;

static void fig2_pre(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  char path[64];
  if (h != fig2.handle) fig2.wrong_handle++;
  /* The demo guest's paths (guest/demo.c demo_paths) are short, and one is relative. */
  if (xenprobes_read_string(h, regs->rdi, path, sizeof path) <= 0) fig2.bad_paths++;
  if (fig2.hits == 0) {
    char tiny[3];
    memcpy(fig2.first_path, path, sizeof path);
    /* A buffer too small: ERANGE, truncated and terminated. */
    if (xenprobes_read_string(h, regs->rdi, tiny, sizeof tiny) == -1 && tiny[2] == '\0' && tiny[0] == path[0])
      fig2.read_string_errno = errno;
    /* The loop cannot be entered from a handler. */
    if (xenprobes_loop() == -1) fig2.loop_errno = errno;
  }
  if (++fig2.hits == fig2.target) xenprobes_stop();
}

int capi_c_fig2(int target, int exact, char *msg, size_t n) {
  struct xenprobe_stats st;
  memset(&fig2, 0, sizeof fig2);
  fig2.target = target;
  fig2.handle = register_xenprobe_symbol(1, "sys_open", fig2_pre, NULL);
  CHECK(fig2.handle > 0, "register_xenprobe_symbol: %s", xenprobes_last_error());
  CHECK(xenprobes_domain_of(fig2.handle) == 1, "domain_of");
  CHECK(xenprobes_loop() == 0, "xenprobes_loop: %s", xenprobes_last_error());
  CHECK(exact ? fig2.hits == target : fig2.hits >= target, "%d hits, wanted %d", fig2.hits, target);
  CHECK(fig2.wrong_handle == 0, "handler got another handle");
  CHECK(fig2.bad_paths == 0, "%d paths unreadable or empty", fig2.bad_paths);
  CHECK(fig2.read_string_errno == ERANGE, "read_string into 3 bytes of '%s': errno %d", fig2.first_path,
        fig2.read_string_errno);
  CHECK(fig2.loop_errno == EBUSY, "xenprobes_loop from a handler: errno %d", fig2.loop_errno);
  st.version = XENPROBE_STATS_VERSION;
  CHECK(xenprobes_stats(fig2.handle, &st) == 0, "stats: %s", xenprobes_last_error());
  CHECK(st.hits == (uint64_t)fig2.hits, "stats.hits %llu != %d", (unsigned long long)st.hits, fig2.hits);
  CHECK(st.unhandled == 0, "unhandled %llu", (unsigned long long)st.unhandled);
  CHECK(unregister_xenprobe(fig2.handle) == 0, "unregister: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(fig2.handle) == -1 && errno == EINVAL, "second unregister");
  CHECK(xenprobes_stats(fig2.handle, &st) == -1 && errno == EINVAL, "stats after unregister");
  return 0;
}

/* ---- errors ---- */

static void nop_handler(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  (void)h;
  (void)regs;
}

int capi_c_errors(char *msg, size_t n) {
  struct xenprobe_stats st;
  char buf[8];
  xenprobes_handle_t h;

  EXPECT_ERR(register_xenprobe_symbol(1, "no_such_function", nop_handler, NULL), ENOENT, "no_such_function");
  EXPECT_ERR(register_xenprobe_symbol(1, "sys_getppid+0x6", nop_handler, NULL), EILSEQ, "boundary");
  EXPECT_ERR(register_xenprobe_symbol(1, NULL, nop_handler, NULL), EINVAL, "NULL");
  EXPECT_ERR(register_xenprobe_symbol(1, "sys_getppid+0x10000", nop_handler, NULL), ERANGE, "beyond");
  EXPECT_ERR(register_xenprobe(77, 0xffffffff81000100ul, nop_handler, NULL), ESRCH, "77");
  EXPECT_ERR(register_xenretprobe_symbol(1, "sys_getppid", nop_handler, nop_handler, 5000), EINVAL, "maxactive 5000");
  EXPECT_ERR(register_xenretprobe_symbol(1, "sys_getppid+0x5", nop_handler, nop_handler, 4), EINVAL,
             "first instruction");
  EXPECT_ERR(register_xenretprobe_symbol(1, NULL, nop_handler, nop_handler, 4), EINVAL, "NULL");
  EXPECT_ERR(register_xenretprobe_data(1, "sys_getppid", 0, NULL, NULL, 4, 1u << 20), EINVAL, "data_size");
  EXPECT_ERR(unregister_xenretprobe(12345), EINVAL, "12345");
  EXPECT_ERR(xenretprobe_untracked_calls(12345), EINVAL, "12345");
  EXPECT_ERR(unregister_xenprobe(12345), EINVAL, "12345");
  EXPECT_ERR(xenprobes_enable(12345, 1), EINVAL, "unknown handle");
  EXPECT_ERR(xenprobes_domain_of(12345), EINVAL, "unknown handle");
  EXPECT_ERR(xenprobes_read(1, 0xffffffff81000100ul, buf, sizeof buf), EINVAL, "inside a handler");
  EXPECT_ERR(xenprobes_read_string(1, 0xffffffff81000100ul, buf, sizeof buf), EINVAL, "inside a handler");
  EXPECT_ERR(xenprobes_write(1, 0xffffffff81000100ul, buf, sizeof buf), EINVAL, "inside a handler");
  EXPECT_ERR(xenprobes_load_symbols(1, "/nonexistent/System.map"), ENOENT, "/nonexistent/System.map");
  EXPECT_ERR(xenprobes_load_symbols(1, NULL), EINVAL, "NULL");
  EXPECT_ERR(xenprobes_open("sim"), EBUSY, "already open");

  h = register_xenprobe_symbol(1, "sys_write", nop_handler, NULL);
  CHECK(h > 0, "register: %s", xenprobes_last_error());
  EXPECT_ERR(unregister_xenretprobe(h), EINVAL, "not a return probe");
  EXPECT_ERR(xenretprobe_untracked_calls(h), EINVAL, "not a return probe");
  st.version = XENPROBE_STATS_VERSION + 1;
  EXPECT_ERR(xenprobes_stats(h, &st), EINVAL, "version");
  EXPECT_ERR(xenprobes_stats(h, NULL), EINVAL, "NULL");
  st.version = XENPROBE_STATS_VERSION;
  CHECK(xenprobes_stats(h, &st) == 0, "stats: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(h) == 0, "unregister: %s", xenprobes_last_error());
  return 0;
}

/* ---- redirection ---- */

static struct {
  xenprobes_handle_t probe, site;
  unsigned long return_address;
  int redirected, site_hits, site_target, wrong_rax, read_failures, pending;
} redir;

static void learn_return_address(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  if (xenprobes_read(h, regs->rsp, &redir.return_address, sizeof redir.return_address) < 0) redir.read_failures++;
  xenprobes_stop();
}

static void return_42(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  uint64_t ra;
  if (xenprobes_read(h, regs->rsp, &ra, sizeof ra) < 0) {
    redir.read_failures++;
    return;
  }
  regs->rip = ra; /* kprobes' "return 1": the body of sys_getppid never runs */
  regs->rsp += 8;
  regs->rax = 42;
  redir.redirected++;
  redir.pending = 1;
}

static void at_return_site(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  (void)h;
  /* Only returns from a redirected call: the site may be shared code (the jump table's common
   * tail), and a call already inside sys_getppid when the probes went in returns normally. */
  if (!redir.pending) return;
  redir.pending = 0;
  if (regs->rax != 42) redir.wrong_rax++;
  if (++redir.site_hits == redir.site_target) xenprobes_stop();
}

int capi_c_redirect_getppid(xenprobes_handle_t *redirect, xenprobes_handle_t *site, char *msg, size_t n) {
  xenprobes_handle_t learn;
  memset(&redir, 0, sizeof redir);
  learn = register_xenprobe_symbol(1, "sys_getppid", learn_return_address, NULL);
  CHECK(learn > 0, "register: %s", xenprobes_last_error());
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(learn) == 0, "unregister: %s", xenprobes_last_error());
  CHECK(redir.read_failures == 0 && redir.return_address >> 32 == 0xfffffffful, "return address %#lx",
        redir.return_address);

  redir.probe = register_xenprobe_symbol(1, "sys_getppid", return_42, NULL);
  CHECK(redir.probe > 0, "register: %s", xenprobes_last_error());
  redir.site = register_xenprobe(1, redir.return_address, at_return_site, NULL);
  CHECK(redir.site > 0, "register at %#lx: %s", redir.return_address, xenprobes_last_error());
  *redirect = redir.probe;
  *site = redir.site;
  return capi_c_redirect_more(5, msg, n);
}

int capi_c_redirect_more(int more, char *msg, size_t n) {
  redir.site_target = redir.site_hits + more;
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(redir.site_hits >= redir.site_target, "%d return-site hits", redir.site_hits);
  CHECK(redir.redirected >= redir.site_hits, "%d redirections for %d return-site hits", redir.redirected,
        redir.site_hits);
  CHECK(redir.wrong_rax == 0, "%d return-site hits without rax == 42", redir.wrong_rax);
  CHECK(redir.read_failures == 0, "stack reads failed");
  return 0;
}

/* ---- return probes with per-call data ---- */

static struct {
  xenprobes_handle_t handle;
  int target, entries, returns, wrong_data, wrong_value, declined_seen;
} rp;

struct rp_call {
  uint64_t depth; /* demo_recurse's argument, saved at entry */
  uint64_t ret;   /* the return address, saved at entry */
};

static int rp_entry(xenprobes_handle_t h, struct cpu_user_regs *regs, void *data) {
  struct rp_call *c = data;
  uint64_t ret = 0;
  if (h != rp.handle || !c || c->depth != 0 || c->ret != 0) rp.wrong_data++;
  if (regs->rdi == 0) { /* decline the innermost call */
    rp.declined_seen++;
    return 1;
  }
  if (xenprobes_read(h, regs->rsp, &ret, sizeof ret) < 0) rp.wrong_data++;
  c->depth = regs->rdi;
  c->ret = ret;
  rp.entries++;
  return 0;
}

static int rp_return(xenprobes_handle_t h, struct cpu_user_regs *regs, void *data) {
  struct rp_call *c = data;
  if (h != rp.handle || !c || c->depth == 0 || regs->rip != c->ret) rp.wrong_data++;
  /* demo_recurse(n) for n >= 1 mixes in n: never 0 or 1. */
  if (regs->rax == 0 || regs->rax == 1) rp.wrong_value++;
  if (++rp.returns == rp.target) xenprobes_stop();
  return 0;
}

int capi_c_retprobe(int target, char *msg, size_t n) {
  struct xenprobe_stats st;
  memset(&rp, 0, sizeof rp);
  rp.target = target;
  rp.handle = register_xenretprobe_data(1, "demo_recurse", 0, rp_entry, rp_return, 32, sizeof(struct rp_call));
  CHECK(rp.handle > 0, "register_xenretprobe_data: %s", xenprobes_last_error());
  CHECK(xenprobes_loop() == 0, "xenprobes_loop: %s", xenprobes_last_error());
  CHECK(rp.returns == target, "%d returns, wanted %d", rp.returns, target);
  CHECK(rp.wrong_data == 0, "%d calls saw the wrong data, handle or return address", rp.wrong_data);
  CHECK(rp.wrong_value == 0, "%d wrong return values", rp.wrong_value);
  CHECK(rp.declined_seen > 0, "the innermost call never came");
  memset(&st, 0, sizeof st);
  st.version = XENPROBE_STATS_VERSION;
  CHECK(xenprobes_stats(rp.handle, &st) == 0, "stats: %s", xenprobes_last_error());
  CHECK(st.returns == (uint64_t)rp.returns, "stats.returns %llu", (unsigned long long)st.returns);
  CHECK(st.declined == (uint64_t)rp.declined_seen, "stats.declined %llu", (unsigned long long)st.declined);
  CHECK(st.maxactive == 32, "maxactive %u", st.maxactive);
  CHECK(st.untracked_calls == 0 && xenretprobe_untracked_calls(rp.handle) == 0, "untracked_calls %llu",
        (unsigned long long)st.untracked_calls);
  /* Only the current version is known: an older one is refused, nothing written. */
  {
    struct xenprobe_stats old;
    memset(&old, 0xab, sizeof old);
    old.version = 1;
    EXPECT_ERR(xenprobes_stats(rp.handle, &old), EINVAL, "version 1");
    CHECK(old.hits == 0xababababababababull, "a refused struct was written");
  }
  CHECK(unregister_xenprobe(rp.handle) == -1 && errno == EINVAL, "unregister_xenprobe on a return probe");
  CHECK(unregister_xenretprobe(rp.handle) == 0, "unregister_xenretprobe: %s", xenprobes_last_error());
  CHECK(unregister_xenretprobe(rp.handle) == -1 && errno == EINVAL, "second unregister");
  return 0;
}
