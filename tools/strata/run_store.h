// A `strata train` run's committed state, every rank's store, opened read-only for `strata
// verify` and `strata export` (never for training: nothing here writes or locks exclusively).
//
// Where the ranks are. A run of N ranks keeps N stores, rank r's in its own folders (the
// run's --nvme with {rank} replaced), each holding rank r's shard of every block. DIR names
// them as `--resume` does: a pattern with {rank} ("/nvme/{rank}"), or one rank's folder, in
// which case the other ranks' folders come from its run record (the --nvme it recorded, or,
// for a store moved since, DIR with its last component, the rank number, replaced).
//
// What each rank's store holds: extent "b<i>.master", the master weights (fp32, or bf16 with
// --master-dtype bf16) of shard r of block i's flat buffer (ComputeBlockLayout of the recorded
// model at N ranks); "b<i>.exp_avg" and "b<i>.exp_avg_sq", the Adam moments of the same elements
// (fp32, or bf16 with
// --state-dtype bf16, or int8 codes followed by their scales: strata/state_layout.h);
// "b<i>.param", the bf16 working copy on CUDA with an fp32 master. Tensor t of block i is
// full-block elements [offset, offset + numel): shard r holds [r·S, (r+1)·S), S the shard
// length, so a tensor is read from the one or more ranks whose shards it meets.
//
// Internal to the CLI. Nothing here prints.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt2.h"
#include "strata/engine.h"
#include "strata/status.h"
#include "strata/store_reader.h"
#include "tools/strata/run_record.h"

namespace strata::cli {

struct RankStore {
  int rank = 0;
  std::vector<std::string> folders;  // folder 0 holds the manifest and the run record
  std::optional<RunRecord> record;
  std::unique_ptr<StoreReader> reader;  // null when the store could not be opened
};

struct RunStore {
  int world_size = 0;
  std::string run_id;
  std::optional<uint64_t> step;  // the committed step every rank holds
  bool have_model = false;       // the geometry is known (from the run record)
  model::Gpt2Config config;
  std::vector<BlockSpec> specs;
  std::vector<BlockLayout> layouts;  // at world_size ranks
  std::string state_dtype;           // the moments as recorded: "fp32", "bf16" or another
  std::string master_dtype;          // the master as recorded: "fp32", "bf16" or another
  std::vector<RankStore> ranks;
  // Everything found wrong, each naming the file (and offset): a missing rank, a damaged
  // manifest or record, ranks that disagree, extents the model does not fit. Reading the
  // extents (their checksums) comes after, through each rank's reader.
  std::vector<Status> problems;
};

// Opens every rank's store of the run `dir` names (see the header comment). Fails only when
// not even one rank's store can be found; everything else is listed in problems.
Result<RunStore> OpenRunStore(const std::string& dir, const StoreReaderOptions& options);

// The bytes one element of `component` ("master", "exp_avg", ...) takes in `store`'s extents;
// 0 for moments or a master in a format this build does not read (verify checks their checksums
// only; export --with-optimizer refuses them).
uint64_t ElementBytes(const RunStore& store, const std::string& component);
// The length extent "b<block>.<component>" of `rank` must have (strata/state_layout.h); 0 for
// moments of a format this build does not know.
uint64_t ExtentBytes(const RunStore& store, int block, int rank, const std::string& component);

// "b<block>.<component>"
std::string ExtentKey(int block, const std::string& component);

}  // namespace strata::cli
