// What xpe2e-probe safety's hazard classes share (the command, cmd_safety(), and these helpers
// are in xpe2e_safety.cpp; the classes in xpe2e_safety_extable.cpp, xpe2e_safety_patched.cpp
// and xpe2e_safety_hookpath.cpp): the kernel's symbols, its linker-bounded tables read from
// guest memory, the probes armed for a phase, and the guest's phases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_kallsyms.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

// A symbol from kallsyms, else from the System.map (whose source is named in the detail).
struct SymSource {
  const Kallsyms* kallsyms;
  const Kallsyms* map;  // may be empty
  std::optional<std::uint64_t> addr(const std::string& name, std::string* from = nullptr) const {
    if (auto a = kallsyms->addr(name)) {
      if (from) *from = kallsyms->source;
      return a;
    }
    if (map && !map->all.empty())
      if (auto a = map->addr(name)) {
        if (from) *from = map->source;
        return a;
      }
    return std::nullopt;
  }
};

std::optional<std::vector<std::byte>> read_table(hv::Hypervisor& hv, DomId dom, const SymSource& syms,
                                                 const char* start_sym, const char* stop_sym, std::uint64_t* start,
                                                 std::string* why);
std::int32_t s32_at(const std::vector<std::byte>& t, std::size_t off);
std::int64_t s64_at(const std::vector<std::byte>& t, std::size_t off);

// Counts per probe point, by address (handlers find their counter through HitContext).
extern std::map<std::uint64_t, std::uint64_t> g_safety_hits;
PreHandler safety_counter();

struct Armed {
  std::string what;
  Gva at;
  Probe probe;
};

bool expect_refused(const std::string& name, Result<Probe> r, const std::string& rule, const std::string& what, Gva at,
                    std::vector<Armed>& armed);
std::optional<std::string> safety_phase(Session& s, DomId dom, int i, const std::string& phase, int seconds,
                                        const std::function<void()>& cap = {});
bool phase_checks(hv::Hypervisor& hv, DomId dom, const std::string& tag, const std::optional<std::string>& res);
void unregister_all(std::vector<Armed>& armed, const std::string& tag);

struct SafetyCtx {
  Session& s;
  DomId dom;
  const Kallsyms& ks;
  SymSource syms;
  std::string channel;
  int timeout_s;
  int phase = 0;  // the guest's phase counter
  bool dead = false;
  bool unloaded = false;  // a phase unloaded the guest module (slotunload)
};

// The hazard classes, as cmd_safety() runs them by their --hazards names.
// xpe2e_safety_extable.cpp:
void hazard_extable(SafetyCtx& x);
void hazard_slotunload(SafetyCtx& x);
// xpe2e_safety_patched.cpp:
void hazard_statickey(SafetyCtx& x);
void hazard_ftrace(SafetyCtx& x);
// xpe2e_safety_hookpath.cpp:
void hazard_hookpath(SafetyCtx& x, const std::string& only);

}  // namespace xpe2e::probe
