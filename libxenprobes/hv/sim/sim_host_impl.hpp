// SimHostImpl (the simulated host) and SimXenHandle (one Dom0 process's Hypervisor handle).
// Locking: one host mutex (mu_) guards all host, domain and handle state; the per-domain
// scheduler threads drop it only while Unicorn executes guest code.
#pragma once

#include <array>
#include <list>
#include <optional>

#include "hv/sim/sim_internal.hpp"

namespace xenprobes::hv::sim {

class PageTableBuilder;

class SimHostImpl final : public SimHost {
 public:
  explicit SimHostImpl(SimOptions);
  ~SimHostImpl() override;

  Result<DomId> create_domain(const DomainConfig&) override;
  Result<void> destroy_domain(DomId) override;
  Result<void> crash_domain(DomId, const std::string& why) override;
  std::unique_ptr<Hypervisor> open() override;
  Result<GuestLayout> layout(DomId) override;
  Result<std::uint64_t> symbol(DomId, const std::string&) override;
  Result<void> peek(DomId, std::uint64_t va, std::span<std::byte> out) override;
  std::string console(DomId) override;
  std::string crash_reason(DomId) override;
  bool wait_halted(DomId, std::chrono::milliseconds) override;
  void fail_op(Op, Errc, unsigned skip, unsigned count) override;
  void fail_nth_call(std::uint64_t n, Errc) override;
  void fail_from_call(std::uint64_t n, Errc) override;
  void clear_faults() override;
  std::uint64_t op_count(Op) const override;
  std::uint64_t total_calls() const override;
  void reset_counts() override;
  Result<void> advance_clock(std::chrono::milliseconds) override;
  Result<unsigned> pause_count(DomId) override;
  Result<std::uint64_t> executions(DomId, std::uint64_t va) override;
  Result<std::uint32_t> guest_evtchn_alloc_unbound(DomId) override;
  Result<void> guest_evtchn_notify(DomId, std::uint32_t port) override;
  Result<std::uint64_t> guest_evtchn_notifications(DomId, std::uint32_t port) override;
  Result<ModuleNotifications> module_notifications(DomId) override;
  Result<void> hold_module_hits(DomId, VcpuId, bool hold) override;
  Result<void> set_module_wait_budget(DomId, std::chrono::milliseconds) override;
  Result<void> vcpu_switched(DomId, VcpuId) override;
  Result<std::uint64_t> module_over_budget(DomId) override;
  Result<unsigned> module_detach(DomId) override;
  Result<void> set_module_hook_calls(DomId, std::vector<std::uint64_t> functions, bool publish) override;
  // The calls of the module's hit path (sim_module_nested.cpp), with nested hits in them
  // handled: false once the domain crashed.
  bool module_hook_calls_locked(Domain&, Vcpu&);
  Result<void> set_module_release_wait(DomId, std::chrono::milliseconds) override;
  Result<ModuleRelease> module_unload(DomId) override;
  Result<std::uint64_t> module_freed_bytes_written(DomId) override;
  Result<unsigned> writable_mappings(DomId, std::uint64_t va) override;
  // One look of the detach at Dom0's hold (sim_module_release.cpp): decides when it can.
  void module_release_look_locked(Domain&);
  // The module's restore pass (sim_module_text.cpp): how many bytes and regions it restored.
  unsigned module_restore_locked(Domain&);
  // The module wrote [p, p + len) of guest text: the vCPUs' translated blocks of it go.
  void module_poked_locked(Domain&, std::uint8_t* p, std::size_t len);
  Result<unsigned> module_state(DomId, const std::string& name, std::uint64_t text_base, bool going) override;
  Result<bool> module_hit_held(DomId, VcpuId) override;

 private:
  friend class SimXenHandle;
  friend class SimRing;

  struct Fault {
    Op op;
    Errc code;
    unsigned skip, count;
  };
  struct Watch {
    SimXenHandle* handle;
    std::string path, token;
  };

  Result<void> check(Op);
  Result<Domain*> dom(DomId);
  Result<Vcpu*> vcpu(Domain&, VcpuId);
  Result<void> setup_engine(Domain&, Vcpu&);

  static void hook_intr(uc_engine*, std::uint32_t intno, void* ud);
  static void hook_block(uc_engine*, std::uint64_t addr, std::uint32_t size, void* ud);
  static void hook_code(uc_engine*, std::uint64_t addr, std::uint32_t size, void* ud);
  static void hook_out(uc_engine*, std::uint32_t port, int size, std::uint32_t value, void* ud);

  bool runnable(const Domain&, const Vcpu&) const;
  void run_domain(Domain&);
  void handle_exit(Domain&, Vcpu&, uc_err);
  void trap(Domain&, Vcpu&, TrapKind, std::uint64_t rip);
  void crash(Domain&, const std::string& why);
  void emulate_one(Domain&, Vcpu&);
  void sync_code_writes(Domain&);
  void post_request_locked(Domain&, Vcpu&, const VmEventRequest&);
  std::uint64_t guest_gfn_of_va(const Domain&, std::uint64_t va) const;
  void stop_vcpu_locked(std::unique_lock<std::mutex>&, Domain&, Vcpu&);
  void resume_vcpu_locked(Vcpu&);
  VcpuRegs read_regs(const Domain&, const Vcpu&) const;
  void write_regs(Vcpu&, const VcpuRegs&, bool debugregs);
  void raise_virq_locked(unsigned virq);
  void fire_watches_locked(const std::string& path, bool removal);
  void module_oea_request_locked(Domain&, const std::string& value);

  // The guest module's side of the guest channel (sim_module.cpp; protocol.h).
  // At creation: the control area at `gpa`, mapped in the guest's page tables.
  Result<void> module_create_control(Domain&, PageTableBuilder&, std::uint64_t gpa);
  // The fixup slots (one executable page at `va`) and their entries (the next page, writable).
  Result<void> module_create_fixup_slots(Domain&, PageTableBuilder&, std::uint64_t va, std::uint64_t gpa);
  Result<void> module_create_jump_entry(Domain&, PageTableBuilder&, std::uint64_t va, std::uint64_t gpa);
  Result<void> module_create_rings(Domain&, PageTableBuilder&, std::uint64_t va, std::uint64_t gpa);
  // An async jump hit (protocol.h "Async jump probes"): the record into the vCPU's ring.
  void module_async_locked(Domain&, Vcpu&, const xenprobes_trap&, const VcpuRegs&);
  // A detour's call reached the jump entry (protocol.h, "Jump probes"): the hit, or on at once.
  void module_jump_locked(Domain&, Vcpu&);
  // Steps 1 and 2 of a hit for the trap entry `e` (an int3's, or a jump's JUMP entry whose hit
  // resumes at `jump_ret`; 0 for an int3): the mailbox, the notification, the vCPU's wait.
  void module_publish_hit_locked(Domain&, Vcpu&, const xenprobes_trap& e, const VcpuRegs& r, std::uint64_t jump_ret);
  // Before a hit goes to a mailbox: whether v's waiting budget is spent (then counted).
  bool module_over_budget_locked(Domain&, Vcpu&);
  // Allocates the port and writes control/addr, control/pages and evtchn under `dir`.
  void module_publish_locked(Domain&, const std::string& dir);
  // The module's int3 hook; rip is after the int3. False: not the module's (the kernel's own).
  bool module_int3_locked(Domain&, Vcpu&, std::uint64_t rip);
  // Scheduler: answers, timeouts and quiescence for the domain's waiting vCPUs.
  void module_poll_locked(Domain&);
  // When the scheduler must look again although nothing else happens (the earliest timeout).
  std::optional<ModuleClock::time_point> module_deadline_locked(const Domain&) const;
  void module_quiesce_request_locked(Domain&, const std::string& value);
  void module_give_up_locked(Domain&, Vcpu&);  // timeout: ABANDONED and the fallback, unless claimed
  // protocol.h, "Return slots written by the module" (sim_module_return.cpp): step 1's
  // stack_top and ret_slot, and the write a taken answer asks for (hit_rsp: the hit's rsp).
  void module_ret_publish_locked(Domain&, std::uint8_t* mailbox, std::uint64_t rsp);
  void module_ret_apply_locked(Domain&, std::uint8_t* mailbox, std::uint64_t hit_rsp);
  void module_fallback_locked(Domain&, Vcpu&, const xenprobes_trap&, VcpuRegs);
  void module_disarm_locked(Domain&);  // Dom0 declared gone
  bool module_quiescent_locked(Domain&);

  SimOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<ModuleClock> clock_;  // the guest module's (guarded by mu_)
  std::uint64_t clock_advances_ = 0;    // advance_clock calls so far
  std::map<DomId, std::unique_ptr<Domain>> domains_;
  std::uint32_t next_domid_ = 1;
  std::map<std::string, std::string> store_;
  std::list<Watch> watches_;
  std::array<SimXenHandle*, kNrVirqs> virq_binder_{};
  std::array<EvtchnPort, kNrVirqs> virq_port_{};
  std::array<std::uint64_t, static_cast<unsigned>(Op::Count_)> counts_{};
  std::uint64_t total_calls_ = 0;
  std::vector<Fault> faults_;
  std::optional<std::pair<std::uint64_t, Errc>> nth_fault_;
  std::optional<std::pair<std::uint64_t, Errc>> from_fault_;
};

class SimXenHandle final : public Hypervisor {
 public:
  explicit SimXenHandle(std::shared_ptr<SimHostImpl> host);
  ~SimXenHandle() override;

  SimHost& host() { return *host_; }

  std::string name() const override { return "sim"; }
  Result<std::string> version() override;
  Result<Capabilities> capabilities() override;
  Result<std::vector<DomainInfo>> list_domains() override;
  Result<DomainInfo> domain_info(DomId) override;
  Result<void> pause(DomId) override;
  Result<void> unpause(DomId) override;
  Result<VcpuRegs> get_vcpu_regs(DomId, VcpuId) override;
  Result<void> set_vcpu_regs(DomId, VcpuId, const VcpuRegs&) override;
  Result<ForeignMapping> map_frames(DomId, std::span<const Frame>, MapAccess) override;
  Result<std::string> xs_read(const std::string&) override;
  Result<void> xs_write(const std::string&, const std::string&) override;
  Result<void> xs_rm(const std::string&) override;
  Result<std::vector<std::string>> xs_directory(const std::string&) override;
  Result<void> xs_grant_read(const std::string&, DomId) override;
  Result<void> xs_watch(const std::string&, const std::string&) override;
  Result<void> xs_unwatch(const std::string&, const std::string&) override;
  int xs_fd() override { return xs_fd_.fd(); }
  Result<std::vector<WatchEvent>> xs_read_watches() override;
  Result<EvtchnPort> evtchn_bind_virq(unsigned) override;
  Result<EvtchnPort> evtchn_bind_interdomain(DomId, std::uint32_t) override;
  Result<void> evtchn_unbind(EvtchnPort) override;
  Result<void> evtchn_notify(EvtchnPort) override;
  int evtchn_fd() override { return ev_fd_.fd(); }
  Result<std::optional<EvtchnPort>> evtchn_pending() override;
  Result<void> evtchn_unmask(EvtchnPort) override;
  Result<void> set_debugging(DomId, bool) override;
  Result<GdbsxStatus> gdbsx_domstatus(DomId) override;
  Result<std::unique_ptr<VmEventRing>> monitor_enable(DomId) override;
  Result<void> monitor_disable(DomId) override;
  Result<void> monitor_software_breakpoint(DomId, bool) override;
  Result<void> monitor_debug_exceptions(DomId, bool, bool) override;
  Result<void> monitor_recover(DomId) override;
  Result<void> inject_event(DomId, VcpuId, std::uint8_t, std::uint8_t, std::uint32_t, std::uint8_t) override;

  // Called by the host with its mutex held.
  void queue_watch(WatchEvent e);
  void raise_port(EvtchnPort p);
  void ring_signal() { ring_fd_.signal(); }
  void peer_gone(EvtchnPort p);

  // Used by SimRing (host mutex NOT held).
  Result<std::optional<VmEventRequest>> ring_get(DomId);
  Result<void> ring_put(DomId, const VmEventResponse&);
  Result<void> ring_notify(DomId);
  int ring_fd() const { return ring_fd_.fd(); }

 private:
  struct Port {
    enum class Kind { Virq, Interdomain } kind;
    unsigned virq = 0;
    DomId dom;
    std::uint32_t remote = 0;
    bool pending = false, masked = false, dead = false;
  };
  DomainInfo info_locked(const Domain&) const;

  std::shared_ptr<SimHostImpl> host_;
  EventFd xs_fd_, ev_fd_, ring_fd_;
  std::deque<WatchEvent> watch_queue_;
  std::map<EvtchnPort, Port> ports_;
  std::deque<EvtchnPort> pending_queue_;
  EvtchnPort next_port_ = 1;
};

}  // namespace xenprobes::hv::sim
