// Recovery from a journal (guardian/journal.hpp): what the guardian does after the process
// that patched the guests died without undoing it (docs/guardian.md). A library function so
// that the simulated Xen can test it in-process; xenprobes-guardian calls it on the real Xen.
#pragma once

#include <functional>
#include <string>

#include "common/log.hpp"
#include "hv/hypervisor.hpp"
#include "guardian/journal.hpp"

namespace xenprobes::guardian {

struct RecoveryReport {
  unsigned domains = 0;           // journaled domains looked at
  unsigned gone = 0;              // skipped: dead or dying
  unsigned reused = 0;            // skipped: the domid names another domain now (its handle differs)
  unsigned restored = 0;          // patches put back (text bytes, slot traps made jumps)
  unsigned already = 0;           // patches already undone
  unsigned left_alone = 0;        // patches whose bytes changed since: not touched
  unsigned vcpus_moved = 0;       // vCPUs moved off a trap, a slot trap or the trampoline
  unsigned returns_restored = 0;  // stack slots given their return address back
  unsigned unpaused = 0;          // pause references released (ours and the stops')
  unsigned failures = 0;          // steps that failed (each logged; the others still ran)
};

// Called for each line of the account (the guardian also sends them to syslog).
using RecoveryLog = std::function<void(log::Level, const std::string&)>;

// Best effort, per journaled domain that still exists with the journaled handle (a domid
// another domain now holds is left alone): pause it; move vCPUs stopped on our
// traps (and on the trampoline) to where they would have gone on; put back every patch whose
// bytes are still exactly what we wrote (anything else is logged and left alone); give stack
// slots that still hold the trampoline address their return address back; turn the channel
// off (debugger: debugging mode; vmevent: monitoring and the ring, releasing every vCPU it
// paused); release our pause and every pause a stop held. Never writes a byte the journal
// does not say is ours. Skips a snapshot marked clean.
RecoveryReport recover(hv::Hypervisor&, const JournalSnapshot&, const RecoveryLog& = {});

// The account's first and last lines (docs/guardian.md, "What recovery does"): what the
// journal holds, said before recovery starts ("<who> ended without cleaning up: recovering
// ..."), and the report's counts ("done: ..."). Tools read them (the real-Xen scenarios, via
// tools/e2e/guardian-account.sh): their wording changes only with that script.
std::string describe_journal(const std::string& who, const JournalSnapshot&);
std::string describe_report(const RecoveryReport&);

}  // namespace xenprobes::guardian
