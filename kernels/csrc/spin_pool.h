// The runtime build's parallel_for: a small thread pool whose workers stay awake after each job
// (kSpinMicros: plain loads, then yielding the core to anyone who wants it), then sleep.
//
// Why not the ExecuTorch threadpool: its pthreadpool workers spin a few microseconds after a job
// and then sleep, and a sleeping worker took 35-45 us to wake on the 2-vCPU machines measured here
// (bench/probe.cpp etfuse_probe_threadpool_lag: 0.8 us after a 5 us gap, 37 us after 10 us). Every
// etfuse op starts its parallel part after some serial work (its checks, a phase split, the
// portable op before it), so the worker often arrived after the calling thread had taken every
// chunk. Measured on the runtime, 8-layer chains of conv+bn+relu6, 2 threads, us per layer
// (ExecuTorch threadpool -> this pool; 1 thread): 64 -> 64 3x3 on 24x24 250 -> 212 (315),
// 64 -> 64 on 8x8 48.7 -> 36.2 (46), 16 -> 16 on 32x32 50.9 -> 45.0 (48).
//
// Threads: the ExecuTorch threadpool's count (so `_unsafe_reset_threadpool` still sets it), the
// calling thread included. A job is cut into chunks claimed through one atomic ticket (job id,
// next chunk): a worker that arrives late takes what is left, and a job never waits for a
// worker that has not started. Nested calls, and calls while another thread's job runs, run
// inline. One pool per library (the runtime and the quantized runtime library each have one).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>

namespace etfuse {
namespace pool {

constexpr int64_t kSpinMicros = 300, kYieldAfterMicros = 50;

class SpinPool {
 public:
  // fn(ctx, begin, end) over [begin, end) in chunks of `chunk`, on `threads` threads at most
  // (the caller included). Returns when every chunk is done.
  void run(int64_t begin, int64_t end, int64_t chunk, int threads, void (*fn)(void*, int64_t, int64_t), void* ctx) {
    const int64_t n = (end - begin + chunk - 1) / chunk;
    if (n <= 1 || threads <= 1 || in_worker() || !busy_.try_lock()) {
      fn(ctx, begin, end);
      return;
    }
    std::lock_guard<std::mutex> held(busy_, std::adopt_lock);
    ensure_workers(threads - 1);
    fn_ = fn;
    ctx_ = ctx;
    begin_ = begin;
    end_ = end;
    chunk_ = chunk;
    chunks_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
    const uint64_t job = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
    ticket_.store(job << 32, std::memory_order_seq_cst);  // publishes the fields above
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    work(job);
    while (done_.load(std::memory_order_acquire) < chunks_) pause();
  }

 private:
  static bool& in_worker() {
    static thread_local bool flag = false;
    return flag;
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  // Claims and runs chunks of job `job` until none is left (or the job is another one).
  void work(uint64_t job) {
    for (;;) {
      uint64_t t = ticket_.load(std::memory_order_acquire);
      if ((t >> 32) != job || static_cast<int64_t>(t & 0xffffffffu) >= chunks_) return;
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      const int64_t c = static_cast<int64_t>(t & 0xffffffffu);
      const int64_t b = begin_ + c * chunk_, e = (b + chunk_) < end_ ? (b + chunk_) : end_;
      fn_(ctx_, b, e);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker_loop() {
    in_worker() = true;
    uint64_t seen = ticket_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      const auto since = std::chrono::steady_clock::now();
      uint64_t job;
      int64_t spins = 0;
      while ((job = ticket_.load(std::memory_order_acquire) >> 32) == seen) {
        // plain loads at first (a pause or a yield here cost microseconds per job noticed); then,
        // every few hundred loads, the checks below
        if ((++spins & 255) != 0) continue;
        if (stop_.load(std::memory_order_relaxed)) return;
        const auto waited = std::chrono::steady_clock::now() - since;
        if (waited < std::chrono::microseconds(kYieldAfterMicros)) continue;
        sched_yield();  // another runnable thread (an XNNPACK worker) gets the core
        move_off_caller();
        if (waited > std::chrono::microseconds(kSpinMicros)) {
          std::unique_lock<std::mutex> lock(sleep_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] {
            return (ticket_.load(std::memory_order_seq_cst) >> 32) != seen || stop_.load(std::memory_order_relaxed);
          });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          move_off_caller();
        }
      }
      seen = job;
      work(job);
    }
  }

  // Spinning on the caller's core starves both, and the scheduler may leave it so for
  // milliseconds (a new thread starts on its creator's core; seen on 2-vCPU VMs): this worker's
  // affinity becomes the process's CPUs but the caller's (none left: unchanged).
  void move_off_caller() {
    const int cpu = caller_cpu_.load(std::memory_order_relaxed);
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getcpu() != cpu) return;
    cpu_set_t set = allowed_;
    CPU_CLR(cpu, &set);
    if (CPU_COUNT(&set) > 0) sched_setaffinity(0, sizeof(set), &set);
  }

  void ensure_workers(int want) {
    if (static_cast<int>(workers_.size()) == want) return;
    stop_workers();
    stop_.store(false);
    if (sched_getaffinity(0, sizeof(allowed_), &allowed_) != 0) CPU_ZERO(&allowed_);
    for (int i = 0; i < want; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop_workers() {
    stop_.store(true);
    {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex busy_;  // one job at a time
  std::atomic<uint64_t> ticket_{0};  // job id << 32 | next chunk
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> caller_cpu_{-1};
  std::atomic<bool> stop_{false};
  std::mutex sleep_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  cpu_set_t allowed_;  // the caller's CPUs when the workers started
  void (*fn_)(void*, int64_t, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  std::atomic<int64_t> chunks_{0};  // read by a worker that may still hold the last job's ticket
};

// The process's pool. A forked child starts a new one: the parent's workers do not exist there
// and its locks may be held, so the parent's pool is left alone (leaked).
inline std::atomic<SpinPool*>& current() {
  static std::atomic<SpinPool*> pool{nullptr};
  return pool;
}

inline void forget_after_fork() {
  current().store(nullptr);
}

inline SpinPool& instance() {
  static const bool registered = pthread_atfork(nullptr, nullptr, &forget_after_fork) == 0;
  (void)registered;
  SpinPool* pool = current().load(std::memory_order_acquire);
  if (pool == nullptr) {
    SpinPool* fresh = new SpinPool();  // never destroyed: its workers live as long as the process
    if (current().compare_exchange_strong(pool, fresh)) {
      pool = fresh;
    } else {
      delete fresh;  // another thread's came first (no workers started yet)
    }
  }
  return *pool;
}

}  // namespace pool
}  // namespace etfuse
