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
// calling thread included. A job's chunks are dealt out as contiguous ranges, one per thread
// (the caller's first), each an atomic word (job id, first and end chunk): a thread takes its own
// range from the front, then steals from the back of the others'. A worker that arrives late
// finds what is left, and a job never waits for a worker that has not started.
//
// Why ranges: the same thread now computes the same part of every op (the top rows of a
// feature map, the first channels), so the next op mostly reads what its own core wrote. With
// one shared ticket the chunks went to whichever thread came first, and on the 2-vCPU machines
// measured here a 32 KB tensor written by the other core took 3 us to read (0.3 us from its own
// core's cache): more than a small conv gained from the second thread.
//
// Nested calls, and calls while another thread's job runs, run inline. One pool per library
// (the runtime and the quantized runtime library each have one).
#pragma once

#include <algorithm>
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
  // fn(ctx, begin, end) over [begin, end) cut into `chunks` near-equal chunks, on `threads`
  // threads at most (the caller included). Returns when every chunk is done.
  void run(int64_t begin, int64_t end, int64_t chunks, int threads, void (*fn)(void*, int64_t, int64_t), void* ctx) {
    const int64_t n = std::min(chunks, end - begin);
    if (n <= 1 || threads <= 1 || worker_index() >= 0 || n > kMaxChunks || !busy_.try_lock()) {
      fn(ctx, begin, end);
      return;
    }
    std::lock_guard<std::mutex> held(busy_, std::adopt_lock);
    if (threads > kMaxThreads) threads = kMaxThreads;
    ensure_workers(threads - 1);
    fn_ = fn;
    ctx_ = ctx;
    begin_ = begin;
    end_ = end;
    const int parts = static_cast<int>(n < threads ? n : threads);
    chunks_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
    const uint64_t job = (job_.load(std::memory_order_relaxed) + 1) & kJobMask;
    // range i: chunks [i * n / parts, (i + 1) * n / parts). The ranges past `parts` are not
    // rewritten: work() reads only the first `parts`, and a late worker of an earlier job finds
    // them all taken (that job ended only when its every chunk was done).
    for (int i = 0; i < parts; ++i) {
      ranges_[i].word.store(pack(job, static_cast<uint64_t>(i * n / parts), static_cast<uint64_t>((i + 1) * n / parts)),
                            std::memory_order_relaxed);
    }
    parts_.store(parts, std::memory_order_relaxed);
    job_.store(job, std::memory_order_seq_cst);  // publishes the fields above
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    work(job, 0);
    while (done_.load(std::memory_order_acquire) < n) pause();
  }

 private:
  static constexpr int kMaxThreads = 64;
  static constexpr int64_t kMaxChunks = (int64_t(1) << 20) - 1;
  static constexpr uint64_t kJobMask = (uint64_t(1) << 24) - 1;

  // a range's word: job (24 bits) | first chunk left (20) | end (20)
  static uint64_t pack(uint64_t job, uint64_t lo, uint64_t hi) { return job << 40 | lo << 20 | hi; }

  // -1 on the calling threads, the worker's range index (1...) on a worker
  static int& worker_index() {
    static thread_local int index = -1;
    return index;
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");  // the spin-wait hint (x86's pause)
#endif
  }

  // Takes one chunk of job `job` from range r (from the front if `own`, else the back); -1 when
  // none is left (or the job is another one).
  int64_t take(uint64_t job, int r, bool own) {
    std::atomic<uint64_t>& word = ranges_[r].word;
    uint64_t w = word.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t lo = (w >> 20) & kMaxChunks, hi = w & kMaxChunks;
      if ((w >> 40) != job || lo >= hi) return -1;
      const uint64_t next = own ? pack(job, lo + 1, hi) : pack(job, lo, hi - 1);
      if (word.compare_exchange_weak(w, next, std::memory_order_acq_rel)) return static_cast<int64_t>(own ? lo : hi - 1);
    }
  }

  void run_chunk(int64_t c) {
    const int64_t n = chunks_.load(std::memory_order_relaxed), len = end_ - begin_;
    fn_(ctx_, begin_ + c * len / n, begin_ + (c + 1) * len / n);
    done_.fetch_add(1, std::memory_order_release);
  }

  // Runs this thread's range of job `job`, then steals from the others until none is left.
  void work(uint64_t job, int self) {
    const int parts = parts_.load(std::memory_order_relaxed);
    if (self < parts) {
      for (int64_t c; (c = take(job, self, true)) >= 0;) run_chunk(c);
    }
    for (int i = 1; i < parts; ++i) {
      const int r = (self + i) % parts;
      for (int64_t c; (c = take(job, r, false)) >= 0;) run_chunk(c);
    }
  }

  void worker_loop(int index) {
    worker_index() = index;
    uint64_t seen = job_.load(std::memory_order_acquire);
    for (;;) {
      const auto since = std::chrono::steady_clock::now();
      uint64_t job;
      int64_t spins = 0;
      while ((job = job_.load(std::memory_order_acquire)) == seen) {
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
            return job_.load(std::memory_order_seq_cst) != seen || stop_.load(std::memory_order_relaxed);
          });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          move_off_caller();
        }
      }
      seen = job;
      work(job, index);
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
    for (int i = 0; i < want; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
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
  std::atomic<uint64_t> job_{0};  // the current job's id
  struct alignas(64) Range {
    std::atomic<uint64_t> word{0};  // pack(job, first chunk left, end)
  };
  Range ranges_[kMaxThreads];
  std::atomic<int> parts_{0};
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
  int64_t begin_ = 0, end_ = 0;
  std::atomic<int64_t> chunks_{0};  // the current job's chunk count (run_chunk)
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
