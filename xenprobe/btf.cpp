// TypeSource over a BTF file, read with libbpf's BTF API.
#include <bpf/btf.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "types.hpp"

namespace xenprobe {
namespace {

// Guards against type graphs that loop (a hostile or broken file): no real chain of
// typedefs/qualifiers or of nested anonymous members is this deep.
constexpr int kMaxDepth = 32;

class BtfFile final : public TypeSource {
 public:
  BtfFile(btf* b, std::string what) : btf_(b), what_(std::move(what)) {}
  ~BtfFile() override { btf__free(btf_); }
  BtfFile(const BtfFile&) = delete;
  BtfFile& operator=(const BtfFile&) = delete;

  std::string description() const override { return what_; }

  std::optional<std::uint32_t> find_record(std::string_view name, bool is_union) const override {
    std::string n(name);
    int id = btf__find_by_name_kind(btf_, n.c_str(), is_union ? BTF_KIND_UNION : BTF_KIND_STRUCT);
    if (id <= 0) return std::nullopt;
    return static_cast<std::uint32_t>(id);
  }

  TypeDesc describe(std::uint32_t id) const override {
    TypeDesc d;
    std::uint32_t cur = id;
    const btf_type* t = nullptr;
    for (int depth = 0; depth < kMaxDepth; ++depth) {
      t = btf__type_by_id(btf_, cur);
      if (!t) return d;
      if (btf_is_mod(t) || btf_is_typedef(t) || btf_is_type_tag(t)) {
        cur = t->type;
        continue;
      }
      break;
    }
    if (!t) return d;
    d.id = cur;
    d.name = name_of(cur);
    if (btf_is_int(t)) {
      d.kind = TypeDesc::Kind::Int;
      d.size = t->size;
      d.is_signed = (btf_int_encoding(t) & BTF_INT_SIGNED) != 0;
    } else if (btf_is_any_enum(t)) {
      d.kind = TypeDesc::Kind::Int;
      d.size = t->size;
      d.is_signed = true;
    } else if (btf_is_ptr(t)) {
      d.kind = TypeDesc::Kind::Ptr;
      d.size = 8;
      d.target = t->type;
    } else if (btf_is_composite(t)) {
      d.kind = TypeDesc::Kind::Record;
      d.size = t->size;
    } else if (btf_is_array(t)) {
      d.kind = TypeDesc::Kind::Array;
      const struct btf_array* a = btf_array(t);
      d.target = a->type;
      d.count = a->nelems;
      __s64 sz = btf__resolve_size(btf_, cur);
      d.size = sz > 0 ? static_cast<std::uint32_t>(sz) : 0;
    }
    return d;
  }

  std::optional<MemberDesc> member(std::uint32_t record, std::string_view name) const override {
    return find_member(record, name, 0, 0);
  }

  std::vector<std::string> member_names(std::uint32_t record) const override {
    std::vector<std::string> out;
    collect_names(record, out, 0);
    return out;
  }

  std::optional<std::uint64_t> percpu_offset(std::string_view variable) const override {
    std::string n(variable);
    int var = btf__find_by_name_kind(btf_, n.c_str(), BTF_KIND_VAR);
    if (var <= 0) return std::nullopt;
    int sec = btf__find_by_name_kind(btf_, ".data..percpu", BTF_KIND_DATASEC);
    if (sec <= 0) return std::nullopt;
    const btf_type* s = btf__type_by_id(btf_, static_cast<std::uint32_t>(sec));
    const btf_var_secinfo* v = btf_var_secinfos(s);
    for (unsigned i = 0; i < btf_vlen(s); ++i)
      if (v[i].type == static_cast<std::uint32_t>(var)) return v[i].offset;
    return std::nullopt;
  }

 private:
  std::string name_of(std::uint32_t id) const {
    const btf_type* t = btf__type_by_id(btf_, id);
    if (!t) return "?";
    const char* n = btf__name_by_offset(btf_, t->name_off);
    std::string base = n && *n ? n : "(anonymous)";
    if (btf_is_struct(t)) return "struct " + base;
    if (btf_is_union(t)) return "union " + base;
    if (btf_is_ptr(t)) return "pointer";
    if (btf_is_array(t)) return "array";
    return base;
  }

  std::optional<MemberDesc> find_member(std::uint32_t record, std::string_view name, std::uint32_t base,
                                        int depth) const {
    if (depth > kMaxDepth) return std::nullopt;
    const btf_type* t = btf__type_by_id(btf_, record);
    if (!t || !btf_is_composite(t)) return std::nullopt;
    const btf_member* m = btf_members(t);
    for (unsigned i = 0; i < btf_vlen(t); ++i) {
      const char* mn = btf__name_by_offset(btf_, m[i].name_off);
      const std::uint32_t bit = btf_member_bit_offset(t, i);
      if (mn && *mn) {
        if (name == mn) {
          MemberDesc d{m[i].type, base + bit / 8, btf_member_bitfield_size(t, i)};
          if (bit % 8) d.bitfield = d.bitfield ? d.bitfield : 1;
          return d;
        }
      } else {
        // An anonymous struct or union: its members are the record's own.
        TypeDesc inner = describe(m[i].type);
        if (inner.kind == TypeDesc::Kind::Record)
          if (auto r = find_member(inner.id, name, base + bit / 8, depth + 1)) return r;
      }
    }
    return std::nullopt;
  }

  void collect_names(std::uint32_t record, std::vector<std::string>& out, int depth) const {
    const btf_type* t = btf__type_by_id(btf_, record);
    if (depth > kMaxDepth || !t || !btf_is_composite(t)) return;
    const btf_member* m = btf_members(t);
    for (unsigned i = 0; i < btf_vlen(t); ++i) {
      const char* mn = btf__name_by_offset(btf_, m[i].name_off);
      if (mn && *mn) {
        out.emplace_back(mn);
      } else {
        TypeDesc inner = describe(m[i].type);
        if (inner.kind == TypeDesc::Kind::Record) collect_names(inner.id, out, depth + 1);
      }
    }
  }

  btf* btf_;
  std::string what_;
};

}  // namespace

std::unique_ptr<TypeSource> open_btf_file(const std::string& path) {
  errno = 0;
  btf* b = btf__parse(path.c_str(), nullptr);  // libbpf 1.x: NULL and errno on failure
  if (!b)
    throw std::runtime_error("cannot read BTF from " + path + ": " + std::strerror(errno ? errno : EINVAL) +
                             " (give a raw BTF file such as /sys/kernel/btf/vmlinux of the guest's kernel, "
                             "or an ELF file with a .BTF section)");
  return std::make_unique<BtfFile>(b, "BTF file " + path);
}

std::unique_ptr<TypeSource> open_btf_bytes(std::span<const std::byte> bytes, const std::string& what) {
  if (bytes.size() > std::numeric_limits<__u32>::max()) throw std::runtime_error(what + " is too large");
  errno = 0;
  btf* b = btf__new(bytes.data(), static_cast<__u32>(bytes.size()));  // libbpf 1.x: NULL and errno
  if (!b) throw std::runtime_error("libbpf refused " + what + ": " + std::strerror(errno ? errno : EINVAL));
  return std::make_unique<BtfFile>(b, what);
}

}  // namespace xenprobe
