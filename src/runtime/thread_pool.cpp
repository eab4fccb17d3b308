#include "runtime/thread_pool.h"

#include <chrono>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "bonsai/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BONSAI_CPU_RELAX() _mm_pause()
#else
#define BONSAI_CPU_RELAX() ((void)0)
#endif

namespace bonsai {
namespace {

// How long a thread busy-waits before it sleeps. Ops of one decode step follow
// each other within a few microseconds; a sleeping worker costs a futex wake
// (~5-20 us), so spin somewhat longer than the usual gap, but not so long that
// an idle pool steals a core from other processes.
constexpr auto kSpin = std::chrono::microseconds(200);

template <class Pred>
void spin_until(Pred&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return;
      BONSAI_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() > deadline) return;
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) fail("thread pool: thread count must be at least 1 (got {})", n_threads);
  workers_.reserve(n_threads - 1);
  for (int t = 1; t < n_threads; ++t) workers_.emplace_back([this, t] { worker_main(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::drain(int thread) {
  for (;;) {
    const int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tasks_) return;
    try {
      fn_(ctx_, t, thread);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_main(int thread) {
  uint32_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen)
      generation_.wait(seen, std::memory_order_acquire);
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    drain(thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (busy_.exchange(true, std::memory_order_acquire))
    throw std::logic_error("ThreadPool::parallel_for called re-entrantly or from two threads at once");
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  error_ = nullptr;
  next_task_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  drain(0);

  spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; });
  int p;
  while ((p = pending_.load(std::memory_order_acquire)) != 0) pending_.wait(p, std::memory_order_acquire);

  std::exception_ptr err = std::exchange(error_, nullptr);
  busy_.store(false, std::memory_order_release);
  if (err) std::rethrow_exception(err);
}

int default_thread_count() {
  // Count distinct (physical id, core id) pairs; fall back to the logical count.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto value = [&] {
      const auto c = line.find(':');
      const auto v = c == std::string::npos ? std::string::npos : line.find_first_not_of(" \t", c + 1);
      return v == std::string::npos ? std::string() : line.substr(v);
    };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.emplace(phys, value());
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  const unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

}  // namespace bonsai
