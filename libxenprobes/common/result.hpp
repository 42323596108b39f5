// Result<T>: every fallible internal operation returns one (std::expected).
// Errc values are errno values, so the C API can hand them out unchanged.
#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <utility>

namespace xenprobes {

// Error codes, one per errno the library documents (see include/xenprobes/xenprobes.h).
enum class Errc : int {
  InvalidArgument = EINVAL,   // bad argument
  NoSuchDomain = ESRCH,       // domain absent or gone
  Fault = EFAULT,             // guest page not present / address not mapped
  IllegalSequence = EILSEQ,   // undecodable or not an instruction boundary
  Busy = EBUSY,               // reserved, foreign breakpoint, or already patched
  Range = ERANGE,             // displacement out of reach
  Exists = EEXIST,            // duplicate
  NoSpace = ENOSPC,           // no slot / ring full
  NotSupported = EOPNOTSUPP,  // backend or hypervisor lacks the feature
  NoSys = ENOSYS,             // hypercall not built into this hypervisor
  Again = EAGAIN,             // try again (guest busy, nothing pending)
  NotFound = ENOENT,          // key / symbol / file absent
  Permission = EPERM,         // not privileged
  Io = EIO,                   // the hypervisor or the guest answered nonsense
  NoMemory = ENOMEM,
  TimedOut = ETIMEDOUT,
};

struct Error {
  Errc code = Errc::Io;
  std::string what;  // one sentence: what failed, and what to do about it

  int errno_value() const { return static_cast<int>(code); }
};

template <typename T>
using Result = std::expected<T, Error>;

// Builds the error side of a Result: `return fail(Errc::Fault, "gva 0x... not mapped")`.
inline std::unexpected<Error> fail(Errc code, std::string what) {
  return std::unexpected<Error>(Error{code, std::move(what)});
}

// Maps an errno (from a failed system or Xen call) to an Errc; unknown ones become Io.
Errc errc_from_errno(int e);

// "what: strerror(e)" helper for wrapping failed system calls.
std::unexpected<Error> fail_errno(int e, std::string what);

const char* errc_name(Errc c);

namespace detail {
template <typename T>
T take_value(std::expected<T, Error>&& r) { return std::move(*r); }
inline void take_value(std::expected<void, Error>&&) {}
}  // namespace detail

}  // namespace xenprobes

// Propagates the error of a Result-returning expression; yields its value otherwise.
// (GNU statement expression: g++ and clang both accept it.)
#define XP_TRY(expr)                                             \
  ({                                                             \
    auto&& xp_try_r_ = (expr);                                   \
    if (!xp_try_r_) return std::unexpected(std::move(xp_try_r_.error())); \
    ::xenprobes::detail::take_value(std::move(xp_try_r_));        \
  })
