// Helpers of bench/gpu_model_bench.cc: the CUDA and Status checks that end the benchmark with
// a message, device allocation, CUDA-event timing, and --query (the device as the CUDA
// runtime sees it). Header-only; single-threaded use, as the benchmark is.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/bench_stats.h"
#include "strata/status.h"

namespace strata::model::cuda_ops {

#define BENCH_CHECK_CUDA(expr)                                                \
  do {                                                                        \
    cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "error: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
#define BENCH_CHECK(expr)                                                               \
  do {                                                                                  \
    ::strata::Status bench_status_ = (expr);                                            \
    if (!bench_status_.ok()) {                                                          \
      std::fprintf(stderr, "error: %s: %s\n", #expr, bench_status_.ToString().c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

inline void* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return p;
}

// Median milliseconds of `fn` on `stream` over `iters` runs after `warmup` runs.
inline double TimeMs(cudaStream_t stream, int warmup, int iters, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn();
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    fn();
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(ms);
}

// --query: the device as the CUDA runtime sees it, one JSON line (no nvidia-smi needed).
// Exit 0 with a device, 3 without one.
inline int Query() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  nlohmann::json doc = {{"device_count", err == cudaSuccess ? count : 0},
                        {"driver_version", driver},
                        {"runtime_version", runtime},
                        {"devices", nlohmann::json::array()}};
  if (err != cudaSuccess) doc["error"] = cudaGetErrorString(err);
  for (int i = 0; err == cudaSuccess && i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&free_bytes, &total_bytes);
    doc["devices"].push_back(
        {{"ordinal", i},
         {"name", prop.name},
         {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
         {"multiprocessors", prop.multiProcessorCount},
         {"memory_bytes", prop.totalGlobalMem},
         {"free_bytes", free_bytes},
         {"l2_bytes", prop.l2CacheSize},
         {"pci_bus", prop.pciBusID}});
  }
  std::printf("%s\n", doc.dump().c_str());
  return err == cudaSuccess && count > 0 ? 0 : 3;
}

}  // namespace strata::model::cuda_ops
