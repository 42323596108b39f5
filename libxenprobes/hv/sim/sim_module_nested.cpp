// The simulated guest module's hit path calling guest code (SimHost::set_module_hook_calls),
// and the hits nested in it. A real module's exchange calls kernel functions (its clock, the
// event-channel poll and clear; protocol.h "hook-path"); a trap Dom0 put in one of them is hit
// again inside the hook. The real module's per-CPU depth guard sends such a hit on at once,
// without Dom0 (guest-module/xp_hook.c, "Nesting"): an int3 through its entry's fallback, a
// jump hit back into its detour with header.nested counted. Here the calls are real guest
// code run on the hitting vCPU's own engine, between two of its quanta, and a trap in them
// ends up below, never in module_int3_locked: depth 2, which runs no calls and asks no Dom0.
#include <cinttypes>
#include <cstring>

#include "hv/sim/sim_host_impl.hpp"

namespace xenprobes::hv::sim {
namespace {

// Where a call returns to: a page of the control area, mapped and never executed (Unicorn
// stops before running it, as uc_emu_start's `until`).
constexpr std::uint64_t kReturnTo = 0xffffffffc0000000ull;
// Bounds on one call: instructions, and nested hits in it.
constexpr std::uint64_t kMaxInstructions = 1u << 20;
constexpr unsigned kMaxNested = 64;
constexpr std::uint8_t kInt3 = 0xcc;

}  // namespace

Result<void> SimHostImpl::set_module_hook_calls(DomId id, std::vector<std::uint64_t> functions, bool publish) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  ModuleState& m = d->module;
  if (!m.present) return fail(Errc::InvalidArgument, "sim: the domain has no guest module");
  if (functions.size() > XENPROBES_HOOK_PATH_MAX)
    return fail(Errc::InvalidArgument, "sim: more hook calls than hook-path can publish");
  const std::string dir = "/local/domain/" + std::to_string(d->id.value) + "/" XENPROBES_XS_DIR "/";
  for (auto it = store_.begin(); it != store_.end();)
    it = it->first.starts_with(dir + "hook-path/") ? store_.erase(it) : std::next(it);
  if (publish) {
    store_[dir + XENPROBES_XS_HOOK_PATH_COUNT] = std::to_string(functions.size());
    for (unsigned i = 0; i < functions.size(); ++i) {
      char key[32], hex[32];
      std::snprintf(key, sizeof key, XENPROBES_XS_HOOK_PATH_FMT, i);
      std::snprintf(hex, sizeof hex, "0x%" PRIx64, functions[i]);
      store_[dir + key] = hex;
    }
  }
  m.hook_calls = std::move(functions);
  m.hook_path_published = publish;
  return {};
}

bool SimHostImpl::module_hook_calls_locked(Domain& d, Vcpu& v) {
  ModuleState& m = d.module;
  if (m.hook_calls.empty()) return true;
  std::lock_guard emu(emulation_mutex());
  const VcpuRegs hit = read_regs(d, v);
  char why[200];
  auto die = [&](std::uint64_t fn, const char* what, std::uint64_t at) {
    std::snprintf(why, sizeof why, "vcpu %u: guest module: its hook's call of 0x%" PRIx64 ": %s at 0x%" PRIx64, v.id,
                  fn, what, at);
    crash(d, why);
    cv_.notify_all();
    return false;
  };
  for (std::uint64_t fn : m.hook_calls) {
    // On the hit's stack, well below it (a real hook runs on the exception stack), with the
    // return address pushed as a call would.
    VcpuRegs r = hit;
    r.rsp = ((hit.rsp - 1024) & ~std::uint64_t{15}) - 8;
    std::uint8_t* top = guest_ptr(d, r.rsp, 8);
    if (!top) return die(fn, "no stack", r.rsp);
    std::memcpy(top, &kReturnTo, 8);
    r.rip = fn;
    write_regs(v, r, false);
    unsigned nested = 0;
    for (;;) {
      v.exit_intno = -1;
      std::uint64_t rip = 0;
      uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
      const uc_err err = uc_emu_start(v.uc, rip, kReturnTo, 0, kMaxInstructions);
      uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
      if (rip == kReturnTo) break;  // returned
      if (err != UC_ERR_OK) return die(fn, uc_strerror(err), rip);
      if (v.exit_intno != 3) return die(fn, v.exit_intno < 0 ? "did not return" : "an exception", rip);
      if (++nested > kMaxNested) return die(fn, "too many nested hits", rip);
      // Depth 2: an int3 inside the hook.
      const std::uint64_t at = rip - 1;
      VcpuRegs n = read_regs(d, v);
      if (m.jump_entry && at == m.jump_entry) {
        // A jump hit: counted, and back into its detour, whose copies run unanswered.
        const std::uint8_t* ret = guest_ptr(d, n.rsp, 8);
        if (!ret) return die(fn, "a jump hit without a stack", at);
        std::memcpy(&n.rip, ret, 8);
        n.rsp += 8;
        ++m.nested;
        publish_counters(d);
        write_regs(v, n, false);
        continue;
      }
      xenprobes_trap e{};
      if (!module_lookup(d, at, e)) {
        const std::uint8_t* b = guest_ptr(d, at, 1);
        if (b && *b != kInt3) {  // restored meanwhile: run the original byte
          n.rip = at;
          write_regs(v, n, false);
          continue;
        }
        return die(fn, "an int3 nobody owns", at);
      }
      if (e.flags == XENPROBES_TRAP_JUMP || e.flags == (XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC))
        return die(fn, "an int3 at a jump's key", at);
      n.rip = at;
      if (e.flags != XENPROBES_TRAP_REDIRECT) {
        ++m.timeouts;  // as xp_fallback() counts a nested hit
        publish_counters(d);
      }
      module_fallback_locked(d, v, e, n);
      if (d.crashed) return false;
    }
  }
  write_regs(v, hit, false);
  return true;
}

}  // namespace xenprobes::hv::sim
