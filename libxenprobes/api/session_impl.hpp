// Session::Impl: what a Session holds (the hypervisor connection, the channels, the engine,
// the guardian) and its event loop's helpers. Private to api/session*.cpp.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "api/kernel_stack.hpp"
#include "channel/debugger.hpp"
#include "channel/eligibility.hpp"
#include "channel/event_ports.hpp"
#include "channel/guest.hpp"
#include "channel/vmevent.hpp"
#include "common/log.hpp"
#include "common/result.hpp"
#include "guardian/journal.hpp"
#include "guardian/spawn.hpp"
#include "probe/engine.hpp"
#include "guestmod/module_info.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {
inline constexpr const char* kReleaseToken = "xenprobes-release";
inline constexpr const char* kModuleToken = "xenprobes-module";

struct Session::Impl {
  std::unique_ptr<hv::Hypervisor> hv;
  SessionOptions options;
  // Opened when a domain first needs them (the debugger channel binds a host-wide VIRQ).
  std::unique_ptr<channel::GuestChannel> guest;
  std::unique_ptr<channel::VmEventChannel> vmevent;       // ICEBP: with the guest module's slots
  std::unique_ptr<channel::VmEventChannel> vmevent_int3;  // int3: agentless (Xen emulates)
  std::unique_ptr<channel::DebuggerChannel> debugger;
  std::map<DomId, channel::Channel*> chosen;
  // The guardian (docs/guardian.md): the journal exists unless it is Off; the process is
  // spawned with the first debugger/vmevent domain.
  std::unique_ptr<guardian::Journal> journal;
  std::unique_ptr<guardian::GuardianProcess> guardian;
  bool guardian_warned = false;
  std::unique_ptr<probe::Engine> engine;
  api::KernelStacks stacks;  // kernel_stack()'s ORC tables, per domain
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  std::atomic<bool> stop{false};
  int wake_fd = -1;
  bool watching = false;
  // The clock spin() measures spin_us and its 10 ms turn by; empty: steady_clock. A test's
  // virtual clock (SessionTesting::set_spin_clock) makes a spin's length independent of how
  // the machine schedules the guest's and Dom0's threads.
  std::function<std::chrono::steady_clock::time_point()> spin_clock;
  // The event loop (Session::run_once, api/session_loop.cpp): the ports fired on the handle,
  // read and acknowledged in one place; when each channel last looked at all its domains (its
  // poll_interval_ms counts from there); the clock that counts it (empty: steady_clock; a
  // test's virtual clock: SessionTesting::set_loop_clock).
  std::optional<channel::EventPorts> ports;
  std::map<const channel::Channel*, std::chrono::steady_clock::time_point> swept;
  std::function<std::chrono::steady_clock::time_point()> loop_clock;

  // Polls the guest channel's mailboxes until no hit came for `idle` (or stop()), at most
  // kMaxSpin in all (then the other channels, the xenstore and dying domains get their turn: a
  // guest that never stops hitting must not keep the loop to itself), with the modules told
  // so; then one more look after telling them it stopped. Returns hits handled.
  // Both bounds are measured by spin_clock when a test set one (SessionTesting::set_spin_clock).
  Result<unsigned> spin(std::chrono::microseconds idle) {
    constexpr std::chrono::milliseconds kMaxSpin{10};  // local: no symbol in the library's ABI
    auto now = [this] { return spin_clock ? spin_clock() : std::chrono::steady_clock::now(); };
    guest->set_polling(true);
    unsigned n = 0;
    std::optional<Error> err;
    const auto until = now() + kMaxSpin;
    for (auto last = now(); !stop && !engine->stop_requested() && now() < until;) {
      auto h = guest->process(*engine);
      if (!h) {
        err = h.error();
        break;
      }
      if (*h > 0) {
        n += *h;
        last = now();
        if (auto r = engine->after_dispatch(true); !r) {
          err = r.error();
          break;
        }
      } else if (now() - last >= idle) {
        break;
      } else {
        __builtin_ia32_pause();
      }
    }
    guest->set_polling(false);
    if (auto h = guest->process(*engine); !h) {
      if (!err) err = h.error();
    } else {
      n += *h;
    }
    if (err) return std::unexpected(*err);
    return n;
  }

  ~Impl() {
    engine.reset();  // restores every byte while the channels still exist
    while (!chosen.empty()) unwatch_module(chosen.begin()->first);
    guest.reset();
    vmevent.reset();
    vmevent_int3.reset();
    debugger.reset();
    if (watching) best_effort(hv->xs_unwatch("@releaseDomain", kReleaseToken), "removing the @releaseDomain watch");
    if (wake_fd >= 0) close(wake_fd);
    *alive = false;
    if (journal) {
      // Clean only when nothing is left: a domain whose channel could not let go stays in
      // the journal, and the guardian tears it down.
      bool clean = journal->empty();
      if (!clean)
        XP_LOG(Warn, "session end left work in the journal: the guardian finishes it once this process exits");
      journal->set_clean(clean);
      if (!clean && guardian) guardian->abandon();  // it waits for this process to exit: no use waiting for it
    }
    guardian.reset();  // EOF: the guardian reads the flag and exits (or recovers)
  }

  // As SIGKILL would leave things: nothing restored, nothing detached; the guardian's pipe
  // closes without the clean flag.
  void abandon() {
    engine->abandon();
    for (channel::Channel* c : channels()) c->abandon();
    chosen.clear();
    if (guardian) guardian->abandon();
  }

  static bool journaled_kind(ChannelKind k) { return k == ChannelKind::Debugger || k == ChannelKind::VmEvent; }

  // Before the first debugger/vmevent domain: the guardian must be watching before anything
  // is patched. Auto on the simulated Xen spawns none: the sim lives in this process and
  // dies with it (the journal is still kept, for the tests).
  Result<void> ensure_guardian() {
    if (options.guardian == GuardianMode::Off || guardian) return {};
    if (!journal) return fail(Errc::Io, "the guardian's journal could not be created");
    if (options.guardian == GuardianMode::Auto && hv->name() == "sim") return {};
    auto g =
        guardian::GuardianProcess::spawn(guardian::guardian_path(options.guardian_path), journal->fd(), hv->name());
    if (g) {
      guardian = std::move(*g);
      return {};
    }
    if (options.guardian == GuardianMode::Required)
      return fail(g.error().code, "the guardian is required and could not be started: " + g.error().what);
    if (!guardian_warned)
      XP_LOG(Warn,
             "no guardian (%s): if this process is killed, probes on the debugger and vmevent channels stay "
             "in the guests",
             g.error().what.c_str());
    guardian_warned = true;
    return {};
  }

  Result<void> journal_domain(channel::Channel* ch, DomId dom) {
    if (!journal || journal->has_domain(dom)) return {};
    guardian::JournalChannel jc;
    guardian::JournalMonitor mon = guardian::JournalMonitor::None;
    if (ch == debugger.get()) {
      jc = guardian::JournalChannel::Debugger;
    } else if (ch == vmevent.get() || ch == vmevent_int3.get()) {
      jc = guardian::JournalChannel::VmEvent;
      mon = static_cast<channel::VmEventChannel*>(ch)->mode() == channel::VmEventChannel::Mode::Int3
                ? guardian::JournalMonitor::SoftwareBreakpoints
                : guardian::JournalMonitor::DebugExceptions;
    } else {
      return {};  // the guest channel: the module's own fail-safe
    }
    hv::DomainInfo info = XP_TRY(hv->domain_info(dom));
    return journal->add_domain(dom, info.handle, jc, ch->traits().trap_byte, mon, info.vcpus);
  }

  // Domains that died are forgotten (nothing to restore in a dead guest), and so are domains
  // whose guest module withdrew (removed `state`: it disarmed every trap itself and Dom0 must
  // not write to its areas any more, protocol.h).
  void reap() {
    auto ev = hv->xs_read_watches();
    if (!ev || ev->empty()) return;
    for (DomId id : engine->domains()) {
      auto it = chosen.find(id);
      if (it != chosen.end() && it->second == guest.get()) {
        auto state = hv->xs_read(guestmod::module_key(id, XENPROBES_XS_STATE));
        if (!state && state.error().code == Errc::NotFound) {
          // The toolstack destroying the domain removes its whole xenstore directory first
          // (xl destroy does so before the domain dies): say that, not "withdrew".
          auto name = hv->xs_read("/local/domain/" + std::to_string(id.value) + "/name");
          if (!name && name.error().code == Errc::NotFound)
            XP_LOG(Warn,
                   "domain %u: its xenstore directory is gone (the toolstack is destroying it): dropping its probes",
                   id.value);
          else
            XP_LOG(Warn, "domain %u: the guest module withdrew (no %s): dropping its probes", id.value,
                   XENPROBES_XS_STATE);
          engine->forget(id);
          unwatch_module(id);
          continue;
        }
      }
      auto info = hv->domain_info(id);
      bool gone = info ? (info->dying || info->crashed) : info.error().code == Errc::NoSuchDomain;
      if (gone) {
        XP_LOG(Warn, "domain %u is %s: dropping its probes", id.value, info ? "shut down or crashed" : "gone");
        engine->forget(id);
        unwatch_module(id);
      }
    }
  }

  void unwatch_module(DomId id) {
    auto it = chosen.find(id);
    if (it == chosen.end()) return;
    if (it->second == guest.get())
      best_effort(hv->xs_unwatch(guestmod::module_key(id, XENPROBES_XS_STATE), kModuleToken),
                  "removing the guest module's xenstore watch");
    chosen.erase(it);
  }

  std::vector<channel::Channel*> channels() const {
    std::vector<channel::Channel*> out;
    for (channel::Channel* c :
         std::initializer_list<channel::Channel*>{guest.get(), vmevent.get(), vmevent_int3.get(), debugger.get()})
      if (c) out.push_back(c);
    return out;
  }

  // Tries one channel on the domain: attaches it (the engine's own attach is then a no-op).
  Result<channel::Channel*> try_channel(ChannelKind kind, DomId dom) {
    channel::Channel* ch = nullptr;
    switch (kind) {
      case ChannelKind::Guest:
        if (!guest) guest = std::make_unique<channel::GuestChannel>(*hv);
        ch = guest.get();
        break;
      case ChannelKind::VmEvent: {
        // Without the guest module there are no slots: only int3 mode lets Xen run the
        // original instruction (agentless).
        bool module =
            hv->xs_read("/local/domain/" + std::to_string(dom.value) + "/" XENPROBES_XS_DIR "/" + XENPROBES_XS_VERSION)
                .has_value();
        auto& slot = module ? vmevent : vmevent_int3;
        if (!slot) {
          auto c = channel::VmEventChannel::open(
              *hv, module ? channel::VmEventChannel::Mode::Icebp : channel::VmEventChannel::Mode::Int3);
          if (!c) return std::unexpected(c.error());
          slot = std::move(*c);
        }
        ch = slot.get();
        break;
      }
      case ChannelKind::Debugger:
        if (!debugger) {
          auto c = channel::DebuggerChannel::open(*hv);
          if (!c) return std::unexpected(c.error());
          debugger = std::move(*c);
        }
        ch = debugger.get();
        break;
      case ChannelKind::Auto: return fail(Errc::InvalidArgument, "try_channel(Auto)");
    }
    if (journaled_kind(kind)) {
      if (auto g = ensure_guardian(); !g) return std::unexpected(g.error());
      // Journaled before the channel touches the domain (debugging mode, the monitor ring).
      if (auto j = journal_domain(ch, dom); !j) return std::unexpected(j.error());
      if (kind == ChannelKind::Debugger && journal) debugger->set_journal(journal.get());
      if (kind == ChannelKind::VmEvent && journal)
        static_cast<channel::VmEventChannel*>(ch)->set_journal(journal.get());
    }
    if (auto a = ch->attach(dom); !a) {
      if (journal && journaled_kind(kind)) journal->remove_domain(dom);
      // Nothing else uses it: give the host-wide VIRQ back rather than hold it for nothing.
      if (ch == debugger.get() &&
          std::none_of(chosen.begin(), chosen.end(), [&](const auto& e) { return e.second == ch; }))
        debugger.reset();
      return std::unexpected(a.error());
    }
    return ch;
  }

  // The channel for a domain: the one asked for, or with Auto the first that works of guest
  // (module present), vmevent (HVM/PVH), debugger (GDBSX), each refusal kept for the error.
  Result<channel::Channel*> choose(DomId dom) {
    if (auto it = chosen.find(dom); it != chosen.end()) {
      XP_TRY(journal_domain(it->second, dom));  // dropped if the engine's attach failed before
      return it->second;
    }
    std::vector<ChannelKind> order{options.channel};
    if (options.channel == ChannelKind::Auto) order.assign(channel::kAutoOrder.begin(), channel::kAutoOrder.end());
    std::string why;
    for (ChannelKind k : order) {
      auto ch = try_channel(k, dom);
      if (ch) {
        XP_LOG(Info, "domain %u: probing through the %s channel", dom.value, (*ch)->name());
        chosen[dom] = *ch;
        if (*ch == guest.get())  // noticed by reap() when the module withdraws
          if (auto w = hv->xs_watch(guestmod::module_key(dom, XENPROBES_XS_STATE), kModuleToken); !w)
            XP_LOG(Warn, "domain %u: cannot watch the guest module's state: %s", dom.value, w.error().what.c_str());
        return *ch;
      }
      if (order.size() == 1) return std::unexpected(ch.error());
      if (ch.error().code == Errc::NoSuchDomain) return std::unexpected(ch.error());
      why += std::string(why.empty() ? "" : "; ") + channel_kind_name(k) + " channel: " + ch.error().what;
    }
    return fail(Errc::NotSupported, "domain " + std::to_string(dom.value) + ": no channel can probe it (" + why + ")");
  }
};

}  // namespace xenprobes
