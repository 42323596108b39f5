// The simulated Xen: a host that runs real x86-64 guest kernels with Unicorn and models the
// Xen 4.17 behaviour libxenprobes depends on (docs/simulated-xen.md):
//
//  - domains with reference-counted controller pauses (XEN_DOMCTL_pausedomain semantics);
//  - one Unicorn engine per vCPU over one guest-RAM buffer. Unicorn's own paging stays off:
//    every kernel mapping has real page-table entries in guest RAM (which the library walks)
//    *and* a Unicorn alias at its virtual address. Writes through foreign mappings become
//    visible to executing code at the next scheduling quantum (the sim compares writable
//    mapped frames against a shadow copy and drops stale translated blocks in every engine);
//  - debugging mode: with CONFIG_GDBSX an int3 in guest kernel mode pauses the whole domain
//    with RIP = address + 1 and raises no VIRQ (gdbsx_vcpu_event = 3, cleared by
//    gdbsx_domstatus); #DB (EFLAGS.TF single step, ICEBP 0xF1) pauses the domain and raises
//    VIRQ_DEBUGGER unless that vCPU still has an unconsumed int3 record. Built without GDBSX
//    (SimOptions::gdbsx = false, like Debian's hypervisor) both are swallowed: the vCPU just
//    continues at address + 1, and the gdbsx domctls answer ENOSYS;
//  - the vm_event monitor for HVM domains: software breakpoints and debug exceptions pause
//    only the trapping vCPU and post a request (RIP = the breakpoint address) into an 8-slot
//    ring; a full ring makes further trapping vCPUs wait; responses may set registers or ask
//    for one instruction to be emulated from supplied bytes;
//  - event channels (global VIRQ with one binder per host, interdomain, pending/mask with
//    coalescing), xenstore with watches (@introduceDomain/@releaseDomain), domain death;
//  - the guest module (protocol.h; unless publish_module = false): its keys, the control
//    area, and its int3 hook, which hands hits in its trap table to Dom0 through the vCPU's
//    mailbox, blocks only that vCPU until Dom0 answers or module_timeout_ms passes (on real
//    time, or on a manual clock that tests advance), then falls back as the trap entry says
//    (docs/simulated-xen.md, "The guest module");
//  - an exception the guest cannot take (it has no IDT: #UD, #GP, an unmapped access, an int3
//    nobody intercepts) crashes the domain, as an oops would; the reason is kept.
//
// Scheduling is deterministic per domain: one thread runs the domain's vCPUs round-robin,
// each for a fixed number of translated blocks. Other vCPUs keep running while one vCPU is
// stopped on a vm_event. Every Hypervisor operation can be made to fail on demand.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xenprobes/hypervisor.hpp"

namespace xenprobes::hv::sim {

// Every Hypervisor operation, for fault injection and call counting.
enum class Op : unsigned {
  Version,
  Capabilities,
  ListDomains,
  DomainInfo,
  Pause,
  Unpause,
  GetRegs,
  SetRegs,
  MapFrames,
  XsRead,
  XsWrite,
  XsRm,
  XsDirectory,
  XsGrantRead,
  XsWatch,
  XsUnwatch,
  XsReadWatches,
  EvtchnBindVirq,
  EvtchnBindInterdomain,
  EvtchnUnbind,
  EvtchnNotify,
  EvtchnPending,
  EvtchnUnmask,
  SetDebugging,
  GdbsxDomstatus,
  MonitorEnable,
  MonitorDisable,
  MonitorSoftwareBreakpoint,
  MonitorDebugExceptions,
  InjectEvent,
  RingGetRequest,
  RingPutResponse,
  RingNotify,
  Count_
};
XENPROBES_API const char* op_name(Op);

struct SimOptions {
  bool gdbsx = true;  // hypervisor built with CONFIG_GDBSX
  std::string xen_version = "4.17.5-sim";
  unsigned quantum_blocks = 512;  // translated blocks a vCPU runs before the next is scheduled
  unsigned ring_slots = 8;        // vm_event ring capacity (one 4 KiB page holds 8 requests)
  // The clock the guest module measures its waits with (DomainConfig::module_timeout_ms and
  // the claim bound). Off: real time. On: a clock that stands still until advance_clock()
  // moves it, so whether a hit times out is the caller's decision, not the machine's load.
  bool manual_clock = false;
};

struct DomainConfig {
  std::string name = "demo";
  // 0: the next domid (they count up from 1). Otherwise this one, which no live domain may
  // hold: a domid is free again once its domain is destroyed, as on Xen. Every domain gets a
  // handle of its own (DomainInfo::handle) all the same.
  std::uint32_t domid = 0;
  GuestType type = GuestType::Pv;
  unsigned vcpus = 1;
  std::size_t ram_mb = 64;
  std::string image;                               // guest ELF; "" = the demo guest
  std::uint64_t iterations = 0;                    // passed to the demo guest entry (0 = run forever)
  bool start_paused = false;                       // created with one controller pause (like `xl create -p`)
  std::size_t oea_size = std::size_t{256} * 1024;  // bytes of the published out-of-line execution area
  bool publish_module = true;                      // publish the guest module's xenstore keys
  bool module_fixup_slots = true;                  // with them its fixup slots (protocol.h, fixup-slots)
  bool module_jump_entry = true;                   // and its jump entry (protocol.h, jump-entry): jump probes
  // Its async rings (protocol.h, rings/*): one per vCPU with 2^module_ring_order bytes of data
  // (12..24; 0: none, so no async probes). Needs the jump entry.
  unsigned module_ring_order = 14;
  // With the rings, rings/cap-flags with XENPROBES_CAP_AUTO (protocol.h): captures whose
  // address picks user or kernel memory (Capture::by_address). false: a module before it.
  bool module_cap_auto = true;
  // Its features key says XENPROBES_FEATURE_RET_WRITE (protocol.h, "Return slots written by the
  // module"): a return probe's entry hit has the module write the return slot, and Dom0 maps
  // no stack for it. false: a module before it (Dom0 writes the slot itself).
  bool module_ret_write = true;
  // Its features key says XENPROBES_FEATURE_JUMP_ISLAND (protocol.h, "Short jumps to islands";
  // with the jump entry): Dom0 may place short jumps to islands, which its restore gives back.
  // false: a module before it (Dom0 makes no short jumps). In the padding after the bool above.
  bool module_jump_island = true;
  // Its waiting vCPUs spin on their mailboxes for up to this many microseconds of real time
  // (protocol.h "Spinning"; the module's spin_us): mailbox.spinning says so and the module looks
  // every 50 µs, so Dom0 may answer without a notification; then it clears the flag, looks once
  // more and waits for a notification as before. 0: never spins.
  unsigned module_spin_us = 0;
  // Extra areas of oea_size the simulated module can publish when Dom0 writes oea-request
  // (the growth protocol in protocol.h); 0 = the module cannot grow.
  unsigned oea_reserve_areas = 3;
  // The guest channel (protocol.h), published with the module's keys: how long the module's
  // int3 hook waits for Dom0's answer before it resumes the vCPU on its own (the fallback in
  // the trap entry), and the sizes of the tables in its control area.
  unsigned module_timeout_ms = 1000;
  unsigned module_trap_capacity = 512;
  unsigned module_ret_capacity = 256;
  // The guest image mapped a second time as user memory (read-only, not executable) at this
  // lower-half address, from the page holding _text on (page aligned, below 2^47; 0: not
  // mapped): what a user process that mapped the same bytes would see, so a test can read a
  // user address whose bytes it knows (GuestLayout::user_image). The demo guest has no user
  // mode: only reads from Dom0 and the module's captures see it.
  std::uint64_t user_image_va = 0;
  // Test oracle: count how often control reaches each of these guest-virtual addresses
  // (instruction starts), read back with SimHost::executions().
  std::vector<std::uint64_t> count_executions;
};

// Where the guest's pieces are (virtual addresses), for tests and for users of the sim.
struct GuestLayout {
  std::uint64_t text_start = 0, text_end = 0;  // _text, _etext
  std::uint64_t image_end = 0;                 // _end
  std::uint64_t oea_addr = 0, oea_size = 0;
  std::uint64_t physmap_base = 0;                    // direct map of all RAM (2 MiB pages)
  std::uint64_t control_addr = 0, control_size = 0;  // the module's control area (0: none)
  std::uint64_t fixup_slots = 0, fixup_table = 0;    // the module's fixup slots and entries (0: none)
  unsigned fixup_count = 0;
  std::uint64_t jump_entry = 0;              // the module's jump entry (0: none)
  std::uint64_t rings = 0, ring_stride = 0;  // its async rings: ring v at rings + v * ring_stride (0: none)
  std::uint64_t user_image = 0;              // DomainConfig::user_image_va: text_start's page appears here (0: none)
  std::uint64_t entry = 0;
};

class SimHost;

// A handle on the simulated host: what one Dom0 process holds (its own event-channel handle,
// xenstore connection and watches). Several handles may share one host.
class SimXen;

class XENPROBES_API SimHost : public std::enable_shared_from_this<SimHost> {
 public:
  static std::shared_ptr<SimHost> create(SimOptions = {});
  virtual ~SimHost() = default;

  // Creates and starts a domain (domids count up from 1, or DomainConfig::domid). Fails with
  // the loader's reason.
  [[nodiscard]] virtual Result<DomId> create_domain(const DomainConfig&) = 0;
  // xl destroy: the domain dies, @releaseDomain fires, later calls get ESRCH.
  [[nodiscard]] virtual Result<void> destroy_domain(DomId) = 0;
  // The guest kernel panics (on_crash = "preserve"): its vCPUs stop, @releaseDomain fires,
  // the domain stays, shut down and crashed, until it is destroyed. `why` is its crash_reason.
  [[nodiscard]] virtual Result<void> crash_domain(DomId, const std::string& why) = 0;
  // A new Hypervisor handle on this host.
  virtual std::unique_ptr<Hypervisor> open() = 0;

  [[nodiscard]] virtual Result<GuestLayout> layout(DomId) = 0;
  // Guest symbol (from the ELF symbol table), e.g. "sys_open" or "demo_stats".
  [[nodiscard]] virtual Result<std::uint64_t> symbol(DomId, const std::string& name) = 0;
  // Reads guest-virtual memory the simple way (through the sim's own mappings, not the
  // page tables): for test oracles only.
  [[nodiscard]] virtual Result<void> peek(DomId, std::uint64_t va, std::span<std::byte> out) = 0;
  virtual std::string console(DomId) = 0;
  virtual std::string crash_reason(DomId) = 0;  // "" if the domain has not crashed

  // Blocks until every vCPU of the domain has executed hlt (the demo workload finished),
  // the domain crashed or died, or the timeout passed. Returns true if all halted.
  virtual bool wait_halted(DomId, std::chrono::milliseconds timeout) = 0;

  // ---- fault injection and accounting ----
  // The next `count` calls of `op` (after skipping `skip` of them) fail with `code`.
  virtual void fail_op(Op op, Errc code, unsigned skip = 0, unsigned count = 1) = 0;
  // The n-th Hypervisor call from now (0-based, any operation) fails with `code`.
  virtual void fail_nth_call(std::uint64_t n, Errc code) = 0;
  // Every Hypervisor call from the n-th from now on (0-based, any operation, any handle) fails
  // with `code` until clear_faults(): what a Dom0 process killed at that point leaves behind.
  virtual void fail_from_call(std::uint64_t n, Errc code) = 0;
  virtual void clear_faults() = 0;
  virtual std::uint64_t op_count(Op) const = 0;
  virtual std::uint64_t total_calls() const = 0;
  virtual void reset_counts() = 0;
  // Moves the manual clock (SimOptions::manual_clock) forward by `by`, then returns once the
  // scheduler of every live domain has looked at its waiting vCPUs at the new time: each wait
  // whose timeout (or claim bound) has passed is over, with its fallback taken, and no other
  // one is. InvalidArgument on a host with the real clock; TimedOut if a scheduler did not
  // get round to it within 30 s.
  [[nodiscard]] virtual Result<void> advance_clock(std::chrono::milliseconds by) = 0;
  // Internal pause reference count (the real Xen does not expose it): for tests.
  [[nodiscard]] virtual Result<unsigned> pause_count(DomId) = 0;
  // How often control reached `va` (one of DomainConfig::count_executions).
  [[nodiscard]] virtual Result<std::uint64_t> executions(DomId, std::uint64_t va) = 0;

  // ---- the guest's side of event channels (what a guest kernel module does) ----
  // EVTCHNOP_alloc_unbound for remote domain 0: a port Dom0 can bind interdomain.
  [[nodiscard]] virtual Result<std::uint32_t> guest_evtchn_alloc_unbound(DomId) = 0;
  // The guest notifies Dom0 over its port.
  [[nodiscard]] virtual Result<void> guest_evtchn_notify(DomId, std::uint32_t port) = 0;
  // How many notifications Dom0 has sent the guest on its port.
  [[nodiscard]] virtual Result<std::uint64_t> guest_evtchn_notifications(DomId, std::uint32_t port) = 0;
  // The guest module's notifications to Dom0 for its hits: sent, and left out because Dom0 said
  // it was polling the mailboxes (protocol.h "Spinning").
  struct ModuleNotifications {
    std::uint64_t sent = 0, skipped = 0;
  };
  [[nodiscard]] virtual Result<ModuleNotifications> module_notifications(DomId) = 0;
  // Test hook: while held, vCPU `v`'s hits stop in the guest module's int3 hook after its
  // trap-table lookup and before its mailbox write, where a vCPU Xen pauses stands; Dom0 may
  // remove the trap meanwhile. Releasing (hold = false) lets a held hit go on: it is
  // published with the entry the hook looked up. module_hit_held() says whether one waits.
  [[nodiscard]] virtual Result<void> hold_module_hits(DomId, VcpuId, bool hold) = 0;
  [[nodiscard]] virtual Result<bool> module_hit_held(DomId, VcpuId) = 0;
  // The guest kernel's module notifier, as the guest module hears it: a module named `name`
  // whose text starts at `text_base` comes (MODULE_STATE_COMING) or goes (MODULE_STATE_GOING).
  // A test that loads or unloads a module in guest memory calls it as the kernel would.
  // Returns how many modules the guest module's set of modules that went holds now.
  [[nodiscard]] virtual Result<unsigned> module_state(DomId, const std::string& name, std::uint64_t text_base,
                                                      bool going) = 0;
  // The guest module's waiting budget per vCPU (protocol.h "Waiting budget"; the module's
  // wait_budget_ms): how long a vCPU's hits may wait for Dom0 in all between two of its context
  // switches, which a test makes with vcpu_switched(). 0, the sim's default (unlike the
  // module's 5000 ms: the tests' manual clocks would spend it), is no bound.
  [[nodiscard]] virtual Result<void> set_module_wait_budget(DomId, std::chrono::milliseconds) = 0;
  // The guest kernel switched tasks on vCPU `v` (what its __schedule() does): the guest
  // module's waiting budget for that vCPU starts again.
  [[nodiscard]] virtual Result<void> vcpu_switched(DomId, VcpuId) = 0;
  // Hits the guest module resumed without Dom0 because their vCPU's budget was spent.
  [[nodiscard]] virtual Result<std::uint64_t> module_over_budget(DomId) = 0;
  // The guest module detaches (its `detach` parameter written in the guest), as far as Dom0
  // can see it: header.closing = 1 first (protocol.h "Detaching"), hits stop going to Dom0
  // (waiting vCPUs give up, a claimed one at its claim bound), `state` removed, then its
  // restore pass. Returns how many trap bytes and jump regions that pass restored. The
  // simulated module then stays detached: it never publishes again.
  [[nodiscard]] virtual Result<unsigned> module_detach(DomId) = 0;
  // The guest module's hit path calls these guest functions (their addresses) on every hit it
  // hands to Dom0, as a real module calls its clock and the event-channel code: real guest
  // code, run on the hitting vCPU before the hit is published, its registers saved and
  // restored. A hit inside them is a nested one, handled as the real module's depth guard
  // handles it (guest-module/xp_hook.c, "Nesting"): an int3 takes its entry's fallback at once
  // (counted in header.timeouts, as xp_fallback() counts it), a jump hit counts header.nested
  // and runs its detour's copies; neither reaches Dom0, and neither runs the calls again. The
  // module publishes the addresses as hook-path/* (protocol.h) unless `publish` is false (a
  // module from before the keys: none published). Call before Dom0 attaches. By default the
  // simulated hook calls no guest code and publishes hook-path/count = 0.
  [[nodiscard]] virtual Result<void> set_module_hook_calls(DomId, std::vector<std::uint64_t> functions,
                                                           bool publish) = 0;
  // protocol.h "Letting go": after its restore pass the detach looks at whether a Dom0 holds
  // the control area and the rings (header.dom0_hold, and whether Dom0 has the module's port
  // bound), and waits for a holder's release up to this bound on the module's clock (the
  // module parameter release_wait_ms; 5000 ms by default, as the module's). Before module_detach.
  [[nodiscard]] virtual Result<void> set_module_release_wait(DomId, std::chrono::milliseconds) = 0;
  // What the detach found, and so what the rmmod does with the control area and the rings.
  enum class ModuleRelease {
    NoDom0,    // no Dom0 held them: freed
    Released,  // Dom0 released them: freed
    Killed,    // the Dom0 process holding them closed its port without releasing: kept
    TimedOut,  // no release within the wait: kept
  };
  static bool frees(ModuleRelease r) { return r == ModuleRelease::NoDom0 || r == ModuleRelease::Released; }
  // The rmmod after module_detach: Busy while the detach would still wait (a Dom0 holds the
  // areas, has not released them, and the wait has not run out: advance the clock, or let Dom0
  // release); else what it found. Freed pages are remembered as they were: from then on a
  // change in them is a write of Dom0 into memory the guest may have reused.
  [[nodiscard]] virtual Result<ModuleRelease> module_unload(DomId) = 0;
  // How many bytes of the pages module_unload freed differ from what they held then.
  [[nodiscard]] virtual Result<std::uint64_t> module_freed_bytes_written(DomId) = 0;
  // Dom0's writable mappings, alive now, of the frame behind the guest-virtual `va`. On a PV
  // guest each one is a writable type reference on the frame, and Xen refuses to make such a
  // frame a page table (the guest's fork or exec then fails).
  [[nodiscard]] virtual Result<unsigned> writable_mappings(DomId, std::uint64_t va) = 0;
};

// The SimHost behind a Hypervisor handle, or null when the handle is not the simulated Xen.
XENPROBES_API SimHost* sim_host_of(Hypervisor&);

// Where the demo guest was built/installed: vmlinux and System.map.
XENPROBES_API std::string default_guest_dir();

// What `XENPROBES_BACKEND=sim` opens: a host with one domain (domid 1) running
// XENPROBES_SIM_GUEST or the demo guest. XENPROBES_SIM_VCPUS (default 2),
// XENPROBES_SIM_TYPE=pv|hvm (default pv) and XENPROBES_SIM_GDBSX=0|1 (default 1) adjust it.
[[nodiscard]] XENPROBES_API Result<std::unique_ptr<Hypervisor>> open_default_sim();

}  // namespace xenprobes::hv::sim

// Where the simulation lives: not inside libxenprobes.so. The functions above load
// libxenprobes-sim.so (installed beside libxenprobes.so; XENPROBES_SIM_LIBRARY may name another
// file) the first time one of them needs it, so that a program that never asks for the
// simulation never loads Unicorn. When it cannot be loaded (missing, Unicorn missing, from
// another build), open_default_sim() fails and SimHost::create(), default_guest_dir() and
// op_name() throw std::runtime_error, saying why (docs/simulated-xen.md, "A library of its
// own"); sim_host_of() answers null.
