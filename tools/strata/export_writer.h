// What `strata export` writes, planned from the model before any byte is read, and the
// streaming writer of one output file (see export.cc). Internal to the CLI; nothing prints.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/status.h"
#include "tools/strata/run_store.h"

namespace strata::cli {

// One tensor of the output: its name, shape and where it lies in its block's flat buffer.
struct ExportTensor {
  std::string name;
  std::vector<int64_t> shape;
  int block = 0;
  uint64_t offset = 0;  // full-block elements
  uint64_t numel = 0;
};

struct ExportPlan {
  std::vector<ExportTensor> tensors;  // in data order: block by block, the block's tensors
  uint64_t out_elem_bytes = 4;        // 4: F32, 2: BF16
  uint64_t data_bytes = 0;            // every tensor's bytes
};

// One output file: tensors [first, last) of the plan.
struct ExportFile {
  std::string path;
  size_t first = 0, last = 0;
};

// The model's tensors under their Hugging Face names, `prefix` before each ("transformer."
// in the Hugging Face layout, "" as --save writes them).
ExportPlan PlanExport(const RunStore& store, const std::string& prefix, uint64_t out_elem_bytes);

// The plan cut into files of at most `max_bytes` of tensors each (a larger tensor gets a file
// of its own), in order: `single` when one file holds everything (as transformers names it),
// else model-0000K-of-0000N.safetensors beside it.
std::vector<ExportFile> SplitIntoShards(const ExportPlan& plan, uint64_t max_bytes,
                                        const std::string& single);

// Writes `file` from every rank's extents of `component` ("master", "exp_avg", ...):
// the safetensors header, then the tensors front to back as the shards are read, converted
// to the plan's dtype (fp32 to bf16 rounds to nearest even; bf16 widens exactly). Through an
// AtomicFile: on any error (a checksum that fails, a read, a write) the destination is left
// as it was. Errors name the extent, file and offset (StoreReader::Read's), or the output.
Status WriteExportFile(RunStore& store, const ExportPlan& plan, const ExportFile& file,
                       const std::string& component,
                       const std::map<std::string, std::string>& metadata);

}  // namespace strata::cli
