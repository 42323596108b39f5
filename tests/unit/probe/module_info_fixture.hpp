// read_module_info against the simulated Xen: the demo guest publishes valid keys; each test
// corrupts them through xenstore to trip exactly one validation rule. What the tests share.
#pragma once

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <string>

#include "demo_guest.hpp"
#include "guestmod/module_info.hpp"
#include "probe/oea_pool.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::guestmod {

using testing::Dom0Guest;

inline std::string hexs(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

inline CheckMapped all_mapped() {
  return [](Gva) -> Result<void> { return {}; };
}

class ModuleInfoTest : public ::testing::Test {
 protected:
  static hv::sim::DomainConfig paused() {
    hv::sim::DomainConfig c;
    c.start_paused = true;  // nothing here needs the guest to run
    return c;
  }
  Dom0Guest g{paused()};
  hv::sim::GuestLayout layout = *g.host->layout(g.dom);

  void put(std::string_view key, const std::string& value) {
    ASSERT_TRUE(g.hv->xs_write(module_key(g.dom, key), value).has_value());
  }
  void rm(std::string_view key) { ASSERT_TRUE(g.hv->xs_rm(module_key(g.dom, key)).has_value()); }
  Result<ModuleInfo> read(const CheckMapped& cm = all_mapped()) { return read_module_info(*g.hv, g.dom, cm); }
  // Expects `code` and a message containing every one of `parts`.
  void expect_error(Errc code, std::initializer_list<std::string> parts, const CheckMapped& cm = all_mapped()) {
    auto r = read(cm);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, code) << r.error().what;
    for (const auto& p : parts)
      EXPECT_NE(r.error().what.find(p), std::string::npos) << "'" << p << "' not in: " << r.error().what;
  }
  std::string path(std::string_view key) { return module_key(g.dom, key); }
  // For tests of other keys that move the module's text or grow its area past the slots: the
  // keys that must lie inside the module's text (the fixup slots, the jump entry) go.
  void rm_text_bound_keys() {
    for (auto k : {XENPROBES_XS_FIXUP_SLOTS_ADDR, XENPROBES_XS_FIXUP_SLOTS_COUNT, XENPROBES_XS_FIXUP_SLOTS_TABLE,
                   XENPROBES_XS_JUMP_ENTRY})
      rm(k);
  }
};

// A key and the junk a test writes there.
struct Junk {
  const char* key;
  const char* value;
};

}  // namespace xenprobes::guestmod
