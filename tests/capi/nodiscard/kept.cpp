// Must compile cleanly with the same flags as discarded.cpp: the check is the attribute, not
// a broken include path (tests/capi/CMakeLists.txt).
#include "xenprobes/xenprobes.hpp"

bool keeps(xenprobes::Session& s) {
  auto p = s.probe(xenprobes::DomId{1}, "sys_read", [](xenprobes::HitContext&) { return 0; });
  return p.has_value();
}
