// Fuzz target: `--config FILE`, the TOML flags file (CLI11's TOML reader and
// ApplyConfigFile). The input is applied to a `strata`-like command tree with flags of every
// type the CLI uses. Any input must give a Status, never a crash, a hang or an exception.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tools/strata/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = strata::fuzz::FuzzInputPath(data, size, "run.toml");
  CLI::App root("strata", "strata");
  CLI::App* train = root.add_subcommand("train");
  CLI::App* generate = root.add_subcommand("generate");
  CLI::App* bench = root.add_subcommand("bench");
  CLI::App* step = bench->add_subcommand("step");
  int d_model = 0, tokens = 0;
  int64_t steps = 0;
  uint64_t host_mem = 0;
  double lr = 0, temperature = 0;
  bool durable = false;
  std::string data_path, init;
  std::vector<std::string> nvme;
  train->add_option("--d-model", d_model)->check(CLI::Range(1, 1 << 20));
  train->add_option("--steps", steps);
  train->add_option("--host-mem", host_mem);
  train->add_option("--lr", lr);
  train->add_option("--data", data_path);
  train->add_option("--nvme", nvme);
  train->add_flag("--durable", durable);
  generate->add_option("--tokens", tokens);
  generate->add_option("--temperature", temperature);
  generate->add_option("--init", init);
  step->add_option("--d-model", d_model);
  for (CLI::App* sub : {train, generate, step}) {
    std::string config;
    strata::cli::AddConfigFlag(sub, &config);
    (void)strata::cli::ApplyConfigFile(sub, path);
  }
  return 0;
}
