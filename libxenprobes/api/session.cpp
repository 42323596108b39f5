// Session: the C++ API over the engine, a channel and the event loop.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "channel/debugger.hpp"
#include "common/log.hpp"
#include "common/result.hpp"
#include "hv/sim/sim.hpp"
#include "probe/engine.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {
namespace {
constexpr const char* kReleaseToken = "xenprobes-release";
}

struct Session::Impl {
  std::unique_ptr<hv::Hypervisor> hv;
  std::unique_ptr<channel::Channel> channel;
  std::unique_ptr<probe::Engine> engine;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  std::atomic<bool> stop{false};
  int wake_fd = -1;
  bool watching = false;

  ~Impl() {
    engine.reset();  // restores every byte while the channel still exists
    channel.reset();
    if (watching) (void)hv->xs_unwatch("@releaseDomain", kReleaseToken);
    if (wake_fd >= 0) close(wake_fd);
    *alive = false;
  }

  // Domains that died are forgotten (nothing to restore in a dead guest).
  void reap() {
    auto ev = hv->xs_read_watches();
    if (!ev || ev->empty()) return;
    for (DomId id : engine->domains()) {
      auto info = hv->domain_info(id);
      bool gone = info ? (info->dying || info->crashed) : info.error().code == Errc::NoSuchDomain;
      if (gone) {
        XP_LOG(Warn, "domain %u is %s: dropping its probes", id.value, info ? "shut down or crashed" : "gone");
        engine->forget(id);
      }
    }
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::open(SessionOptions o) {
  auto hv = XP_TRY(hv::open_hypervisor());
  return open(std::move(hv), o);
}

Result<std::unique_ptr<Session>> Session::open(std::unique_ptr<hv::Hypervisor> hv, SessionOptions o) {
  if (!hv) return fail(Errc::InvalidArgument, "Session::open: no hypervisor");
  auto impl = std::make_unique<Impl>();
  impl->hv = std::move(hv);
  switch (o.channel) {
    case ChannelKind::Auto:
    case ChannelKind::Debugger: {
      auto ch = channel::DebuggerChannel::open(*impl->hv);
      if (!ch) return std::unexpected(ch.error());
      impl->channel = std::move(*ch);
      break;
    }
  }
  impl->engine = std::make_unique<probe::Engine>(*impl->hv, *impl->channel);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (auto w = impl->hv->xs_watch("@releaseDomain", kReleaseToken); w)
    impl->watching = true;
  else
    XP_LOG(Warn, "cannot watch @releaseDomain (%s): dead domains are noticed on their next error",
           w.error().what.c_str());
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

hv::Hypervisor& Session::hypervisor() { return *impl_->hv; }
const char* Session::channel_name() const { return impl_->channel->name(); }

Result<void> Session::load_symbols(DomId dom, const std::string& path) {
  auto t = XP_TRY(symbols::SymbolTable::load(path));
  return impl_->engine->set_symbols(dom, std::move(t));
}

Result<Probe> Session::probe(DomId dom, Gva address, PreHandler pre, PostHandler post) {
  auto id = XP_TRY(impl_->engine->add(dom, address, std::move(pre), std::move(post)));
  return Probe(this, impl_->alive, id);
}

Result<Probe> Session::probe(DomId dom, std::string_view symbol, PreHandler pre, PostHandler post) {
  Gva addr = XP_TRY(resolve(dom, symbol));
  return probe(dom, addr, std::move(pre), std::move(post));
}

Result<Gva> Session::resolve(DomId dom, std::string_view symbol) {
  if (!impl_->engine->symbols(dom) && impl_->hv->name() == "sim") {
    // The simulated Xen's demo guest ships its System.map: use it unless told otherwise.
    std::string map = hv::sim::default_guest_dir() + "/System.map";
    if (std::filesystem::exists(map)) XP_TRY(load_symbols(dom, map));
  }
  const symbols::SymbolTable* t = impl_->engine->symbols(dom);
  if (!t)
    return fail(Errc::NotFound, "no symbols for domain " + std::to_string(dom.value) +
                                    ": call load_symbols() with the guest kernel's System.map first");
  return t->resolve(symbol);
}

Result<Probe> Session::ret_probe(DomId dom, Gva address, EntryHandler entry, ReturnHandler on_return,
                                 RetProbeOptions o) {
  auto id = XP_TRY(impl_->engine->add_ret(dom, address, std::move(entry), std::move(on_return), o));
  return Probe(this, impl_->alive, id);
}

Result<Probe> Session::ret_probe(DomId dom, std::string_view symbol, EntryHandler entry, ReturnHandler on_return,
                                 RetProbeOptions o) {
  Gva addr = XP_TRY(resolve(dom, symbol));
  return ret_probe(dom, addr, std::move(entry), std::move(on_return), o);
}

Result<void> Session::begin_batch() { return impl_->engine->begin_batch(); }
Result<void> Session::end_batch() { return impl_->engine->end_batch(); }

Result<unsigned> Session::run_once(int timeout_ms) {
  auto& ch = *impl_->channel;
  pollfd fds[3] = {{ch.fd(), POLLIN, 0}, {impl_->hv->xs_fd(), POLLIN, 0}, {impl_->wake_fd, POLLIN, 0}};
  int interval = ch.poll_interval_ms();
  int wait = interval > 0 && (timeout_ms < 0 || timeout_ms > interval) ? interval : timeout_ms;
  int n = ::poll(fds, 3, wait);
  if (n < 0 && errno != EINTR) return fail_errno(errno, "poll");
  if (fds[2].revents & POLLIN) {
    std::uint64_t v;
    [[maybe_unused]] auto r = ::read(impl_->wake_fd, &v, sizeof v);
  }
  if (fds[1].revents & POLLIN) impl_->reap();
  // Some stops raise no event (see Channel::poll_interval_ms): process on every wake-up.
  auto handled = ch.process(*impl_->engine);
  XP_TRY(impl_->engine->after_dispatch());
  return handled;
}

Result<void> Session::run() {
  impl_->stop = false;
  impl_->engine->clear_stop();
  while (!impl_->stop && !impl_->engine->stop_requested()) XP_TRY(run_once(-1));
  impl_->engine->clear_stop();
  return {};
}

void Session::stop() {
  impl_->stop = true;
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(impl_->wake_fd, &one, sizeof one);
}

Result<void> Session::set_enabled(std::uint64_t id, bool on) { return impl_->engine->set_enabled(id, on); }
Result<void> Session::unregister(std::uint64_t id) { return impl_->engine->remove(id); }
ProbeStats Session::stats(std::uint64_t id) const { return impl_->engine->stats(id); }
Result<ProbeInfo> Session::info(std::uint64_t id) const { return impl_->engine->info(id); }

// ---- Probe ----

Probe::Probe(Probe&& o) noexcept
    : session_(std::exchange(o.session_, nullptr)), alive_(std::move(o.alive_)), id_(std::exchange(o.id_, 0)) {}

Probe& Probe::operator=(Probe&& o) noexcept {
  if (this != &o) {
    (void)unregister();
    session_ = std::exchange(o.session_, nullptr);
    alive_ = std::move(o.alive_);
    id_ = std::exchange(o.id_, 0);
  }
  return *this;
}

Probe::~Probe() {
  if (auto r = unregister(); !r) XP_LOG(Error, "probe %llu: unregister failed: %s", (unsigned long long)id_, r.error().what.c_str());
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
  session_ = nullptr;
  alive_.reset();
  if (!s) return {};
  return s->unregister(id_);
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
