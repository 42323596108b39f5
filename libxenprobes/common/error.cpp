#include "common/result.hpp"

#include <cstring>

namespace xenprobes {

Errc errc_from_errno(int e) {
  switch (e) {
    case EINVAL:
    case ESRCH:
    case EFAULT:
    case EILSEQ:
    case EBUSY:
    case ERANGE:
    case EEXIST:
    case ENOSPC:
    case EOPNOTSUPP:
    case ENOSYS:
    case EAGAIN:
    case ENOENT:
    case EPERM:
    case EIO:
    case ENOMEM:
    case ETIMEDOUT: return static_cast<Errc>(e);
    case EACCES: return Errc::Permission;
    default: return Errc::Io;
  }
}

std::unexpected<Error> fail_errno(int e, std::string what) {
  what += ": ";
  what += std::strerror(e);
  return fail(errc_from_errno(e), std::move(what));
}

const char* errc_name(Errc c) {
  switch (c) {
    case Errc::InvalidArgument: return "EINVAL";
    case Errc::NoSuchDomain: return "ESRCH";
    case Errc::Fault: return "EFAULT";
    case Errc::IllegalSequence: return "EILSEQ";
    case Errc::Busy: return "EBUSY";
    case Errc::Range: return "ERANGE";
    case Errc::Exists: return "EEXIST";
    case Errc::NoSpace: return "ENOSPC";
    case Errc::NotSupported: return "EOPNOTSUPP";
    case Errc::NoSys: return "ENOSYS";
    case Errc::Again: return "EAGAIN";
    case Errc::NotFound: return "ENOENT";
    case Errc::Permission: return "EPERM";
    case Errc::Io: return "EIO";
    case Errc::NoMemory: return "ENOMEM";
    case Errc::TimedOut: return "ETIMEDOUT";
  }
  return "E?";
}

}  // namespace xenprobes
