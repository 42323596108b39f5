// The guest kernel's BTF (its type information, CONFIG_DEBUG_INFO_BTF) read from its memory:
// the .BTF section lies in the kernel image between __start_BTF and __stop_BTF, symbols any
// SymbolTable has (a System.map, or the guest's own kallsyms, symbols/kallsyms.hpp).
//
// Trust. The bounds come from the symbols and the bytes from the guest: the size is bounded,
// the header is checked, and the whole blob must be accepted by libbpf's own parser (btf__new,
// which checks every type, name offset and section bound) before anyone gets it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/result.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::kernel {

// Debian's 6.1 kernel has 4.2 MiB of BTF, 6.12 has 4.7 MiB.
inline constexpr std::uint64_t kMaxKernelBtfBytes = 64ull << 20;

// NotFound when the symbols have no __start_BTF / __stop_BTF (a kernel without BTF),
// InvalidArgument when they are out of order or too far apart, Fault when the memory cannot be
// read, Io when the bytes are not BTF libbpf accepts.
[[nodiscard]] Result<std::vector<std::byte>> read_kernel_btf(const symbols::SymbolTable& syms, const ReadFn& read,
                                                             std::uint64_t max_bytes = kMaxKernelBtfBytes);

// The checks read_kernel_btf applies to the bytes (header, then libbpf's parse), on their own:
// for blobs from elsewhere and for the fuzzer. Returns the number of types.
[[nodiscard]] Result<std::uint32_t> validate_btf(const std::vector<std::byte>& blob);

}  // namespace xenprobes::kernel
