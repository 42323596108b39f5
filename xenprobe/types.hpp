// Where xenprobe learns the guest kernel's types: casts, field access, and the task struct
// behind comm/pid/tid. A TypeSource is an interface: the BTF comes from a file (--btf) or out of
// the guest kernel's own memory, and the compiler does not know which.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xenprobe {

// A type with typedefs and qualifiers looked through.
struct TypeDesc {
  enum class Kind : std::uint8_t { Int, Ptr, Record, Array, Other };
  Kind kind = Kind::Other;
  std::uint32_t id = 0;      // the resolved type itself
  std::uint32_t size = 0;    // bytes (Ptr: 8)
  bool is_signed = false;    // Int
  std::uint32_t target = 0;  // Ptr: pointee; Array: element (both unresolved ids)
  std::uint32_t count = 0;   // Array: elements
  std::string name;          // "struct file", "unsigned int", "char *", ...
};

struct MemberDesc {
  std::uint32_t type = 0;       // unresolved id
  std::uint32_t offset = 0;     // bytes from the start of the record
  std::uint32_t bitfield = 0;   // bits, 0 if not a bitfield
  std::uint32_t bit_shift = 0;  // a bitfield's first bit in the byte at `offset` (0 ... 7)
  bool misaligned = false;      // not a bitfield, yet not at a byte boundary: unreadable
};

class TypeSource {
 public:
  virtual ~TypeSource() = default;
  virtual std::string description() const = 0;  // "BTF file /sys/kernel/btf/vmlinux"
  // A struct (or union) by name, e.g. "file". nullopt if there is none.
  virtual std::optional<std::uint32_t> find_record(std::string_view name, bool is_union) const = 0;
  virtual TypeDesc describe(std::uint32_t id) const = 0;
  // A member by name, searched through anonymous structs and unions; nullopt if absent.
  virtual std::optional<MemberDesc> member(std::uint32_t record, std::string_view name) const = 0;
  virtual std::vector<std::string> member_names(std::uint32_t record) const = 0;
  // The offset of a per-CPU variable from the per-CPU base (its place in .data..percpu).
  virtual std::optional<std::uint64_t> percpu_offset(std::string_view variable) const = 0;

  // Said after "no struct X in <description>": where else such a type could come from and
  // when it is read (a module loaded after the types were read, a module left out), set by
  // whoever read the types; "" for nothing.
  const std::string& missing_type_hint() const { return missing_type_hint_; }
  void set_missing_type_hint(std::string hint) { missing_type_hint_ = std::move(hint); }

 private:
  std::string missing_type_hint_;
};

// A BTF file: a raw one (/sys/kernel/btf/vmlinux, `bpftool btf dump ... format raw`) or an ELF
// object with a .BTF section. Throws std::runtime_error saying what is wrong with the file.
std::unique_ptr<TypeSource> open_btf_file(const std::string& path);
// A loaded module's BTF: split BTF over the kernel's (Session::module_btf).
struct ModuleTypes {
  std::string module;
  std::vector<std::byte> btf;
};

// Raw BTF bytes (e.g. read out of the guest kernel's memory), described as `what` in errors.
// Throws std::runtime_error when libbpf refuses them. `modules`: loaded modules' BTF on top of
// it (btf__new_split); their structs and unions become names too, but a name the kernel's BTF
// has is the kernel's type, and among modules the first in `modules` wins. A module's BTF
// libbpf refuses is left out, its reason appended to `refused`.
std::unique_ptr<TypeSource> open_btf_bytes(std::span<const std::byte> bytes, const std::string& what,
                                           const std::vector<ModuleTypes>& modules = {},
                                           std::vector<std::string>* refused = nullptr);

}  // namespace xenprobe
