// Fuzz target: the token-file reader (`--data`): llm.c token files and text. Any input must
// give a Status, never a crash, a hang or an exception; an accepted stream must be cut into
// batches of in-range tokens.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "model/data.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = strata::fuzz::FuzzInputPath(data, size, "tokens.bin");
  auto stream = strata::model::LoadTokens(path);
  if (!stream.ok()) return 0;
  for (int32_t t : stream->tokens) {
    if (t < 0 || t >= stream->vocab) std::abort();  // the reader's vocab bound must hold
  }
  constexpr int kB = 2, kT = 4;
  auto batcher = strata::model::Batcher::Create(&*stream, kB, kT);
  if (!batcher.ok()) return 0;
  std::vector<int32_t> inputs(kB * kT), targets(kB * kT);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{1} << 40}) {
    batcher->TrainBatch(i, inputs.data(), targets.data());
    batcher->ValBatch(i, inputs.data(), targets.data());
  }
  return 0;
}
