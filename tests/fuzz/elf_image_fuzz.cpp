// Fuzz target: kernel images (common/elf_image.cpp, on libelf). A vmlinux comes from wherever
// the user found it (Session::load_symbols, XENPROBES_SIM_GUEST), so every byte is hostile.
//
// Input: the file, whole. It is read twice: from memory (parse) and as a file (load, through a
// memfd: libelf maps it).
// Invariants: both reads agree (the same refusal, or the same image); a refusal is
// InvalidArgument with a printable message naming the file; an accepted image has a segment
// for each PT_LOAD program header with memory, in order, holding exactly that header's file
// bytes, never more than its memory size or 1 GiB; symbols are non-empty names found in the
// file, the map holding the first value of each name; a symtab_error is printable and comes
// with no sections and no symbols, and symbols come only with sections.
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/elf_image.hpp"
#include "fuzz/fuzz_common.hpp"

using namespace xenprobes;
using namespace xenprobes::elf;

namespace {

void check_refusal(const Error& e, const std::string& what) {
  FUZZ_CHECK(e.code == Errc::InvalidArgument, e.what);
  FUZZ_CHECK(e.what.starts_with(what + ": "), e.what);
  FUZZ_CHECK(fuzz::printable(e.what), "hostile bytes in a message: " + e.what.substr(0, 200));
}

bool same_image(const Image& a, const Image& b) {
  if (a.entry != b.entry || a.segments.size() != b.segments.size() || a.sections.size() != b.sections.size() ||
      a.symtab.size() != b.symtab.size() || a.symbols != b.symbols || a.symtab_error != b.symtab_error)
    return false;
  for (std::size_t i = 0; i < a.segments.size(); ++i) {
    const Segment &x = a.segments[i], &y = b.segments[i];
    if (x.vaddr != y.vaddr || x.memsz != y.memsz || x.bytes != y.bytes || x.writable != y.writable ||
        x.executable != y.executable)
      return false;
  }
  for (std::size_t i = 0; i < a.sections.size(); ++i) {
    const Section &x = a.sections[i], &y = b.sections[i];
    if (x.type != y.type || x.flags != y.flags || x.addr != y.addr || x.size != y.size) return false;
  }
  for (std::size_t i = 0; i < a.symtab.size(); ++i) {
    const Symbol &x = a.symtab[i], &y = b.symtab[i];
    if (x.name != y.name || x.value != y.value || x.size != y.size || x.info != y.info || x.shndx != y.shndx)
      return false;
  }
  return true;
}

void check_image(const Image& img, std::span<const std::uint8_t> file) {
  Elf64_Ehdr eh;
  FUZZ_CHECK(file.size() >= sizeof eh);
  std::memcpy(&eh, file.data(), sizeof eh);
  FUZZ_CHECK(img.entry == eh.e_entry);
  FUZZ_CHECK(!img.segments.empty());
  if (eh.e_phnum != PN_XNUM) {  // the reference: the program headers as they lie in the file
    std::size_t k = 0;
    for (std::size_t i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      FUZZ_CHECK(eh.e_phoff + (i + 1) * sizeof ph <= file.size(), "accepted program headers past the end");
      std::memcpy(&ph, file.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
      if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
      FUZZ_CHECK(k < img.segments.size(), "a PT_LOAD header without its segment");
      const Segment& s = img.segments[k++];
      FUZZ_CHECK(s.vaddr == ph.p_vaddr && s.memsz == ph.p_memsz && s.bytes.size() == ph.p_filesz);
      FUZZ_CHECK(s.memsz <= kMaxSegmentBytes && s.bytes.size() <= s.memsz);
      FUZZ_CHECK(ph.p_offset <= file.size() && s.bytes.size() <= file.size() - ph.p_offset);
      FUZZ_CHECK(std::equal(s.bytes.begin(), s.bytes.end(), file.begin() + static_cast<std::ptrdiff_t>(ph.p_offset)),
                 "a segment's bytes are not its file bytes");
      FUZZ_CHECK(s.writable == ((ph.p_flags & PF_W) != 0) && s.executable == ((ph.p_flags & PF_X) != 0));
    }
    FUZZ_CHECK(k == img.segments.size(), "a segment without its PT_LOAD header");
  }
  if (!img.symtab_error.empty()) {
    FUZZ_CHECK(fuzz::printable(img.symtab_error), img.symtab_error.substr(0, 200));
    FUZZ_CHECK(img.sections.empty() && img.symtab.empty() && img.symbols.empty());
  }
  FUZZ_CHECK(img.symtab.empty() || !img.sections.empty(), "symbols without sections");
  const std::string_view all(reinterpret_cast<const char*>(file.data()), file.size());
  for (const Symbol& s : img.symtab) {
    FUZZ_CHECK(!s.name.empty() && s.name.find('\0') == std::string::npos);
    FUZZ_CHECK(all.find(s.name + '\0') != std::string_view::npos, "a name that is not in the file: " + s.name);
    FUZZ_CHECK(s.shndx != SHN_UNDEF);
    auto it = img.symbols.find(s.name);
    FUZZ_CHECK(it != img.symbols.end(), "a symbol missing from the map: " + s.name);
  }
  FUZZ_CHECK(img.symbols.size() <= img.symtab.size());
  for (const auto& entry : img.symbols) {
    auto first =
        std::find_if(img.symtab.begin(), img.symtab.end(), [&](const Symbol& s) { return s.name == entry.first; });
    FUZZ_CHECK(first != img.symtab.end() && first->value == entry.second,
               "the map does not hold the first of " + entry.first);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 65536) return 0;
  const std::span<const std::uint8_t> file(data, size);
  auto m = parse(file, "fuzz.elf");

  const int fd = memfd_create("fuzz-elf", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(size == 0 || write(fd, data, size) == static_cast<ssize_t>(size));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto f = load(path);
  close(fd);

  if (!m) {
    check_refusal(m.error(), "fuzz.elf");
    FUZZ_CHECK(!f, "load took what parse refused: " + m.error().what);
    check_refusal(f.error(), path);
    FUZZ_CHECK(f.error().what.substr(path.size()) == m.error().what.substr(std::string("fuzz.elf").size()),
               "parse: " + m.error().what + "; load: " + f.error().what);
    return 0;
  }
  FUZZ_CHECK(f, "load refused what parse took: " + f.error().what);
  FUZZ_CHECK(same_image(*m, *f), "parse and load read different images");
  check_image(*m, file);
  return 0;
}
