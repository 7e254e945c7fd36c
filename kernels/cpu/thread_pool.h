// A small fork-join pool for the host kernels: the caller's thread plus `threads - 1` pinned workers run
// the tasks of one Run() call, then Run() returns.
//
// Guarantees and protocol:
//  - Run(tasks, fn, ctx) calls fn(ctx, task, participant) exactly once for every task in [0, tasks) and
//    returns after all of them finished (everything they wrote is visible to the caller). Tasks are
//    claimed dynamically in increasing order, so each participant sees its own tasks in increasing order.
//    participant 0 is the calling thread, 1..threads-1 the workers.
//  - Run() calls are serialised by an internal mutex: the pool may be shared, it is just not concurrent.
//    fn must not call Run() on the same pool (that would deadlock).
//  - Workers are created in the constructor (the only allocation) and pinned, one CPU each: worker i to
//    cpus[i], or by default to the i-th CPU the constructing thread may run on (AllowedCpus(), wrapping
//    around when there are more threads than CPUs), leaving the first for the caller. So construct the
//    pool before pinning the calling thread, or pass cpus. Pinning is best effort: pinned() says whether
//    every worker got its CPU. The caller's thread is never re-pinned by the pool (it belongs to the
//    caller; see PinCurrentThread).
//  - Between Runs the workers spin briefly (about 50 us) and then sleep on a futex, so an idle pool
//    costs no CPU and back-to-back Runs do not pay a wake-up each.
// No function here allocates after construction, reads the environment or throws.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::kernels::cpu {

class ThreadPool {
 public:
  static constexpr int kMaxThreads = 256;

  struct Options {
    int threads = 1;        // participants including the caller; clamped to [1, kMaxThreads]
    std::vector<int> cpus;  // cpus[i] for participant i (index 0 unused); empty: allowed set order
  };

  explicit ThreadPool(const Options& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }
  bool pinned() const { return pinned_; }
  // The CPU worker i (1 <= i < threads) was pinned to, or -1 when pinning failed.
  int worker_cpu(int i) const { return worker_cpus_[static_cast<size_t>(i)]; }

  using TaskFn = void (*)(void* ctx, size_t task, int participant);
  void Run(size_t tasks, TaskFn fn, void* ctx);

  // Run with a callable f(size_t task, int participant); f lives on the caller's stack.
  template <class F>
  void ParallelFor(size_t tasks, F& f) {
    Run(tasks, [](void* c, size_t t, int p) { (*static_cast<F*>(c))(t, p); }, &f);
  }

 private:
  void WorkerLoop(int participant);
  void RunTasks(int participant);

  int threads_ = 1;
  bool pinned_ = true;
  std::vector<int> worker_cpus_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;

  // The current job; written by Run() before generation_ is released, read by workers after acquiring it.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_task_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> busy_{0};  // workers not yet done with the current generation
  std::atomic<bool> stop_{false};
};

// Pins the calling thread to `cpu`; false when the OS refuses (for example, a CPU outside the cpuset).
bool PinCurrentThread(int cpu);

// The CPUs the calling thread may run on (its affinity mask), in increasing order.
std::vector<int> AllowedCpus();

}  // namespace strata::kernels::cpu
