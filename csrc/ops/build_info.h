#pragma once
#include <string>

namespace spconv {
// What this extension was compiled with, as a JSON object.
std::string build_info_json();
}  // namespace spconv
