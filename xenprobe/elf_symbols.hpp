// A vmlinux (an ELF file with a symbol table) as a source of a guest kernel's symbols, for
// `xenprobe --symbols DOMAIN=vmlinux`: its .symtab written as System.map lines, which the
// library then loads as it loads a System.map (Session::load_symbols, KASLR included).
#pragma once

#include <string>

namespace xenprobe {

// Whether the file starts with ELF's magic bytes.
bool is_elf_file(const std::string& path);

// The ELF file's .symtab as System.map text ("ffffffff81000000 T _text" lines in address order;
// nm's letters: T/t text, D/d writable data, R/r read-only data, B/b no bits, A/a absolute;
// section and file symbols and undefined ones left out). Every offset, size and string is
// checked against the file; throws std::runtime_error saying what is wrong with it.
std::string system_map_from_elf(const std::string& path);

}  // namespace xenprobe
