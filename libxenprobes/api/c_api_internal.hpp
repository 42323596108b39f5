// What the C API's two source files share (c_api.cpp: the paper's interface, sessions, guest
// memory; c_api_probes.cpp: jump and async probes, probe info, ring statistics). Nothing here
// is exported: the library is built with hidden visibility.
#pragma once

#include <atomic>
#include <cerrno>
#include <climits>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>

#include "common/result.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::capi {

struct CProbe {
  std::uint64_t id = 0;  // the C++ probe id (Probe::release()d: the session owns the probe)
  DomId dom;
  bool ret = false;  // a return probe (unregister_xenretprobe)
};

struct State {
  std::recursive_mutex mu;
  std::unique_ptr<Session> session;            // guarded by mu
  std::map<int, CProbe> probes;                // guarded by mu
  int next_handle = 1;                         // guarded by mu; handles are never reused
  bool close_pending = false;                  // guarded by mu: xenprobes_close() from a handler
  std::atomic<std::thread::id> loop_thread{};  // the thread in xenprobes_loop(), if any

  std::mutex stop_mu;
  Session* live = nullptr;  // guarded by stop_mu: the session xenprobes_stop() wakes
  std::atomic<bool> stop{false};

  // At exit, a program that forgot xenprobes_close() still gets its guests' bytes back.
  ~State() {
    std::lock_guard l(mu);
    close_now();
  }

  void close_now() {
    {
      std::lock_guard l(stop_mu);
      live = nullptr;
    }
    probes.clear();
    session.reset();  // unregisters every probe, restores every byte
    close_pending = false;
    stop = false;
  }
};

// The one process-wide state, constructed on first use.
State& state();

// Sets errno and this thread's xenprobes_last_error(); returns -1.
int set_error(int err, const char* what) noexcept;
int set_error(const Error& e) noexcept;

// A handler let a C++ exception out: the loop stops and reports it (xenprobes_loop()).
void handler_threw(int handle) noexcept;

// While an async handler runs in this thread (the session is on the stack under it):
// xenprobes_close() then waits for the call running it to return (CloseWhenDone) and
// xenprobes_loop() is refused, as from a hit's handler.
struct AsyncHandlerScope {
  AsyncHandlerScope() noexcept;
  ~AsyncHandlerScope();
  AsyncHandlerScope(const AsyncHandlerScope&) = delete;
  AsyncHandlerScope& operator=(const AsyncHandlerScope&) = delete;
};

// For the calls that read the rings in the calling thread outside xenprobes_loop()
// (xenprobes_ring_stats(), unregister_xenprobe()): an async handler they ran may have called
// xenprobes_close(), which could not close the session under it. Made after the call has taken
// State::mu, it closes the session as the call returns (still holding it), unless the call
// itself runs inside a handler: then the loop or the outer call closes it.
struct CloseWhenDone {
  CloseWhenDone() = default;
  ~CloseWhenDone();
  CloseWhenDone(const CloseWhenDone&) = delete;
  CloseWhenDone& operator=(const CloseWhenDone&) = delete;
};

// The one try/catch of every entry point: runs `body` (returning Result<int> or Result<long>)
// and translates a failure into -1 + errno + the detail.
template <typename F, typename T = typename std::invoke_result_t<F>::value_type>
T entry(F&& body) noexcept {
  try {
    Result<T> r = body();
    if (r) return *r;
    return set_error(r.error());
  } catch (const std::bad_alloc&) { return set_error(ENOMEM, "out of memory"); } catch (const std::exception& e) {
    std::string what = std::string("internal error: ") + e.what();
    return set_error(EIO, what.c_str());
  } catch (...) { return set_error(EIO, "internal error: unknown exception"); }
}

// Takes State::mu, unless the loop holds it in another thread (EBUSY).
Result<std::unique_lock<std::recursive_mutex>> acquire();
// The implicit session: opened by the first call that needs one.
Result<Session*> session(State& s);
// The probe behind a handle (EINVAL for an unknown one).
Result<CProbe*> find(State& s, int handle);
// The C frame of a C++ register set (the fields the C API does not provide are 0).
void to_c(const Regs& r, cpu_user_regs& c);
void request_stop(State& s);
// A probe with C pre/post handlers, at `symbol` when it is not NULL, else at `address`.
xenprobes_handle_t register_probe(domid_t domid, const char* symbol, unsigned long address, xenprobe_handler_t pre,
                                  xenprobe_handler_t post, ProbeOptions o) noexcept;

// Registers through `make` (given the session and the handle the probe will have) and
// returns that handle: the one path every register_* entry point takes.
template <typename Make>
xenprobes_handle_t register_with(domid_t domid, bool ret, Make&& make) noexcept {
  return entry([&]() -> Result<int> {
    auto lock = XP_TRY(acquire());
    State& s = state();
    Session* ses = XP_TRY(session(s));
    if (s.next_handle == INT_MAX) return fail(Errc::NoSpace, "out of probe handles");
    const int h = s.next_handle;
    DomId dom{domid};
    Result<Probe> probe = make(*ses, dom, h);
    if (!probe) return std::unexpected(probe.error());
    std::uint64_t id = probe->release();
    s.probes.emplace(h, CProbe{id, dom, ret});
    ++s.next_handle;
    return h;
  });
}

}  // namespace xenprobes::capi
