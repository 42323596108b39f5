// Internals of the simulated Xen shared by its .cpp files. Not installed.
#pragma once

#include <unicorn/unicorn.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/elf_image.hpp"
#include "hv/sim/sim.hpp"
#include "xenprobes/protocol.h"
#include "xp_budget.h"   // guest-module/: the module's waiting budget per CPU
#include "xp_gone.h"     // guest-module/: the module's own set of modules that went
#include "xp_release.h"  // guest-module/: whether the module may free what Dom0 maps
#include "xp_ring.h"     // guest-module/: the module's own ring producer

namespace xenprobes::hv::sim {

class SimXenHandle;

// The clock the simulated guest module measures its waits with: when a hit's timeout_ms and
// claim bound run out (sim_module.cpp). Used with the host mutex held. Real time, or a manual
// clock that only SimHost::advance_clock moves (SimOptions::manual_clock).
class ModuleClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~ModuleClock() = default;
  virtual time_point now() const = 0;
  // The scheduler, with nothing to run, waits for a notification or until the clock reaches t.
  virtual void wait_until(std::condition_variable&, std::unique_lock<std::mutex>&, time_point t) const = 0;
  virtual bool manual() const = 0;
  // Manual clocks only.
  virtual void advance(std::chrono::milliseconds) {}
};

class RealClock final : public ModuleClock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, time_point t) const override {
    cv.wait_until(lk, t);
  }
  bool manual() const override { return false; }
};

// Starts at the real time of its creation and moves only when advanced; the scheduler then
// waits for a notification only (advance_clock notifies after moving it).
class ManualClock final : public ModuleClock {
 public:
  time_point now() const override { return now_; }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, time_point) const override {
    cv.wait(lk);
  }
  bool manual() const override { return true; }
  void advance(std::chrono::milliseconds by) override { now_ += by; }

 private:
  time_point now_ = std::chrono::steady_clock::now();
};

// A pollable counter (eventfd) that handles expose as their xs/evtchn/ring fds.
class EventFd {
 public:
  EventFd();
  ~EventFd();
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  int fd() const { return fd_; }
  void signal();
  void drain();

 private:
  int fd_ = -1;
};

// Guest RAM: a memfd so that foreign mappings can alias arbitrary frames page by page,
// exactly like xenforeignmemory_map does, with real read-only protection.
struct GuestRam {
  int fd = -1;
  std::uint8_t* base = nullptr;
  std::size_t size = 0;
  ~GuestRam();
};

struct Alias {
  std::uint64_t va, gpa, len;
};

enum class TrapKind { Int3, Icebp, SingleStep };

struct Vcpu {
  unsigned id = 0;
  uc_engine* uc = nullptr;
  // Control state as Xen would report it (Unicorn runs with paging off; see sim.hpp).
  std::uint64_t cr0 = 0x80050033, cr4 = 0x6a0, efer = 0xd01, cr2 = 0;
  std::uint64_t dr6 = 0xffff0ff0, dr7 = 0x400;
  // HVM/PVH: cr3 names the user half of the top-level table pair (bit 12), as a vCPU of a
  // guest with page-table isolation does in user mode. Only what Dom0 sees: the guest itself
  // always runs on the kernel half (the demo guest has no user mode).
  bool pti_user_half = false;
  bool halted = false;
  bool done_port = false;    // wrote DEMO_PORT_DONE
  unsigned vm_pause = 0;     // paused by a vm_event request
  unsigned sync_pause = 0;   // paused by a Dom0 operation (get/set regs)
  bool grace = false;        // may run once more before a nosync domain pause lands
  unsigned gdbsx_event = 0;  // Xen's v->arch.gdbsx_vcpu_event
  bool ring_wait = false;    // waiting for a free vm_event ring slot
  VmEventRequest waiting_req;
  bool pending_emulate = false;  // a vm_event response asked to emulate emul[] at RIP
  std::array<std::uint8_t, 16> emul{};
  // Set by the Unicorn hooks during a quantum (scheduler thread only).
  int exit_intno = -1;
  bool quantum_expired = false;
  std::uint64_t quantum_resume = 0;  // with quantum_expired: the block not run, where to resume
  std::atomic<bool> stop_requested{false};
  std::uint64_t blocks = 0;
  std::string console;
  // Execution counting (DomainConfig::count_executions): the domain's counters, and the last
  // instruction this vCPU started.
  std::map<std::uint64_t, std::uint64_t>* executions = nullptr;
  std::uint64_t last_code = 0;
  // In the guest module's int3 hook, waiting for Dom0's answer in its mailbox (the guest
  // channel). What the hook keeps on its own stack: the seq it published, the trap entry it
  // found (for the fallback) and the registers as trapped (rip = the trap byte). The wait ends
  // at module_deadline (timeout_ms) unless Dom0 claimed the hit, then at module_claim_deadline
  // (the claim bound, protocol.h); both counted from the hit.
  bool module_wait = false;
  // The waiting budget (xp_budget.h): waits since the vCPU's last switch (SimHost::vcpu_switched).
  xp_budget module_budget{};
  std::uint64_t task_switches = 0;
  bool module_spinning = false;                                    // mailbox.spinning is 1 (cfg.module_spin_us)
  std::chrono::steady_clock::time_point module_spin_end;           // real time: when the spin runs out
  ModuleClock::time_point module_deadline, module_claim_deadline;  // on the host's ModuleClock
  std::uint32_t module_seq = 0;
  xenprobes_trap module_entry{};
  VcpuRegs module_regs;
  // A jump probe's hit (module_entry is a JUMP entry): where it resumes in the detour (the
  // return address its call pushed). module_regs.rsp is the probed instruction's, above it.
  std::uint64_t module_jump_ret = 0;
  // SimHost::hold_module_hits: hits stop after the lookup (module_held: one stands there, with
  // module_entry and module_regs as the hook found them).
  bool module_hold = false, module_held = false;
};

// The simulated guest module's own state for the guest channel. Like the real module it keeps
// the control area's layout privately and never re-reads it from the area, which Dom0 writes.
struct ModuleState {
  bool present = false;
  std::uint64_t ctl_va = 0, ctl_gpa = 0;
  unsigned ctl_pages = 0;
  std::uint32_t mailbox_offset = 0, trap_offset = 0, trap_capacity = 0, ret_offset = 0, ret_capacity = 0;
  std::uint32_t timeout_ms = 0;
  std::uint32_t port = 0;  // the unbound port published for Dom0
  unsigned waiters = 0;    // vCPUs with module_wait
  unsigned consecutive_timeouts = 0;
  bool dom0_gone = false;
  std::uint64_t hits = 0, timeouts = 0, foreign = 0;
  std::uint64_t bad_answers = 0;  // answers it could not use (resumed as if unanswered)
  bool quiesce_pending = false;
  std::string quiesce_token;
  // fixup-slots (protocol.h): the slots, in the module's text after its OEA pool, and their
  // exception-table entries on the page after them.
  std::uint64_t fixup_va = 0, fixup_table_va = 0;
  unsigned fixup_count = 0;
  // jump-entry (protocol.h): a page of the module's text after the fixup slots. The sim's
  // module code is Dom0-side C++, so the page holds int3s and a detour's call to it lands in
  // module_int3_locked, which runs the jump entry (a real module runs it without a trap).
  std::uint64_t jump_entry = 0;
  // rings/* (protocol.h "Async jump probes"): the producer state of each vCPU's ring (the
  // module's own xp_ring, pointing into guest RAM), and what async hits it refused.
  std::uint64_t rings_va = 0;
  unsigned ring_order = 0;
  std::vector<xp_ring> rings;
  std::uint64_t nested = 0, async_bad = 0;
  // Hits' notifications sent, and left out because Dom0 polled (the header's notify_skipped).
  std::uint64_t notified = 0, unnotified = 0;
  std::uint64_t wait_ns = 0, wait_max_ns = 0;    // header.wait_ns and wait_max_ns, on the ModuleClock
  std::uint64_t budget_ns = 0, over_budget = 0;  // SimHost::set_module_wait_budget; header.over_budget
  // Return slots written for Dom0, and writes refused (header.ret_refused; DomainConfig::module_ret_write).
  std::uint64_t ret_written = 0, ret_refused = 0;
  bool detaching = false;  // SimHost::module_detach: hits no longer go to Dom0
  // protocol.h "Letting go" (xp_release.h): the detach's looks at Dom0's hold, from
  // module_detach on, bounded by release_wait (SimHost::set_module_release_wait); the outcome
  // once decided; after module_unload, the pages it freed as they were then (a later change is
  // a write of Dom0 into freed memory).
  std::chrono::milliseconds release_wait{XP_RELEASE_WAIT_DEFAULT_MS};
  xp_release_state release_state{};
  ModuleClock::time_point release_deadline{};
  std::optional<xp_release> release;
  std::vector<std::pair<std::uint64_t, std::vector<std::uint8_t>>> freed;  // guest-virtual page, its bytes
  // Modules that went while a trap entry named them (SimHost::module_state, the module
  // notifier's calls): the restore leaves their entries alone (protocol.h "Modules that go").
  xp_gone gone{};
  unsigned gone_left = 0;  // entries the last restore left alone for that reason
  // SimHost::set_module_hook_calls: the guest functions its hit path calls, and whether it
  // publishes them (hook-path/*).
  std::vector<std::uint64_t> hook_calls;
  bool hook_path_published = true;
};

struct WritableFrame {
  unsigned refs = 0;
  std::array<std::uint8_t, 4096> shadow;
};

struct GuestPort {
  SimXenHandle* peer = nullptr;  // bound Dom0 handle, or null while unbound
  std::uint32_t peer_port = 0;
  std::uint64_t notifications = 0;  // events Dom0 sent to the guest on this port
};

struct Domain {
  DomId id;
  DomainHandle handle{};  // xen_domain_handle_t: distinct for every domain the process creates
  DomainConfig cfg;
  std::shared_ptr<GuestRam> ram;
  std::uint64_t mfn_base = 0;  // PV: MFN = GFN + mfn_base; HVM: 0
  std::uint64_t root_gpa = 0;  // L4 page table
  std::vector<Alias> aliases;
  GuestLayout layout;
  elf::Image image;
  std::vector<std::unique_ptr<Vcpu>> vcpus;

  unsigned pause_count = 0;
  bool debugging = false;
  bool dying = false;
  bool crashed = false;
  std::string crash_reason;
  std::string console;

  bool monitor = false, mon_sw_bp = false, mon_debug = false;
  SimXenHandle* monitor_owner = nullptr;
  std::deque<VmEventRequest> requests;
  std::deque<VmEventResponse> responses;
  unsigned outstanding = 0;  // requests posted and not yet answered
  std::deque<unsigned> ring_waiters;

  std::map<std::uint64_t, WritableFrame> wframes;  // by GFN
  // Growth: reserve areas mapped at creation, published one per oea-request.
  std::vector<std::uint64_t> oea_reserve;  // guest-virtual starts, not yet published
  unsigned oea_published = 1;
  std::map<std::uint32_t, GuestPort> guest_ports;
  std::uint32_t next_guest_port = 1;
  ModuleState module;

  // Execution counters (DomainConfig::count_executions), updated by the scheduler thread.
  std::map<std::uint64_t, std::uint64_t> executions;

  std::thread thread;
  // The last advance of the manual clock (SimHostImpl::clock_advances_) the scheduler has run
  // the module's timeouts against.
  std::uint64_t clock_seen = 0;
  int running_vcpu = -1;
  unsigned rr_next = 0;

  std::uint64_t frame_count() const { return ram->size / 4096; }
  std::uint64_t entry_frame(std::uint64_t gfn) const { return gfn + mfn_base; }
};

inline constexpr unsigned kNrVirqs = 24;

// The one lock around every Unicorn call in the process (sim_host.cpp says why). Recursive;
// never held while waiting for anything but Unicorn.
std::recursive_mutex& emulation_mutex();

// Linux's module mapping [MODULES_VADDR, MODULES_END) without KASLR: where the module's own
// code (and every other module's) lies, and where a fallback may resume.
inline constexpr std::uint64_t kModulesVa = 0xffffffffa0000000ull, kModulesEnd = 0xffffffffff000000ull;
inline constexpr std::uint64_t kOeaStride = 16ull << 20;  // create_domain's reserve-area spacing

// The simulated module's helpers (sim_module.cpp), shared with sim_module_*.cpp.
// Its accesses to the control area (header, mailboxes, tables), which Dom0 may write at any
// time: one load or store each.
template <typename T>
T shm_load(const std::uint8_t* p, std::memory_order o = std::memory_order_relaxed) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(const_cast<std::uint8_t*>(p))).load(o);
}
template <typename T>
void shm_store(std::uint8_t* p, T v, std::memory_order o = std::memory_order_relaxed) {
  std::atomic_ref<T>(*reinterpret_cast<T*>(p)).store(v, o);
}
// [va, va + len) inside one of the guest's mappings: where it is in RAM, or null.
std::uint8_t* guest_ptr(Domain& d, std::uint64_t va, std::uint64_t len);
// The guest's memory for the module's own code (xp_emulate, xp_ret_write): 8-byte reads and
// writes through guest_ptr, false where nothing is mapped.
xp_mem_ops module_mem_ops(Domain& d);
// The module's counters into its control area's header.
void publish_counters(Domain& d);
// Its control area in guest RAM, and a field of its header there.
std::uint8_t* area(Domain& d);
std::uint8_t* header_at(Domain& d, std::size_t field);
// Whether va lies in an area it published (oea/0, then reserve areas in order).
bool in_oea(const Domain& d, std::uint64_t va);
// What the module's own code (xp_logic.c) is told about the guest.
xp_bounds module_bounds(Domain& d);
xenprobes_regs to_protocol(const VcpuRegs& r);
// Its search of the Dom0-written trap table.
bool module_lookup(Domain& d, std::uint64_t addr, xenprobes_trap& out);

}  // namespace xenprobes::hv::sim
