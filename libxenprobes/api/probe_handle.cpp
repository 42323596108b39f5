// Probe: the handle a registration returns (include/xenprobes/xenprobes.hpp), over its Session.
#include <utility>

#include "common/log.hpp"
#include "common/result.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

Probe::Probe(Probe&& o) noexcept
    : session_(std::exchange(o.session_, nullptr)), alive_(std::move(o.alive_)), id_(std::exchange(o.id_, 0)) {}

Probe& Probe::operator=(Probe&& o) noexcept {
  if (this != &o) {
    if (auto r = unregister(); !r)
      XP_LOG(Error, "probe %llu: unregister failed: %s", (unsigned long long)id_, r.error().what.c_str());
    session_ = std::exchange(o.session_, nullptr);
    alive_ = std::move(o.alive_);
    id_ = std::exchange(o.id_, 0);
  }
  return *this;
}

Probe::~Probe() {
  if (auto r = unregister(); !r)
    XP_LOG(Error, "probe %llu: unregister failed: %s", (unsigned long long)id_, r.error().what.c_str());
}

Result<void> Probe::enable() {
  Session* s = live();
  if (!s) return fail(Errc::InvalidArgument, "the probe is not registered");
  return s->set_enabled(id_, true);
}

Result<void> Probe::disable() {
  Session* s = live();
  if (!s) return fail(Errc::InvalidArgument, "the probe is not registered");
  return s->set_enabled(id_, false);
}

Result<void> Probe::unregister() {
  Session* s = live();
  if (!s) {
    session_ = nullptr;
    alive_.reset();
    return {};
  }
  auto r = s->unregister(id_);
  // NotFound: the session already dropped it with its domain (gone, or its guest module
  // withdrew): nothing is left to restore. Any other failure keeps the handle: the probe may
  // still be armed, and a retry must find it.
  if (!r && r.error().code != Errc::NotFound) return r;
  session_ = nullptr;
  alive_.reset();
  return {};
}

ProbeStats Probe::stats() const {
  Session* s = live();
  return s ? s->stats(id_) : ProbeStats{};
}

Result<ProbeInfo> Probe::info() const {
  Session* s = live();
  if (!s) return fail(Errc::InvalidArgument, "the probe is not registered");
  return s->info(id_);
}

std::uint64_t Probe::release() {
  session_ = nullptr;
  alive_.reset();
  return id_;
}

}  // namespace xenprobes
