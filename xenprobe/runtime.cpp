// Running a compiled program (runtime.hpp). A hit walks the annotated tree: no parsing, no
// lookup by name, and no allocation unless a string is built or a map gains an entry.
// runtime_internal.hpp says where the rest is.
#include "runtime_internal.hpp"

namespace xenprobe {

// Strings come from guest memory: in JSON, bytes that are not UTF-8 become U+FFFD instead of
// an exception; in text, control bytes are written as \xNN so that a guest cannot drive the
// operator's terminal.
std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      out += b;
    } else {
      out += c;
    }
  }
  return out;
}

// ---- Output ----

void Output::text(const std::string& domain, std::string_view s) {
  if (!prefix_) {
    std::fwrite(s.data(), 1, s.size(), out_);
    std::fflush(out_);
    return;
  }
  std::string& part = partial_[domain];
  for (char c : s) {
    part += c;
    if (c == '\n') {
      std::fprintf(out_, "[%s] %s", domain.c_str(), part.c_str());
      part.clear();
    }
  }
  std::fflush(out_);
}

void Output::record(const std::string& domain, const char* type, const std::string& data_json) {
  std::string line =
      std::string("{\"type\": \"") + type + "\", \"domain\": " + json_text(domain) + ", \"data\": " + data_json + "}\n";
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

void Output::warning(const std::string& domain, const std::string& msg) {
  std::fprintf(stderr, "xenprobe: %s: %s\n", domain.c_str(), msg.c_str());
}

void Output::flush() {
  for (auto& [domain, part] : partial_)
    if (!part.empty()) {
      std::fprintf(out_, "[%s] %s\n", domain.c_str(), part.c_str());
      part.clear();
    }
  std::fflush(out_);
}

// ---- Instance ----

namespace {

int hist_index(std::int64_t x) {
  if (x < 0) return 0;
  if (x == 0) return 1;
  return 2 + (63 - std::countl_zero(static_cast<std::uint64_t>(x)));
}

}  // namespace

Instance::Instance(const Compiled& c, Output& out, std::string domain, std::vector<std::int64_t> kaddrs, Limits l)
    : c_(c),
      out_(out),
      domain_(std::move(domain)),
      kaddrs_(std::move(kaddrs)),
      maps_(c.maps.size()),
      limits_(l),
      dropped_(c.maps.size(), 0),
      vars_(static_cast<std::size_t>(c.max_vars)) {}

void Instance::run(int b, const ProbeSite& site, xenprobes::HitContext* ctx, std::optional<std::int64_t> nsecs) {
  ctx_ = ctx;
  site_ = &site;
  nsecs_ = nsecs;
  leave_ = false;
  const ProbeBlock& block = c_.program.blocks[static_cast<std::size_t>(b)];
  if (!block.predicate || eval_int(*block.predicate) != 0) exec(block.body);
  ctx_ = nullptr;
}

void Instance::exec(const std::vector<Stmt>& body) {
  for (const Stmt& s : body) {
    if (leave_) return;
    statement(s);
  }
}

void Instance::statement(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::Expr: {
      const Expr& e = *s.value;
      if (e.kind == ExprKind::Call) {
        if (e.name == "printf") return do_printf(e);
        if (e.name == "print") return print_map(e.slot);
        if (e.name == "clear") return maps_[static_cast<std::size_t>(e.slot)].clear();
        if (e.name == "exit") {
          exit_ = leave_ = true;  // the rest of this action is skipped; END still runs
          if (ctx_) ctx_->stop();
          return;
        }
        if (e.name == "delete") {
          entry(*e.kids[0], false);  // encodes the key into key_
          maps_[static_cast<std::size_t>(e.slot)].erase(key_);
          return;
        }
      }
      Value v;
      eval(e, v);
      return;
    }
    case StmtKind::VarAssign: eval(*s.value, vars_[static_cast<std::size_t>(s.target->slot)]); return;
    case StmtKind::MapAssign: {
      if (s.agg >= 0) return aggregate(s);
      Value v;
      eval(*s.value, v);
      Entry* en = entry(*s.target, true);
      if (!en) return;  // the map is full: counted
      if (c_.maps[static_cast<std::size_t>(s.target->slot)].kind == MapKind::Str) en->s = std::move(v.s);
      else en->v = v.i;
      return;
    }
    case StmtKind::If:
      if (eval_int(*s.value) != 0) exec(s.then_body);
      else exec(s.else_body);
      return;
  }
}

Instance::Entry* Instance::entry(const Expr& target, bool create) {
  Value keys[kMaxKeys];
  const std::size_t n = target.kids.size();
  for (std::size_t i = 0; i < n; ++i) eval(*target.kids[i], keys[i]);
  const MapDecl& d = c_.maps[static_cast<std::size_t>(target.slot)];
  key_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (d.key_is_str[i]) {
      key_.append(keys[i].s);
      key_.push_back('\0');
    } else {
      key_.append(reinterpret_cast<const char*>(&keys[i].i), sizeof keys[i].i);
    }
  }
  Table& t = maps_[static_cast<std::size_t>(target.slot)];
  auto it = t.find(std::string_view(key_));
  if (it != t.end()) return &it->second;
  if (!create) return nullptr;
  if (t.size() >= limits_.max_map_keys) {
    if (dropped_[static_cast<std::size_t>(target.slot)]++ == 0)
      out_.warning(domain_, "map " + d.name + " is full (" + std::to_string(limits_.max_map_keys) +
                                " keys): updates with new keys are dropped and counted; raise the limit "
                                "(xenprobe --max-map-keys, xenprobesd max_map_keys) or clear() or delete() the map");
    return nullptr;
  }
  Entry e;
  e.keys.assign(std::make_move_iterator(keys), std::make_move_iterator(keys + n));
  if (d.kind == MapKind::Hist) e.buckets.assign(kHistBuckets, 0);
  if (d.kind == MapKind::Lhist) e.buckets.assign(static_cast<std::size_t>((d.hi - d.lo) / d.step + 2), 0);
  return &t.emplace(key_, std::move(e)).first->second;
}

void Instance::aggregate(const Stmt& s) {
  const MapDecl& d = c_.maps[static_cast<std::size_t>(s.target->slot)];
  const Expr& call = *s.value;
  const std::int64_t x = call.kids.empty() ? 0 : eval_int(*call.kids[0]);
  Entry* e = entry(*s.target, true);
  if (!e) return;  // the map is full: counted
  switch (d.kind) {
    case MapKind::Count: ++e->v; break;
    case MapKind::Sum: e->v += x; break;
    case MapKind::Avg:
      e->v += x;
      ++e->n;
      break;
    case MapKind::Min:
      if (!e->n || x < e->v) e->v = x;
      e->n = 1;
      break;
    case MapKind::Max:
      if (!e->n || x > e->v) e->v = x;
      e->n = 1;
      break;
    case MapKind::Hist: ++e->buckets[static_cast<std::size_t>(hist_index(x))]; break;
    case MapKind::Lhist: {
      std::size_t last = e->buckets.size() - 1;
      std::size_t i = x < d.lo ? 0 : x >= d.hi ? last : static_cast<std::size_t>(1 + (x - d.lo) / d.step);
      ++e->buckets[i];
      break;
    }
    case MapKind::Int:
    case MapKind::Str: break;
  }
}

std::int64_t Instance::eval_int(const Expr& e) {
  Value v;
  eval(e, v);
  return v.i;
}

std::int64_t Instance::load(std::uint64_t addr, std::uint32_t size, bool is_signed) {
  if (!ctx_) {
    ++read_errors_;
    return 0;
  }
  std::uint64_t raw = 0;
  auto r = ctx_->read(xenprobes::Gva{addr}, std::as_writable_bytes(std::span(&raw, 1)).first(size));
  if (!r) {
    ++read_errors_;
    return 0;
  }
  if (size < 8 && is_signed) {
    const unsigned shift = 64 - size * 8;
    return static_cast<std::int64_t>(raw << shift) >> shift;
  }
  return static_cast<std::int64_t>(raw);
}

std::optional<std::uint64_t> Instance::current_task() {
  // x86-64 Linux keeps the per-CPU base in the kernel's gs base (the guest channel's mailbox
  // has none: the library asks Xen for it).
  auto base = ctx_->kernel_gs_base();
  if (!base) {
    ++read_errors_;
    return std::nullopt;
  }
  auto task = ctx_->read_u64(xenprobes::Gva{*base + c_.task.current_percpu});
  if (!task || *task == 0) {
    ++read_errors_;
    return std::nullopt;
  }
  return *task;
}

}  // namespace xenprobe
