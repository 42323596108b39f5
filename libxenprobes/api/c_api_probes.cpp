// The C API's jump probes, async probes, probe info and ring statistics
// (include/xenprobes/xenprobes.h) over Session::probe(..., ProbeOptions), Session::probe_async
// and Session::ring_stats. Same rules as c_api.cpp: every entry point is noexcept and runs
// through entry(); every call that touches the session holds State::mu.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/c_api_internal.hpp"
#include "api/session_access.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {
namespace {

using namespace capi;

// The C enums are the C++ ones, value for value.
static_assert(XENPROBE_METHOD_TRAP == static_cast<int>(ProbeMethod::Trap));
static_assert(XENPROBE_METHOD_JUMP == static_cast<int>(ProbeMethod::Jump));
static_assert(XENPROBE_METHOD_FASTEST == static_cast<int>(ProbeMethod::Fastest));
static_assert(XENPROBE_MODE_BOOSTED == static_cast<int>(ExecMode::Boosted));
static_assert(XENPROBE_MODE_EMULATED == static_cast<int>(ExecMode::Emulated));
static_assert(XENPROBE_MODE_SKIPPED == static_cast<int>(ExecMode::Skipped));
static_assert(XENPROBE_MODE_TRAP_AFTER == static_cast<int>(ExecMode::TrapAfter));
static_assert(XENPROBE_MODE_DETOUR == static_cast<int>(ExecMode::Detour));
static_assert(XENPROBE_REG_RAX == static_cast<int>(CaptureBase::Rax));
static_assert(XENPROBE_REG_RDI == static_cast<int>(CaptureBase::Rdi));
static_assert(XENPROBE_REG_RSP == static_cast<int>(CaptureBase::Rsp));
static_assert(XENPROBE_REG_R15 == static_cast<int>(CaptureBase::R15));
static_assert(XENPROBE_REG_RIP == static_cast<int>(CaptureBase::Rip));
static_assert(XENPROBE_CAPTURE_BYTES == static_cast<int>(Capture::Kind::Bytes));
static_assert(XENPROBE_CAPTURE_STRING == static_cast<int>(Capture::Kind::String));
// The layouts the header promises (a C program reads them without our compiler's help).
static_assert(sizeof(xenprobe_capture) == 12);
static_assert(offsetof(xenprobe_capture, flags) == 3 && offsetof(xenprobe_capture, offset) == 4);
static_assert(sizeof(xenprobe_capture_value) == 16);
static_assert(offsetof(xenprobe_async_hit, address) == 16);
static_assert(offsetof(xenprobe_async_hit, regs) == 32);
static_assert(offsetof(xenprobe_async_hit, captures) == 240);
static_assert(offsetof(xenprobe_info, address) == 24);
static_assert(offsetof(xenprobe_ring_stats, records) == 8);
// Version 1 ends with bad_keys; version 2 adds bad_records and notify_skipped after it.
static_assert(offsetof(xenprobe_ring_stats, bad_keys) == 64);
static_assert(offsetof(xenprobe_ring_stats, bad_records) == 72 && offsetof(xenprobe_ring_stats, notify_skipped) == 80);
static_assert(sizeof(xenprobe_ring_stats) == 88);

// The three strings xenprobes_info() hands out, kept until this thread's next call.
struct InfoStrings {
  std::string instruction, moved_because, not_jump_because;
};
thread_local InfoStrings t_info;

std::string version_error(const char* fn, const char* type, std::uint32_t got, std::uint32_t known, const char* macro) {
  return std::string(fn) + "(): struct " + type + " version " + std::to_string(got) + "; this library knows version " +
         std::to_string(known) + " (set out->version = " + macro + ")";
}

Result<Capture> to_capture(const xenprobe_capture& c, unsigned k) {
  const std::string which = "capture " + std::to_string(k) + ": ";
  if (c.kind != XENPROBE_CAPTURE_BYTES && c.kind != XENPROBE_CAPTURE_STRING)
    return fail(Errc::InvalidArgument,
                which + "kind " + std::to_string(c.kind) + " (use XENPROBE_CAPTURE_BYTES or XENPROBE_CAPTURE_STRING)");
  if (c.base > XENPROBE_REG_RIP)
    return fail(Errc::InvalidArgument, which + "base " + std::to_string(c.base) + " is no enum xenprobe_reg");
  if (c.flags & ~XENPROBE_CAPTURE_BY_ADDRESS)
    return fail(Errc::InvalidArgument,
                which + "flags " + std::to_string(c.flags) + " (use 0 or XENPROBE_CAPTURE_BY_ADDRESS)");
  const bool by_address = (c.flags & XENPROBE_CAPTURE_BY_ADDRESS) != 0;
  if (by_address && c.user != 0)
    return fail(Errc::InvalidArgument, which + "user " + std::to_string(c.user) +
                                           " with XENPROBE_CAPTURE_BY_ADDRESS: the address decides, set user to 0");
  if (c.max == 0 || c.max > XENPROBE_CAPTURE_MAX_BYTES)
    return fail(Errc::InvalidArgument, which + "max " + std::to_string(c.max) + " bytes, must be 1.." +
                                           std::to_string(XENPROBE_CAPTURE_MAX_BYTES));
  Capture out;
  out.kind = static_cast<Capture::Kind>(c.kind);
  out.base = static_cast<CaptureBase>(c.base);
  out.offset = c.offset;
  out.max = static_cast<std::uint16_t>(c.max);
  out.user = c.user != 0;
  out.by_address = by_address;
  return out;
}

// Hands one record to a C handler. The values array lives on this frame: the pointers are
// valid during the call only, as the header says.
void call_async(int handle, xenprobe_async_handler_t fn, void* arg, const AsyncHit& h) {
  xenprobe_async_hit hit{};
  hit.handle = handle;
  hit.domid = static_cast<domid_t>(h.domain.value);
  hit.vcpu = h.vcpu.value;
  hit.seq = h.seq;
  hit.address = h.address.value;
  hit.time_ns = h.time_ns;
  to_c(h.regs, hit.regs);
  xenprobe_capture_value values[XENPROBE_MAX_CAPTURES] = {};
  const std::size_t n = std::min<std::size_t>(h.captures.size(), XENPROBE_MAX_CAPTURES);
  for (std::size_t k = 0; k < n; ++k) {
    const CaptureValue& v = h.captures[k];
    values[k].status = v.status == CaptureStatus::Ok          ? XENPROBE_CAPTURE_OK
                       : v.status == CaptureStatus::Truncated ? XENPROBE_CAPTURE_TRUNCATED
                                                              : XENPROBE_CAPTURE_FAULT;
    values[k].length = static_cast<std::uint32_t>(v.bytes.size());
    values[k].data = v.bytes.empty() ? nullptr : reinterpret_cast<const unsigned char*>(v.bytes.data());
  }
  hit.ncaptures = static_cast<std::uint32_t>(n);
  hit.captures = n ? values : nullptr;
  AsyncHandlerScope scope;
  try {
    fn(&hit, arg);
  } catch (...) { handler_threw(handle); }
}

// EINVAL with the message `what()` builds, inside entry(): building it may throw.
template <typename What>
int refuse(What&& what) noexcept {
  return entry([&]() -> Result<int> { return fail(Errc::InvalidArgument, what()); });
}

}  // namespace
}  // namespace xenprobes

using namespace xenprobes;
using namespace xenprobes::capi;

extern "C" {

xenprobes_handle_t register_xenprobe_method(domid_t domid, const char* symbol, unsigned long address,
                                            xenprobe_handler_t pre_handler, xenprobe_handler_t post_handler,
                                            enum xenprobe_method method) noexcept {
  // An enum parameter from C may hold any int.
  const int m = static_cast<int>(method);
  if (m != XENPROBE_METHOD_TRAP && m != XENPROBE_METHOD_JUMP && m != XENPROBE_METHOD_FASTEST)
    return refuse([&] {
      return "register_xenprobe_method(): unknown method " + std::to_string(m) +
             " (use XENPROBE_METHOD_TRAP, _JUMP or _FASTEST)";
    });
  return register_probe(domid, symbol, address, pre_handler, post_handler, ProbeOptions{static_cast<ProbeMethod>(m)});
}

int xenprobes_info(xenprobes_handle_t handle, struct xenprobe_info* out) noexcept {
  return entry([&]() -> Result<int> {
    if (!out) return fail(Errc::InvalidArgument, "xenprobes_info(): NULL out");
    if (out->version != XENPROBE_INFO_VERSION)
      return fail(Errc::InvalidArgument, version_error("xenprobes_info", "xenprobe_info", out->version,
                                                       XENPROBE_INFO_VERSION, "XENPROBE_INFO_VERSION"));
    auto lock = XP_TRY(acquire());
    State& s = state();
    CProbe* p = XP_TRY(find(s, handle));
    ProbeInfo info = XP_TRY(SessionAccess::info(*s.session, p->id));
    t_info = InfoStrings{std::move(info.instruction), std::move(info.moved_because), std::move(info.not_jump_because)};
    out->method = static_cast<std::uint32_t>(info.method);
    out->mode = static_cast<std::uint32_t>(info.mode);
    out->jump_pending = info.jump_pending ? 1 : 0;
    out->async = info.async ? 1 : 0;
    out->ret = p->ret ? 1 : 0;
    out->address = info.address.value;
    out->requested = info.requested.value;
    out->slot = info.slot.value;
    out->trampoline = info.trampoline.value;
    out->instruction = t_info.instruction.c_str();
    out->moved_because = t_info.moved_because.c_str();
    out->not_jump_because = t_info.not_jump_because.c_str();
    return 0;
  });
}

xenprobes_handle_t register_xenprobe_async(domid_t domid, const char* symbol, unsigned long address,
                                           const struct xenprobe_capture* captures, unsigned ncaptures,
                                           xenprobe_async_handler_t handler, void* arg) noexcept {
  if (!handler) return set_error(EINVAL, "register_xenprobe_async(): NULL handler");
  if (ncaptures > XENPROBE_MAX_CAPTURES)
    return refuse([&] {
      return "register_xenprobe_async(): " + std::to_string(ncaptures) + " captures: an async probe has at most " +
             std::to_string(XENPROBE_MAX_CAPTURES);
    });
  if (ncaptures && !captures) return set_error(EINVAL, "register_xenprobe_async(): NULL captures with ncaptures > 0");
  return register_with(domid, false, [&](Session& ses, DomId dom, int h) -> Result<Probe> {
    AsyncOptions o;
    for (unsigned k = 0; k < ncaptures; ++k) o.captures.push_back(XP_TRY(to_capture(captures[k], k)));
    AsyncHandler fn = [h, handler, arg](const AsyncHit& hit) { call_async(h, handler, arg, hit); };
    return symbol ? ses.probe_async(dom, std::string_view(symbol), std::move(fn), std::move(o))
                  : ses.probe_async(dom, Gva{address}, std::move(fn), std::move(o));
  });
}

int xenprobes_ring_stats(domid_t domid, struct xenprobe_ring_stats* out) noexcept {
  return entry([&]() -> Result<int> {
    if (!out) return fail(Errc::InvalidArgument, "xenprobes_ring_stats(): NULL out");
    // Version 1 callers allocated the struct up to bad_keys: nothing is written past it.
    const std::uint32_t version = out->version;
    if (version != 1 && version != XENPROBE_RING_STATS_VERSION)
      return fail(Errc::InvalidArgument, "xenprobes_ring_stats(): struct xenprobe_ring_stats version " +
                                             std::to_string(version) + "; this library knows versions 1 and " +
                                             std::to_string(XENPROBE_RING_STATS_VERSION) +
                                             " (set out->version = XENPROBE_RING_STATS_VERSION)");
    auto lock = XP_TRY(acquire());
    CloseWhenDone close_when_done;  // the handlers it runs may close the session
    Session* ses = XP_TRY(session(state()));
    RingStats r = XP_TRY(ses->ring_stats(DomId{domid}));
    out->rings = r.rings;
    out->records = r.records;
    out->orphans = r.orphans;
    out->missed = r.missed;
    out->resyncs = r.resyncs;
    out->corrupt_bytes = r.corrupt_bytes;
    out->drops = r.drops;
    out->nested = r.nested;
    out->bad_keys = r.bad_keys;
    if (version >= 2) {
      out->bad_records = r.bad_records;
      out->notify_skipped = r.notify_skipped;
    }
    return 0;
  });
}

}  // extern "C"
