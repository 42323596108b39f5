// A demo guest on the simulated Xen, probed through the debugger or vmevent channel, whose
// session can be abandoned as if its process had been killed.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "api/session_testing.hpp"
#include "demo_guest.hpp"
#include "guardian/journal.hpp"
#include "guardian/recovery.hpp"

namespace xenprobes::testing {

struct Guest : SessionGuest {
  unsigned vcpus;
  std::uint64_t iterations;

  // `load`: load the demo guest's symbols, which attaches the domain (its channel, and the
  // guardian with it).
  Guest(ChannelKind ch, unsigned nvcpus, std::uint64_t iters, SessionOptions o = {}, bool load = true)
      : SessionGuest(demo_config(nvcpus, iters, ch), {}, with_channel(std::move(o), ch), load),
        vcpus(nvcpus),
        iterations(iters) {}

  // A probe on the first instruction of `fn` that runs boosted from a slot.
  Probe boosted_probe(const char* fn, PreHandler pre) {
    for (const auto& i : function(fn)) {
      auto p = session->probe(dom, i.address, pre);
      if (p && p->info()->mode == ExecMode::Boosted) return std::move(*p);
    }
    throw std::runtime_error(std::string("no boostable instruction in ") + fn);
  }

  // Drops the session as SIGKILL would, and the process's hypervisor handle with it. Returns
  // a copy of the journal's file descriptor.
  int abandon() {
    int fd = ::dup(SessionTesting::journal_fd(*session));
    auto hv = SessionTesting::abandon(std::move(session));
    hv.reset();
    return fd;
  }

 private:
  static SessionOptions with_channel(SessionOptions o, ChannelKind ch) {
    o.channel = ch;
    return o;
  }
};

}  // namespace xenprobes::testing
