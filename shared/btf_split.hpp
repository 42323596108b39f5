// Split BTF over a base from bytes in memory, for the library (kernel/module_btf.cpp) and for
// xenprobe (xenprobe/btf.cpp), which links only the library's public API: one implementation
// both compile (shared/README.md).
//
// libbpf's btf__new_split would do, but Debian 12's libbpf 1.1.2 declares it without exporting
// it; btf__parse_raw_split reads a file and parses its bytes exactly as btf__new_split does
// (both end in libbpf's btf_new(data, size, base)), so the bytes go through a memfd.
#pragma once

#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <span>
#include <string>

namespace xp_shared {

// The split BTF `data` over `base` (which it refers to and must outlive it), or null with errno
// set when it cannot be written to a memfd or libbpf refuses it. Free it with btf__free.
inline btf* btf_new_split(std::span<const std::byte> data, btf* base) {
  const int fd = memfd_create("xenprobes-split-btf", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      errno = e ? e : EIO;
      return nullptr;
    }
    done += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  errno = 0;
  btf* b = btf__parse_raw_split(path.c_str(), base);
  const int e = errno;
  ::close(fd);
  if (!b || libbpf_get_error(b)) {  // libbpf 1.x returns null; an error pointer is no BTF either
    errno = e ? e : EINVAL;
    return nullptr;
  }
  return b;
}

}  // namespace xp_shared
