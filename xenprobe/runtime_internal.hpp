// Running a compiled program (runtime.hpp), internal: what runtime.cpp (Output, statements, maps'
// updates), runtime_eval.cpp (expressions, printf) and runtime_print.cpp (printing maps) share.
#pragma once

#include "runtime.hpp"

#include <time.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <nlohmann/json.hpp>

namespace xenprobe {

std::string json_text(const nlohmann::ordered_json& j);
std::string printable(std::string_view s);

}  // namespace xenprobe
