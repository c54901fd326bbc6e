// Re-sharding: a block's states written by N ranks, read as M ranks' shards.
//
// A block's flat buffer (ComputeBlockLayout) is padded to a multiple of alignment·N and cut
// into N equal shards; rank q's store holds shard q of every state extent of the block. A
// state extent is described only by how many bytes it keeps per element of its shard
// (`ShardedExtent`): 4 for fp32, 2 for bf16, 1 for int8, or `unit_bytes` per
// `elems_per_unit` elements for a side extent such as a per-block scale. Rank r of M
// gathers elements [r·S_M, (r+1)·S_M) from the old shards that overlap them, reading each
// old extent through a StoreReader (its checksum verified as it streams by; the pieces
// outside the range are hashed and dropped) and copying the overlap to its place; elements
// past the old padded length are the new padding (zeros).
//
// Thread safety: none; one thread at a time (a StoreReader is one ring).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/status.h"
#include "strata/store_reader.h"

namespace strata::engine_internal {

struct ShardedExtent {
  std::string key;              // "b3.master": the same key under every rank count
  uint64_t unit_bytes = 4;      // bytes per unit
  uint64_t elems_per_unit = 1;  // shard elements per unit (a shard is a whole number of units)
};

// The element geometry of one block under the old and the new rank count.
struct ReshardGeometry {
  uint64_t old_shard = 0;  // elements per old shard (S_N)
  int old_ranks = 0;       // N
  uint64_t new_shard = 0;  // elements per new shard (S_M)
  int new_rank = 0;        // r
};

// Fills `out` (the new shard of `extent`: new_shard / elems_per_unit · unit_bytes bytes,
// zeroed by the caller) from the old ranks' stores `old` (one reader per old rank).
// Corruption naming the store when an old extent's length is not the old shard's; the
// reader's Corruption (key, file, offset) when a checksum fails.
Status ReadNewShard(std::span<StoreReader* const> old, const ShardedExtent& extent,
                    const ReshardGeometry& g, std::span<uint8_t> out);

// The old padded length of a block whose unpadded flat length (its last tensor's end) is
// `end`, under `ranks` ranks: RoundUp(end, alignment · ranks), as ComputeBlockLayout.
uint64_t ShardNumel(uint64_t end, uint32_t alignment, int ranks);

}  // namespace strata::engine_internal
