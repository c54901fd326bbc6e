// Clang thread-safety annotations (-Wthread-safety) and the annotated mutex the engine's
// parts share. On compilers other than clang the macros expand to nothing.
//
// A field marked GUARDED_BY(mu) may be read or written only with `mu` held; a method
// marked REQUIRES(mu) is called with it held, EXCLUDES(mu) without it. std::mutex carries
// no annotations in libstdc++, so the engine uses Mutex/MutexLock/CondVar below (LevelDB's
// port::Mutex pattern): the same std::mutex and std::condition_variable, annotated.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define STRATA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define STRATA_THREAD_ANNOTATION(x)
#endif

#ifndef CAPABILITY
#define CAPABILITY(x) STRATA_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY STRATA_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef GUARDED_BY
#define GUARDED_BY(x) STRATA_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) STRATA_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
#ifndef REQUIRES
#define REQUIRES(...) STRATA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef EXCLUDES
#define EXCLUDES(...) STRATA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) STRATA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) STRATA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS STRATA_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif

namespace strata::engine_internal {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope; Unlock()/Lock() drop and retake it inside the scope (around a
// blocking call that must not hold it).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void Unlock() RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  // Atomically releases the mutex and waits; holds it again on return. REQUIRES: the
  // mutex is held (not annotated: callers reach it under other names).
  void Wait() {
    std::unique_lock<std::mutex> lk(mu_->mu_, std::adopt_lock);
    cv_.wait(lk);
    lk.release();
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace strata::engine_internal
