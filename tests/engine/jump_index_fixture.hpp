// Demo guests of one kernel build and of others, for the tests of the jump probes' index per
// build and of the tail-call proof from a kernel image (jump_index_test.cpp, jump_image_test.cpp).
#pragma once

#include <elf.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/hex.hpp"
#include "engine/engine_fixture.hpp"
#include "probe/jump_index.hpp"

namespace xenprobes::testing {

using probe::JumpIndexCache;

constexpr std::uint64_t kIters = 5;

inline hv::sim::DomainConfig config(const std::string& image = "") {
  hv::sim::DomainConfig c = demo_config(1, kIters, ChannelKind::Guest);
  c.image = image;
  return c;
}

inline SessionOptions guest_channel() { return SessionOptions{ChannelKind::Guest}; }

inline std::uint64_t demo_sym(const std::string& name) {
  static const symbols::SymbolTable t = *symbols::SymbolTable::load(demo_map());
  auto s = t.lookup(name);
  if (!s) throw std::runtime_error("demo guest: no symbol " + name);
  return s->front().address.value;
}

inline std::vector<char> demo_file() {
  std::ifstream in(hv::sim::default_guest_dir() + "/vmlinux", std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The file offset of the image's bytes at `va` (inside a PT_LOAD's file bytes).
inline std::size_t file_offset(const std::vector<char>& f, std::uint64_t va, std::size_t len) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, f.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_LOAD && va >= ph.p_vaddr && va + len <= ph.p_vaddr + ph.p_filesz)
      return ph.p_offset + (va - ph.p_vaddr);
  }
  throw std::runtime_error("demo guest: " + hex(va) + " is in no PT_LOAD");
}

// The demo vmlinux with `bytes` over the image at `va`, in a file of its own.
inline std::string demo_image_with(std::uint64_t va, const std::vector<std::uint8_t>& bytes, const std::string& name) {
  std::vector<char> f = demo_file();
  std::memcpy(f.data() + file_offset(f, va, bytes.size()), bytes.data(), bytes.size());
  const auto path = std::filesystem::temp_directory_path() /
                    ("xp-jump-index-" + std::to_string(::getpid()) + "-" + name + ".vmlinux");
  std::ofstream(path, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
  return path.string();
}

// Where the demo's build id is: its note right at __start_notes (namesz 4, descsz 20, NT_GNU_BUILD_ID, "GNU").
inline std::uint64_t build_id_va() {
  const std::uint64_t at = demo_sym("__start_notes");
  std::vector<char> f = demo_file();
  const std::size_t off = file_offset(f, at, 36);
  std::uint32_t h[3];
  std::memcpy(h, f.data() + off, sizeof h);
  if (h[0] != 4 || h[1] != 20 || h[2] != NT_GNU_BUILD_ID || std::memcmp(f.data() + off + 12, "GNU", 4) != 0)
    throw std::runtime_error("demo guest: no sha1 build id at __start_notes");
  return at + 16;
}

// Another domain of `image` on the guest's host, in its session, with the demo's symbols.
inline DomId add_domain(SessionGuest& g, const std::string& image = "") {
  hv::sim::DomainConfig c = config(image);
  c.start_paused = true;
  auto d = g.host->create_domain(c);
  if (!d) throw std::runtime_error(d.error().what);
  if (auto l = g.session->load_symbols(*d, demo_map()); !l) throw std::runtime_error(l.error().what);
  return *d;
}

struct Delta {
  JumpIndexCache::Counters at = JumpIndexCache::process().counters();
  std::uint64_t builds() const { return JumpIndexCache::process().counters().builds - at.builds; }
  std::uint64_t reuses() const { return JumpIndexCache::process().counters().reuses - at.reuses; }
  std::uint64_t mismatches() const { return JumpIndexCache::process().counters().mismatches - at.mismatches; }
};

inline std::string demo_vmlinux() { return hv::sim::default_guest_dir() + "/vmlinux"; }

// The demo vmlinux with its build id changed (its first byte inverted): another build.
inline std::string demo_image_of_another_build(const std::string& name) {
  const std::uint64_t id = build_id_va();
  std::vector<char> f = demo_file();
  const std::vector<std::uint8_t> other{static_cast<std::uint8_t>(~f[file_offset(f, id, 20)])};
  return demo_image_with(id, other, name);
}

}  // namespace xenprobes::testing
