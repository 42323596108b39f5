// Pausing domains: nested holds, batches, and the journal's record of a held pause.
#include "probe/engine_internal.hpp"

namespace xenprobes::probe {

Result<void> Engine::pause(Domain& d) {
  auto first = [&]() -> Result<void> {
    // Journaled before the pause: a process killed right after it leaves the guardian a
    // pause to release (it releases one only while the domain is still paused).
    if (d.journaled) journal_->add_held_pause(d.id);
    if (auto p = hv_.pause(d.id); !p) {
      if (d.journaled) journal_->drop_held_pause(d.id);
      return p;
    }
    // Paused, vCPU 0's page tables cannot go away: walk those, with nothing cached from
    // before (the guest ran).
    if (auto r = refresh_context(d); !r) {
      d.memory->invalidate_translations();
      if (auto u = hv_.unpause(d.id); !u && u.error().code != Errc::NoSuchDomain) {
        XP_LOG(Error, "domain %u: could not unpause: %s", d.id.value, u.error().what.c_str());
        d.stuck_pauses++;
      } else if (d.journaled) {
        journal_->drop_held_pause(d.id);
      }
      return r;
    }
    return {};
  };
  if (batching_ && std::find(batch_paused_.begin(), batch_paused_.end(), &d) == batch_paused_.end()) {
    // The batch's own hold, released by end_batch().
    if (d.pause_depth == 0) XP_TRY(first());
    d.pause_depth++;
    batch_paused_.push_back(&d);
  }
  if (d.pause_depth == 0) XP_TRY(first());
  d.pause_depth++;
  return {};
}

// Releases our hold when the last nested one goes, then any earlier hold whose release failed
// (the domain stayed paused by it).
Result<void> Engine::unpause(Domain& d) {
  if (d.pause_depth == 0) return {};
  if (--d.pause_depth > 0) return {};
  unsigned holds = 1 + d.stuck_pauses;
  d.stuck_pauses = 0;
  while (holds > 0) {
    Result<void> r;
    for (int attempt = 0; attempt < 3; ++attempt) {
      r = hv_.unpause(d.id);
      if (r || r.error().code == Errc::NoSuchDomain) break;
      XP_LOG(Warn, "domain %u: unpause failed (%s), retrying", d.id.value, r.error().what.c_str());
    }
    if (!r && r.error().code != Errc::NoSuchDomain) {
      XP_LOG(Error, "domain %u: could not unpause: %s", d.id.value, r.error().what.c_str());
      d.stuck_pauses = holds;  // still ours and journaled: the next release tries them again
      return r;
    }
    if (d.journaled) journal_->drop_held_pause(d.id);
    --holds;
  }
  return {};
}

Result<void> Engine::begin_batch() {
  if (batching_) return fail(Errc::Busy, "a batch is already open");
  batching_ = true;
  return {};
}

Result<void> Engine::end_batch() {
  if (!batching_) return fail(Errc::InvalidArgument, "no batch is open");
  batching_ = false;
  Result<void> r;
  for (Domain* d : batch_paused_)
    if (auto u = unpause(*d); !u) r = u;
  batch_paused_.clear();
  return r;
}

}  // namespace xenprobes::probe
