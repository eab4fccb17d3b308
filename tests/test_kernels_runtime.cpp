// Runtime support for the fast kernels: CPU feature selection and the thread pool.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bonsai/error.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

namespace bonsai {
namespace {

TEST(CpuFeatures, LevelsAreConsistent) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(&f, &cpu_features());  // detected once
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  if (isa_supported(Isa::Avx512)) {
    EXPECT_TRUE(isa_supported(Isa::Avx2));
  }
  EXPECT_TRUE(isa_supported(best_isa()));
  // A CPU without the OS enabling the wide state cannot run AVX-512.
  CpuFeatures no_os = f;
  no_os.os_avx512 = false;
  EXPECT_FALSE(isa_supported(Isa::Avx512, no_os));
  CpuFeatures no_vnni = f;
  no_vnni.avx512vnni = false;
  EXPECT_NE(best_isa(no_vnni), Isa::Avx512);
}

TEST(CpuFeatures, ParseAndSelect) {
  EXPECT_EQ(parse_isa("AVX2"), Isa::Avx2);
  EXPECT_EQ(parse_isa("scalar"), Isa::Scalar);
  EXPECT_EQ(parse_isa("avx512"), Isa::Avx512);
  EXPECT_FALSE(parse_isa("sse4").has_value());
  EXPECT_EQ(select_isa(Isa::Scalar), Isa::Scalar);

  const char* old = std::getenv("BONSAI_ISA");
  const std::string saved = old ? old : "";
  ::setenv("BONSAI_ISA", "scalar", 1);
  EXPECT_EQ(select_isa(), Isa::Scalar);
  if (isa_supported(Isa::Avx2)) {
    EXPECT_EQ(select_isa(Isa::Avx2), Isa::Avx2);  // explicit beats the environment
  }
  ::setenv("BONSAI_ISA", "neon", 1);
  EXPECT_THROW(select_isa(), Error);
  ::unsetenv("BONSAI_ISA");
  EXPECT_EQ(select_isa(), best_isa());
  if (!isa_supported(Isa::Avx512)) {
    EXPECT_THROW(select_isa(Isa::Avx512), Error);
  }
  if (old) ::setenv("BONSAI_ISA", saved.c_str(), 1);
}

TEST(ThreadPool, EveryTaskRunsOnceOnAValidThread) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, [&](int64_t t, int th) {
        hits[t].fetch_add(1);
        if (th < 0 || th >= threads) bad_thread.fetch_add(1);
      });
      for (int64_t t = 0; t < n; ++t) ASSERT_EQ(hits[t].load(), 1) << threads << " threads, task " << t;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, ManyBackToBackCalls) {
  ThreadPool pool(2);
  int64_t total = 0;
  for (int call = 0; call < 500; ++call) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(64, [&](int64_t t, int) { sum.fetch_add(t); });
    total += sum.load();
  }
  EXPECT_EQ(total, 500 * (63 * 64 / 2));
}

TEST(ThreadPool, TwoThreadsRunConcurrently) {
  // Each of the two tasks waits for the other to start: this only finishes if
  // a worker runs one task while the caller runs the other (bounded wait so a
  // broken pool fails instead of hanging).
  ThreadPool pool(2);
  for (int rep = 0; rep < 20; ++rep) {
    std::atomic<int> arrived{0};
    std::atomic<int> met{0};
    std::atomic<int> mask{0};
    pool.parallel_for(2, [&](int64_t, int th) {
      mask.fetch_or(1 << th);
      arrived.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      if (arrived.load() == 2) met.fetch_add(1);
    });
    ASSERT_EQ(met.load(), 2);
    ASSERT_EQ(mask.load(), 3);
  }
}

// A job with fewer tasks than threads is joined only by workers 1 .. n-1 (thread_pool.h), and
// small and large jobs alternating back to back still run every task once (a worker that skips
// job g must not miss g + 1, nor touch a slot it did not join).
TEST(ThreadPool, SmallJobsOnlyUseTheFirstThreadsAndMixWithLargeOnes) {
  ThreadPool pool(6);
  for (int call = 0; call < 400; ++call) {
    const int64_t n = std::array<int64_t, 5>{2, 3, 1000, 5, 64}[call % 5];
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> max_thread{0};
    pool.parallel_for(n, [&](int64_t t, int th) {
      hits[t].fetch_add(1);
      int m = max_thread.load();
      while (th > m && !max_thread.compare_exchange_weak(m, th)) {
      }
    });
    for (int64_t t = 0; t < n; ++t) ASSERT_EQ(hits[t].load(), 1) << "call " << call << " task " << t;
    if (n < pool.size()) {
      ASSERT_LT(max_thread.load(), n) << "call " << call;
    }
  }
}

TEST(ThreadPool, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(16,
                                 [](int64_t t, int) {
                                   if (t == 5) throw std::runtime_error("task 5");
                                 }),
               std::runtime_error);
  std::atomic<int> n{0};
  pool.parallel_for(16, [&](int64_t, int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 16);
  EXPECT_THROW(ThreadPool(0), Error);
}

TEST(ThreadPool, NestedUseIsRefused) {
  ThreadPool pool(2);
  std::atomic<int> refused{0};
  pool.parallel_for(2, [&](int64_t, int) {
    try {
      pool.parallel_for(2, [](int64_t, int) {});
    } catch (const std::logic_error&) {
      refused.fetch_add(1);
    }
  });
  EXPECT_EQ(refused.load(), 2);
}

TEST(ThreadPool, CreateUseDestroyQuickly) {
  // Workers that start after the first job (or after the destructor began)
  // must still see the stop signal: a lost wake-up here hangs the test.
  for (int i = 0; i < 300; ++i) {
    ThreadPool pool(2 + i % 2);
    std::atomic<int> n{0};
    if (i % 3) pool.parallel_for(4, [&](int64_t, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), i % 3 ? 4 : 0);
  }
}

TEST(ThreadPool, DefaultThreadCountIsPositive) { EXPECT_GE(default_thread_count(), 1); }

}  // namespace
}  // namespace bonsai
