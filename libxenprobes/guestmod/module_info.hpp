// What the guest module (xenprobesU) publishes in xenstore, read and validated as hostile
// input. The key set and the growth protocol are documented in include/xenprobes/protocol.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "common/types.hpp"
#include "hv/hypervisor.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::mem {
class GuestMemory;
}

namespace xenprobes::guestmod {

// One out-of-line execution area: [addr, addr + size), guest-virtual.
struct OeaArea {
  Gva addr;
  std::uint64_t size = 0;

  // The last byte (an area may end exactly at the top of the address space, so no end()).
  std::uint64_t last() const { return addr.value + size - 1; }
  bool contains(Gva va) const { return va.value >= addr.value && va.value - addr.value < size; }
  bool operator==(const OeaArea&) const = default;
};

// Out-of-line slots whose faults reach the original instruction's fixup (fixup-slots/*,
// protocol.h): `count` slots of XENPROBES_FIXUP_SLOT_SIZE bytes from `addr`, the exception-table
// entry of slot k at `table` + 12 k.
struct FixupSlots {
  Gva addr;
  unsigned count = 0;
  Gva table;
  Gva slot(unsigned k) const { return Gva{addr.value + std::uint64_t{k} * XENPROBES_FIXUP_SLOT_SIZE}; }
  Gva entry(unsigned k) const { return Gva{table.value + std::uint64_t{k} * XENPROBES_FIXUP_ENTRY_SIZE}; }
  bool contains(Gva va) const {
    return va.value >= addr.value && va.value - addr.value < std::uint64_t{count} * XENPROBES_FIXUP_SLOT_SIZE;
  }
};

struct ModuleInfo {
  unsigned version = 0;
  Gva kernel_text;      // the running kernel's _text (KASLR slide = kernel_text - link address)
  std::string release;  // uname -r
  unsigned nr_cpus = 0;
  std::vector<OeaArea> areas;  // in publication order (oea/0 first)
  // The module's own core text [module_text_start, module_text_end) (module-text/start and
  // module-text/end, optional): its int3 hook runs this code, so no probe may go there (the hook
  // would recurse into itself). Both 0 when the module does not publish them. The real module's
  // range contains its OEA areas (its static pool is a section of its text), where slots live.
  Gva module_text_start{0};
  Gva module_text_end{0};

  // fixup-slots/* (optional): none from a module that does not publish them.
  std::optional<FixupSlots> fixup_slots;
  // jump-entry (optional): the function a jump probe's detour calls (protocol.h, "Jump probes");
  // none from a module that makes no jump probes.
  std::optional<Gva> jump_entry;

  bool has_module_text() const { return module_text_end.value != 0; }
  bool in_module_text(Gva va) const { return va.value >= module_text_start.value && va.value < module_text_end.value; }
};

// Tells whether the guest page at `page` (4 KiB aligned) is mapped (and executable) in the
// guest; an error says why not. The engine passes check_mapped_via(GuestMemory).
using CheckMapped = std::function<Result<void>(Gva page)>;

struct ModuleInfoOptions {
  // An area must not overlap [kernel_text, kernel_text + kernel_text_guard). We are not told
  // where the kernel image ends, so this is a lower bound on its size: every x86-64 Linux
  // image is larger than 16 MiB with a distribution config, and module memory (where a real
  // OEA lives: MODULES_VADDR) always starts past the image's end. It catches a module that
  // publishes kernel text itself as its "area"; it is not a proof that the area is free.
  std::uint64_t kernel_text_guard = 16ull << 20;
};

inline constexpr unsigned kMaxNrCpus = 8192;                             // Linux CONFIG_NR_CPUS upper bound
inline constexpr std::size_t kMaxReleaseLen = 64;                        // utsname.release without the NUL
inline constexpr std::uint64_t kUpperHalfStart = 0xffff800000000000ull;  // canonical with LA48 and LA57
// module-text's largest range: the real module's text (a few dozen KiB of code plus its static
// OEA pool, 2 MiB by default) stays far below it; a larger value is not a module's text.
inline constexpr std::uint64_t kMaxModuleText = XENPROBES_MODULE_TEXT_MAX_SIZE;

// "/local/domain/<id>/data/xenprobes" and "/local/domain/<id>/data/xenprobes/<key>".
std::string module_dir(DomId);
std::string module_key(DomId, std::string_view key);

// Reads and validates everything the module publishes (the order of the checks: version,
// state, kernel-text, release, nr-cpus, oea/count, then each area, then module-text). Errors:
//  - NotFound: no version key (module not loaded), a required key is missing, or one of
//    module-text/start and module-text/end without the other;
//  - NotSupported: another protocol version;
//  - Again: state is not "ready" (the module is still publishing: watch the state key);
//  - InvalidArgument: a value is malformed or breaks a rule; the message names the key and
//    the (sanitised) value;
//  - Fault: a page of an area is not mapped (check_mapped's reason appended);
//  - whatever xs_read fails with otherwise.
[[nodiscard]] Result<ModuleInfo> read_module_info(hv::Hypervisor& hv, DomId dom, const CheckMapped& check_mapped,
                                                  const ModuleInfoOptions& options = {});

// The guest channel's keys (protocol.h, module version 1): where the control area is and
// which port the module allocated for Dom0. Optional for the module (an older one publishes
// none of them); read only by the guest channel, so that a module without them still serves
// the other channels.
struct GuestChannelInfo {
  Gva control;               // control/addr: page aligned, canonical upper half
  unsigned pages = 0;        // control/pages: 1..XENPROBES_CTL_MAX_PAGES
  std::uint32_t evtchn = 0;  // evtchn: the module's unbound port, 1..kMaxEvtchnPort
  // features (optional): the XENPROBES_FEATURE_* bits Dom0 knows that the module says it
  // implements; 0 from an older module.
  std::uint32_t features = 0;

  std::uint64_t size() const { return std::uint64_t{pages} * kPageSize; }
  std::uint64_t last() const { return control.value + size() - 1; }
};

// The FIFO event-channel ABI has 2^17 ports (the 2-level ABI of a 64-bit guest 4096); port 0
// is never allocated.
inline constexpr std::uint32_t kMaxEvtchnPort = (1u << 17) - 1;

// Reads and validates the guest channel's keys of a module whose other keys `info` holds
// (read_module_info first: it checks version and state). The control area must not wrap,
// must lie outside [kernel_text, kernel_text + kernel_text_guard) and outside every OEA area
// of `info`. Errors:
//  - NotFound: control/addr is absent (the module predates the guest channel; the message
//    names the alternatives), or control/addr is there but another of the keys is missing;
//  - InvalidArgument: a value is malformed or breaks a rule (key and sanitised value named);
//  - whatever xs_read fails with otherwise.
// Whether the pages are mapped and writable is the channel's check (it translates them).
[[nodiscard]] Result<GuestChannelInfo> read_guest_channel_info(hv::Hypervisor& hv, DomId dom, const ModuleInfo& info,
                                                               const ModuleInfoOptions& options = {});

// features (protocol.h; optional): the XENPROBES_FEATURE_* bits Dom0 knows that the module
// publishes, 0 when the key is absent (an older module). InvalidArgument when malformed.
[[nodiscard]] Result<std::uint32_t> read_features(hv::Hypervisor& hv, DomId dom);

// The async rings (rings/*, protocol.h "Async jump probes"): `count` rings of
// XENPROBES_RING_DATA_OFFSET + 2^order bytes each, one after the other from `addr`, ring v for
// the vCPU whose Xen id is v.
struct RingsInfo {
  Gva addr;
  unsigned count = 0;
  unsigned order = 0;
  // rings/cap-flags: the capture kind flags the module reads (XENPROBES_CAP_USER always; the
  // optional key adds others, e.g. XENPROBES_CAP_AUTO).
  std::uint32_t cap_flags = XENPROBES_CAP_USER;

  std::uint64_t stride() const { return XENPROBES_RING_DATA_OFFSET + (std::uint64_t{1} << order); }
  Gva ring(unsigned v) const { return addr + std::uint64_t{v} * stride(); }
  std::uint64_t bytes() const { return std::uint64_t{count} * stride(); }
};

// All the rings of one domain together stay below this (64 vCPUs with 4 MiB of data each): a
// larger total is not a module's rings, and Dom0 maps all of them.
inline constexpr std::uint64_t kMaxRingsBytes = 256ull << 20;

// Reads and validates the rings a module whose other keys `info` holds publishes. nullopt: the
// module publishes none of the three keys (it makes no async probes); rings/cap-flags is
// optional (absent: XENPROBES_CAP_USER only; flags Dom0 does not know are ignored). The rings must be page
// aligned in the upper half, not wrap, stay within kMaxRingsBytes, and lie outside the kernel
// text guard, the module's text and every OEA area; count 1..nr-cpus, order
// XENPROBES_RING_MIN_ORDER..XENPROBES_RING_MAX_ORDER. Errors: InvalidArgument (a key missing
// while another is there, a malformed value or a broken rule; the key and sanitised value
// named), or whatever xs_read fails with. Whether the pages are mapped and writable is the
// mapper's check (guestmod/rings.hpp).
[[nodiscard]] Result<std::optional<RingsInfo>> read_rings_info(hv::Hypervisor& hv, DomId dom, const ModuleInfo& info,
                                                               const ModuleInfoOptions& options = {});

// hook-path/* (protocol.h): the kernel functions the module's own hit path calls out to, as
// addresses the module took itself. nullopt: the module publishes no hook-path/count (an older
// one; an entry without the count is InvalidArgument). Otherwise the addresses, sorted, without
// duplicates: count 0..XENPROBES_HOOK_PATH_MAX, each entry strict hex in the upper half.
// Errors: InvalidArgument (a malformed value, an entry missing; key and sanitised value named),
// or whatever xs_read fails with. The caller refuses every guest-channel probe on an error: it
// cannot tell the hook's path from other code (address_rules.hpp, RuleContext::hook_path).
[[nodiscard]] Result<std::optional<std::vector<std::uint64_t>>> read_hook_path(hv::Hypervisor& hv, DomId dom);

// The areas of `fresh` (a re-read after growth) that `known` does not have yet. A known area
// that moved or vanished is refused with Io: Dom0 may have slot code in it.
[[nodiscard]] Result<std::vector<OeaArea>> added_areas(const ModuleInfo& fresh, std::span<const OeaArea> known);

// Asks the module for one more area of at least `bytes` (rounded up to whole pages): removes
// a stale oea-error, then writes oea-request. InvalidArgument for 0 or more than
// XENPROBES_OEA_MAX_SIZE. Watch module_key(dom, XENPROBES_XS_OEA_COUNT) (and oea-error), then
// read_module_info + added_areas + OeaPool::add_area.
[[nodiscard]] Result<void> request_growth(hv::Hypervisor& hv, DomId dom, std::size_t bytes);

// A CheckMapped that walks the guest's page tables: the page must translate and must not be
// NX (the guest executes slot code). The GuestMemory must outlive the callback.
CheckMapped check_mapped_via(mem::GuestMemory& memory);

// Strict parsers for hostile strings (exposed for tests).
// Decimal: 1..20 digits, no sign, blanks or leading zeros ("0" itself is fine), value <= max.
[[nodiscard]] std::optional<std::uint64_t> parse_decimal(std::string_view s, std::uint64_t max);
// Hex: "0x" or "0X" then 1..16 hex digits, nothing else.
[[nodiscard]] std::optional<std::uint64_t> parse_hex(std::string_view s);
// A hostile value made safe for an error message: printable ASCII, at most 40 characters.
std::string sanitize(std::string_view s);

}  // namespace xenprobes::guestmod
