// The layout of a rank's optimizer state for one block, as the engine keeps it in host memory,
// in its swap store and in checkpoints: which extents there are, the size of their elements,
// and where int8 moments keep their per-block scales. The planner, the engine's optimizer
// stage and host tier, and the readers of a store (strata verify, strata export) all take it
// from here, so one description serves them all (and a re-sharding tool later).
//
// A block's state on rank r of N is three extents of its shard (BlockLayout::shard_numel
// values, elements [r * shard_numel, (r + 1) * shard_numel) of the flat buffer):
//   master      fp32 values, or bf16 with MasterFormat::kBf16Stochastic (StateFormats::master)
//   exp_avg     values of the moments' format (fp32, bf16 or int8 codes), then, for int8,
//   exp_avg_sq  the fp32 scales of its quantization runs (below), right after the codes
//               (shard_numel is a multiple of 64, so they start 4-byte aligned)
// Each extent is written, checksummed and committed as one piece, so a moment's codes and
// its scales are always of the same step.
//
// Int8 quantization runs. The blocks of kInt8StateBlock values that the int8 kernel scales
// together are counted from each tensor's first element (not from the shard's), so a
// tensor's blocks are the same whatever the rank count, except where a shard boundary cuts
// one: that block is split into two partial blocks, one per rank, each with its own scale.
// A rank's part of a tensor is therefore at most two runs: the partial block up to the next
// block edge (when the part starts inside a block), then a run from that edge whose blocks
// are whole (its last one may be short). Padding between tensors belongs to no run: its codes
// stay 0. Runs are listed tensor by tensor, and their scales follow one another.
//
// A 2-byte master (StateFormats::master kBf16Stochastic) is shard_numel bf16 values; the
// readers take the extents' sizes from BlockStateLayout, not from a rule of their own.
//
// Plain functions over values; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strata/engine.h"
#include "strata/optim.h"
#include "strata/status.h"

namespace strata {

// The formats of a run's optimizer state.
struct StateFormats {
  StateFormat moments = StateFormat::kFp32;  // exp_avg and exp_avg_sq
  // The master weights: kFp32 or kBf16Stochastic (kBf16Kahan is not an engine format).
  MasterFormat master = MasterFormat::kFp32;
};

// Bytes per value of a moment in `format`, scales apart: 4 (fp32), 2 (bf16), 1 (int8).
uint32_t MomentElemBytes(StateFormat format);
// Bytes per value of the master in `format`: 4 (fp32), 2 (bf16).
uint32_t MasterElemBytes(MasterFormat format);
// Bytes of optimizer state per parameter moved each way by a step: the master (4 or 2) and
// both moments, with int8's scales (2 x 4 bytes per kInt8StateBlock): with an fp32 master 12,
// 8, 6 + 1/256; with a bf16 one 10, 6, 4 + 1/256.
double StateBytesPerParam(const StateFormats& formats);

// One int8 quantization run of a rank's shard: shard elements [lo, hi), whose blocks count
// from lo, with scales [scale, scale + Int8StateBlocks(hi - lo)) of each moment's extent.
struct Int8Run {
  uint64_t lo = 0;
  uint64_t hi = 0;
  uint64_t scale = 0;
  bool operator==(const Int8Run&) const = default;
};
// The runs of `block`'s shard on `rank` of `world_size` (see above), in shard order.
std::vector<Int8Run> Int8Runs(const BlockLayout& block, int rank, int world_size);

// One extent of a block's state on one rank.
struct StateExtent {
  Component component = Component::kMaster;
  uint32_t elem_bytes = 4;    // per value
  uint64_t values = 0;        // the shard's values (BlockLayout::shard_numel)
  uint64_t scale_offset = 0;  // where the fp32 scales start (bytes); = bytes when none
  uint64_t scales = 0;        // how many (int8 moments only)
  uint64_t bytes = 0;         // the extent's length
};

struct BlockStateLayout {
  StateFormats formats;
  StateExtent master, exp_avg, exp_avg_sq;
  std::vector<Int8Run> runs;  // int8 moments only

  // The extent of `component` (kMaster, kExpAvg or kExpAvgSq; else nullptr).
  const StateExtent* Extent(Component component) const;
};
BlockStateLayout DescribeBlockState(const BlockLayout& block, int rank, int world_size,
                                    const StateFormats& formats);

// The moments of one block's shard as fp32 values (shard_numel each) from their extents, and
// back (int8: quantized per run, round to nearest; padding 0). Either moment may be omitted
// (null/empty) when only the other is wanted. InvalidArgument naming the length that is
// wrong.
[[nodiscard]] Status DecodeMoment(const BlockStateLayout& layout, Component component,
                                  std::span<const uint8_t> extent, std::span<float> out);
[[nodiscard]] Status EncodeMoment(const BlockStateLayout& layout, Component component,
                                  std::span<const float> values, std::span<uint8_t> extent);
// The master of one block's shard as fp32 values from its extent (bf16 widened exactly), and
// back (bf16: round to nearest, ties to even). InvalidArgument naming the length that is
// wrong.
[[nodiscard]] Status DecodeMaster(const BlockStateLayout& layout, std::span<const uint8_t> extent,
                                  std::span<float> out);
[[nodiscard]] Status EncodeMaster(const BlockStateLayout& layout, std::span<const float> values,
                                  std::span<uint8_t> extent);

}  // namespace strata
