// hook-path/* (include/xenprobes/protocol.h): the kernel functions the guest module's own hit
// path calls out to, each an address the module took itself. Hostile input like every other
// key: a bounded count, strict hex, canonical upper-half addresses; the set is taken whole or
// refused whole.
#include <algorithm>
#include <cstdio>
#include <string>

#include "guestmod/module_info.hpp"

namespace xenprobes::guestmod {

namespace {

std::string bad(const std::string& path, std::string_view value, std::string_view why) {
  return "xenstore key " + path + " = '" + sanitize(value) + "': " + std::string(why);
}

}  // namespace

Result<std::optional<std::vector<std::uint64_t>>> read_hook_path(hv::Hypervisor& hv, DomId dom) {
  const std::string cpath = module_key(dom, XENPROBES_XS_HOOK_PATH_COUNT);
  auto count_value = hv.xs_read(cpath);
  if (!count_value) {
    if (count_value.error().code != Errc::NotFound)
      return fail(count_value.error().code, "reading xenstore key " + cpath + ": " + count_value.error().what);
    // No count: an older module, unless an entry is there without it.
    char key[32];
    std::snprintf(key, sizeof key, XENPROBES_XS_HOOK_PATH_FMT, 0u);
    const std::string first = module_key(dom, key);
    auto e = hv.xs_read(first);
    if (e) return fail(Errc::InvalidArgument, "xenstore key " + first + " is there without " + cpath);
    if (e.error().code != Errc::NotFound)
      return fail(e.error().code, "reading xenstore key " + first + ": " + e.error().what);
    return std::optional<std::vector<std::uint64_t>>{};
  }
  auto count = parse_decimal(*count_value, XENPROBES_HOOK_PATH_MAX);
  if (!count)
    return fail(Errc::InvalidArgument,
                bad(cpath, *count_value, "not a decimal number up to " + std::to_string(XENPROBES_HOOK_PATH_MAX)));
  std::vector<std::uint64_t> out;
  out.reserve(*count);
  for (unsigned i = 0; i < *count; ++i) {
    char key[32];
    std::snprintf(key, sizeof key, XENPROBES_XS_HOOK_PATH_FMT, i);
    const std::string path = module_key(dom, key);
    auto v = hv.xs_read(path);
    if (!v) {
      if (v.error().code == Errc::NotFound)
        return fail(Errc::InvalidArgument,
                    "xenstore key " + path + " is missing although " + cpath + " is " + std::to_string(*count));
      return fail(v.error().code, "reading xenstore key " + path + ": " + v.error().what);
    }
    auto a = parse_hex(*v);
    if (!a) return fail(Errc::InvalidArgument, bad(path, *v, "not a 0x-prefixed 64-bit hex address"));
    if (*a < kUpperHalfStart) return fail(Errc::InvalidArgument, bad(path, *v, "not a kernel (upper-half) address"));
    out.push_back(*a);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return std::optional<std::vector<std::uint64_t>>{std::move(out)};
}

}  // namespace xenprobes::guestmod
