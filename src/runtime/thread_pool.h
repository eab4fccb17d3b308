// A persistent worker pool for data-parallel kernels.
//
// n_threads - 1 workers are created once; the calling thread takes part as
// thread 0, so ThreadPool(1) runs everything inline with no synchronisation.
// parallel_for(n, fn) calls fn(task, thread) for every task in [0, n), tasks
// handed out dynamically (an atomic counter), and returns when all are done.
// Between calls the workers spin briefly (a decode step issues ops back to
// back, so the next job usually arrives within microseconds) and then sleep on
// an atomic wait, so an idle pool costs no CPU.
//
// One caller at a time: parallel_for is not re-entrant (a task must not call
// it on the same pool) and must not be called concurrently from two threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace bonsai {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(int64_t task, int thread), thread in [0, size()). Exceptions thrown by
  // fn are rethrown here (the first one) after every task has finished.
  template <class F>
  void parallel_for(int64_t n_tasks, F&& fn) {
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || n_threads_ == 1) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run(
        n_tasks, [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread);
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_main(int thread);
  void drain(int thread);  // run tasks until the counter passes n_tasks_

  int n_threads_;
  std::vector<std::thread> workers_;
  // The current job; written by the caller before `generation_` is bumped
  // (release) and read by workers after they observe the bump (acquire).
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};  // workers that have not finished the current job
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// Number of physical cores (logical CPUs / SMT siblings), at least 1.
int default_thread_count();

}  // namespace bonsai
