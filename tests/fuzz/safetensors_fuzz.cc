// Fuzz target: the safetensors reader (`strata train --init`, `strata generate`). Any input
// must give a Status, never a crash, a hang or an exception; what it accepts must be
// readable: every F32/BF16/F16 tensor converts to fp32 with its own shape.
#include <cstdint>
#include <vector>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = strata::fuzz::FuzzInputPath(data, size, "model.safetensors");
  auto reader = strata::model::SafetensorsReader::Open(path);
  if (!reader.ok()) return 0;
  std::vector<float> out;
  for (const auto& [name, t] : reader->tensors()) {
    const int64_t n = t.NumElements();
    if (n < 0 || n > (1 << 20)) continue;  // the byte-size check bounds it by the file's size
    out.assign(static_cast<size_t>(n), 0.0f);
    (void)reader->ReadFloat(name, t.shape, out.data(), out.size());
    (void)reader->ReadFloat(name, {n + 1}, out.data(), out.size());  // a wrong shape: refused
  }
  (void)reader->ReadFloat("absent tensor", {1}, out.data(), 0);
  return 0;
}
