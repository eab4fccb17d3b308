// The BONSAI_* environment knob parser (src/runtime/env.h) and the CUDA knob check
// (kernels/cuda/knobs.h, cuda::check_knobs: host code, no device needed).
//   EnvKnob.*: unset and empty give the default; valid values parse; garbage ("abc", "3x", " 1",
//     "1.5", "+1", "0x1"), values out of range on either side and near-misses of a choice are
//     refused with one UsageError naming the variable, the value and the accepted range.
//   CudaKnobs.*: check_knobs passes with every knob unset and with valid values, and refuses a
//     bad value of a kernel knob (BONSAI_CUDA_MV_RING=99), of a backend knob and of a pair knob;
//     CudaBackend's constructor refuses one before it looks for a device.
// Every test restores the variables it sets (EnvGuard).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "runtime/env.h"
#if BONSAI_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/knobs.h"
#endif

namespace bonsai {
namespace {

// Sets (or with nullptr unsets) a variable for the scope, restoring its old state afterwards.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~EnvGuard() { set(old_ ? old_->c_str() : nullptr); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  void set(const char* value) {
    if (value)
      setenv(name_.c_str(), value, 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

constexpr const char* kVar = "BONSAI_TEST_KNOB";

// The message of the UsageError f() throws; fails the test when it throws nothing or another type.
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
    return {};
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(EnvKnob, UnsetAndEmptyGiveTheDefault) {
  EnvGuard g(kVar, nullptr);
  for (const char* v : {static_cast<const char*>(nullptr), ""}) {
    g.set(v);
    EXPECT_TRUE(env_value(kVar).empty());
    EXPECT_TRUE(env_flag(kVar, true));
    EXPECT_FALSE(env_flag(kVar, false));
    EXPECT_EQ(env_int(kVar, 7, 1, 8), 7);
    EXPECT_EQ(env_int(kVar, -1, 0, 3), -1);  // a sentinel default outside the range
    EXPECT_EQ(env_int_in(kVar, 4, {4, 6}), 4);
    EXPECT_EQ(env_choice<int>(kVar, {{"a", 1}, {"b", 2}}, 9), 9);
  }
}

TEST(EnvKnob, ValidValuesParse) {
  EnvGuard g(kVar, "1");
  EXPECT_TRUE(env_flag(kVar, false));
  g.set("0");
  EXPECT_FALSE(env_flag(kVar, true));
  for (int n : {1, 5, 8}) {
    g.set(std::to_string(n).c_str());
    EXPECT_EQ(env_int(kVar, 3, 1, 8), n);
  }
  g.set("-1");
  EXPECT_EQ(env_int(kVar, 1, -1, 16), -1);
  g.set("65536");
  EXPECT_EQ(env_int(kVar, 0, 0, 65536), 65536);
  g.set("6");
  EXPECT_EQ(env_int_in(kVar, 4, {4, 6}), 6);
  g.set("bar");
  EXPECT_EQ(env_choice<int>(kVar, {{"mb", 1}, {"bar", 0}}, 1), 0);
  int n = 0;
  EXPECT_TRUE(parse_decimal("42", n));
  EXPECT_EQ(n, 42);
}

TEST(EnvKnob, GarbageIsRefusedNamingTheVariable) {
  EnvGuard g(kVar, nullptr);
  for (const char* v : {"abc", "3x", " 1", "1 ", "1.5", "+1", "0x1", "2", "-1", "true", "on"}) {
    g.set(v);
    const std::string m = refusal([] { env_flag(kVar, false); });
    EXPECT_EQ(m, std::string(kVar) + "='" + v + "': expected 0 or 1") << v;
  }
  for (const char* v : {"abc", "3x", " 1", "1.5", "+1", "0x1", "-", "99999999999"}) {
    g.set(v);
    const std::string m = refusal([] { env_int(kVar, 3, 1, 8); });
    EXPECT_EQ(m, std::string(kVar) + "='" + v + "': expected an integer in 1 .. 8") << v;
  }
  for (const char* v : {"5", "04", "4.0", " 4", "four"}) {
    g.set(v);
    EXPECT_EQ(refusal([] {
                env_int_in(kVar, 4, {4, 6});
              }),
              std::string(kVar) + "='" + v + "': expected one of 4, 6")
        << v;
  }
  for (const char* v : {"Bar", "bar ", "b", "mbar"}) {
    g.set(v);
    EXPECT_EQ(refusal([] {
                env_choice<int>(kVar, {{"mb", 1}, {"bar", 0}}, 1);
              }),
              std::string(kVar) + "='" + v + "': expected one of mb, bar")
        << v;
  }
  int n = 0;
  for (const char* v : {"", "-", "1-", "1e3", " 7"}) EXPECT_FALSE(parse_decimal(v, n)) << v;
}

TEST(EnvKnob, OutOfRangeIsRefusedOnBothSides) {
  EnvGuard g(kVar, "0");
  EXPECT_NE(refusal([] { env_int(kVar, 3, 1, 8); }).find("expected an integer in 1 .. 8"), std::string::npos);
  g.set("9");
  EXPECT_NE(refusal([] { env_int(kVar, 3, 1, 8); }).find("'9'"), std::string::npos);
  g.set("-2");
  EXPECT_NE(refusal([] { env_int(kVar, 1, -1, 16); }).find("-1 .. 16"), std::string::npos);
  g.set("17");
  EXPECT_NE(refusal([] { env_int(kVar, 1, -1, 16); }).find("-1 .. 16"), std::string::npos);
}

#if BONSAI_HAVE_CUDA

TEST(CudaKnobs, DefaultsPass) {
  // The defaults as the kernels read them (only what the test process does not override).
  if (!env_value("BONSAI_CUDA_MV_RING").empty()) GTEST_SKIP() << "BONSAI_CUDA_MV_RING is set";
  EXPECT_EQ(cuda::knob::mv_ring(), 3);
  EXPECT_NO_THROW(cuda::check_knobs());
}

TEST(CudaKnobs, ValidValuesPass) {
  EnvGuard ring("BONSAI_CUDA_MV_RING", "8"), pipe("BONSAI_CUDA_GEMM_PIPE", "bar"),
      split("BONSAI_CUDA_GEMM_SPLIT", "-1"), site("BONSAI_CUDA_SITE_CLUSTER", "0,3"),
      stream("BONSAI_CUDA_GEMM_F16_STREAM", "off"), walk("BONSAI_CUDA_WALK", "6");
  EXPECT_NO_THROW(cuda::check_knobs());
  EXPECT_EQ(cuda::knob::mv_ring(), 8);
  EXPECT_FALSE(cuda::knob::gemm_mbarrier());
  EXPECT_EQ(cuda::knob::gemm_split(), -1);
  EXPECT_EQ(cuda::knob::gemm_f16_stream(), -1);
  EXPECT_EQ(cuda::knob::walk(), 6);
  stream.set("10");
  EXPECT_EQ(cuda::knob::gemm_f16_stream(), 10);
}

TEST(CudaKnobs, BadValuesAreRefusedAtTheCheck) {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;  // part of the message
  };
  const std::vector<Case> cases = {
      {"BONSAI_CUDA_MV_RING", "99", "BONSAI_CUDA_MV_RING='99': expected an integer in 1 .. 8"},
      {"BONSAI_CUDA_MV_RING", "0", "BONSAI_CUDA_MV_RING='0': expected an integer in 1 .. 8"},
      {"BONSAI_CUDA_MV_RING", "abc", "BONSAI_CUDA_MV_RING='abc'"},
      {"BONSAI_CUDA_MV_BPS", "3", "BONSAI_CUDA_MV_BPS='3': expected an integer in 1 .. 2"},
      {"BONSAI_CUDA_GEMM_OCC", "0", "BONSAI_CUDA_GEMM_OCC='0': expected one of 1, 2"},
      {"BONSAI_CUDA_GEMM_PIPE", "mbar", "BONSAI_CUDA_GEMM_PIPE='mbar': expected one of mb, bar"},
      {"BONSAI_CUDA_GEMM_SPLIT", "-2", "BONSAI_CUDA_GEMM_SPLIT='-2'"},
      {"BONSAI_CUDA_PDL", "2", "BONSAI_CUDA_PDL='2': expected 0 or 1"},
      {"BONSAI_CUDA_MV", "fast", "BONSAI_CUDA_MV='fast': expected one of ws, bulk, legacy"},
      {"BONSAI_CUDA_GEMM_F16_STREAM", "11", "off or an integer in 0 .. 10"},
      {"BONSAI_CUDA_GEMM_WG_STAGES", "6", "BONSAI_CUDA_GEMM_WG_STAGES='6': expected one of 4, 8"},
      {"BONSAI_CUDA_SWI_SITE", "3", "BONSAI_CUDA_SWI_SITE='3': expected one of 0, 1, 2, 4"},
      {"BONSAI_CUDA_GDN_DEC_CLUSTER", "8", "BONSAI_CUDA_GDN_DEC_CLUSTER='8'"},
      {"BONSAI_CUDA_MV_UNITS_HEAD", "65537", "BONSAI_CUDA_MV_UNITS_HEAD='65537'"},
      {"BONSAI_CUDA_SITE_CLUSTER", "5,0", "BONSAI_CUDA_SITE_CLUSTER='5,0'"},
      {"BONSAI_CUDA_FWHT_CLUSTER", "4", "BONSAI_CUDA_FWHT_CLUSTER='4'"},
      {"BONSAI_CUDA_FWHT_CLUSTER", "4,3", "BONSAI_CUDA_FWHT_CLUSTER='4,3'"},
  };
  for (const Case& c : cases) {
    EnvGuard g(c.name, c.value);
    const std::string m = refusal([] { cuda::check_knobs(); });
    EXPECT_NE(m.find(c.expected), std::string::npos) << c.name << "=" << c.value << ": " << m;
  }
  // Two knobs valid alone but not together.
  EnvGuard tokens("BONSAI_CUDA_GEMM_WG_TOKENS", "128"), stages("BONSAI_CUDA_GEMM_WG_STAGES", "8");
  EXPECT_NE(refusal([] { cuda::check_knobs(); }).find("BONSAI_CUDA_GEMM_WG_STAGES=8"), std::string::npos);
}

TEST(CudaKnobs, BackendConstructionChecksThemFirst) {
  // Before it looks for a device: the same refusal on a machine without one.
  EnvGuard g("BONSAI_CUDA_MV_RING", "99");
  const std::string m = refusal([] { CudaBackend be(0); });
  EXPECT_EQ(m, "BONSAI_CUDA_MV_RING='99': expected an integer in 1 .. 8");
}

#endif  // BONSAI_HAVE_CUDA

}  // namespace
}  // namespace bonsai
