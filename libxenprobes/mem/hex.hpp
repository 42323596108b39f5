// Internal: mem's name for the shared hex formatter.
#pragma once

#include "common/hex.hpp"

namespace xenprobes::mem::detail {
using xenprobes::hex;
}  // namespace xenprobes::mem::detail
