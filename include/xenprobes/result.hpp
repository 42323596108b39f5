// Result<T>: every fallible operation of libxenprobes returns one (std::expected<T, Error>).
// Errc values are errno values, so the C API can hand them out unchanged.
#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <utility>

#include "xenprobes/export.h"

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

// "EFAULT", "EILSEQ", … for an Errc.
XENPROBES_API const char* errc_name(Errc c);

}  // namespace xenprobes
