// Must NOT compile cleanly: a probe registered and its Result dropped on the floor would be
// unregistered again at the end of the statement, silently (tests/capi/CMakeLists.txt).
#include "xenprobes/xenprobes.hpp"

void discards(xenprobes::Session& s) {
  s.probe(xenprobes::DomId{1}, "sys_read", [](xenprobes::HitContext&) { return 0; });
}
