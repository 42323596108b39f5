// A vmlinux's .symtab as System.map text (elf_symbols.hpp).
#include "elf_symbols.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace xenprobe {
namespace {

constexpr std::size_t kMaxSymbols = 1u << 22;  // Debian's vmlinux has ~150 000

struct Mapping {
  const unsigned char* p = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (p) ::munmap(const_cast<unsigned char*>(p), size);
  }
};

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": not a symbol table xenprobe can read: " + what);
}

char letter(const Elf64_Sym& s, const Elf64_Shdr* sec) {
  char c;
  if (s.st_shndx == SHN_ABS) c = 'a';
  else if (!sec) c = '?';
  else if (sec->sh_flags & SHF_EXECINSTR) c = 't';
  else if (sec->sh_type == SHT_NOBITS) c = 'b';
  else if (sec->sh_flags & SHF_WRITE) c = 'd';
  else c = 'r';
  const unsigned bind = ELF64_ST_BIND(s.st_info);
  if (bind == STB_GLOBAL || bind == STB_WEAK) c = static_cast<char>(c - 'a' + 'A');
  return c;
}

}  // namespace

bool is_elf_file(const std::string& path) {
  unsigned char m[SELFMAG] = {};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  const bool elf = std::fread(m, 1, SELFMAG, f) == SELFMAG && std::memcmp(m, ELFMAG, SELFMAG) == 0;
  std::fclose(f);
  return elf;
}

std::string system_map_from_elf(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    ::close(fd);
    bad(path, "not a regular file of an ELF header's size");
  }
  Mapping m;
  m.size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
  m.p = static_cast<const unsigned char*>(p);
  // Whether [off, off + len) lies inside the file.
  const auto inside = [&](std::uint64_t off, std::uint64_t len) { return off <= m.size && len <= m.size - off; };

  Elf64_Ehdr eh;
  std::memcpy(&eh, m.p, sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) bad(path, "no ELF magic");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64)
    bad(path, "not a 64-bit little-endian x86-64 ELF file");
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      !inside(eh.e_shoff, static_cast<std::uint64_t>(eh.e_shnum) * sizeof(Elf64_Shdr)))
    bad(path, "its section headers are outside the file");
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), m.p + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  const Elf64_Shdr* symtab = nullptr;
  for (const Elf64_Shdr& s : sh)
    if (s.sh_type == SHT_SYMTAB) symtab = &s;
  if (!symtab) bad(path, "it has no .symtab (a stripped file: give the System.map instead)");
  if (symtab->sh_entsize != sizeof(Elf64_Sym) || !inside(symtab->sh_offset, symtab->sh_size) ||
      symtab->sh_offset % alignof(Elf64_Sym) != 0)
    bad(path, "its .symtab is outside the file or of the wrong entry size");
  if (symtab->sh_link >= sh.size()) bad(path, "its .symtab names no string table");
  const Elf64_Shdr& strtab = sh[symtab->sh_link];
  if (strtab.sh_type != SHT_STRTAB || !inside(strtab.sh_offset, strtab.sh_size))
    bad(path, "its symbols' string table is outside the file");
  const std::size_t n = symtab->sh_size / sizeof(Elf64_Sym);
  if (n > kMaxSymbols) bad(path, "more than " + std::to_string(kMaxSymbols) + " symbols");
  const std::string_view strings(reinterpret_cast<const char*>(m.p + strtab.sh_offset), strtab.sh_size);

  std::vector<std::pair<std::uint64_t, std::string>> lines;
  lines.reserve(n);
  for (std::size_t i = 1; i < n; ++i) {
    Elf64_Sym s;
    std::memcpy(&s, m.p + symtab->sh_offset + i * sizeof s, sizeof s);
    const unsigned type = ELF64_ST_TYPE(s.st_info);
    if (type == STT_SECTION || type == STT_FILE || s.st_shndx == SHN_UNDEF) continue;
    if (s.st_name >= strings.size()) bad(path, "symbol " + std::to_string(i) + "'s name is outside its string table");
    const std::size_t end = strings.find('\0', s.st_name);
    if (end == std::string_view::npos) bad(path, "symbol " + std::to_string(i) + "'s name has no end");
    const std::string_view name = strings.substr(s.st_name, end - s.st_name);
    if (name.empty() || name.size() > 512 ||
        !std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127; }))
      continue;  // not a name a System.map line can hold
    const Elf64_Shdr* sec = s.st_shndx < sh.size() ? &sh[s.st_shndx] : nullptr;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx %c ", static_cast<unsigned long long>(s.st_value), letter(s, sec));
    lines.emplace_back(s.st_value, std::string(buf).append(name).append("\n"));
  }
  if (lines.empty()) bad(path, "its .symtab has no symbol");
  std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& l : lines) out += l.second;
  return out;
}

}  // namespace xenprobe
