// Internal to SimXenHandle's files (hv/sim/sim_xen*.cpp): the helpers they share. Not
// installed.
#pragma once

#include <string>

#include "common/types.hpp"

namespace xenprobes::hv::sim {

inline std::string dstr(DomId d) { return std::to_string(d.value); }

}  // namespace xenprobes::hv::sim
