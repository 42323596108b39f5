// Internal helpers around the public Result<T> (include/xenprobes/result.hpp).
#pragma once

#include "common/log.hpp"
#include "xenprobes/result.hpp"

namespace xenprobes {

// Builds the error side of a Result: `return fail(Errc::Fault, "gva 0x... not mapped")`.
inline std::unexpected<Error> fail(Errc code, std::string what) {
  return std::unexpected<Error>(Error{code, std::move(what)});
}

// Maps an errno (from a failed system or Xen call) to an Errc; unknown ones become Io.
Errc errc_from_errno(int e);

// "what: strerror(e)" helper for wrapping failed system calls.
std::unexpected<Error> fail_errno(int e, std::string what);

// A step whose failure the caller can do nothing about and that must not stop what follows
// (tearing down what a domain that may be gone already had, a refresh the next call tries
// again): its error is logged at `level` with `what` was tried, never dropped unseen. Debug by
// default: tearing down a destroyed domain fails at every step, as expected.
template <typename T>
void best_effort(const std::expected<T, Error>& r, const char* what, log::Level level = log::Level::Debug) {
  if (!r && level >= log::level()) log::write(level, "%s: %s", what, r.error().what.c_str());
}

namespace detail {
template <typename T>
T take_value(std::expected<T, Error>&& r) {
  return std::move(*r);
}
inline void take_value(std::expected<void, Error>&&) {}
}  // namespace detail

}  // namespace xenprobes

// Propagates the error of a Result-returning expression; yields its value otherwise.
// (GNU statement expression: g++ and clang both accept it.)
#define XP_TRY(expr)                                                      \
  ({                                                                      \
    auto&& xp_try_r_ = (expr);                                            \
    if (!xp_try_r_) return std::unexpected(std::move(xp_try_r_.error())); \
    ::xenprobes::detail::take_value(std::move(xp_try_r_));                \
  })
