// Fork-join pool (see thread_pool.h). Memory ordering: Run() writes the job, resets next_task_ and
// busy_, then bumps generation_ with release; a worker acquires generation_, runs tasks, and decrements
// busy_ with release; Run() acquires busy_ == 0 before returning, so every task's writes happen-before
// Run() returns and the next job's fields are not written while a worker may still read them.
#include "kernels/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata::kernels::cpu {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

constexpr auto kSpin = std::chrono::microseconds(50);

// Spins until `a` != `old` or kSpin passes, then sleeps on the futex until it changes.
template <class T>
T WaitChange(const std::atomic<T>& a, T old) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    const T now = a.load(std::memory_order_acquire);
    if (now != old) return now;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
    CpuRelax();
  }
  for (;;) {
    a.wait(old, std::memory_order_acquire);
    const T now = a.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

bool PinThread(pthread_t t, int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(t, sizeof(set), &set) == 0;
}

}  // namespace

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

bool PinCurrentThread(int cpu) { return PinThread(pthread_self(), cpu); }

ThreadPool::ThreadPool(const Options& options) {
  threads_ = options.threads < 1 ? 1 : (options.threads > kMaxThreads ? kMaxThreads : options.threads);
  std::vector<int> cpus = options.cpus;
  if (cpus.empty()) cpus = AllowedCpus();
  worker_cpus_.assign(static_cast<size_t>(threads_), -1);
  workers_.reserve(static_cast<size_t>(threads_ - 1));
  for (int i = 1; i < threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
    // More participants than CPUs: wrap around (the caller asked for the oversubscription).
    const int cpu = cpus.empty() ? -1 : cpus[static_cast<size_t>(i) % cpus.size()];
    if (PinThread(workers_.back().native_handle(), cpu)) {
      worker_cpus_[static_cast<size_t>(i)] = cpu;
    } else {
      pinned_ = false;
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks(int participant) {
  for (;;) {
    const size_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks_) return;
    fn_(ctx_, t, participant);
  }
}

void ThreadPool::WorkerLoop(int participant) {
  uint32_t seen = 0;
  for (;;) {
    seen = WaitChange(generation_, seen);
    if (stop_.load(std::memory_order_relaxed)) return;
    RunTasks(participant);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_all();
  }
}

void ThreadPool::Run(size_t tasks, TaskFn fn, void* ctx) {
  if (tasks == 0) return;
  std::lock_guard<std::mutex> lock(run_mu_);
  if (workers_.empty() || tasks == 1) {
    for (size_t t = 0; t < tasks; ++t) fn(ctx, t, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  tasks_ = tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<uint32_t>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunTasks(0);
  for (uint32_t b = busy_.load(std::memory_order_acquire); b != 0; b = busy_.load(std::memory_order_acquire)) {
    WaitChange(busy_, b);
  }
}

}  // namespace strata::kernels::cpu
