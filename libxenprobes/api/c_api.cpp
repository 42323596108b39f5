// The C API (include/xenprobes/xenprobes.h) over the C++ Session: one implicit, process-wide
// session, integer handles mapped to probe ids, C handlers wrapped in C++ handlers that hand
// them Xen's struct cpu_user_regs and write the changes back.
//
// Error policy: every entry point is noexcept and runs its body through
// entry(), the one try/catch that turns an Error or an exception into -1 + errno + a
// thread-local message. No C++ exception leaves this file. Jump and async probes, probe info
// and ring statistics are in c_api_probes.cpp; what both files share, in c_api_internal.hpp.
//
// Locking: Session is not thread-safe, so every call that touches it holds State::mu, and
// xenprobes_loop() holds it for as long as it runs. It is recursive because handlers run inside
// the loop, in the loop's thread, and may call the API. Another thread that finds the loop
// running gets EBUSY instead of blocking until some handler calls xenprobes_stop().
// xenprobes_stop() never takes State::mu: it only needs the session's wake-up, which Session
// allows from any thread; State::stop_mu keeps that session alive while it is used.
#include "xenprobes/xenprobes.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "api/c_api_internal.hpp"
#include "api/session_access.hpp"
#include "common/result.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {
namespace {

// The layout is Xen's (xen/arch-x86/xen-x86_64.h); a handler built against Xen's own
// definition must find every register where ours puts it.
static_assert(offsetof(cpu_user_regs, rdi) == 112);
static_assert(offsetof(cpu_user_regs, error_code) == 120);
static_assert(offsetof(cpu_user_regs, rip) == 128);
static_assert(offsetof(cpu_user_regs, cs) == 136);
static_assert(offsetof(cpu_user_regs, rflags) == 144);
static_assert(offsetof(cpu_user_regs, rsp) == 152);
static_assert(offsetof(cpu_user_regs, ss) == 160);
static_assert(offsetof(cpu_user_regs, gs) == 192);
static_assert(sizeof(cpu_user_regs) == 200);

}  // namespace

namespace capi {
// Constructed on first use, so destroyed before the library's own statics.
State& state() {
  static State s;
  return s;
}
}  // namespace capi

namespace {

thread_local std::string t_last_error;

// The hit being handled in this thread (for xenprobes_read and friends).
struct CurrentHit {
  HitContext* ctx = nullptr;
  int handle = 0;
};
thread_local CurrentHit t_hit;
thread_local unsigned t_async_handlers = 0;  // async handlers running in this thread (AsyncHandlerScope)

// A handler of this session runs in this thread: the session is on the stack under it.
bool in_handler() { return t_hit.ctx != nullptr || t_async_handlers > 0; }
// A handler let a C++ exception out (possible for a C++ function behind a C pointer): the loop
// stops and reports it rather than let it unwind through the engine.
thread_local std::string t_handler_exception;

}  // namespace

namespace capi {

int set_error(int err, const char* what) noexcept {
  try {
    t_last_error = what;
  } catch (...) {
    t_last_error.clear();  // out of memory: errno still says what happened
  }
  errno = err;
  return -1;
}

int set_error(const Error& e) noexcept {
  int err = e.errno_value();
  return set_error(err > 0 ? err : EIO, e.what.c_str());
}

AsyncHandlerScope::AsyncHandlerScope() noexcept { ++t_async_handlers; }
AsyncHandlerScope::~AsyncHandlerScope() { --t_async_handlers; }

CloseWhenDone::~CloseWhenDone() {
  State& s = state();
  if (s.close_pending && !in_handler()) s.close_now();
}

void handler_threw(int handle) noexcept {
  try {
    if (t_handler_exception.empty())
      t_handler_exception = "the handler of probe " + std::to_string(handle) + " threw a C++ exception";
    request_stop(state());
  } catch (...) {
    // No memory for the message, or the stop failed: say so the one way left (no allocation).
    std::fputs("xenprobes: a probe handler threw, and the loop could not record it\n", stderr);
  }
}

// Takes State::mu, unless the loop holds it in another thread (EBUSY). The loop's own thread
// (its handlers) gets it at once: the mutex is recursive.
Result<std::unique_lock<std::recursive_mutex>> acquire() {
  State& s = state();
  // try_lock's result is the loop's condition: gcc 14's libstdc++ makes it [[nodiscard]].
  std::unique_lock l(s.mu, std::defer_lock);
  while (!l.try_lock()) {
    std::thread::id t = s.loop_thread.load();
    if (t != std::thread::id{} && t != std::this_thread::get_id())
      return fail(Errc::Busy,
                  "xenprobes_loop() is running in another thread: call this from a handler, "
                  "or after xenprobes_stop() has ended the loop");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return l;
}

Result<Session*> open_session(State& s, const char* backend) {
  // The channel: XENPROBES_CHANNEL (auto, guest, vmevent, debugger; default auto).
  SessionOptions o;
  if (const char* ch = std::getenv("XENPROBES_CHANNEL"); ch && *ch) {
    auto k = parse_channel_kind(ch);
    if (!k) return fail(Errc::InvalidArgument, "XENPROBES_CHANNEL: " + k.error().what);
    o.channel = *k;
  }
  Result<std::unique_ptr<Session>> r = (backend && *backend) ? [&]() -> Result<std::unique_ptr<Session>> {
    auto hv = XP_TRY(hv::open_hypervisor(backend));
    return Session::open(std::move(hv), o);
  }()
      : Session::open(o);
  if (!r) {
    Error e = r.error();
    e.what = "cannot open a xenprobes session: " + e.what;
    return std::unexpected(std::move(e));
  }
  s.session = std::move(*r);
  std::lock_guard l(s.stop_mu);
  s.live = s.session.get();
  return s.session.get();
}

// The implicit session: opened by the first call that needs one.
Result<Session*> session(State& s) {
  if (s.session) return s.session.get();
  return open_session(s, nullptr);
}

Result<CProbe*> find(State& s, int handle) {
  auto it = s.probes.find(handle);
  if (it == s.probes.end())
    return fail(Errc::InvalidArgument, "unknown handle " + std::to_string(handle) +
                                           " (never registered, already unregistered, or its session was closed)");
  return &it->second;
}

void to_c(const Regs& r, cpu_user_regs& c) {
  c = cpu_user_regs{};
  c.r15 = r.r15, c.r14 = r.r14, c.r13 = r.r13, c.r12 = r.r12, c.rbp = r.rbp, c.rbx = r.rbx;
  c.r11 = r.r11, c.r10 = r.r10, c.r9 = r.r9, c.r8 = r.r8, c.rax = r.rax, c.rcx = r.rcx;
  c.rdx = r.rdx, c.rsi = r.rsi, c.rdi = r.rdi;
  c.rip = r.rip, c.cs = r.cs, c.rflags = r.rflags, c.rsp = r.rsp, c.ss = r.ss;
}

// Segment selectors and the private fields are not written back: a handler has no business
// changing them, and Xen's frame fields we do not fill must not reach the vCPU.
void from_c(const cpu_user_regs& c, Regs& r) {
  r.r15 = c.r15, r.r14 = c.r14, r.r13 = c.r13, r.r12 = c.r12, r.rbp = c.rbp, r.rbx = c.rbx;
  r.r11 = c.r11, r.r10 = c.r10, r.r9 = c.r9, r.r8 = c.r8, r.rax = c.rax, r.rcx = c.rcx;
  r.rdx = c.rdx, r.rsi = c.rsi, r.rdi = c.rdi;
  r.rip = c.rip, r.rflags = c.rflags, r.rsp = c.rsp;
}

void request_stop(State& s) {
  s.stop = true;
  std::lock_guard l(s.stop_mu);
  if (s.live) s.live->stop();
}

}  // namespace capi

namespace {

using namespace capi;

// Runs one C handler on a hit (`call` calls it with the frame). A changed rip is honoured by
// the engine (kprobes' "return 1"). Returns what the handler returned (0 if it threw).
template <typename Call>
int call_c(int handle, HitContext& c, Call&& call) {
  cpu_user_regs regs;
  to_c(c.regs(), regs);
  CurrentHit saved = t_hit;
  t_hit = {&c, handle};
  int rc = 0;
  try {
    rc = call(&regs);
  } catch (...) {
    t_hit = saved;
    handler_threw(handle);
    return 0;  // its register changes are dropped
  }
  t_hit = saved;
  from_c(regs, c.regs());
  return rc;
}

void call_c(int handle, xenprobe_handler_t fn, HitContext& c) {
  call_c(handle, c, [&](cpu_user_regs* r) {
    fn(handle, r);
    return 0;
  });
}

}  // namespace

namespace capi {

xenprobes_handle_t register_probe(domid_t domid, const char* symbol, unsigned long address, xenprobe_handler_t pre,
                                  xenprobe_handler_t post, ProbeOptions o) noexcept {
  return register_with(domid, false, [&](Session& ses, DomId dom, int h) {
    PreHandler p;
    PostHandler q;
    if (pre)
      p = [h, pre](HitContext& c) {
        call_c(h, pre, c);
        return 0;
      };
    if (post) q = [h, post](HitContext& c) { call_c(h, post, c); };
    return symbol ? ses.probe(dom, std::string_view(symbol), std::move(p), std::move(q), o)
                  : ses.probe(dom, Gva{address}, std::move(p), std::move(q), o);
  });
}

}  // namespace capi

namespace {

// `bind` makes the two handlers once the handle is known.
template <typename Bind>
xenprobes_handle_t register_retprobe(domid_t domid, const char* symbol, unsigned long address, RetProbeOptions o,
                                     Bind&& bind) noexcept {
  return register_with(domid, true, [&](Session& ses, DomId dom, int h) {
    EntryHandler e;
    ReturnHandler r;
    bind(h, e, r);
    return symbol ? ses.ret_probe(dom, std::string_view(symbol), std::move(e), std::move(r), o)
                  : ses.ret_probe(dom, Gva{address}, std::move(e), std::move(r), o);
  });
}

int unregister_any(xenprobes_handle_t handle, bool ret, const char* fn) noexcept {
  return entry([&]() -> Result<int> {
    auto lock = XP_TRY(acquire());
    CloseWhenDone close_when_done;  // an async probe's last records reach its handler here
    State& s = state();
    CProbe* p = XP_TRY(find(s, handle));
    if (p->ret != ret)
      return fail(Errc::InvalidArgument, std::string(fn) + "(" + std::to_string(handle) + "): the handle is " +
                                             (p->ret ? "a return probe: use unregister_xenretprobe()"
                                                     : "not a return probe: use unregister_xenprobe()"));
    if (auto r = SessionAccess::unregister(*s.session, p->id); !r && r.error().code != Errc::NotFound) {
      // Still registered: the handle stays valid for a retry.
      Error e = r.error();
      e.what = std::string(fn) + "(" + std::to_string(handle) + "): " + e.what;
      return std::unexpected(std::move(e));
    }
    // NotFound: the engine already dropped it (its domain died); nothing left to restore.
    s.probes.erase(handle);
    return 0;
  });
}

std::string hex(unsigned long v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%lx", v);
  return b;
}

Result<HitContext*> current_hit(int handle, const char* fn) {
  if (!t_hit.ctx) return fail(Errc::InvalidArgument, std::string(fn) + "() works only inside a handler");
  if (t_hit.handle != handle)
    return fail(Errc::InvalidArgument, std::string(fn) + "(): handle " + std::to_string(handle) +
                                           " is not the probe whose handler is running (" +
                                           std::to_string(t_hit.handle) + ")");
  return t_hit.ctx;
}

}  // namespace
}  // namespace xenprobes

using namespace xenprobes;
using namespace xenprobes::capi;

extern "C" {

xenprobes_handle_t register_xenprobe(domid_t domid, unsigned long address, xenprobe_handler_t pre_handler,
                                     xenprobe_handler_t post_handler) noexcept {
  return register_probe(domid, nullptr, address, pre_handler, post_handler, ProbeOptions{});
}

xenprobes_handle_t register_xenprobe_symbol(domid_t domid, const char* symbol, xenprobe_handler_t pre_handler,
                                            xenprobe_handler_t post_handler) noexcept {
  if (!symbol) return set_error(EINVAL, "register_xenprobe_symbol(): NULL symbol");
  return register_probe(domid, symbol, 0, pre_handler, post_handler, ProbeOptions{});
}

int unregister_xenprobe(xenprobes_handle_t handle) noexcept {
  return unregister_any(handle, false, "unregister_xenprobe");
}

namespace {
// The paper's handlers: no per-call data, every call tracked.
void bind_plain(xenprobe_handler_t entry_h, xenprobe_handler_t ret_h, int h, EntryHandler& e, ReturnHandler& r) {
  if (entry_h)
    e = [h, entry_h](HitContext& c, std::span<std::byte>) {
      call_c(h, entry_h, c);
      return 0;
    };
  if (ret_h) r = [h, ret_h](HitContext& c, std::span<std::byte>) { call_c(h, ret_h, c); };
}
void bind_data(xenretprobe_handler_t entry_h, xenretprobe_handler_t ret_h, int h, EntryHandler& e, ReturnHandler& r) {
  if (entry_h)
    e = [h, entry_h](HitContext& c, std::span<std::byte> d) {
      return call_c(h, c, [&](cpu_user_regs* regs) { return entry_h(h, regs, d.empty() ? nullptr : d.data()); });
    };
  if (ret_h)
    r = [h, ret_h](HitContext& c, std::span<std::byte> d) {
      call_c(h, c, [&](cpu_user_regs* regs) { return ret_h(h, regs, d.empty() ? nullptr : d.data()); });
    };
}
}  // namespace

xenprobes_handle_t register_xenretprobe(domid_t domid, unsigned long address, xenprobe_handler_t entry_handler,
                                        xenprobe_handler_t return_handler, int maxactive) noexcept {
  return register_retprobe(
      domid, nullptr, address, RetProbeOptions{maxactive, 0},
      [&](int h, EntryHandler& e, ReturnHandler& r) { bind_plain(entry_handler, return_handler, h, e, r); });
}

xenprobes_handle_t register_xenretprobe_symbol(domid_t domid, const char* symbol, xenprobe_handler_t entry_handler,
                                               xenprobe_handler_t return_handler, int maxactive) noexcept {
  if (!symbol) return set_error(EINVAL, "register_xenretprobe_symbol(): NULL symbol");
  return register_retprobe(
      domid, symbol, 0, RetProbeOptions{maxactive, 0},
      [&](int h, EntryHandler& e, ReturnHandler& r) { bind_plain(entry_handler, return_handler, h, e, r); });
}

xenprobes_handle_t register_xenretprobe_data(domid_t domid, const char* symbol, unsigned long address,
                                             xenretprobe_handler_t entry_handler, xenretprobe_handler_t return_handler,
                                             int maxactive, size_t data_size) noexcept {
  return register_retprobe(
      domid, symbol, address, RetProbeOptions{maxactive, data_size},
      [&](int h, EntryHandler& e, ReturnHandler& r) { bind_data(entry_handler, return_handler, h, e, r); });
}

int unregister_xenretprobe(xenprobes_handle_t handle) noexcept {
  return unregister_any(handle, true, "unregister_xenretprobe");
}

long xenretprobe_untracked_calls(xenprobes_handle_t handle) noexcept {
  return entry([&]() -> Result<long> {
    auto lock = XP_TRY(acquire());
    State& s = state();
    CProbe* p = XP_TRY(find(s, handle));
    if (!p->ret)
      return fail(Errc::InvalidArgument,
                  "xenretprobe_untracked_calls(" + std::to_string(handle) + "): not a return probe");
    std::uint64_t n = SessionAccess::stats(*s.session, p->id).untracked_calls;
    return static_cast<long>(std::min<std::uint64_t>(n, LONG_MAX));
  });
}

int xenprobes_loop(void) noexcept {
  return entry([&]() -> Result<int> {
    if (in_handler()) return fail(Errc::Busy, "xenprobes_loop() cannot be called from a handler");
    auto lock = XP_TRY(acquire());
    State& s = state();
    Session* ses = XP_TRY(session(s));
    s.loop_thread = std::this_thread::get_id();
    struct Leave {
      State& s;
      ~Leave() { s.loop_thread = std::thread::id{}; }
    } leave{s};
    t_handler_exception.clear();
    Result<int> out = 0;
    while (!s.stop.exchange(false)) {
      if (auto r = ses->run_once(-1); !r) {
        Error e = r.error();
        e.what = "xenprobes_loop(): " + e.what;
        out = std::unexpected(std::move(e));
        break;
      }
      if (!t_handler_exception.empty()) {
        out = fail(Errc::Io, "xenprobes_loop(): " + t_handler_exception);
        t_handler_exception.clear();
        s.stop = false;
        break;
      }
    }
    if (s.close_pending) s.close_now();
    return out;
  });
}

int xenprobes_enable(xenprobes_handle_t handle, int enable) noexcept {
  return entry([&]() -> Result<int> {
    auto lock = XP_TRY(acquire());
    State& s = state();
    CProbe* p = XP_TRY(find(s, handle));
    XP_TRY(SessionAccess::set_enabled(*s.session, p->id, enable != 0));
    return 0;
  });
}

void xenprobes_stop(void) noexcept {
  entry([&]() -> Result<int> {
    request_stop(state());
    return 0;
  });
}

int xenprobes_open(const char* backend) noexcept {
  return entry([&]() -> Result<int> {
    auto lock = XP_TRY(acquire());
    State& s = state();
    if (s.session)
      return fail(Errc::Busy, std::string("a xenprobes session is already open (") + s.session->hypervisor().name() +
                                  "): call xenprobes_close() first");
    XP_TRY(open_session(s, backend));
    return 0;
  });
}

void xenprobes_close(void) noexcept {
  entry([&]() -> Result<int> {
    State& s = state();
    if (in_handler()) {  // the session is running this handler: close once the call running it returns
      std::lock_guard l(s.mu);
      s.close_pending = true;
      request_stop(s);
      return 0;
    }
    std::thread::id t = s.loop_thread.load();
    if (t != std::thread::id{} && t != std::this_thread::get_id()) request_stop(s);
    std::lock_guard l(s.mu);  // waits for that loop to return
    s.close_now();
    return 0;
  });
}

int xenprobes_load_symbols(domid_t domid, const char* system_map) noexcept {
  return entry([&]() -> Result<int> {
    if (!system_map) return fail(Errc::InvalidArgument, "xenprobes_load_symbols(): NULL path");
    auto lock = XP_TRY(acquire());
    Session* ses = XP_TRY(session(state()));
    XP_TRY(ses->load_symbols(DomId{domid}, system_map));
    return 0;
  });
}

int xenprobes_stats(xenprobes_handle_t handle, struct xenprobe_stats* out) noexcept {
  return entry([&]() -> Result<int> {
    if (!out) return fail(Errc::InvalidArgument, "xenprobes_stats(): NULL out");
    if (out->version != XENPROBE_STATS_VERSION)
      return fail(Errc::InvalidArgument, "xenprobes_stats(): struct xenprobe_stats version " +
                                             std::to_string(out->version) + "; this library knows version " +
                                             std::to_string(XENPROBE_STATS_VERSION) +
                                             " (set out->version = XENPROBE_STATS_VERSION)");
    auto lock = XP_TRY(acquire());
    State& s = state();
    CProbe* p = XP_TRY(find(s, handle));
    ProbeStats st = SessionAccess::stats(*s.session, p->id);
    out->hits = st.hits;
    out->unhandled = st.unhandled;
    out->returns = st.returns;
    out->untracked_calls = st.untracked_calls;
    out->declined = st.declined;
    out->reclaimed = st.reclaimed;
    out->maxactive = st.maxactive;
    out->active = st.active;
    return 0;
  });
}

int xenprobes_domain_of(xenprobes_handle_t handle) noexcept {
  return entry([&]() -> Result<int> {
    auto lock = XP_TRY(acquire());
    CProbe* p = XP_TRY(find(state(), handle));
    return static_cast<int>(p->dom.value);
  });
}

const char* xenprobes_last_error(void) noexcept { return t_last_error.c_str(); }

int xenprobes_read(xenprobes_handle_t handle, unsigned long gva, void* buf, size_t len) noexcept {
  return entry([&]() -> Result<int> {
    HitContext* c = XP_TRY(current_hit(handle, "xenprobes_read"));
    if (!buf && len) return fail(Errc::InvalidArgument, "xenprobes_read(): NULL buffer");
    if (len) XP_TRY(c->read(Gva{gva}, std::span(static_cast<std::byte*>(buf), len)));
    return 0;
  });
}

int xenprobes_write(xenprobes_handle_t handle, unsigned long gva, const void* buf, size_t len) noexcept {
  return entry([&]() -> Result<int> {
    HitContext* c = XP_TRY(current_hit(handle, "xenprobes_write"));
    if (!buf && len) return fail(Errc::InvalidArgument, "xenprobes_write(): NULL buffer");
    if (len) XP_TRY(c->write(Gva{gva}, std::span(static_cast<const std::byte*>(buf), len)));
    return 0;
  });
}

int xenprobes_read_string(xenprobes_handle_t handle, unsigned long gva, char* buf, size_t size) noexcept {
  return entry([&]() -> Result<int> {
    HitContext* c = XP_TRY(current_hit(handle, "xenprobes_read_string"));
    if (!buf || size == 0) return fail(Errc::InvalidArgument, "xenprobes_read_string(): no buffer");
    if (size > INT_MAX) size = INT_MAX;  // the length must fit the return value
    // Up to size - 1 characters (what the buffer holds), then, only when none of them is the
    // NUL, the byte after them: the NUL (the string fits exactly) or not, or unreadable (it
    // does not end within `size` bytes). An async string capture of max `size` reads the same
    // bytes (protocol.h "Captures").
    std::string str = XP_TRY(c->read_string(Gva{gva}, size - 1));
    const std::size_t n = std::min(str.size(), size - 1);
    std::memcpy(buf, str.data(), n);
    buf[n] = '\0';
    bool longer = false;
    if (n == size - 1) {
      const std::uint64_t next = gva + n;
      std::byte b{1};
      longer = next < gva || !c->read(Gva{next}, std::span(&b, 1)) || b != std::byte{0};
    }
    if (longer)
      return fail(Errc::Range, "xenprobes_read_string(): the string at " + hex(gva) + " is longer than the " +
                                   std::to_string(size) + "-byte buffer");
    return static_cast<int>(n);
  });
}

}  // extern "C"

namespace xenprobes::capi_testing {
// For tests linked against the static layers (not exported from libxenprobes.so): the implicit
// session, or null when none is open.
Session* current_session() { return capi::state().session.get(); }
}  // namespace xenprobes::capi_testing
