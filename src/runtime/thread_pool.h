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
// The caller never waits for a worker that has not started: it runs tasks
// itself and then waits only for workers that joined the job and are still
// inside a task. A job of n tasks with n < size() is joined only by workers
// 1 .. n-1 (the others skip it without touching its counters), so a small
// job's hand-off costs what n threads cost, not the whole pool. A worker the OS has descheduled (a loaded
// machine) simply misses the job; a late one finds the task counter exhausted and leaves. Jobs alternate
// between two slots so a straggler of job g can still read its slot while job g+1 is being set up in the
// other one.
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
  // The two counters every participant updates live on cache lines of their own: on a 16-core
  // mesh each contended update is a serialized round trip (docs/performance.md, "What a pool
  // round trip costs on 16 cores").
  struct alignas(64) Slot {
    TaskFn fn = nullptr;
    void* ctx = nullptr;
    std::atomic<int64_t> n_tasks{0};            // read by workers before they join (see worker_main)
    alignas(64) std::atomic<int64_t> next{0};   // next task index to hand out
    alignas(64) std::atomic<int> in_flight{0};  // threads inside this job
    alignas(64) std::mutex error_mutex;
    std::exception_ptr error;
  };
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_main(int thread);
  static void drain(Slot& s, int thread);  // run tasks until the counter passes n_tasks

  int n_threads_;
  std::vector<std::thread> workers_;
  Slot slots_[2];  // job g uses slots_[g & 1]
  // Job id. The fields of slots_[g & 1] are written before `generation_` is
  // set to g (seq_cst) and read by a worker only after it has joined the slot
  // (in_flight) and seen that generation_ is still g.
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
};

// Number of physical cores (logical CPUs / SMT siblings), at least 1.
int default_thread_count();

}  // namespace bonsai
