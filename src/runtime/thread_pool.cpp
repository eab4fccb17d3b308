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
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::drain(Slot& s, int thread) {
  for (;;) {
    const int64_t t = s.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= s.n_tasks.load(std::memory_order_relaxed)) return;
    try {
      s.fn(s.ctx, t, thread);
    } catch (...) {
      std::lock_guard lock(s.error_mutex);
      if (!s.error) s.error = std::current_exception();
    }
  }
}

void ThreadPool::worker_main(int thread) {
  // The generation the pool was created with: a worker that starts late must
  // still notice every later bump (including the destructor's).
  uint32_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_relaxed) != seen; });
    uint32_t g;
    while ((g = generation_.load()) == seen) generation_.wait(seen);
    seen = g;
    if (stop_.load()) return;
    Slot& s = slots_[g & 1];
    // A job with fewer tasks than threads needs only the caller and workers 1 .. n_tasks - 1; the
    // others skip it without joining (the caller runs whatever a slow participant leaves). If the
    // slot is already being rewritten for job g + 2, the count read here may be that job's:
    // either decision is safe, since a joining worker still checks the generation below.
    if (thread >= s.n_tasks.load(std::memory_order_relaxed)) continue;
    s.in_flight.fetch_add(1);
    // Joined: the caller of job g + 2 (same slot) waits for us before it
    // rewrites the slot. If the job moved on meanwhile, touch nothing.
    if (generation_.load() == g) drain(s, thread);
    s.in_flight.fetch_sub(1);
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (busy_.exchange(true, std::memory_order_acquire))
    throw std::logic_error("ThreadPool::parallel_for called re-entrantly or from two threads at once");
  const uint32_t g = generation_.load(std::memory_order_relaxed) + 1;  // only this thread writes it
  Slot& s = slots_[g & 1];
  // Stragglers of job g - 2 may still be inside this slot (finding no tasks).
  spin_until([&] { return s.in_flight.load() == 0; });
  while (s.in_flight.load() != 0) std::this_thread::yield();
  s.fn = fn;
  s.ctx = ctx;
  s.n_tasks.store(n_tasks, std::memory_order_relaxed);  // published by the generation store
  s.error = nullptr;
  s.next.store(0, std::memory_order_relaxed);
  generation_.store(g);
  generation_.notify_all();

  drain(s, 0);
  // Every task is handed out; wait for the workers still running one.
  spin_until([&] { return s.in_flight.load() == 0; });
  while (s.in_flight.load() != 0) std::this_thread::yield();

  std::exception_ptr err = std::exchange(s.error, nullptr);
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
