// safetensors files: the weight format `strata train --init/--save` and `strata generate`
// read and write (https://huggingface.co/docs/safetensors, format described below).
//
// Layout: an 8-byte little-endian header length H, then H bytes of JSON
//   {"name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {...}}
// then the data section; offsets are relative to its start. The reader accepts F32, BF16 and
// F16 tensors (converted to fp32) and keeps the string values of __metadata__ (where strata
// records the model's geometry); the writer writes F32.
//
// SafetensorsReader owns the file's bytes (read whole at Open). Not thread-safe for
// concurrent Open; const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::model {

struct TensorEntry {
  std::string dtype;            // "F32", "BF16", "F16" (others are listed but not readable)
  std::vector<int64_t> shape;   // may be empty (a scalar)
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t NumElements() const;
};

class SafetensorsReader {
 public:
  // Reads and validates `path`: Corruption (with the path) when the file is shorter than
  // its header says, the header is not valid JSON, or an entry lacks dtype/shape/
  // data_offsets, has offsets outside the data section, or a byte size that does not match
  // its shape and dtype (the message names the tensor and what was expected).
  static Result<SafetensorsReader> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorEntry* Find(const std::string& name) const;
  // The string entries of the header's __metadata__ (others are skipped), e.g. "format".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor converted to fp32 into out[0, numel). NotFound naming the tensor when
  // absent; InvalidArgument when its shape is not `expected_shape` (both shapes in the
  // message) or out_elems differs; NotSupported for a dtype other than F32/BF16/F16.
  Status ReadFloat(const std::string& name, const std::vector<int64_t>& expected_shape, float* out,
                   size_t out_elems) const;

 private:
  std::string path_;
  std::vector<uint8_t> data_;  // the data section
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: fp32 values, row-major.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // product(shape) elements
};

// Writes `tensors` as F32 to `path` through an AtomicFile (temporary in the same folder,
// fsync, rename, folder fsync: a crash or power cut leaves the old file or the new one; the
// file is 0644 whatever the umask; a folder or link at `path` is refused). The output is a function
// of the inputs only (keys sorted, fixed padding): equal weights give byte-identical files.
// `metadata` joins {"format": "pt"} in __metadata__.
// IOError/NoSpace with the path on failure; InvalidArgument for duplicate names.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// The bytes a safetensors file of `tensors` starts with: the 8-byte header length and the
// JSON header (space-padded so that the data section is 8-byte aligned), with every tensor
// of `dtype` ("F32" or "BF16") and its data right after the previous one's, in the order
// given (`data` is not read). WriteSafetensors writes this and then the data; a writer that
// streams the data (strata export) writes it first. InvalidArgument for duplicate names or
// another dtype.
Result<std::string> SafetensorsPrefix(const std::vector<TensorToWrite>& tensors,
                                      const std::string& dtype,
                                      const std::map<std::string, std::string>& metadata = {});

// "[768, 2304]"
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace strata::model
