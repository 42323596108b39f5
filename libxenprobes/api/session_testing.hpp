// Test hooks on a Session (the guardian's tests, tests/guardian/; the spinning tests,
// tests/engine/spin_test.cpp). Not part of the API: the library's own tests link the static
// layers and reach them; libxenprobes.so hides them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>

#include "channel/event_ports.hpp"
#include "channel/guest.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

class SessionTesting {
 public:
  // The guardian's journal (a memfd; -1 when the guardian is Off). dup() it to keep it.
  static int journal_fd(Session&);
  static pid_t guardian_pid(Session&);  // -1: none spawned
  // Waits up to `ms` for the guardian to exit; its wait status, or -1.
  static int wait_guardian(Session&, int ms);
  // Drops the session as SIGKILL would: no byte restored, no channel detached, no vCPU
  // answered, the journal left as it is, the guardian's pipe closed without the clean flag.
  // Returns the hypervisor handle (destroy it to release what the process's death releases).
  static std::unique_ptr<hv::Hypervisor> abandon(std::unique_ptr<Session>);
  // What the guest module counts in `dom`'s control area, as the guest channel reads it.
  // InvalidArgument when the session has no guest channel or `dom` is not attached to it.
  [[nodiscard]] static Result<channel::GuestChannel::ModuleCounters> module_counters(Session&, DomId dom);
  // The clock run_once()'s spin (SessionOptions::spin_us) measures its idle time and its 10 ms
  // turn by, instead of steady_clock (an empty function: steady_clock again). A test's virtual
  // clock makes how many hits one spin sees independent of the machine's load.
  static void set_spin_clock(Session&, std::function<std::chrono::steady_clock::time_point()>);
  // The clock kernel_stack() rates its looks at the module list by (empty: steady_clock): a
  // test's virtual clock decides when a hit's walk looks again.
  static void set_module_clock(Session&, std::function<std::chrono::steady_clock::time_point()>);
  // The clock run_once() counts the channels' poll_interval_ms by (when a channel's look at
  // all its domains is due), instead of steady_clock (empty: steady_clock again). A clock that
  // stands still makes no such look due after the first: only the ports that fire wake anyone.
  static void set_loop_clock(Session&, std::function<std::chrono::steady_clock::time_point()>);
  // The ports the event loop read on the hypervisor handle, and those no channel owned.
  static channel::EventPorts::Counters event_ports(Session&);
  // The guest channel's own counts for `dom` (looks at its mailboxes among them).
  // InvalidArgument when the session has no guest channel.
  [[nodiscard]] static Result<channel::GuestChannel::Stats> guest_stats(Session&, DomId dom);
  // Whether what jump probes need of `dom`'s kernel is built (Session::prepare_jump_probes, or a
  // first jump probe).
  static bool jumps_prepared(Session&, DomId dom);
};

}  // namespace xenprobes
