/* Jump probes, async probes, probe info and ring statistics through the C API, from C (C11,
 * -Wall -Wextra -pedantic). Exactness comes from the demo guest itself: with one vCPU its
 * calls[] counter for a function goes up by one per call. A jump probe's handler that reads it
 * advancing by exactly one from hit to hit has seen every call; an async probe captures it at
 * each hit, so every call it has no record of must be a drop the guest module counted. */
#include "capi_c_part.h"
#include "capi_c_check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void nop(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  (void)h;
  (void)regs;
}

static int info_of(xenprobes_handle_t h, struct xenprobe_info *out) {
  memset(out, 0, sizeof *out);
  out->version = XENPROBE_INFO_VERSION;
  return xenprobes_info(h, out);
}

/* ---- a jump probe on sys_getppid ---- */

static struct {
  xenprobes_handle_t handle;
  unsigned long counter, address;
  uint64_t last;
  int hits, stop_at, gaps, wrong_rip, read_failures;
} jmp;

static void jump_pre(xenprobes_handle_t h, struct cpu_user_regs *regs) {
  uint64_t calls = 0;
  if (regs->rip != jmp.address) jmp.wrong_rip++;
  if (xenprobes_read(h, jmp.counter, &calls, sizeof calls) < 0) jmp.read_failures++;
  if (jmp.hits > 0 && calls != jmp.last + 1) jmp.gaps++;
  jmp.last = calls;
  if (++jmp.hits == jmp.stop_at) xenprobes_stop();
}

int capi_c_jump(unsigned long getppid_counter, int target, char *msg, size_t n) {
  struct xenprobe_info info;
  struct xenprobe_stats st;
  int rounds = 0;
  memset(&jmp, 0, sizeof jmp);
  jmp.counter = getppid_counter;
  jmp.handle = register_xenprobe_method(1, "sys_getppid", 0, jump_pre, NULL, XENPROBE_METHOD_JUMP);
  CHECK(jmp.handle > 0, "register_xenprobe_method(JUMP): %s", xenprobes_last_error());
  CHECK(info_of(jmp.handle, &info) == 0, "info: %s", xenprobes_last_error());
  CHECK(info.method == XENPROBE_METHOD_JUMP, "method %u", info.method);
  CHECK(info.mode == XENPROBE_MODE_DETOUR, "mode %u", info.mode);
  CHECK(info.slot != 0, "no detour");
  CHECK(info.async == 0 && info.ret == 0, "async %u ret %u", info.async, info.ret);
  CHECK(info.address > info.requested, "sys_getppid's probe sits past its ftrace site");
  CHECK(strstr(info.moved_because, "ftrace") != NULL, "moved_because '%s'", info.moved_because);
  CHECK(info.instruction[0] != '\0' && info.not_jump_because[0] == '\0', "instruction '%s', not_jump_because '%s'",
        info.instruction, info.not_jump_because);
  jmp.address = (unsigned long)info.address;
  /* The trap byte fires until the guest module confirms quiescence; then the jump is written. */
  do {
    jmp.stop_at = jmp.hits + 5;
    CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
    CHECK(info_of(jmp.handle, &info) == 0, "info: %s", xenprobes_last_error());
  } while (info.jump_pending && ++rounds < 1000);
  CHECK(!info.jump_pending, "the jump was never written");
  jmp.stop_at = jmp.hits + target;
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(jmp.hits >= jmp.stop_at, "%d hits", jmp.hits);
  CHECK(jmp.gaps == 0, "%d calls of sys_getppid were not seen", jmp.gaps);
  CHECK(jmp.wrong_rip == 0 && jmp.read_failures == 0, "rip %d, reads %d", jmp.wrong_rip, jmp.read_failures);
  memset(&st, 0, sizeof st);
  st.version = XENPROBE_STATS_VERSION;
  CHECK(xenprobes_stats(jmp.handle, &st) == 0, "stats: %s", xenprobes_last_error());
  CHECK(st.hits == (uint64_t)jmp.hits, "stats.hits %llu, handler %d", (unsigned long long)st.hits, jmp.hits);
  CHECK(unregister_xenprobe(jmp.handle) == 0, "unregister: %s", xenprobes_last_error());
  return 0;
}

/* FASTEST falls back to a trap and says why; JUMP is refused where FASTEST falls back. */
int capi_c_jump_refusals(const char *channel_word, char *msg, size_t n) {
  struct xenprobe_info info;
  xenprobes_handle_t h;
  EXPECT_ERR(register_xenprobe_method(1, "sys_open", 0, nop, nop, XENPROBE_METHOD_JUMP), EOPNOTSUPP, channel_word);
  EXPECT_ERR(register_xenprobe_method(1, "sys_open", 0, nop, NULL, (enum xenprobe_method)7), EINVAL, "method 7");
  EXPECT_ERR(register_xenprobe_method(1, "no_such_function", 0, nop, NULL, XENPROBE_METHOD_FASTEST), ENOENT,
             "no_such_function");
  h = register_xenprobe_method(1, "sys_open", 0, nop, nop, XENPROBE_METHOD_FASTEST);
  CHECK(h > 0, "FASTEST: %s", xenprobes_last_error());
  CHECK(info_of(h, &info) == 0, "info: %s", xenprobes_last_error());
  CHECK(info.method == XENPROBE_METHOD_TRAP, "FASTEST with a post-handler became method %u", info.method);
  CHECK(info.mode != XENPROBE_MODE_DETOUR && info.jump_pending == 0, "mode %u", info.mode);
  CHECK(strstr(info.not_jump_because, channel_word) != NULL, "not_jump_because '%s'", info.not_jump_because);
  /* A jump cannot share a trap probe's point. */
  errno = 0;
  CHECK(register_xenprobe_method(1, "sys_open", 0, nop, NULL, XENPROBE_METHOD_JUMP) == -1 &&
            (errno == EBUSY || errno == EOPNOTSUPP),
        "a jump over a trap probe: errno %d, '%s'", errno, xenprobes_last_error());
  info.version = XENPROBE_INFO_VERSION + 1;
  EXPECT_ERR(xenprobes_info(h, &info), EINVAL, "version");
  EXPECT_ERR(xenprobes_info(h, NULL), EINVAL, "NULL");
  info.version = XENPROBE_INFO_VERSION;
  EXPECT_ERR(xenprobes_info(12345, &info), EINVAL, "12345");
  CHECK(unregister_xenprobe(h) == 0, "unregister: %s", xenprobes_last_error());
  return 0;
}

/* ---- an async probe on sys_open ---- */

static const char *const known_paths[] = {"/etc/hostname", "/etc/passwd",   "/tmp",          "/nonexistent",
                                          "/proc/version", "/tmp/demo.log", "relative/path", "/etc"};

struct async_seen {
  xenprobes_handle_t handle;
  unsigned long address;
  uint64_t last_calls, skipped; /* skipped: calls between two records that made none */
  uint32_t next_seq;
  int records, stop_at, bad, gaps, unknown_paths, faults_ok;
  char first_path[64];
};

static void async_handler(const struct xenprobe_async_hit *hit, void *arg) {
  struct async_seen *s = arg;
  uint64_t calls = 0;
  size_t i;
  int known = 0;
  if (hit->handle != s->handle || hit->domid != 1 || hit->vcpu != 0 || hit->address != s->address ||
      hit->regs.rip != s->address || hit->ncaptures != 3)
    s->bad++;
  if (s->records > 0 && hit->seq != s->next_seq) s->gaps++;
  s->next_seq = hit->seq + 1;
  if (hit->ncaptures == 3) {
    const struct xenprobe_capture_value *c = hit->captures;
    if (c[0].status != XENPROBE_CAPTURE_OK || c[0].length == 0 || c[0].data[c[0].length - 1] != '\0') {
      s->bad++;
    } else {
      for (i = 0; i < sizeof known_paths / sizeof known_paths[0]; i++)
        known |= strcmp((const char *)c[0].data, known_paths[i]) == 0;
      if (!known) s->unknown_paths++;
      if (s->records == 0) snprintf(s->first_path, sizeof s->first_path, "%s", (const char *)c[0].data);
    }
    if (c[1].status == XENPROBE_CAPTURE_OK && c[1].length == 8) {
      memcpy(&calls, c[1].data, 8);
      if (s->records > 0 && calls <= s->last_calls) s->bad++;
      if (s->records > 0 && calls > s->last_calls + 1) s->skipped += calls - s->last_calls - 1;
      s->last_calls = calls;
    } else {
      s->bad++;
    }
    if (c[2].status == XENPROBE_CAPTURE_FAULT && c[2].length == 0 && c[2].data == NULL) s->faults_ok++;
  }
  if (++s->records == s->stop_at) xenprobes_stop();
}

int capi_c_async(unsigned long open_counter, int target, char *msg, size_t n) {
  static struct async_seen seen;
  struct xenprobe_capture caps[3];
  struct xenprobe_info info;
  struct xenprobe_stats st;
  struct xenprobe_ring_stats rs;
  xenprobes_handle_t probe;

  /* Where the probe will sit (past sys_open's ftrace site): the captures are relative to it. */
  probe = register_xenprobe_symbol(1, "sys_open", nop, NULL);
  CHECK(probe > 0, "register: %s", xenprobes_last_error());
  CHECK(info_of(probe, &info) == 0, "info: %s", xenprobes_last_error());
  CHECK(unregister_xenprobe(probe) == 0, "unregister: %s", xenprobes_last_error());

  memset(&seen, 0, sizeof seen);
  memset(caps, 0, sizeof caps);
  caps[0].kind = XENPROBE_CAPTURE_STRING; /* the path, sys_open's first argument */
  caps[0].base = XENPROBE_REG_RDI;
  caps[0].max = 64;
  caps[1].kind = XENPROBE_CAPTURE_BYTES; /* vCPU 0's calls[DEMO_FN_OPEN], before this call counts */
  caps[1].base = XENPROBE_REG_RIP;
  caps[1].offset = (int32_t)(open_counter - info.address);
  caps[1].max = 8;
  caps[2].kind = XENPROBE_CAPTURE_BYTES; /* 1 GiB below the kernel: nothing mapped */
  caps[2].base = XENPROBE_REG_RIP;
  caps[2].offset = -0x40000000;
  caps[2].max = 8;
  seen.address = (unsigned long)info.address;
  seen.stop_at = target;
  seen.handle = register_xenprobe_async(1, "sys_open", 0, caps, 3, async_handler, &seen);
  CHECK(seen.handle > 0, "register_xenprobe_async: %s", xenprobes_last_error());
  CHECK(info_of(seen.handle, &info) == 0, "info: %s", xenprobes_last_error());
  CHECK(info.async == 1 && info.method == XENPROBE_METHOD_JUMP && info.mode == XENPROBE_MODE_DETOUR,
        "async %u method %u mode %u", info.async, info.method, info.mode);
  CHECK(info.address == seen.address, "the async probe sits at %#llx", (unsigned long long)info.address);
  /* Nothing else may share its point. */
  EXPECT_ERR(register_xenprobe_symbol(1, "sys_open", nop, NULL), EBUSY, "an async probe");

  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(seen.records >= target, "%d records", seen.records);
  CHECK(seen.bad == 0, "%d records with a wrong field", seen.bad);
  CHECK(seen.gaps == 0, "%d gaps in seq: Dom0 lost records", seen.gaps);
  CHECK(seen.unknown_paths == 0, "%d paths the guest never opens", seen.unknown_paths);
  CHECK(seen.faults_ok == seen.records, "%d of %d unmapped captures faulted", seen.faults_ok, seen.records);
  memset(&st, 0, sizeof st);
  st.version = XENPROBE_STATS_VERSION;
  CHECK(xenprobes_stats(seen.handle, &st) == 0, "stats: %s", xenprobes_last_error());
  CHECK(st.hits == (uint64_t)seen.records, "stats.hits %llu, records %d", (unsigned long long)st.hits, seen.records);

  /* Unregistering hands over the records still in the ring first. */
  CHECK(unregister_xenprobe(seen.handle) == 0, "unregister: %s", xenprobes_last_error());
  CHECK(seen.gaps == 0 && seen.bad == 0, "after unregister: gaps %d bad %d", seen.gaps, seen.bad);
  memset(&rs, 0, sizeof rs);
  rs.version = XENPROBE_RING_STATS_VERSION;
  CHECK(xenprobes_ring_stats(1, &rs) == 0, "ring_stats: %s", xenprobes_last_error());
  CHECK(rs.rings == 1, "%u rings", rs.rings);
  CHECK(rs.records == (uint64_t)seen.records, "ring records %llu, handler %d", (unsigned long long)rs.records,
        seen.records);
  /* A ring Dom0 does not read in time fills up (the guest runs on while this thread is not in
   * the loop, until the unregistration reads it), and the module drops hits and counts them:
   * every call the records skipped is such a drop (some may come after the last record). */
  CHECK(seen.skipped <= rs.drops, "%llu calls made no record, the module dropped %llu",
        (unsigned long long)seen.skipped, (unsigned long long)rs.drops);
  CHECK(rs.missed == 0 && rs.resyncs == 0 && rs.orphans == 0 && rs.bad_keys == 0,
        "missed %llu resyncs %llu orphans %llu bad_keys %llu", (unsigned long long)rs.missed,
        (unsigned long long)rs.resyncs, (unsigned long long)rs.orphans, (unsigned long long)rs.bad_keys);
  return 0;
}

int capi_c_async_refusals(char *msg, size_t n) {
  struct xenprobe_capture caps[XENPROBE_MAX_CAPTURES + 1];
  struct xenprobe_ring_stats rs;
  xenprobes_handle_t trap;
  int dummy = 0;
  unsigned k;
  memset(caps, 0, sizeof caps);
  for (k = 0; k < sizeof caps / sizeof caps[0]; k++) {
    caps[k].kind = XENPROBE_CAPTURE_BYTES;
    caps[k].base = XENPROBE_REG_RDI;
    caps[k].max = 8;
  }
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, NULL, 0, NULL, &dummy), EINVAL, "NULL handler");
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 9, async_handler, &dummy), EINVAL, "at most 8");
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, NULL, 1, async_handler, &dummy), EINVAL, "NULL captures");
  caps[1].max = 0;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 2, async_handler, &dummy), EINVAL, "capture 1: max 0");
  caps[1].max = 1025;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 2, async_handler, &dummy), EINVAL, "max 1025");
  caps[1].max = 8;
  caps[0].kind = 2;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 1, async_handler, &dummy), EINVAL, "capture 0: kind 2");
  caps[0].kind = XENPROBE_CAPTURE_BYTES;
  caps[0].base = XENPROBE_REG_RIP + 1;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 1, async_handler, &dummy), EINVAL, "base 17");
  caps[0].base = XENPROBE_REG_RDI;
  caps[0].flags = 0x80;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 1, async_handler, &dummy), EINVAL, "flags 128");
  caps[0].flags = 0;
  for (k = 0; k < 4; k++) caps[k].max = 1024;
  EXPECT_ERR(register_xenprobe_async(1, "sys_getppid", 0, caps, 4, async_handler, &dummy), EINVAL,
             "capture fewer bytes");
  EXPECT_ERR(register_xenprobe_async(1, "no_such_function", 0, NULL, 0, async_handler, &dummy), ENOENT,
             "no_such_function");
  /* A trap probe's point is not an async probe's. */
  trap = register_xenprobe_symbol(1, "sys_read", nop, NULL);
  CHECK(trap > 0, "register: %s", xenprobes_last_error());
  EXPECT_ERR(register_xenprobe_async(1, "sys_read", 0, NULL, 0, async_handler, &dummy), EBUSY, "");
  CHECK(unregister_xenprobe(trap) == 0, "unregister: %s", xenprobes_last_error());
  memset(&rs, 0, sizeof rs);
  rs.version = XENPROBE_RING_STATS_VERSION + 1;
  EXPECT_ERR(xenprobes_ring_stats(1, &rs), EINVAL, "version");
  EXPECT_ERR(xenprobes_ring_stats(1, NULL), EINVAL, "NULL");
  rs.version = XENPROBE_RING_STATS_VERSION;
  EXPECT_ERR(xenprobes_ring_stats(77, &rs), ESRCH, "77");
  CHECK(xenprobes_ring_stats(1, &rs) == 0 && rs.records == 0, "ring_stats: %s", xenprobes_last_error());
  return 0;
}

/* ---- an async handler that unregisters its own probe, or closes the session ---- */

static struct {
  xenprobes_handle_t self;
  int nth;     /* the record of `self` on which its handler acts */
  int more;    /* records of the other probe after that, then the loop stops */
  int acted;   /* the handler has acted */
  int records; /* calls of self's handler */
  int after;   /* of those, calls after it acted */
  int rc, again_rc, again_errno;
  int other_after; /* the other probe's records since self's handler acted */
  int close_now;   /* close: at the next record, not at record nth */
} rm;

static void rm_unregister(const struct xenprobe_async_hit *hit, void *arg) {
  (void)arg;
  if (rm.acted) rm.after++;
  if (++rm.records != rm.nth) return;
  rm.acted = 1;
  rm.rc = unregister_xenprobe(hit->handle);
  errno = 0;
  rm.again_rc = unregister_xenprobe(hit->handle);
  rm.again_errno = errno;
}

static void rm_other(const struct xenprobe_async_hit *hit, void *arg) {
  (void)hit;
  (void)arg;
  if (rm.acted && ++rm.other_after == rm.more) xenprobes_stop();
}

static int expect_handle_gone(xenprobes_handle_t h, const char *why, char *msg, size_t n) {
  struct xenprobe_stats st;
  memset(&st, 0, sizeof st);
  st.version = XENPROBE_STATS_VERSION;
  EXPECT_ERR(xenprobes_stats(h, &st), EINVAL, why);
  EXPECT_ERR(unregister_xenprobe(h), EINVAL, why);
  return 0;
}

int capi_c_async_unregister_self(int nth, int more, xenprobes_handle_t *other, char *msg, size_t n) {
  struct xenprobe_ring_stats rs;
  int line;
  memset(&rm, 0, sizeof rm);
  rm.nth = nth;
  rm.more = more;
  rm.self = register_xenprobe_async(1, "sys_getppid", 0, NULL, 0, rm_unregister, NULL);
  CHECK(rm.self > 0, "register_xenprobe_async(sys_getppid): %s", xenprobes_last_error());
  /* Keeps the loop going after the removal: it stops `more` of its own records later. */
  *other = register_xenprobe_async(1, "sys_open", 0, NULL, 0, rm_other, NULL);
  CHECK(*other > 0, "register_xenprobe_async(sys_open): %s", xenprobes_last_error());
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  CHECK(rm.acted, "the handler never saw record %d", nth);
  CHECK(rm.rc == 0, "unregister_xenprobe() from its own handler: %d", rm.rc);
  CHECK(rm.again_rc == -1 && rm.again_errno == EINVAL, "a second unregister_xenprobe(): %d, errno %d", rm.again_rc,
        rm.again_errno);
  CHECK(rm.other_after >= more, "sys_open: %d records after the removal", rm.other_after);
  if ((line = expect_handle_gone(rm.self, "unknown handle", msg, n)) != 0) return line;
  /* The guest goes on calling sys_getppid, through another `more` records of the other probe
   * and a read of the rings outside the loop: none of it reaches the handler. */
  rm.other_after = 0;
  CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
  memset(&rs, 0, sizeof rs);
  rs.version = XENPROBE_RING_STATS_VERSION;
  CHECK(xenprobes_ring_stats(1, &rs) == 0, "ring_stats: %s", xenprobes_last_error());
  CHECK(rm.records == nth && rm.after == 0, "%d handler calls, %d after the probe was unregistered", rm.records,
        rm.after);
  CHECK(rs.missed == 0 && rs.resyncs == 0 && rs.bad_keys == 0, "missed %llu resyncs %llu bad_keys %llu",
        (unsigned long long)rs.missed, (unsigned long long)rs.resyncs, (unsigned long long)rs.bad_keys);
  return 0;
}

static void rm_close(const struct xenprobe_async_hit *hit, void *arg) {
  (void)hit;
  (void)arg;
  if (rm.acted) rm.after++;
  if (++rm.records != rm.nth && !rm.close_now) return;
  if (rm.acted) return;
  rm.acted = 1;
  xenprobes_close();
}

/* xenprobes_close() from an async handler: the session is running that handler, so the close
 * waits for the call that runs it to return: xenprobes_loop() (`in_loop`), or else
 * xenprobes_ring_stats(), which reads the rings in the calling thread. Either way the probe and
 * the session are gone after it, the handle with them, and a new session opens lazily. */
int capi_c_async_close_in_handler(int nth, int in_loop, char *msg, size_t n) {
  struct xenprobe_ring_stats rs;
  long tries;
  int line, calls;
  memset(&rm, 0, sizeof rm);
  rm.nth = in_loop ? nth : 0;
  rm.self = register_xenprobe_async(1, "sys_getppid", 0, NULL, 0, rm_close, NULL);
  CHECK(rm.self > 0, "register_xenprobe_async: %s", xenprobes_last_error());
  memset(&rs, 0, sizeof rs);
  rs.version = XENPROBE_RING_STATS_VERSION;
  if (in_loop) {
    CHECK(xenprobes_loop() == 0, "loop: %s", xenprobes_last_error());
    CHECK(rm.acted && rm.records >= nth, "%d records", rm.records);
  } else {
    /* The guest calls sys_getppid all the time: one of these reads finds a record, and its
     * handler closes the session. A read after the close would open a new one: stop at once. */
    rm.close_now = 1;
    for (tries = 0; tries < 10000000L && !rm.acted; tries++)
      CHECK(xenprobes_ring_stats(1, &rs) == 0, "ring_stats: %s", xenprobes_last_error());
    CHECK(rm.acted, "no record in %ld reads of the rings", tries);
  }
  calls = rm.records;
  if ((line = expect_handle_gone(rm.self, "session was closed", msg, n)) != 0) return line;
  /* A new session, opened by this call, probes nothing in domain 1. */
  EXPECT_ERR(xenprobes_ring_stats(1, &rs), ESRCH, "not attached");
  CHECK(rm.records == calls, "%d handler calls after the close", rm.records - calls);
  return 0;
}
