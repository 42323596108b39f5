// libxenforeignmemory: the only file of the backend that includes xenforeignmemory.h.
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include <xenforeignmemory.h>
}

#include "common/log.hpp"
#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv::xen {

Result<std::shared_ptr<ForeignMemory>> ForeignMemory::open() {
  xenforeignmemory_handle* h = xenforeignmemory_open(quiet_logger(), 0);
  if (!h) {
    int e = errno;
    if (e == EACCES || e == EPERM)
      return fail(Errc::Permission, "xenforeignmemory_open: permission denied: run as root in Dom0");
    return fail_errno(e, "xenforeignmemory_open");
  }
  return std::shared_ptr<ForeignMemory>(new ForeignMemory(h));
}

ForeignMemory::~ForeignMemory() { xenforeignmemory_close(h_); }

Result<ForeignMapping> ForeignMemory::map(DomId dom, std::span<const Frame> frames, MapAccess access) {
  const std::string call = "xenforeignmemory_map(dom" + std::to_string(dom.value) + ")";
  if (frames.empty()) return fail(Errc::InvalidArgument, call + ": no frames");
  std::vector<xen_pfn_t> arr(frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i) arr[i] = frames[i].value;
  std::vector<int> err(frames.size(), 0);
  const int prot = access == MapAccess::ReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;

  void* p = xenforeignmemory_map(h_, dom.value, prot, arr.size(), arr.data(), err.data());
  if (!p) return fail_errno(errno, call);  // nothing was attempted; err[] is not valid

  // With err[] given, the call may "succeed" with some pages unmapped: check each one.
  for (std::size_t i = 0; i < err.size(); ++i) {
    if (err[i] == 0) continue;
    int e = err[i] < 0 ? -err[i] : err[i];  // documented as errno values; be liberal
    xenforeignmemory_unmap(h_, p, arr.size());
    char what[96];
    std::snprintf(what, sizeof what,
                  ": frame 0x%llx (index %zu of %zu) not mapped: ", static_cast<unsigned long long>(arr[i]), i,
                  arr.size());
    return fail(Errc::Fault, call + what + std::strerror(e));
  }

  // The deleter owns a reference to this handle: unmapping after the Hypervisor is gone works.
  auto self = shared_from_this();
  return ForeignMapping(static_cast<std::byte*>(p), arr.size(), [self](std::byte* data, std::size_t pages) {
    if (xenforeignmemory_unmap(self->h_, data, pages) < 0)
      XP_LOG(Warn, "xenforeignmemory_unmap(%p, %zu pages): %s", static_cast<void*>(data), pages, std::strerror(errno));
  });
}

}  // namespace xenprobes::hv::xen
