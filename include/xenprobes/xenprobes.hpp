// libxenprobes, the C++ API: probes in running Xen guest kernels, handled in Dom0.
//
//   auto s = xenprobes::Session::open();                 // XENPROBES_BACKEND=xen|sim
//   s.value()->load_symbols(DomId{1}, "System.map");
//   auto p = (*s)->probe(DomId{1}, "sys_open", [](xenprobes::HitContext& c) {
//     auto path = c.read_string(xenprobes::Gva{c.regs().rdi}, 256);
//     std::printf("open(%s)\n", path ? path->c_str() : "?");
//     return 0;
//   });
//   (*s)->run();                                          // until stop()
//
// Handlers run in the thread that calls run(), one hit at a time, while the hit vCPU waits.
// A probe is an RAII handle: destroying it unregisters the probe (bytes restored exactly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xenprobes/export.h"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes {

using Regs = hv::VcpuRegs;

// What a handler sees of one hit. Valid only during the handler call.
class XENPROBES_API HitContext {
 public:
  virtual ~HitContext() = default;
  virtual DomId domain() const = 0;
  virtual VcpuId vcpu() const = 0;
  // The probe point. Pre-handlers see regs().rip == address() (PreHandler says what a
  // change of rip does).
  virtual Gva address() const = 0;
  // The registers of the hit vCPU. Written back when the vCPU resumes, the same on every
  // channel: the 16 general registers, rip, and rflags' arithmetic flags (CF PF AF ZF SF OF).
  // Everything else (the other rflags bits, cr*, efer, dr6/dr7, fs/gs base, cs/ss,
  // kernel_mode) is for reading: a change is put back as it was at the hit, with a
  // (rate-limited) warning in the log.
  virtual Regs& regs() = 0;
  // Guest-virtual memory as the hit vCPU sees it: its own page tables (a user pointer of the
  // task that hit the probe reads that task's memory), walked afresh for each hit. On the
  // guest channel the first access of a hit asks Xen for the vCPU's cr3 (one
  // XEN_DOMCTL_getvcpucontext). On a PV guest writes leave no writable mapping of the frame
  // behind (the guest frees and reuses stacks and data, and a frame Dom0 holds writable
  // cannot become a page table there).
  [[nodiscard]] virtual Result<void> read(Gva va, std::span<std::byte> out) = 0;
  [[nodiscard]] virtual Result<void> write(Gva va, std::span<const std::byte> data) = 0;
  [[nodiscard]] virtual Result<std::uint64_t> read_u64(Gva va) = 0;
  [[nodiscard]] virtual Result<std::string> read_string(Gva va, std::size_t max_len) = 0;
  // The hit vCPU's kernel GS base: x86-64 Linux's per-CPU base in kernel mode (the current
  // task, per-CPU variables). regs().gs_base holds it where the channel reports it; the guest
  // channel's mailbox does not, so there the first call of a hit asks Xen (the same
  // XEN_DOMCTL_getvcpucontext as the first memory access).
  [[nodiscard]] virtual Result<std::uint64_t> kernel_gs_base() = 0;
  // Makes run() return once this hit has been handled. The vmevent channel takes the stops in
  // its ring in rounds: those it took in the same round as this one (at most one more per
  // vCPU, that trapped again while the round was answering) are handled before run() returns.
  virtual void stop() = 0;
};

// A pre-handler's one contract: regs().rip decides where the vCPU goes. Left at the probe
// point, the probed instruction runs (then the post-handlers). Changed, the vCPU continues at
// the new rip: the probed instruction, the post-handlers and the point's later pre-handlers
// are skipped (kprobes' "set regs->ip and return 1"). Return 0. A nonzero return with rip
// unchanged is taken as 0, with a (rate-limited) warning in the log: skipping the instruction
// without moving rip would bring the vCPU straight back to the probe.
using PreHandler = std::function<int(HitContext&)>;
using PostHandler = std::function<void(HitContext&)>;

// Return probes (kretprobes' model). The entry handler runs at the function's first
// instruction and may decline to track the call by returning nonzero; the return handler
// runs when that call returns, with the return value in regs().rax (changes are written
// back) and regs().rip already the real return address. `data` is the call's own
// RetProbeOptions::data_size bytes, zeroed at entry and shared by its two handlers.
using EntryHandler = std::function<int(HitContext&, std::span<std::byte> data)>;
using ReturnHandler = std::function<void(HitContext&, std::span<std::byte> data)>;

struct RetProbeOptions {
  // Calls tracked at once, preallocated. <= 0: max(10, 2 * the domain's vCPUs), as kretprobes
  // does with NR_CPUS. A call made while all are in flight is not tracked and counts in
  // ProbeStats::untracked_calls.
  int maxactive = 0;
  std::size_t data_size = 0;  // per-call bytes for the handlers, at most 4096
};

struct ProbeStats {
  std::uint64_t hits = 0;       // handler calls (for a return probe: entries seen)
  std::uint64_t unhandled = 0;  // hits the guest went through without the handler (see docs)
  // Return probes only.
  std::uint64_t returns = 0;          // return-handler calls
  std::uint64_t untracked_calls = 0;  // calls not tracked: no free instance (raise maxactive)
  std::uint64_t declined = 0;         // calls the entry handler chose not to track
  std::uint64_t reclaimed = 0;        // instances found stale (the call left by another way)
  unsigned maxactive = 0;
  unsigned active = 0;  // calls in flight now (instances in use)
};

// How the probed instruction runs after the pre-handlers. Detour: a jump probe's, in its
// detour right after the handlers, with no trap at all.
enum class ExecMode { Boosted, Emulated, Skipped, TrapAfter, Detour };

// How a probe is put into the guest (docs/probes.md "Jump probes").
enum class ProbeMethod {
  Trap,  // a trap byte over the instruction: every channel, every instruction the rules accept
  // A 5-byte jump to a detour that calls the guest module, which hands the hit to Dom0 with no
  // trap: the guest channel, with a module that publishes its jump entry, on points the jump
  // rules accept (x86/jump_safety.hpp), pre-handlers only. Refused otherwise, saying why.
  Jump,
  Fastest,  // a jump where the point can be one, else a trap (ProbeInfo says which and why)
};
XENPROBES_API const char* probe_method_name(ProbeMethod);  // "trap", "jump", "fastest"

struct ProbeOptions {
  ProbeMethod method = ProbeMethod::Trap;
};

// Async probes (docs/probes.md "Async probes"): a jump probe whose hit the guest module writes
// as a record into the hit vCPU's ring in memory shared with Dom0, and goes on at once: no trap,
// no wait, no hypercall per hit. Dom0 reads the rings between events (run(), run_once()) and
// hands each record to the probe's handler, after the hit: the handler sees the registers and
// what the probe captured at the hit, and can change nothing in the guest.

// What a capture is read relative to: a general register of the hit, or rip.
enum class CaptureBase { Rax, Rbx, Rcx, Rdx, Rsi, Rdi, Rbp, Rsp, R8, R9, R10, R11, R12, R13, R14, R15, Rip };

// One item an async probe copies out of guest memory at every hit, with the kernel's no-fault
// reads (a page that is not there gives CaptureStatus::Fault, never a guest fault). At most 8
// per probe; each at most 1024 bytes.
struct Capture {
  enum class Kind { Bytes, String };
  Kind kind = Kind::Bytes;
  CaptureBase base = CaptureBase::Rdi;
  std::int32_t offset = 0;  // added to the register: the bytes are at base + offset
  std::uint16_t max = 8;    // Bytes: exactly this many; String: at most, its NUL included
  bool user = false;        // a user-space address (read as the hit task's), else a kernel one
  // The address decides instead of `user`: below 2^63 (x86-64's lower half) a user address,
  // else a kernel one, as bpftrace's str() reads either. Needs a guest module that publishes
  // it (rings/cap-flags; protocol.h): probe_async refuses it, saying why, on an older one.
  bool by_address = false;

  // `n` bytes at [base + offset]: Capture::bytes(CaptureBase::Rsp, 8, 8) is the u64 at [rsp+8].
  static Capture bytes(CaptureBase b, std::int32_t off, std::uint16_t n, bool user = false) {
    return Capture{Kind::Bytes, b, off, n, user};
  }
  // A NUL-terminated string at base + offset, at most `max` bytes with its NUL.
  static Capture string(CaptureBase b, std::int32_t off = 0, std::uint16_t max = 256, bool user = false) {
    return Capture{Kind::String, b, off, max, user};
  }
};

enum class CaptureStatus {
  Ok,
  Fault,      // the address could not be read: no bytes
  Truncated,  // a string longer than max: max - 1 bytes and a NUL
};

struct CaptureValue {
  CaptureStatus status = CaptureStatus::Ok;
  std::span<const std::byte> bytes;  // a string's with its NUL
  // A String capture's text (without the NUL); "" after a fault.
  std::string_view text() const {
    if (bytes.empty()) return {};
    std::string_view v(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return v.substr(0, v.find('\0'));
  }
};

// One hit of an async probe, as the guest module wrote it. Valid only during the handler call.
struct AsyncHit {
  DomId domain;
  VcpuId vcpu;
  Gva address;                // the probe point (regs.rip)
  std::uint64_t time_ns = 0;  // the guest's monotonic clock at the hit
  std::uint32_t seq = 0;      // the record's number in its vCPU's ring
  // At the probe point. The general registers, rip, rsp and rflags are the hit's; the other
  // fields (control registers, segment bases, ...) are not recorded and read 0.
  Regs regs;
  std::span<const CaptureValue> captures;  // one per Capture, in the order registered
};
using AsyncHandler = std::function<void(const AsyncHit&)>;

struct AsyncOptions {
  std::vector<Capture> captures;
};

// A domain's async rings, as Dom0 read them (Session::ring_stats).
struct RingStats {
  unsigned rings = 0;         // mapped (one per vCPU); 0 until the first async probe
  std::uint64_t records = 0;  // records read and handed to a probe
  std::uint64_t orphans = 0;  // records of a probe unregistered since (no handler ran)
  // Records whose captures their probe's specs cannot give (a count or order of captures, a
  // length, a string without its NUL): the guest wrote them wrongly; no handler ran.
  std::uint64_t bad_records = 0;
  std::uint64_t missed = 0;   // records missing by their sequence numbers
  std::uint64_t resyncs = 0;  // times a ring broke a rule and Dom0 skipped to its head
  std::uint64_t corrupt_bytes = 0;
  // The guest module's word (reported, never relied on):
  std::uint64_t drops = 0;     // hits with no room left in the ring (Dom0 did not drain in time)
  std::uint64_t nested = 0;    // hits inside a hit on the same vCPU
  std::uint64_t bad_keys = 0;  // hits whose probe entry the module refused (async_bad)
  // Synchronous hits on the guest channel the module did not notify because Dom0 said it was
  // polling the mailboxes (SessionOptions::spin_us; protocol.h header.notify_skipped). Read
  // with or without rings; 0 off the guest channel.
  std::uint64_t notify_skipped = 0;
};

struct ProbeInfo {
  Gva address;
  std::string instruction;  // "0xffffffff81000123: 48 89 e5 (mov rbp, rsp)"
  ExecMode mode = ExecMode::Boosted;
  Gva slot;        // out-of-line slot (0 for emulated and skipped instructions)
  Gva trampoline;  // return probes: the domain's return trampoline (else 0)
  // The address asked for. A probe asked for at a function's first byte sits past its endbr64
  // and its 5-byte ftrace site, which belong to the guest kernel (registers and the return
  // address are the same there); `moved_because` then says why, and `address` is where it is.
  Gva requested;
  std::string moved_because;
  // Trap or Jump: what the probe became (never Fastest). A jump probe's `slot` is its detour.
  ProbeMethod method = ProbeMethod::Trap;
  // Asked for a jump (Fastest) and got a trap: why the point cannot be a jump. A jump probe
  // that is a short jump to an island (protocol.h "Short jumps to islands"): it says so,
  // where the island is, and why no 5-byte jump (it starts "a short jump").
  std::string not_jump_because;
  // A jump probe whose jump is not written yet: the guest module has not yet confirmed that no
  // task is stopped inside the bytes the jump covers (protocol.h "Jump probes"). Meanwhile a
  // trap byte sends every hit to the detour, so the probe already fires.
  bool jump_pending = false;
  // An async probe (Session::probe_async): its hits arrive as records.
  bool async = false;
};

// One symbol of a guest kernel, at its running address (KASLR applied).
struct SymbolInfo {
  std::string name;
  Gva address;
  char type = '?';         // the nm type letter from the symbol file: T t W w are text
  bool function = false;   // a text symbol: something a probe can be put on
  std::uint64_t size = 0;  // bytes to the next symbol; 0 = unknown
};

// A loaded module's BTF, read from the guest (Session::module_btf).
struct ModuleBtf {
  std::string module;          // its name, as lsmod shows it
  std::vector<std::byte> btf;  // split BTF over the kernel's, checked by libbpf; empty when `why`
  std::string why{};           // why it has none or it was refused ("" when `btf` is set)
};

// A guest kernel's call stack at a hit (Session::kernel_stack).
struct KernelStack {
  std::vector<Gva> frames;  // innermost first: the hit's address, then the return addresses
  std::string stopped;      // why the walk ended: "end of stack", "depth limit", "stack unreadable", ...
  bool guessed = false;     // a frame had no unwind entry and was taken as a frame-pointer frame
};

class Session;
class SessionTesting;  // test hooks, libxenprobes/api/session_testing.hpp
struct SessionAccess;  // the C API's access to a session's probes, libxenprobes/api/session_access.hpp

// An RAII probe handle; move-only. Destruction unregisters.
// (The standard attribute must come first, hence the visibility in the same form.)
class [[nodiscard]] [[gnu::visibility("default")]] Probe {
 public:
  Probe() = default;
  Probe(Probe &&) noexcept;
  Probe& operator=(Probe&&) noexcept;
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  ~Probe();

  explicit operator bool() const { return session_ != nullptr && alive_ && *alive_; }
  std::uint64_t id() const { return id_; }
  [[nodiscard]] Result<void> enable();
  [[nodiscard]] Result<void> disable();
  // Restores the bytes. A probe whose domain the session already dropped (the domain died or
  // its guest module withdrew) has nothing left to restore: success. On any other failure the
  // handle keeps the probe (it may still be armed): call unregister() again.
  [[nodiscard]] Result<void> unregister();
  ProbeStats stats() const;
  [[nodiscard]] Result<ProbeInfo> info() const;
  // Gives up ownership: the probe stays registered until the session ends.
  std::uint64_t release();

 private:
  friend class Session;
  Probe(Session * s, std::shared_ptr<bool> alive, std::uint64_t id) : session_(s), alive_(std::move(alive)), id_(id) {}
  Session* live() const { return alive_ && *alive_ ? session_ : nullptr; }
  Session* session_ = nullptr;
  std::shared_ptr<bool> alive_;  // false once the session is gone: the probe went with it
  std::uint64_t id_ = 0;
};

// How hits reach Dom0 (docs/probes.md "Choosing a channel"). Auto picks per domain: guest (the
// xenprobesU module is loaded) → vmevent (HVM/PVH guest) → debugger (a Xen with GDBSX), and
// when none works the error names every channel's reason.
enum class ChannelKind { Auto, Debugger, Guest, VmEvent };
XENPROBES_API const char* channel_kind_name(ChannelKind);
[[nodiscard]] XENPROBES_API Result<ChannelKind> parse_channel_kind(std::string_view);  // "auto", "guest", ...

// The guardian (docs/guardian.md): a small process, xenprobes-guardian, that undoes what a
// session left in its guests if the session's process dies without doing it (SIGKILL, a
// crash) — for the debugger and vmevent channels, which have no fail-safe in the guest.
enum class GuardianMode {
  Auto,      // spawned with the first debugger/vmevent domain; if it cannot be, a warning
  Off,       // no journal, no guardian
  Required,  // attaching a debugger/vmevent domain fails when the guardian cannot be spawned
};

// What one session takes on at most. Each limit reached is an ENOSPC naming it, and nothing
// changes in the guest; each must be at least 1.
struct SessionLimits {
  unsigned domains = 64;              // domains probed at once
  unsigned points_per_domain = 4096;  // probe points (distinct addresses) per domain
  // Return-probe instances (the sum of the return probes' maxactive) per domain: each holds
  // its data_size bytes of Dom0 memory and, on the guest channel, a slot of the return table.
  unsigned instances_per_domain = 16384;
  // Guest frames kept mapped into Dom0 per domain (least recently used go first); each
  // mapping is one page of Dom0 address space and a grant-free foreign map in Xen.
  std::size_t mapped_frames_per_domain = 256;
};

struct SessionOptions {
  ChannelKind channel = ChannelKind::Auto;
  GuardianMode guardian = GuardianMode::Auto;
  // The guardian program: "" = $XENPROBES_GUARDIAN, else the installed
  // <libexecdir>/xenprobes/xenprobes-guardian.
  std::string guardian_path{};
  SessionLimits limits{};
  // Spinning (docs/probes.md "Spinning instead of notifying"): after a hit on the guest channel,
  // run() keeps polling the mailboxes for this many microseconds while hits keep coming, and
  // the guest module, told so, sends no event-channel notification for them (a hypercall per
  // hit saved). It costs Dom0 that much CPU after each burst of hits. 0 (the default): never.
  unsigned spin_us = 0;
};

// One hypervisor connection, its channel, and every probe it owns, in any number of domains.
// Not thread-safe, except stop(), which any thread (or a handler) may call.
class XENPROBES_API Session {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Session>> open(SessionOptions = {});
  [[nodiscard]] static Result<std::unique_ptr<Session>> open(std::unique_ptr<hv::Hypervisor>, SessionOptions = {});
  ~Session();  // unregisters every probe and restores every byte, in every domain

  hv::Hypervisor& hypervisor();
  // The channel serving a domain ("guest", "vmevent", "debugger"); attaches it if needed.
  [[nodiscard]] Result<std::string> channel_name(DomId);

  // Symbols for `symbol+offset` probe points: a System.map (or /proc/kallsyms copy) of the
  // guest's kernel, or its vmlinux (an ELF with a symbol table, such as Debian's -dbg
  // package's). KASLR: the slide comes from the kernel-text address the guest module
  // publishes, when it does. A vmlinux also lets jump probes prove tail calls, when its build id
  // is the guest's (docs/probes.md "Jump probes"); one without a symbol table (the ELF inside a
  // vmlinuz) is taken for that alone, with the symbols loaded before (the kernel's System.map, or
  // the guest's own kallsyms: load_symbols_from_guest, or what resolve() loaded); one whose
  // section headers or symbol table cannot be read is refused, the error saying why. A vmlinuz
  // itself is refused (InvalidArgument): the library does not decompress kernels.
  [[nodiscard]] Result<void> load_symbols(DomId, const std::string& system_map);
  // Symbols with no file: the guest kernel's own kallsyms tables, found and decoded in its
  // memory (docs/guest-symbols.md). They hold running addresses, so no slide is needed; with a
  // guest module its published kernel text must agree. resolve() and find_symbols() fall back
  // to this when no symbols were loaded (on a real Xen).
  [[nodiscard]] Result<void> load_symbols_from_guest(DomId);
  // The guest kernel's BTF (__start_BTF..__stop_BTF through the domain's symbols, loaded from
  // the guest if none were), validated by libbpf's parser: a blob for btf__new().
  [[nodiscard]] Result<std::vector<std::byte>> kernel_btf(DomId);
  // The BTF of every live loaded module (CONFIG_DEBUG_INFO_BTF_MODULES): its entry on the
  // kernel's btf_modules list (where Linux 5.11 and later keep it once the module's init ran and
  // struct module's btf_data is NULL), else struct module's btf_data; each bounded (16 MiB) and
  // accepted by libbpf as split BTF over kernel_btf(): parse one with
  // btf__new_split(m.btf, btf__new(kernel_btf)), or btf__parse_raw_split on a file of it where
  // libbpf does not export btf__new_split (Debian 12's 1.1.2). A module without BTF, or whose BTF is refused,
  // is listed with `why`. NotFound when the module list cannot be read (no BTF for struct
  // module's layout, no `modules` symbol). Loaded modules' functions are added to the domain's
  // symbols when they are loaded (load_symbols, load_symbols_from_guest), and follow modules
  // loaded or unloaded later (resolve, find_symbols; docs/guest-symbols.md "When modules come
  // and go"). The BTF is read at each call.
  [[nodiscard]] Result<std::vector<ModuleBtf>> module_btf(DomId);

  // The guest kernel's ORC unwind tables (CONFIG_UNWINDER_ORC: __start_orc_unwind_ip ...
  // __stop_orc_unwind through the domain's symbols), read from its memory, checked and kept for
  // kernel_stack(); a summary. NotFound when its kernel has none, InvalidArgument when they are
  // malformed (unsorted, sizes that disagree). The live modules' own tables come with them
  // (struct module's arch.orc_unwind_ip, orc_unwind, num_orcs, laid out from the kernel's BTF);
  // a module without one, or when the module list cannot be read, is unwound as frame-pointer
  // frames. Modules loaded or unloaded later are followed by kernel_stack().
  [[nodiscard]] Result<std::string> load_unwind_tables(DomId);
  // The hit vCPU's kernel call stack, walked from Dom0 with those tables (loaded by the first
  // call if load_unwind_tables() was not called; a failure to load is kept), reading the stack
  // through the hit's own view of memory: at most `max_frames` (1 ... 127) addresses. Call it
  // from a handler, while the vCPU waits. docs/xenprobe.md ("kstack") says what it can walk.
  // A module loaded or unloaded since its tables were read is seen by a look at the guest's
  // module list at most once a second, and after a walk that met an address in no known text
  // at most every 100 ms (docs/guest-symbols.md "When modules come and go").
  [[nodiscard]] Result<KernelStack> kernel_stack(HitContext&, unsigned max_frames = 127);

  [[nodiscard]] Result<Probe> probe(DomId, Gva address, PreHandler pre, PostHandler post = {});
  [[nodiscard]] Result<Probe> probe(DomId, std::string_view symbol, PreHandler pre, PostHandler post = {});
  // With options: ProbeOptions::method asks for a jump probe (or the fastest a point allows).
  [[nodiscard]] Result<Probe> probe(DomId, Gva address, PreHandler pre, PostHandler post, ProbeOptions);
  [[nodiscard]] Result<Probe> probe(DomId, std::string_view symbol, PreHandler pre, PostHandler post, ProbeOptions);

  // A return probe on the function whose first instruction is at `address` (or `symbol`).
  // Either handler may be empty. It coexists with other probes on the same address.
  [[nodiscard]] Result<Probe> ret_probe(DomId, Gva address, EntryHandler entry, ReturnHandler on_return,
                                        RetProbeOptions = {});
  [[nodiscard]] Result<Probe> ret_probe(DomId, std::string_view symbol, EntryHandler entry, ReturnHandler on_return,
                                        RetProbeOptions = {});

  // An async probe: always a jump probe (refused, saying why, where a jump cannot go, or when
  // the guest module publishes no rings); its own point (no other probe at that address).
  // `handler` runs in run()/run_once() for each record, after the hit.
  [[nodiscard]] Result<Probe> probe_async(DomId, Gva address, AsyncHandler handler, AsyncOptions = {});
  [[nodiscard]] Result<Probe> probe_async(DomId, std::string_view symbol, AsyncHandler handler, AsyncOptions = {});
  // Reads the domain's rings now (run() does between events and at least every 20 ms), and the
  // guest module's counts.
  [[nodiscard]] Result<RingStats> ring_stats(DomId);

  // `symbol` or `symbol+offset` to an address, with the symbols loaded for the domain.
  [[nodiscard]] Result<Gva> resolve(DomId, std::string_view symbol);
  // The domain's symbols whose names match a shell glob (`vfs_*`, `sys_?ead`; fnmatch(3)), in
  // name order: what a tool lists, or expands a wildcard probe into. Loads the default symbols
  // like resolve(); NotFound when the domain has none.
  // Both look at the guest's module list first: a module loaded since the symbols were loaded
  // brings its functions (`module:func` resolves), one unloaded takes its own away.
  [[nodiscard]] Result<std::vector<SymbolInfo>> find_symbols(DomId, std::string_view glob);
  // A number that changes whenever the domain's symbols change: loaded, or their loaded
  // modules' functions read again because a module came or went (seen by resolve(),
  // find_symbols(), a registration or kernel_stack()). Whoever keeps what find_symbols() gave
  // (names for a stack's addresses) asks again when it changed. 0 while the domain has none.
  std::uint64_t symbols_generation(DomId) const;
  // symbols_generation() after a look at the guest's module list now (what resolve() does
  // first): for a caller that keeps something per set of loaded modules (their BTF) and must
  // know, before it uses it, whether a module came or went. Loads the default symbols like
  // resolve(). A list that cannot be walked now (vCPU 0 in user space with page-table
  // isolation) leaves the generation as it was.
  [[nodiscard]] Result<std::uint64_t> check_modules(DomId);

  // What jump probes need to know of the domain's kernel, built now: every function of its core
  // text read and decoded once, for the branches between functions (seconds; tens of seconds in
  // a Dom0 under emulation). The first jump probe (ProbeMethod::Jump, Fastest, async) builds it
  // otherwise, with the domain paused when a batch already holds it. Call it before a batch
  // that will register jump probes. Nothing when built already.
  [[nodiscard]] Result<void> prepare_jump_probes(DomId);

  // Registrations between begin_batch() and end_batch() pause each domain once.
  [[nodiscard]] Result<void> begin_batch();
  [[nodiscard]] Result<void> end_batch();

  // Handles hits until stop() (returns Ok) or a fatal channel error.
  [[nodiscard]] Result<void> run();
  // Handles what arrives within `timeout_ms` (0: only what is pending); returns hits handled.
  [[nodiscard]] Result<unsigned> run_once(int timeout_ms);
  void stop();

  struct Impl;

 private:
  // The library's own access (Probe, the C API, the tests); none of it is exported.
  friend class Probe;
  friend struct SessionAccess;
  friend class SessionTesting;
  [[gnu::visibility("hidden")]] explicit Session(std::unique_ptr<Impl>);
  [[nodiscard, gnu::visibility("hidden")]] Result<void> set_enabled(std::uint64_t id, bool on);
  [[nodiscard, gnu::visibility("hidden")]] Result<void> unregister(std::uint64_t id);
  [[gnu::visibility("hidden")]] ProbeStats stats(std::uint64_t id) const;
  [[nodiscard, gnu::visibility("hidden")]] Result<ProbeInfo> info(std::uint64_t id) const;
  // On the simulated Xen, the demo guest's System.map unless symbols were loaded.
  [[nodiscard, gnu::visibility("hidden")]] Result<void> default_symbols(DomId);
  // default_symbols(), then on a real Xen the guest's own kallsyms if the domain still has none;
  // NotFound saying what to do when it still has none.
  [[nodiscard, gnu::visibility("hidden")]] Result<void> symbols_for_lookup(DomId);
  std::unique_ptr<Impl> impl_;
};

}  // namespace xenprobes
