// Jump probes: the branches from one function of the core text into the middle of another,
// decoded once per kernel build per process (probe/jump_index.hpp) and rebased onto each
// domain's text.
#include <chrono>

#include "probe/engine_internal.hpp"
#include "probe/jump_index.hpp"

namespace xenprobes::probe {

namespace {

// Debian's 6.1 core text is about 16 MiB; a symbol table that claims more than this is not
// believed (the text is then indexed nothing from, and every function counts as unknown).
constexpr std::uint64_t kMaxCoreTextBytes = std::uint64_t{128} << 20;
constexpr std::uint64_t kReadChunk = std::uint64_t{64} * 1024;

// The bytes of the core text the kernel rewrites while it runs, as [offset, offset + len):
// masked out of the text's hash, so that two guests of one build whose static keys, static
// calls or ftrace differ, or whose lock prefixes were patched differently, still share their
// index. None of them can hide a branch the index needs: a jump label's site jumps to its
// target, which every domain adds from its own __jump_table (Engine::jump_fixups); a static
// call and an ftrace site call or jump to a function's start (or out of the core text), which
// the index leaves out anyway; a lock prefix is no branch. Everything else differs when the
// guest differs (alternatives picked by other CPU features, a guest's own text changes) and
// makes the hash differ: the domain decodes its own.
std::vector<std::pair<std::uint64_t, std::uint64_t>> mask_runtime_sites(const kernel::KernelTables& t,
                                                                        std::span<const std::uint8_t> text,
                                                                        const std::vector<symbols::Function>& fns) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> m;
  const kernel::Range& r = t.core_text();
  for (const kernel::Site* s = t.jump_label_in(r.start, r.end); s;
       s = t.jump_label_in(s->addr + kernel::KernelTables::kJumpSiteLen, r.end))
    m.emplace_back(s->addr - r.start, kernel::KernelTables::kJumpSiteLen);
  for (const kernel::Site* s = t.static_call_in(r.start, r.end); s;
       s = t.static_call_in(s->addr + kernel::KernelTables::kStaticCallSiteLen, r.end))
    m.emplace_back(s->addr - r.start, kernel::KernelTables::kStaticCallSiteLen);
  for (auto l = t.smp_lock_in(r.start, r.end); l; l = t.smp_lock_in(*l + 1, r.end)) m.emplace_back(*l - r.start, 1);
  // The ftrace site: a function's first 5 bytes (after an endbr64), a nop5 or a call.
  static constexpr std::uint8_t kEndbr[] = {0xf3, 0x0f, 0x1e, 0xfa}, kNop5[] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
  for (const symbols::Function& f : fns) {
    std::uint64_t at = f.start.value - r.start;
    const std::uint64_t end = std::min<std::uint64_t>(at + f.size, text.size());
    if (end - at >= 4 && std::equal(kEndbr, kEndbr + 4, text.begin() + static_cast<std::ptrdiff_t>(at))) at += 4;
    if (at + 5 > end) continue;
    if (text[at] == 0xe8 || std::equal(kNop5, kNop5 + 5, text.begin() + static_cast<std::ptrdiff_t>(at)))
      m.emplace_back(at, 5);
  }
  std::sort(m.begin(), m.end());
  return m;
}

std::optional<std::uint64_t> text_hash(std::span<const std::uint8_t> text,
                                       const std::vector<std::pair<std::uint64_t, std::uint64_t>>& masked) {
  KeyedHash h;
  h.update_u64(text.size());
  std::uint64_t at = 0;
  for (const auto& [off, len] : masked) {
    if (off >= text.size() || off + len <= at) continue;
    if (off > at) h.update(text.subspan(at, off - at));
    h.update_u64(~std::uint64_t{0});  // a masked site
    at = std::min<std::uint64_t>(off + len, text.size());
  }
  h.update(text.subspan(at));
  return h.finish();
}

}  // namespace

bool Engine::read_text_pages(Domain& d, std::uint64_t base, std::uint64_t size, std::vector<std::uint8_t>& bytes,
                             std::vector<bool>& unread) {
  bytes.assign(size, 0);
  unread.assign((size + kPage - 1) / kPage, false);
  bool complete = true;
  for (std::uint64_t off = 0; off < size; off += kReadChunk) {
    const std::uint64_t n = std::min(kReadChunk, size - off);
    if (auto b = read_text(d, Gva{base + off}, n)) {
      std::copy(b->begin(), b->end(), bytes.begin() + static_cast<std::ptrdiff_t>(off));
      continue;
    }
    for (std::uint64_t p = off; p < off + n; p += kPage) {
      const std::uint64_t m = std::min(kPage, off + n - p);
      if (auto b = read_text(d, Gva{base + p}, m)) {
        std::copy(b->begin(), b->end(), bytes.begin() + static_cast<std::ptrdiff_t>(p));
      } else {
        unread[p / kPage] = true;
        complete = false;
      }
    }
  }
  return complete;
}

// Branches from one function into the middle of another: a compiler's split part (foo.cold),
// assembly whose local labels are symbols of their own (6.1's copy_mc_fragile and its .E_*
// labels). Every function of the core text is decoded for them, as bench/kernel_coverage does,
// once per kernel build per process; a branch to another function's start is a call or tail
// call.
void Engine::cross_function_branches(Domain& d, Domain::JumpIndex& idx) {
  const auto t0 = std::chrono::steady_clock::now();
  const kernel::Range& text = d.tables->core_text();
  const std::uint64_t base = text.start, size = text.end - text.start;
  const std::vector<symbols::Function> fns = index_functions(*d.syms, text);
  BuildKey key;
  key.build = kernel_build(*d.syms, [&](Gva a, std::span<std::byte> out) { return d.memory->read(a, out); });
  idx.build = key.build;
  if (size > kMaxCoreTextBytes) {
    XP_LOG(Warn,
           "domain %u: the kernel's core text is said to be %s bytes (more than %s): its functions are not decoded, "
           "so jump probes know no branch between them",
           d.id.value, hex(size).c_str(), hex(kMaxCoreTextBytes).c_str());
    return;
  }

  // The whole core text as the guest runs it (our own probes' bytes read as the original),
  // a page that cannot be read left out.
  std::vector<std::uint8_t> bytes;
  std::vector<bool> unread;
  const bool complete = read_text_pages(d, base, size, bytes, unread);

  // Its build, and what its text and functions hash to: the index of exactly this text is
  // reused (a text that could not be read whole, or not hashed, is decoded, and not kept).
  key.text_size = size;
  const std::optional<std::uint64_t> text_tag = text_hash(bytes, mask_runtime_sites(*d.tables, bytes, fns));
  std::optional<std::uint64_t> layout_tag;
  {
    KeyedHash h;
    for (const symbols::Function& f : fns) {
      h.update_u64(f.start.value - base);
      h.update_u64(f.size);
      h.update(std::span(reinterpret_cast<const std::uint8_t*>(f.name.data()), f.name.size() + 1));
    }
    layout_tag = h.finish();
  }
  key.text_hash = text_tag.value_or(0);
  key.layout_hash = layout_tag.value_or(0);
  const bool hashed = text_tag && layout_tag;
  const std::string build = key.build.empty() ? std::string("a kernel with no build id or banner") : key.build;
  JumpIndexCache& cache = JumpIndexCache::process();
  const std::uint64_t mismatches = cache.counters().mismatches;
  std::shared_ptr<const CrossBranches> cb = complete && hashed ? cache.find(key) : nullptr;
  const double checked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cb) {
    XP_LOG(Info,
           "domain %u: jump probes: the branches between the kernel's functions reused from the index of %s "
           "(decoded for domain %u in %.1f s; this domain's text and functions read and checked in %.1f s)",
           d.id.value, build.c_str(), cb->decoded_in, cb->seconds, checked);
  } else {
    if (cache.counters().mismatches != mismatches)
      XP_LOG(Warn,
             "domain %u: says it runs %s, whose index this process has, but its text or functions differ from "
             "that index's: decoding its own",
             d.id.value, build.c_str());
    auto fresh = std::make_shared<CrossBranches>();
    fresh->build = key.build;
    fresh->decoded_in = d.id.value;
    const unsigned threads = index_threads(fns.size());
    decode_cross_branches(bytes, base, unread, fns, threads, *fresh);
    fresh->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Before the pause when the registration that needs it is the first of its batch (Engine::add
    // decodes and plans before pausing); said either way.
    XP_LOG(Info,
           "domain %u: jump probes: the branches between the kernel's functions indexed in %.1f s (%zu functions "
           "on %u thread%s; once per kernel build: %s%s)%s",
           d.id.value, fresh->seconds, fns.size(), threads, threads == 1 ? "" : "s", build.c_str(),
           !complete ? "; not kept, its text could not be read whole"
           : !hashed ? "; not kept, its text could not be hashed"
                     : "",
           d.pause_depth ? ", with the domain paused: a batch whose first probe was not a jump holds it" : "");
    // Those cannot be seen; the same as the coverage figures leave out (docs/benchmarks.md).
    if (fresh->unknown)
      XP_LOG(Info, "domain %u: %zu kernel functions do not decode: their branches into other functions are not known",
             d.id.value, fresh->unknown);
    if (complete && hashed) cache.put(key, fresh);
    cb = std::move(fresh);
  }
  for (const CrossBranches::Branch& b : cb->branches)
    idx.fixups.add(base + b.to, 1, "a branch from " + cb->names[b.fn] + " (" + hex(base + b.from) + ")");
}

// Tail calls proven from the kernel image (kernel/addresses_taken.hpp): when the domain's
// symbols came from a vmlinux whose build id is the one the guest says it runs, the code
// addresses that image forms, found once per build per process and moved onto this domain's
// text. The image is dropped afterwards either way. The guest's claim decides only whether
// the proof applies; a guest that lies about its build to get it can only mislead the jump
// rules about its own indirect jumps, as a guest can always by rewriting its text later.
void Engine::image_proof(Domain& d, Domain::JumpIndex& idx) {
  const std::shared_ptr<const symbols::KernelImage> img = std::move(d.image);
  d.image.reset();
  if (!img) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string image_build =
      kernel_build(img->symbols(), [&](Gva a, std::span<std::byte> out) { return img->read(a, out); });
  if (!image_build.starts_with("build-id ")) {
    idx.no_taken = "the kernel image " + img->source() + " has no build id to match the guest's kernel with";
    return;
  }
  if (image_build != idx.build) {
    idx.no_taken = "the kernel image " + img->source() + " is " + image_build + ", not the guest's kernel (" +
                   (idx.build.empty() ? std::string("which has no build id") : idx.build) + ")";
    return;
  }
  JumpIndexCache& cache = JumpIndexCache::process();
  std::shared_ptr<const TakenAddresses> taken = cache.find_taken(image_build);
  if (!taken) {
    const kernel::KernelTables t =
        kernel::KernelTables::read(img->symbols(), [&](Gva a, std::span<std::byte> out) { return img->read(a, out); });
    if (t.core_text().empty()) {
      idx.no_taken = "the kernel image " + img->source() + " has no _stext/_etext";
      return;
    }
    auto fresh = std::make_shared<TakenAddresses>();
    fresh->core_start = t.core_text().start;
    fresh->taken = kernel::addresses_taken(*img, t.core_text(), t.init_text());
    fresh->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    XP_LOG(Info,
           "domain %u: jump probes: %zu code addresses formed inside functions, read from %s in %.1f s (once "
           "per kernel build: %s)",
           d.id.value, fresh->taken.size(), img->source().c_str(), fresh->seconds, image_build.c_str());
    cache.put_taken(image_build, fresh);
    taken = std::move(fresh);
  } else {
    XP_LOG(Info, "domain %u: jump probes: the code addresses formed inside functions reused (%s)", d.id.value,
           image_build.c_str());
  }
  idx.taken =
      kernel::taken_index(taken->taken, static_cast<std::int64_t>(d.tables->core_text().start - taken->core_start));
}

}  // namespace xenprobes::probe
