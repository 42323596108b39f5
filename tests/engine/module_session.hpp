// The module guest (module_guest.hpp) under a probing session on the simulated Xen: what the
// engine's module tests start from (jump_module_test.cpp, module_refresh_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>

#include "engine/engine_fixture.hpp"
#include "engine/module_guest.hpp"

namespace xenprobes::testing {

// The demo guest's domain running the module guest's image.
inline hv::sim::DomainConfig module_config(const ModuleGuest& g, std::uint64_t iterations) {
  hv::sim::DomainConfig c = demo_config(1, iterations);
  c.image = g.image;
  return c;
}

// ModuleSession: the module guest made with `split`, its domain running `iterations` workload
// iterations (`tweak` changes its config), its symbols loaded into the session, and `w` to act
// as the guest's kernel (w.load() puts the module in its list). Writer::Own: `w` writes through
// a hypervisor handle of its own, for tests in which the session dies while the guest goes on.
struct ModuleSession {
  enum class Writer { Session, Own };
  using Tweak = std::function<void(hv::sim::DomainConfig&)>;

  ModuleGuest mg;
  ProbedGuest g;
  Session& s;
  std::unique_ptr<hv::Hypervisor> own;
  ModuleWriter w;

  explicit ModuleSession(Split split, std::uint64_t iterations, const Tweak& tweak = {},
                         Writer writer = Writer::Session)
      : g(config(mg, split, iterations, tweak)),
        s(with_symbols(*g.session, g.dom, mg.map)),
        own(writer == Writer::Own ? g.host->open() : nullptr),
        w(own ? *own : s.hypervisor(), g.dom, mg) {}

 private:
  static hv::sim::DomainConfig config(ModuleGuest& mg, Split split, std::uint64_t iterations, const Tweak& tweak) {
    make_module_guest(mg, split);
    hv::sim::DomainConfig c = module_config(mg, iterations);
    if (tweak) tweak(c);
    return c;
  }
  static Session& with_symbols(Session& s, DomId dom, const std::string& map) {
    if (auto r = s.load_symbols(dom, map); !r) throw std::runtime_error("load_symbols: " + r.error().what);
    return s;
  }
};

}  // namespace xenprobes::testing
