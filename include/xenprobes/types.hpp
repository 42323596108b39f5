// Strong types for the addresses and identifiers the library passes around.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace xenprobes {

template <typename Tag, typename Rep = std::uint64_t>
struct Strong {
  Rep value{};
  constexpr Strong() = default;
  constexpr explicit Strong(Rep v) : value(v) {}
  constexpr auto operator<=>(const Strong&) const = default;
};

using DomId = Strong<struct DomIdTag, std::uint32_t>;
using VcpuId = Strong<struct VcpuIdTag, std::uint32_t>;
using Gva = Strong<struct GvaTag>;      // guest virtual address
using Gpa = Strong<struct GpaTag>;      // guest physical address (HVM) / machine address (PV)
using Frame = Strong<struct FrameTag>;  // GFN for HVM guests, MFN for PV guests

inline constexpr std::uint64_t kPageSize = 4096;
inline constexpr unsigned kPageShift = 12;

constexpr Gva operator+(Gva a, std::uint64_t off) { return Gva{a.value + off}; }
constexpr Gpa operator+(Gpa a, std::uint64_t off) { return Gpa{a.value + off}; }
constexpr Frame frame_of(Gpa a) { return Frame{a.value >> kPageShift}; }
constexpr Gpa gpa_of(Frame f) { return Gpa{f.value << kPageShift}; }

}  // namespace xenprobes

template <typename Tag, typename Rep>
struct std::hash<xenprobes::Strong<Tag, Rep>> {
  std::size_t operator()(const xenprobes::Strong<Tag, Rep>& s) const noexcept { return std::hash<Rep>{}(s.value); }
};
