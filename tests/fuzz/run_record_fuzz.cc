// Fuzz target: the run record `strata.run.toml` that `--resume DIR` reads (ReadRunRecord)
// and merges into the flags (MergeRecord), once with no flag given on the command line and
// once with every flag given. Any input must give a Status, never a crash, a hang or an
// exception.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tools/strata/run_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace cli = strata::cli;
  (void)strata::fuzz::FuzzInputPath(data, size, cli::kRunRecordFile);
  auto record = cli::ReadRunRecord(strata::fuzz::FuzzFolder());
  if (!record.ok() || !record->has_value()) return 0;
  int layers = 2, d_model = 64;
  int64_t steps = 10;
  uint64_t host_mem = 1 << 21;
  double lr = 3e-4;
  bool durable = false;
  std::string data_path = "/data/x.txt", schedule = "cosine";
  std::vector<std::string> nvme = {"/a", "/b"};
  const std::vector<cli::Setting> settings = {
      {"layers", cli::OnResume::kFixed, &layers},
      {"d-model", cli::OnResume::kFixed, &d_model},
      {"data", cli::OnResume::kFixed, &data_path, true},
      {"lr", cli::OnResume::kSchedule, &lr},
      {"lr-schedule", cli::OnResume::kSchedule, &schedule},
      {"nvme", cli::OnResume::kFixed, &nvme, true},
      {"steps", cli::OnResume::kFree, &steps},
      {"host-mem", cli::OnResume::kFree, &host_mem},
      {"durable", cli::OnResume::kFree, &durable},
  };
  auto identity = [](cli::RunIdentity* id) {
    id->world_size = 2;
    id->data_bytes = 1234;
    id->data_xxh3 = "0123456789abcdef";
    return strata::Status::OK();
  };
  for (bool given : {false, true}) {
    std::vector<std::string> applied;
    (void)cli::MergeRecord(
        **record, settings, [given](const std::string&) { return given; }, identity,
        /*allow_schedule_change=*/given, &applied);
  }
  return 0;
}
