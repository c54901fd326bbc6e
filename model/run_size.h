// RunSize: what a training run of the GPT-2 workload needs in bytes, computed with
// overflow-safe arithmetic before anything is allocated or planned, and the up-front check
// of those sizes against this host's memory.
//
// Why up front: a size that overflows 64 bits (--d-model 2000000000) made the planner spin
// forever; one that merely exceeds the host (--layers 2000000) grew memory without a word, and
// --batch 2000000000 threw from a vector's constructor. Each is now a message with the
// numbers and the flag to change.
//
// Plain functions over values; safe from any thread.
#pragma once

#include <cstdint>

#include "model/gpt2.h"
#include "strata/status.h"

namespace strata::model {

struct RunSize {
  uint64_t params = 0;               // parameters of the model
  uint64_t state_bytes = 0;          // fp32 params, grads, Adam m and v: 16 bytes a parameter
  uint64_t largest_block_bytes = 0;  // fp32 params of the largest block (embed or one layer)
  uint64_t activation_bytes = 0;     // the CPU model's activations for one micro-batch
};

// The sizes for `rows` rows of `seq_len` tokens per micro-batch on this rank. InvalidArgument
// naming the flags when a count does not fit 64 bits.
Result<RunSize> EstimateRunSize(const Gpt2Config& config, int64_t rows, int64_t seq_len,
                                bool recompute);

struct RunSizeLimits {
  uint64_t host_memory_bytes = 0;  // this host's physical memory (HostMemoryBytes())
  bool cpu_model = true;           // activations live in host memory (HostDevice)
  bool have_nvme = false;          // states may spill to NVMe
};

// InvalidArgument, with the sizes and the host's memory in the message, when a block, the
// activations, or (without NVMe) the model and optimizer states cannot fit in host memory.
Status CheckRunSize(const RunSize& size, const RunSizeLimits& limits);

// What this host's memory leaves once the run is placed: the memory less one micro-batch's
// activations (with the CPU model) and, without NVMe, the states. 0 when the memory is not
// known, 1 when nothing is left. (Layer-major micro-batches keep more activations in it.)
uint64_t HostRoomLeft(const RunSize& size, const RunSizeLimits& limits);

// Physical memory of this host in bytes (0 when unknown).
uint64_t HostMemoryBytes();

}  // namespace strata::model
