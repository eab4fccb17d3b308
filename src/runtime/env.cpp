#include "runtime/env.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <system_error>

#include "bonsai/error.h"

namespace bonsai {

std::string_view env_value(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::string_view(e) : std::string_view();
}

void env_refuse(const char* name, std::string_view value, std::string_view expected) {
  usage_fail("{}='{}': expected {}", name, value, expected);
}

bool parse_decimal(std::string_view s, int& out) {
  // from_chars takes a leading '-' but no '+', spaces or base prefix; the whole string must go.
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return false;
  out = v;
  return true;
}

bool env_flag(const char* name, bool dflt) {
  const std::string_view v = env_value(name);
  if (v.empty()) return dflt;
  if (v != "0" && v != "1") env_refuse(name, v, "0 or 1");
  return v == "1";
}

int env_int(const char* name, int dflt, int lo, int hi) {
  const std::string_view v = env_value(name);
  if (v.empty()) return dflt;
  int n = 0;
  if (!parse_decimal(v, n) || n < lo || n > hi)
    env_refuse(name, v, fmt::format("an integer in {} .. {}", lo, hi));
  return n;
}

int env_int_in(const char* name, int dflt, std::initializer_list<int> choices) {
  const std::string_view v = env_value(name);
  if (v.empty()) return dflt;
  std::string expected = "one of";
  const char* sep = " ";
  for (const int c : choices) {
    // Compared as spellings, so "04" or "-0" are not taken for 4 or 0.
    if (v == std::to_string(c)) return c;
    expected.append(sep).append(std::to_string(c));
    sep = ", ";
  }
  env_refuse(name, v, expected);
}

}  // namespace bonsai
