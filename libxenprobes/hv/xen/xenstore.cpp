// libxenstore: the only file of the backend that includes xenstore.h.
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

extern "C" {
#include <xenstore.h>
}

#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv::xen {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

std::string on_path(const char* call, const std::string& path) { return std::string(call) + "(" + path + ")"; }

}  // namespace

Result<std::unique_ptr<XsClient>> XsClient::open() {
  xs_handle* h = xs_open(0);
  if (!h) return fail_errno(errno, "xs_open (is xenstored running?)");
  return std::unique_ptr<XsClient>(new XsClient(h));
}

XsClient::~XsClient() { xs_close(h_); }

Result<std::string> XsClient::read(const std::string& path) {
  unsigned len = 0;
  std::unique_ptr<void, FreeDeleter> v(xs_read(h_, XBT_NULL, path.c_str(), &len));
  if (!v) return fail_errno(errno, on_path("xs_read", path));
  return std::string(static_cast<const char*>(v.get()), len);
}

Result<void> XsClient::write(const std::string& path, const std::string& value) {
  if (!xs_write(h_, XBT_NULL, path.c_str(), value.data(), value.size()))
    return fail_errno(errno, on_path("xs_write", path));
  return {};
}

Result<void> XsClient::rm(const std::string& path) {
  if (!xs_rm(h_, XBT_NULL, path.c_str())) return fail_errno(errno, on_path("xs_rm", path));
  return {};
}

Result<std::vector<std::string>> XsClient::directory(const std::string& path) {
  unsigned num = 0;
  // One allocation holds the array and the strings (xenstore.h): one free().
  std::unique_ptr<char*, FreeDeleter> d(xs_directory(h_, XBT_NULL, path.c_str(), &num));
  if (!d) return fail_errno(errno, on_path("xs_directory", path));
  std::vector<std::string> out;
  out.reserve(num);
  for (unsigned i = 0; i < num; ++i) out.emplace_back(d.get()[i]);
  return out;
}

Result<void> XsClient::grant_read(const std::string& path, DomId reader) {
  // The first entry is the owner and the default for everyone else (docs/misc/xenstore.txt in
  // Xen's tree; perm_for_conn in tools/xenstore/xenstored_core.c, `other` in oxenstored's
  // perms.ml): Dom0 owns the node, nobody else has access, then `reader` gets read access.
  xs_permissions perms[2] = {{0, XS_PERM_NONE}, {reader.value, XS_PERM_READ}};
  if (!xs_set_permissions(h_, XBT_NULL, path.c_str(), perms, 2))
    return fail_errno(errno, on_path("xs_set_permissions", path) + " for dom" + std::to_string(reader.value));
  return {};
}

Result<void> XsClient::watch(const std::string& path, const std::string& token) {
  if (!xs_watch(h_, path.c_str(), token.c_str())) return fail_errno(errno, on_path("xs_watch", path));
  return {};
}

Result<void> XsClient::unwatch(const std::string& path, const std::string& token) {
  if (!xs_unwatch(h_, path.c_str(), token.c_str())) return fail_errno(errno, on_path("xs_unwatch", path));
  return {};
}

int XsClient::fd() { return xs_fileno(h_); }

Result<std::vector<WatchEvent>> XsClient::read_watches() {
  std::lock_guard lk(watch_mu_);
  std::vector<WatchEvent> out;
  // xenstore.h: call xs_check_watch until it returns NULL with EAGAIN; the fd may stop being
  // readable before the queue is empty.
  for (;;) {
    errno = 0;
    std::unique_ptr<char*, FreeDeleter> w(xs_check_watch(h_));
    if (!w) {
      int e = errno;
      if (e == EAGAIN || e == 0) break;
      return fail_errno(e, "xs_check_watch");
    }
    out.push_back({w.get()[XS_WATCH_PATH], w.get()[XS_WATCH_TOKEN]});
  }
  return out;
}

}  // namespace xenprobes::hv::xen
