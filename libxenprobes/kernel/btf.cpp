#include "kernel/btf.hpp"

#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <cerrno>
#include <cstring>
#include <linux/btf.h>

#include "common/hex.hpp"

namespace xenprobes::kernel {
namespace {

Result<std::uint64_t> unique_address(const symbols::SymbolTable& syms, const char* name) {
  auto r = syms.lookup(name);
  if (!r)
    return fail(Errc::NotFound, std::string("no ") + name + " in " + syms.source() +
                                    ": the guest kernel was built without CONFIG_DEBUG_INFO_BTF, or these symbols "
                                    "are not its own");
  if (r->size() != 1)
    return fail(Errc::InvalidArgument, std::string(name) + " is at several addresses in " + syms.source());
  return r->front().address.value;
}

}  // namespace

Result<std::uint32_t> validate_btf(const std::vector<std::byte>& blob) {
  btf_header h;
  if (blob.size() < sizeof h)
    return fail(Errc::Io, "the BTF is " + std::to_string(blob.size()) + " bytes, shorter than its header");
  std::memcpy(&h, blob.data(), sizeof h);
  if (h.magic != BTF_MAGIC)
    return fail(Errc::Io, "the BTF starts with " + hex(h.magic) + ", not the BTF magic " + hex(BTF_MAGIC) +
                              " (a big-endian or foreign kernel, or not BTF at all)");
  if (h.version != BTF_VERSION)
    return fail(Errc::Io, "BTF version " + std::to_string(h.version) + " is not the version libbpf reads (" +
                              std::to_string(BTF_VERSION) + ")");
  // libbpf checks everything else: header length, section bounds, every type and name.
  errno = 0;
  btf* b = btf__new(blob.data(), static_cast<__u32>(blob.size()));
  if (int err = static_cast<int>(libbpf_get_error(b)); err != 0 || !b)
    return fail(Errc::Io, std::string("libbpf rejects the guest kernel's BTF: ") + std::strerror(err ? -err : errno));
  const std::uint32_t n = btf__type_cnt(b);
  btf__free(b);
  return n;
}

Result<std::vector<std::byte>> read_kernel_btf(const symbols::SymbolTable& syms, const ReadFn& read,
                                               std::uint64_t max_bytes) {
  const std::uint64_t start = XP_TRY(unique_address(syms, "__start_BTF"));
  const std::uint64_t stop = XP_TRY(unique_address(syms, "__stop_BTF"));
  if (stop <= start)
    return fail(Errc::InvalidArgument,
                "__stop_BTF (" + hex(stop) + ") is not above __start_BTF (" + hex(start) + ") in " + syms.source());
  if (stop - start > max_bytes)
    return fail(Errc::InvalidArgument, "the guest kernel's BTF would be " + std::to_string(stop - start) +
                                           " bytes, more than the limit of " + std::to_string(max_bytes) +
                                           ": the symbols are wrong, or raise the limit");
  std::vector<std::byte> blob(stop - start);
  constexpr std::uint64_t kChunk = 1ull << 20;
  for (std::uint64_t off = 0; off < blob.size(); off += kChunk) {
    const std::uint64_t n = std::min<std::uint64_t>(kChunk, blob.size() - off);
    if (auto r = read(Gva{start + off}, std::span(blob.data() + off, n)); !r)
      return fail(r.error().code, "cannot read the guest kernel's BTF at " + hex(start + off) + ": " + r.error().what);
  }
  XP_TRY(validate_btf(blob));
  return blob;
}

}  // namespace xenprobes::kernel
