// The one parser for BONSAI_* environment knobs.
//
// Every knob reads through these: an unset or empty variable means the default; a set one must
// be exactly a valid value (no spaces, no trailing characters, no case folding), else the call
// throws one UsageError naming the variable, the value and what it accepts, e.g.
//   BONSAI_CUDA_MV_RING='99': expected an integer in 1 .. 8
// The CLI prints it as one line and exits with code 2. Nothing here caches: a knob read twice
// is parsed twice (the callers keep their own function-local caches where they want one).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace bonsai {

// $name's value; empty when unset.
std::string_view env_value(const char* name);

// Throws the knob's UsageError: "<name>='<value>': expected <expected>".
[[noreturn]] void env_refuse(const char* name, std::string_view value, std::string_view expected);

// 0 or 1; `dflt` when unset or empty.
bool env_flag(const char* name, bool dflt);

// A decimal integer (an optional '-' and digits, nothing else) in [lo, hi]; `dflt` when unset or
// empty (dflt itself need not lie in the range: it may be a sentinel such as -1).
int env_int(const char* name, int dflt, int lo, int hi);

// One of `choices`, spelled exactly; `dflt` when unset or empty.
int env_int_in(const char* name, int dflt, std::initializer_list<int> choices);

// `s` as a whole decimal integer (an optional '-' and digits), or false when it is not one or
// does not fit an int. For knobs of several fields (e.g. BONSAI_CUDA_SITE_CLUSTER=0,3).
bool parse_decimal(std::string_view s, int& out);

// The value paired with $name's value: env_choice<int>("X", {{"mb", 1}, {"bar", 0}}, 1).
template <class T>
T env_choice(const char* name, std::initializer_list<std::pair<std::string_view, T>> choices, T dflt) {
  const std::string_view v = env_value(name);
  if (v.empty()) return dflt;
  std::string expected = "one of";
  const char* sep = " ";
  for (const auto& [spelling, value] : choices) {
    if (v == spelling) return value;
    expected.append(sep).append(spelling);
    sep = ", ";
  }
  env_refuse(name, v, expected);
}

}  // namespace bonsai
