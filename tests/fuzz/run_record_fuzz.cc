// Fuzz target: the run record `strata.run.toml` that `--resume DIR` reads (ReadRunRecord)
// and merges into the flags (MergeRecord), once with no flag given on the command line and
// once with every flag given. Any input must give a Status, never a crash, a hang or an
// exception.
//
// A record is sealed by a checksum of its text (its last line), so a mutated input almost
// never gets past the seal: each input is read as it is (the seal's checks), and then once
// more sealed anew (SealRunRecord), so that the TOML reader and the merge behind the seal
// see the mutations too.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tools/strata/run_record.h"

namespace {

namespace cli = strata::cli;

void ReadAndMerge() {
  auto record = cli::ReadRunRecord(strata::fuzz::FuzzFolder());
  if (!record.ok() || !record->has_value()) return;
  int layers = 2, d_model = 64;
  int64_t steps = 10;
  uint64_t host_mem = 1 << 21;
  double lr = 3e-4;
  bool durable = false;
  std::string data_path = "/data/x.txt", tokenizer = "", schedule = "cosine";
  std::vector<std::string> nvme = {"/a", "/b"};
  const std::vector<cli::Setting> settings = {
      {"layers", cli::OnResume::kFixed, &layers},
      {"d-model", cli::OnResume::kFixed, &d_model},
      {"data", cli::OnResume::kFixed, &data_path, true},
      {"tokenizer", cli::OnResume::kFixed, &tokenizer, true},
      {"lr", cli::OnResume::kSchedule, &lr},
      {"lr-schedule", cli::OnResume::kSchedule, &schedule},
      {"nvme", cli::OnResume::kFixed, &nvme, true},
      {"steps", cli::OnResume::kFree, &steps},
      {"host-mem", cli::OnResume::kFree, &host_mem},
      {"durable", cli::OnResume::kFree, &durable},
  };
  auto identity = [](cli::RunIdentity* id) {
    id->world_size = 2;
    id->rank = 1;
    id->data = {1234, "0123456789abcdef"};
    return strata::Status::OK();
  };
  for (bool given : {false, true}) {
    std::vector<std::string> applied;
    (void)cli::MergeRecord(
        **record, settings, [given](const std::string&) { return given; }, identity,
        /*allow_schedule_change=*/given, &applied);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  (void)strata::fuzz::FuzzInputPath(data, size, cli::kRunRecordFile);
  ReadAndMerge();
  const std::string sealed = cli::SealRunRecord(input);
  (void)strata::fuzz::FuzzInputPath(reinterpret_cast<const uint8_t*>(sealed.data()), sealed.size(),
                                    cli::kRunRecordFile);
  ReadAndMerge();
  return 0;
}
