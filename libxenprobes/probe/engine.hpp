// The probe engine: probe points per domain (aggregates), their slots, arming and disarming
// under pause, and what a hit means (docs/probes.md "A hit"). Channel-agnostic:
// a channel finds stopped vCPUs and hands them to on_stop().
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "channel/channel.hpp"
#include "kernel/address_rules.hpp"
#include "kernel/modules.hpp"
#include "kernel/tables.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "guestmod/module_info.hpp"
#include "guestmod/rings.hpp"
#include "guardian/journal.hpp"
#include "probe/oea_pool.hpp"
#include "probe/patcher.hpp"
#include "probe/slot_map.hpp"
#include "symbols/kernel_image.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/analysis.hpp"
#include "x86/detour.hpp"
#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::probe {

using ProbeId = std::uint64_t;

inline constexpr std::size_t kSlotSize = 32;  // bytes per out-of-line slot

// How much of one async ring a drain reads (probe/engine_async.cpp, drain_rings): records that
// keep arriving wait for the next drain, so a guest that keeps its ring non-empty cannot keep
// the event loop (or Session::ring_stats) from everything else. The passes are bounded too: a
// ring the guest keeps breaking is resynchronised on every pass and delivers nothing.
inline constexpr std::size_t kMaxRecordsPerDrain = 65536;
inline constexpr int kMaxPassesPerDrain = 4;

// What one engine takes on at most (SessionLimits in xenprobes.hpp says why each exists).
struct Limits {
  unsigned domains = 64;
  unsigned points_per_domain = 4096;
  unsigned instances_per_domain = 16384;
  std::size_t mapped_frames_per_domain = 256;
};

class Engine final : public channel::StopSink {
 public:
  // Which channel serves a domain (chosen when the engine first attaches it).
  using ChannelFor = std::function<Result<channel::Channel*>(DomId)>;
  Engine(hv::Hypervisor& hv, channel::Channel& ch);  // one channel for every domain
  Engine(hv::Hypervisor& hv, ChannelFor channel_for);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Takes effect for domains attached and probes added from now on.
  void set_limits(const Limits& l) { limits_ = l; }
  const Limits& limits() const { return limits_; }

  // Attaches on first use: reads the guest module's keys (OEA), attaches the channel.
  [[nodiscard]] Result<void> attach(DomId);
  // Disarms every probe in the domain (restoring bytes, resuming pending stops), detaches.
  [[nodiscard]] Result<void> detach(DomId);
  [[nodiscard]] Result<void> set_symbols(DomId, symbols::SymbolTable);
  // The kernel image those symbols came from (a vmlinux): jump probes prove tail calls from it
  // when its build id is the guest's (probe/engine_jump_index.cpp). Drops what jump probes
  // knew of the kernel, so that the next one reads it.
  [[nodiscard]] Result<void> set_kernel_image(DomId, std::shared_ptr<const symbols::KernelImage>);
  const symbols::SymbolTable* symbols(DomId) const;
  // The running _text the guest module published (attached domains), or nullopt: no module,
  // so a System.map's KASLR slide must come from somewhere else.
  std::optional<Gva> published_kernel_text(DomId) const;
  // The channel serving the domain (attaching it first if needed).
  [[nodiscard]] Result<channel::Channel*> channel_of(DomId);

  // Loaded modules that came or went after the symbols were loaded (probe/engine_modules.cpp).
  // Checks the guest's module list (ModuleTables::changed: the head and each live module's
  // state, links and text) unless the last check is younger than `min_interval` (0: always),
  // walks it again when it changed, and when the set of live modules differs from the one the
  // symbols hold, reads the new set's functions into them (SymbolTable::set_module_functions)
  // and counts a new symbols generation. Registrations check on their own. Returns the
  // generation; NoSuchDomain when not attached, Fault when vCPU 0's page tables cannot be had.
  [[nodiscard]] Result<std::uint64_t> refresh_modules(DomId, std::chrono::milliseconds min_interval = {});
  // Changes whenever the domain's symbols do (loaded, or their modules' functions read again);
  // 0 when it has none.
  std::uint64_t symbols_generation(DomId) const;
  // The domain's module list as last walked (null: no symbols, or never walked).
  const kernel::ModuleTables* modules(DomId) const;
  // The clock refresh_modules() measures `min_interval` by (empty: steady_clock); for tests.
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  void set_clock(Clock c) { clock_ = std::move(c); }

  // `method`: ProbeMethod in xenprobes.hpp (a jump probe, docs/probes.md "Jump probes").
  [[nodiscard]] Result<ProbeId> add(DomId, Gva, PreHandler, PostHandler, ProbeMethod method = ProbeMethod::Trap);
  // A return probe on the function starting at the address (see docs/probes.md, "Return
  // probes"): an entry registration on the point, plus instances tracked by stack slot.
  [[nodiscard]] Result<ProbeId> add_ret(DomId, Gva, EntryHandler, ReturnHandler, RetProbeOptions);
  // An async jump probe (probe/engine_async.cpp; protocol.h "Async jump probes").
  [[nodiscard]] Result<ProbeId> add_async(DomId, Gva, AsyncHandler, std::vector<Capture>);
  // Reads every ring of the domain and hands the records to their probes.
  [[nodiscard]] Result<RingStats> ring_stats(DomId);
  // Builds what jump probes need to know of the domain's kernel (jump_fixups: every function
  // read and decoded, seconds) now, before a batch pauses the domain, so that no registration
  // pays it; nothing when built already. Attaches the domain like a registration.
  [[nodiscard]] Result<void> prepare_jumps(DomId);
  bool jumps_prepared(DomId) const;  // built (by prepare_jumps or a first jump probe)
  [[nodiscard]] Result<void> remove(ProbeId);
  [[nodiscard]] Result<void> set_enabled(ProbeId, bool);
  ProbeStats stats(ProbeId) const;
  [[nodiscard]] Result<ProbeInfo> info(ProbeId) const;

  // Batches: every domain touched between begin and end is paused once.
  [[nodiscard]] Result<void> begin_batch();
  [[nodiscard]] Result<void> end_batch();

  // Runs what handlers asked for during the last channel process() (deferred removals).
  // Call after the channel has resumed every stop it handled.
  // `resumed` false: a channel failed this round, so a stop it handled may not have been
  // resumed; the journal keeps what such a vCPU would need (returned_records_) a round more.
  [[nodiscard]] Result<void> after_dispatch(bool resumed = true);

  // A domain is gone (released): forget it without touching it.
  void forget(DomId);
  // The guardian's journal (guardian/journal.hpp). Domains the session journaled (debugger and
  // vmevent channels) get every patch, pause and return-probe instance recorded in it.
  void set_journal(Journal* j) { journal_ = j; }
  // Test hook: drops every domain without restoring anything, as a killed process would
  // (the journal keeps what it says; nothing is written to any guest).
  void abandon();
  std::vector<DomId> domains() const;

  // How soon the event loop should call after_dispatch() again even with no event (0: no need):
  // a jump probe waits for the guest module's quiescence (Domain::jumps_waiting), or async
  // probes' rings are read (kDrainIntervalMs).
  int wake_interval_ms() const;
  static constexpr int kDrainIntervalMs = 20;

  bool stop_requested() const { return stop_requested_; }
  void clear_stop() { stop_requested_ = false; }
  void request_stop() { stop_requested_ = true; }

  // StopSink
  bool owns_trap(DomId, Gva) const override;
  channel::Verdict on_stop(channel::Stop&) override;
  void on_channel_failure(DomId, const Error&) override;

 private:
  struct Point;
  struct Registration;
  // One tracked call of a return probe: the stack slot whose return address now points at
  // the domain's trampoline, and what it held.
  struct Instance {
    Registration* owner = nullptr;
    Gva slot{0};
    std::uint64_t ret = 0;
    std::vector<std::byte> data;  // RetProbeOptions::data_size bytes, zeroed per call
    bool live = false;
    // The guest module writes its slot (Stop::ret_write), after Dom0's answer: until the vCPU
    // takes the answer up the slot still holds `ret`, which reclaiming must not take for a
    // frame gone.
    bool by_module = false;
    VcpuId vcpu{0};               // by_module: whose answer carried the write
    std::uint32_t journal = ~0u;  // its record in the guardian's journal
  };
  struct RetState {
    EntryHandler entry;
    ReturnHandler on_return;
    std::vector<Instance> instances;  // maxactive, preallocated
    std::vector<Instance*> free;
  };
  struct Registration {
    ProbeId id;
    Point* point;
    PreHandler pre;
    PostHandler post;
    ProbeMethod method = ProbeMethod::Trap;  // as asked
    bool enabled = true;
    Gva requested;              // the address asked for (the point's may be past an ftrace site)
    std::string moved_because;  // why the point is not at `requested`
    ProbeStats stats;
    std::unique_ptr<RetState> ret;              // a return probe's entry registration
    AsyncHandler async;                         // an async probe's (then no pre or post)
    std::vector<xenprobes_capture_spec> specs;  // its captures, as the guest module reads them
  };
  // A jump probe's state (probe/engine_jump.cpp; protocol.h "Jump probes").
  struct JumpState {
    x86::JumpRegion region;  // the bytes the jump covers; starts at the point or before it
    std::array<std::uint8_t, x86::kMaxInsnLen> original{};  // the region's bytes (length <= 15)
    std::vector<x86::Insn> insns;                           // the region's instructions
    Gva detour{0};                                          // its slot (0: none yet)
    // An async probe's: its key in the domain's records (Domain::async_keys), and the slots
    // its detour and capture specs take, adjacent from `detour`.
    std::uint32_t async_key = 0;
    std::vector<xenprobes_capture_spec> specs;
    unsigned slots = 1;
    x86::DetourLayout layout;
    std::optional<Patch> redirect;  // the trap byte at region.start (a REDIRECT entry)
    std::optional<Patch> jmp;       // the jump over that trap byte and the next four
    // The quiescence the jump waits for (requested after the trap byte went in).
    std::optional<std::uint64_t> waits_for;
    // A short jump (region.patch == 2, protocol.h "Short jumps to islands"): its island in
    // dead padding, the padding's bytes there, and the island's jmp rel32 to the detour.
    std::optional<Gva> island;
    std::array<std::uint8_t, x86::kIslandLen> island_original{};
    std::optional<Patch> island_patch;
    std::string short_because;  // ProbeInfo::not_jump_because of a short jump: why not 5 bytes
    Gva key() const { return detour + layout.call_offset; }  // its JUMP entry
  };
  struct Point {
    DomId dom;
    Gva addr;
    x86::Insn insn;
    x86::Plan plan = x86::Plan::Boost;
    std::array<std::uint8_t, x86::kMaxInsnLen> original{};
    std::optional<Gva> slot;  // Boost plans
    // The instruction after a 1-byte probed instruction, run from the slot too when the
    // channel finds stops by rip (see ChannelTraits::stops_found_by_rip).
    std::optional<x86::Insn> next;
    x86::Plan next_plan = x86::Plan::Boost;  // Emulate*: Dom0 runs it at the slot's trap
    bool trap_tail = false;                  // the slot ends with the trap byte (post-handlers)
    // An instruction whose fault the kernel fixes up by the faulting address (its exception-
    // table entry): it runs in place where the channel emulates, else in a fixup slot.
    std::optional<kernel::OwnAddress> own_address;
    // No slot: the hypervisor runs the original bytes at their own address (Stop::Emulate).
    // Every Boost point of a domain without the guest module, and own_address ones on a
    // channel that emulates.
    bool in_place = false;
    // `slot` is a fixup slot (guestmod::FixupSlots): bound to this instruction for as long as
    // the guest module is loaded, never given back.
    bool fixup_slot = false;
    // A point in a loaded module's text: which module (its struct module and its text). Its
    // trap byte is written back only while that very module is still loaded: once it is
    // unloaded the memory is freed or holds another module's code.
    std::optional<kernel::ModuleIdentity> module;
    bool armed = false;
    // Disarmed, but a vCPU may still be stopped on the trap byte it executed before: the
    // channel must still find it (and rewind it) until the next flush.
    bool flush_pending = false;
    // The trap byte over the instruction: applied while armed, restored while flush_pending.
    std::optional<Patch> text;
    std::vector<Registration*> regs;  // registration order
    std::optional<JumpState> jump;    // a jump probe (then no slot, no trap over the instruction)
    std::string not_jump_because;     // asked for Fastest, got a trap: why
  };
  // A slot trap that still resolves after its point went away (until the slot is reclaimed).
  struct SlotTrap {
    Point* point;       // null once the point is gone
    Gva resume;         // the instruction after the probed one (its copy, with a continuation)
    Gva original_next;  // the instruction after the probed one in the kernel's own text
    // A branch after a 1-byte probed instruction, emulated at this trap (see Point::next).
    std::optional<x86::Insn> emulate_next;
    x86::Plan emulate_plan = x86::Plan::EmulateBranch;
    Patch patch;  // the slot's code; forgotten (entry and journal record) when the slot is reclaimed
    // A jump probe's detour: the key is its call (a JUMP entry, no trap byte), `resume` the
    // probed address. A hit on it with no point runs no handler and goes on in the detour.
    bool jump = false;
  };
  // A slot written for a point and not yet its own (adopt_slot): dropping it undoes it.
  struct NewSlot {
    Gva slot;
    bool trap_tail = false;
    Gva resume;
    Patch patch;
  };
  struct Domain {
    DomId id;
    channel::Channel* ch = nullptr;
    // Read from the channel once, at attach: what it needs of the patches, and its trap table
    // (null: it keeps none, and is told nothing of traps and return instances).
    channel::ChannelTraits traits;
    channel::TrapTable* table = nullptr;
    hv::DomainInfo info;  // from attach: vCPU count, and the guest type and width the paging mode needs
    std::unique_ptr<mem::HypervisorFrameSource> source;
    std::unique_ptr<mem::GuestMemory> memory;
    std::unique_ptr<OeaPool> pool;              // null: agentless (no guest module; ChannelTraits::can_emulate)
    std::optional<guestmod::FixupSlots> fixup;  // the module's fixup slots, when it gives them
    std::optional<symbols::SymbolTable> syms;
    // The guest kernel's own tables (exception table, jump labels, …), read with the symbols.
    std::optional<kernel::KernelTables> tables;
    // The live modules whose functions `syms` holds (by struct module, name and text), the
    // symbols' generation (Engine::symbols_generation) and when the module list was last
    // checked (Engine::refresh_modules).
    std::vector<kernel::ModuleIdentity> module_set;
    bool generation_ready = false;  // module_set is what `syms` holds
    std::uint64_t symbols_generation = 0;
    std::optional<std::chrono::steady_clock::time_point> modules_checked;
    kernel::Range module_text;  // the guest module's own text, as it publishes it (guest channel)
    // The kernel functions its hit path calls out to (hook-path/*), or why they could not be
    // read (every guest-channel probe is refused then); none from an older module.
    std::optional<std::vector<std::uint64_t>> hook_path;
    std::string hook_path_error;
    std::uint64_t text_changed = 0;  // disarms that found the guest's own byte, not ours
    std::uint64_t lost_returns = 0;  // trampoline stops with no known return address
    Gva kernel_text;
    std::map<Gva, std::unique_ptr<Point>> points;
    std::map<Gva, SlotTrap> slot_traps;  // by trap-byte address in a slot
    unsigned pause_depth = 0;
    // Pauses of ours whose release failed: the domain stays paused by them. The next release
    // tries them again; the journal counts them, so the guardian releases them if we die.
    unsigned stuck_pauses = 0;
    std::optional<Error> failed;    // the channel gave the domain up: nothing may be armed again
    bool journaled = false;         // its patches go into the guardian's journal
    bool growth_requested = false;  // oea-request written, new area not seen yet
    // Quiescence before a released slot is reused: a task preempted inside the slot keeps
    // its rip on its own stack, where no vCPU register shows it. A released slot waits for
    // the guest module to confirm a quiescence requested after the release (protocol.h).
    std::map<std::uint64_t, std::uint64_t> quiesce_wait;  // dirty slot -> the token that frees it
    std::uint64_t quiesce_next = 0;                       // the token of the next request
    std::optional<std::uint64_t> quiesce_asked;           // written to quiesce-request, not yet done
    // Return probes: one trampoline (a trap byte in a slot) per domain, allocated with the
    // first return probe and kept until detach, so a return still on its way there after an
    // unregister is caught. Live instances by stack slot; `returned` remembers where calls
    // that lost their instance (unregistered, reclaimed) return to, in case one still comes.
    std::optional<Gva> trampoline;
    Patch trampoline_patch;
    // Jump probes: the guest module's jump entry (none: no jump probes), what the jump rules
    // need from the whole kernel (built on the first jump probe), jumps waiting for quiescence,
    // and the last quiescence the module confirmed.
    std::optional<Gva> jump_entry;
    struct JumpIndex {
      // Entered from outside the function's own decoded branches: exception fixups, the
      // targets of jump labels (a nop until their key turns them into a jmp), and branches
      // from other functions of the core text.
      x86::SiteIndex fixups;
      x86::SiteIndex thunks;  // retpoline thunks: a jmp into one is an indirect jump
      bool ibt = false;       // an IBT build (endbr64 marks every indirect target)
      std::string build;      // the build the guest says it runs (probe/jump_index.hpp)
      // Every code address formed inside a core-text function, from the kernel image given as
      // the domain's symbols when its build is the guest's (JumpContext::addresses_taken: tail
      // calls proven); else why not, said beside a refusal it would have decided.
      std::optional<x86::SiteIndex> taken;
      std::string no_taken;
    };
    std::unique_ptr<JumpIndex> jump_index;
    // Jump probes in a loaded module's text (engine_jump_module.cpp): per module, what enters
    // its functions from outside their own branches (its exception fixups, its jump labels'
    // targets, branches from its other functions), built at its first jump probe and kept by
    // the module's identity: a module unloaded and loaded again gets a fresh one. Dropped when
    // the module leaves the list (update_modules).
    struct ModuleJumpIndex {
      kernel::ModuleIdentity module;
      x86::SiteIndex entries;
      std::size_t functions = 0, unknown = 0;  // decoded; not decoded (their branches unknown)
    };
    std::vector<std::unique_ptr<ModuleJumpIndex>> module_jump_indexes;
    // The kernel image the symbols came from (a vmlinux given to load_symbols), kept until jump
    // probes have read what they need of it (JumpIndex::taken), then dropped.
    std::shared_ptr<const symbols::KernelImage> image;
    unsigned jumps_waiting = 0;
    std::optional<std::uint64_t> quiesce_done;
    // Short jumps to islands: the module publishes XENPROBES_FEATURE_JUMP_ISLAND; islands whose
    // short jump is gone, given back after the quiescence `token` (engine_island.cpp).
    bool jump_islands = false;
    struct ReturningIsland {
      Patch patch;
      std::uint64_t token = 0;
      Gva detour;  // where its jump goes: that slot stays dirty until the island is back
      std::array<std::uint8_t, x86::kIslandLen> original{};  // the padding it goes over
    };
    std::vector<ReturningIsland> islands_returning;
    // Async probes: the rings the module publishes (read at attach; why not, when it publishes
    // them wrongly), mapped with the first async probe; the probes by record key; Dom0's counts.
    std::optional<guestmod::RingsInfo> rings_info;
    std::string rings_refused;
    std::vector<guestmod::MappedRing> rings;
    std::map<std::uint32_t, Registration*> async_keys;
    std::uint32_t next_async_key = 1;
    std::uint64_t ring_records = 0, ring_orphans = 0;
    std::uint64_t ring_bad_records = 0;  // records whose captures their probe's specs cannot give
    bool draining = false;
    SlotMap<Instance> live_returns;
    struct Returned {
      std::uint64_t ret;
      std::uint64_t seq;
      std::uint32_t journal = ~0u;  // its journal record, kept while the slot may still return
    };
    std::map<std::uint64_t, Returned> returned;
    std::deque<std::pair<std::uint64_t, std::uint64_t>> returned_order;  // (slot, seq), oldest first
    std::uint64_t returned_seq = 0;
  };
  class Pause;  // RAII domain pause, nested through Domain::pause_depth
  class Ctx;    // HitContext implementation

  Result<Domain*> domain(DomId);
  Domain* domain_of(const Point&);
  Result<void> pause(Domain&);
  Result<void> unpause(Domain&);
  Result<void> refresh_context(Domain&);
  // Before the first guest-memory access of a hit: the hit vCPU's own page tables (a handler
  // reads the hit task's user memory), and no translation cached before the guest ran again
  // (stacks and user pages are freed and reused). Lazy: a hit that touches no memory costs
  // nothing. Outside a hit (the domain paused) it does nothing: pause() prepared the memory.
  Result<void> hit_memory(Domain&);
  // Decodes the probed instruction (and, when needed, the one after it), and checks the
  // address rules (kernel/address_rules.hpp) for the domain's channel.
  Result<void> decode_probe_point(Domain&, Point&);
  // Where a probe asked for at `addr` goes: past the endbr64 and the ftrace site when `addr`
  // starts a function (kernel::place_entry_probe), else `addr`.
  Result<kernel::EntryPlacement> place(Domain&, Gva addr);
  // Kernel text as the guest would run it: bytes we patched read back as the original.
  Result<std::vector<std::uint8_t>> read_text(Domain&, Gva start, std::uint64_t size);
  kernel::RuleContext rule_context(const Domain&) const;
  bool uses_slot(const Point&) const;
  // A fixup slot for the point (own_address with its entry): the one already holding exactly
  // its copy and entry, else an unused one, written and its entry set (protocol.h).
  Result<Gva> take_fixup_slot(Domain&, const Point&);
  // Patches guest code (probe/patcher.hpp): with the domain's channel and, when journaled, its journal.
  Patcher patcher(Domain&);
  // A freshly allocated slot's PatchSpec::on_undo: back to the pool (a failed step, or the
  // patch's handle dropped uncommitted).
  std::function<void()> give_back_slot(Domain&, Gva slot);
  // Allocates and writes a new slot for the point (an uncommitted patch: dropping it undoes
  // it); adopt_slot() makes it the point's, releasing the one it had.
  Result<NewSlot> write_slot(Domain&, const Point&, bool trap_tail);
  void adopt_slot(Domain&, Point&, NewSlot&&);
  // write_slot() then adopt_slot().
  Result<void> replace_slot(Domain&, Point&, bool trap_tail);
  Result<void> arm(Domain&, Point&);
  Result<void> disarm(Domain&, Point&);
  // The module a point is in was unloaded, or another took its place, since the point was
  // decoded: says which, else nullopt (also when the module list cannot be read).
  std::optional<std::string> module_gone(Domain&, const Point&);
  // Walks the module list again if it changed (through d.memory as it is now) and brings the
  // symbols' module functions up to date (probe/engine_modules.cpp).
  void update_modules(Domain&);
  Result<void> remove_now(ProbeId);
  Result<void> remove_registration(Domain&, std::map<ProbeId, std::unique_ptr<Registration>>::iterator);
  // Resumes every vCPU stopped on one of our traps in the domain (the domain is paused).
  Result<void> flush(Domain&);
  void release_slot(Domain&, Point&);
  // Used -> Dirty for a slot a vCPU may have run in: reusable once reclaim_slots() sees no
  // vCPU in it and the guest module confirmed a quiescence requested after now.
  void release_ran_slot(Domain&, Gva slot);
  // Reads quiesce-done; asks for another quiescence when slots wait and none is asked.
  void advance_quiescence(Domain&);
  // Before the channel lets go of a domain: every trap byte left in a slot becomes a jump to
  // the instruction after the probed one, so a vCPU still inside a slot goes on without a
  // stop nobody would answer.
  void neutralize_slot_traps(Domain&);
  Result<void> reclaim_slots(Domain&);
  // A Clean slot; asks the guest module for another area when the pool runs low, and picks
  // up areas it has published since.
  Result<Gva> allocate_slot(Domain&, unsigned n = 1);
  Result<void> refresh_areas(Domain&);
  bool needs_trap_tail(const Point&) const;
  bool any_enabled(const Point&) const;
  void run_post(Domain&, Point&, channel::Stop&);
  channel::Verdict hit_point(Domain&, Point&, channel::Stop&);
  channel::Verdict hit_slot(Domain&, const SlotTrap&, channel::Stop&);
  channel::Verdict hit_trampoline(Domain&, channel::Stop&);
  // A return probe's entry: takes an instance and rewrites the return address (or counts a miss).
  void enter_return_probe(Domain&, Registration&, Ctx&, channel::Stop&);
  // A handler's access to [va, va + len) covering the slot the stop asked the guest module to
  // write (Stop::ret_write): Dom0 makes that write itself first (engine_return.cpp).
  Result<void> settle_ret_write(Domain&, std::uint64_t va, std::uint64_t len);
  // The domain's return trampoline; made now if it has none (then `made` is set: the caller
  // commits Domain::trampoline_patch, or undo_trampoline() takes it away again).
  Result<Gva> ensure_trampoline(Domain&, bool* made);
  void undo_trampoline(Domain&);
  // Frees the instance; its slot is remembered in Domain::returned when `remember`.
  void drop_instance(Domain&, Instance&, bool remember);
  // Instances whose stack slot no longer holds the trampoline address can never return
  // through it: give them back (returns how many).
  unsigned reclaim_instances(Domain&, Registration&);
  // With the domain paused: puts every live instance's return address back on its stack
  // (and moves a vCPU standing on the trampoline), for one registration or all (null).
  void restore_returns(Domain&, Registration*);
  void remember_return(Domain&, std::uint64_t slot, std::uint64_t ret, std::uint32_t journal);
  void forget_return(Domain&, std::map<std::uint64_t, Domain::Returned>::iterator);
  [[nodiscard]] Result<ProbeId> add_registration(DomId, Gva, std::unique_ptr<Registration>);
  // Jump probes (probe/engine_jump.cpp).
  // Why the point cannot be a jump probe on this domain, or nullopt with p.jump planned.
  std::optional<std::string> plan_jump(Domain&, Point&, const Registration&);
  // The region of an armed or planned jump, or the point of a trap probe, that overlaps
  // [lo, hi) other than `self`: what a new probe there would collide with.
  const Point* overlapping_point(const Domain&, std::uint64_t lo, std::uint64_t hi, const Point* self) const;
  Result<void> arm_jump(Domain&, Point&);
  Result<void> disarm_jump(Domain&, Point&);
  // Writes the jumps whose quiescence the module confirmed (takes its own pause).
  void advance_jumps(Domain&);
  const x86::SiteIndex& jump_fixups(Domain&);
  // A point in a loaded module's text (engine_jump_module.cpp): why it cannot be a jump on
  // the module's own terms (the module changed, a table of it unread), else nullopt and `mod`.
  std::optional<std::string> module_jump_check(Domain&, const Point&, const kernel::Module*& mod);
  // The module's index (built now if it has none), or null with `why`.
  const Domain::ModuleJumpIndex* module_jump_index(Domain&, const kernel::Module&, std::string& why);
  // Why a jump at `region` in module text could not reach a detour in any of the guest
  // module's slot areas (rel32), else nullopt.
  std::optional<std::string> module_detour_reach(const Domain&, const x86::JumpRegion& region) const;
  // Drops the module indexes of modules no longer in `live` (update_modules).
  static void prune_module_jump_indexes(Domain&, const std::vector<kernel::ModuleIdentity>& live);
  // Reads [base, base + size) of text as read_text() does, in chunks, page by page where a
  // chunk cannot be read: unread[p] for a page p that could not be. False when any could not.
  bool read_text_pages(Domain&, std::uint64_t base, std::uint64_t size, std::vector<std::uint8_t>& bytes,
                       std::vector<bool>& unread);
  // Short jumps to islands (probe/engine_island.cpp): the dead padding of the function
  // [lo, hi) (decoded as `insns` under `jc`) the kernel leaves alone, and the islands taken.
  void island_context(Domain&, const std::vector<x86::Insn>& insns, Gva lo, Gva hi, const x86::JumpContext& jc,
                      x86::SiteIndex& padding, x86::SiteIndex& taken);
  // The island's jmp rel32 to the detour, over the padding listed (paused, before the trap byte).
  Result<void> arm_island(Domain&, JumpState&);
  // After the short jump went: the island waits for a later quiescence.
  void return_island(Domain&, JumpState&);
  // Gives back the islands whose quiescence the module confirmed (takes its own pause); with
  // `wait_ms`, first waits that long at most for it (detach).
  void advance_islands(Domain&, int wait_ms = 0);
  void cross_function_branches(Domain&, Domain::JumpIndex&);
  void image_proof(Domain&, Domain::JumpIndex&);
  channel::Verdict hit_jump(Domain&, const SlotTrap&, channel::Stop&);
  // Async probes (probe/engine_async.cpp).
  std::optional<std::string> plan_async(Domain&, const Registration&);
  Result<void> map_rings(Domain&);
  // Reads every ring of the domain, runs the handlers, then asks each ring for a notification
  // past its watermark (reading again what arrived meanwhile).
  void drain_rings(Domain&);
  // An async probe's JUMP entry: its key, with the specs at `specs`.
  static void async_key(const JumpState&, Gva specs, channel::TrapEntry&);
  channel::TrapEntry trap_entry(const Point&) const;
  bool emulate(Domain&, const x86::Insn&, x86::Plan, Regs&);
  bool next_emulated(const Point& p) const {
    return p.next && (p.next_plan == x86::Plan::EmulateBranch || p.next_plan == x86::Plan::EmulateLoaded);
  }
  void flush_deferred();

  hv::Hypervisor& hv_;
  Limits limits_;
  ChannelFor channel_for_;
  std::map<DomId, std::unique_ptr<Domain>> domains_;
  std::map<ProbeId, std::unique_ptr<Registration>> probes_;
  ProbeId next_id_ = 1;
  bool batching_ = false;
  std::vector<Domain*> batch_paused_;
  bool dispatching_ = false;
  channel::Stop* hit_stop_ = nullptr;  // the stop being dispatched (see hit_memory)
  bool hit_memory_ready_ = false;
  std::uint64_t hit_gs_base_ = 0;  // the stop's kernel GS base, set with hit_memory_ready_
  std::vector<ProbeId> deferred_removals_;
  // Journal records of calls whose return a hit has just handled: removed by after_dispatch(),
  // once the channel has resumed the vCPU at the real return address. Until then a process
  // killed in between leaves the guardian the record it needs to move that vCPU off the
  // trampoline.
  std::vector<std::pair<DomId, std::uint32_t>> returned_records_;
  bool stop_requested_ = false;
  Journal* journal_ = nullptr;
  Clock clock_;
};

}  // namespace xenprobes::probe
