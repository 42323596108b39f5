// The engine's private classes, shared by its source files (probe/engine*.cpp): not a header
// for anyone else.
#pragma once

#include <algorithm>
#include <utility>

#include "common/hex.hpp"
#include "common/log.hpp"
#include "probe/engine.hpp"

namespace xenprobes::probe {

// Holds one pause of a domain for its lifetime; nested holds pause Xen only once. A failed
// unpause is retried: leaving a guest paused is the one failure a probe must never cause.
class Engine::Pause {
 public:
  static Result<Pause> take(Engine& e, Domain& d) {
    XP_TRY(e.pause(d));
    return Pause(e, d);
  }
  Pause(Pause&& o) noexcept : e_(o.e_), d_(std::exchange(o.d_, nullptr)) {}
  Pause& operator=(Pause&&) = delete;
  ~Pause() {
    if (d_ && !e_.unpause(*d_)) return;  // unpause() logged it: a destructor has nobody else to tell
  }

 private:
  Pause(Engine& e, Domain& d) : e_(e), d_(&d) {}
  Engine& e_;
  Domain* d_;
};

class Engine::Ctx final : public HitContext {
 public:
  Ctx(Engine& e, Domain& d, const channel::Stop& s, Regs& regs, Gva addr)
      : e_(e), d_(d), vcpu_(s.vcpu), regs_(regs), addr_(addr) {}
  DomId domain() const override { return d_.id; }
  VcpuId vcpu() const override { return vcpu_; }
  Gva address() const override { return addr_; }
  Regs& regs() override { return regs_; }
  Result<void> read(Gva va, std::span<std::byte> out) override {
    XP_TRY(e_.hit_memory(d_));
    XP_TRY(e_.settle_ret_write(d_, va.value, out.size()));
    return d_.memory->read(va, out);
  }
  // Handlers write stacks and data the guest frees and reuses: no writable mapping stays.
  Result<void> write(Gva va, std::span<const std::byte> data) override {
    XP_TRY(e_.hit_memory(d_));
    XP_TRY(e_.settle_ret_write(d_, va.value, data.size()));
    return d_.memory->write_transient(va, data);
  }
  Result<std::uint64_t> read_u64(Gva va) override {
    XP_TRY(e_.hit_memory(d_));
    XP_TRY(e_.settle_ret_write(d_, va.value, 8));
    return d_.memory->read_u64(va);
  }
  Result<std::string> read_string(Gva va, std::size_t max_len) override {
    XP_TRY(e_.hit_memory(d_));
    XP_TRY(e_.settle_ret_write(d_, va.value, max_len + 1));
    return d_.memory->read_string(va, max_len);
  }
  Result<std::uint64_t> kernel_gs_base() override {
    XP_TRY(e_.hit_memory(d_));
    return e_.hit_gs_base_;
  }
  void stop() override { e_.request_stop(); }

 private:
  Engine& e_;
  Domain& d_;
  VcpuId vcpu_;
  Regs& regs_;
  Gva addr_;
};

}  // namespace xenprobes::probe
