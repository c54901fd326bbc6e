// The flags every engine run shares (`strata train`, `strata bench step`), registered once
// with one help text and one default each, and turned into the trainer's RunConfig (the one
// place that becomes EngineOptions: trainer/run_setup.h).
//
// Internal to the CLI. Nothing here prints.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "strata/status.h"
#include "trainer/run_setup.h"

namespace strata::cli {

// The shared flags as the command line gives them (sizes and choices as text). The
// defaults are RunConfig's.
struct RunFlags {
  std::string device = trainer::DeviceChoiceName(trainer::RunConfig{}.device);
  std::string device_mem, host_mem;  // "" (or 0): unlimited
  std::vector<std::string> nvme;
  int micro_batches = trainer::RunConfig{}.micro_batches;
  std::string micro_batch_order =
      trainer::MicroBatchOrderChoiceName(trainer::RunConfig{}.micro_batch_order);
  std::string offload_activations =
      trainer::OffloadActivationsName(trainer::RunConfig{}.offload_activations);
  double grad_clip = trainer::RunConfig{}.grad_clip;
  std::string speculate = SpeculationName(trainer::RunConfig{}.speculation);
  std::string grad_spill = GradSpillName(trainer::RunConfig{}.grad_spill);
  std::string pipeline = trainer::RunConfig{}.pipeline_updates ? "on" : "off";
  std::string state_dtype = "fp32";   // fp32, bf16 (stochastic rounding) or bf16-rne
  std::string master_dtype = "fp32";  // fp32 or bf16 (stochastic rounding)
  std::string grad_dtype = "fp32";    // fp32 or bf16 (device -> host)
  std::string trace;
  std::string trace_steps;  // "a:b", "a:", ":b" or "a"; "" = every step
  std::string io = IoBackendKindName(trainer::RunConfig{}.io);
  CLI::Option* io_option = nullptr;  // --io, to tell whether the command line gave it
  std::string io_config;             // --io-config FILE, as `strata bench io --sweep` writes it
  std::string io_block;              // --io-block SIZE; "": --io-config's, else the default
  int cpu_threads = trainer::RunConfig{}.cpu_threads;
  int optimizer_threads = trainer::RunConfig{}.optimizer_threads;
  std::string rendezvous;
  double comm_timeout = trainer::RunConfig{}.comm_timeout_seconds;  // seconds; 0: the variable
  std::string run_secret, run_secret_file;  // --run-secret, --run-secret-file
  std::string comm_backend = trainer::CommBackendChoiceName(trainer::RunConfig{}.comm_backend);
  std::string collective_memory = CollectiveMemoryName(trainer::RunConfig{}.collective_memory);
};

// Registers the shared flags on `cmd`, writing into `flags` (which must outlive `cmd`'s
// parse). `nvme_help` is the subcommand's --nvme text (what it does without the flag).
void AddRunFlags(CLI::App* cmd, RunFlags* flags, const std::string& nvme_help);

// --run-secret and --run-secret-file, as every command that joins ranks takes them (the
// secret itself, or the file to read it from: comm/join.h's JoinOptions).
void AddRunSecretFlags(CLI::App* cmd, std::string* secret, std::string* file);

// Sets the fields of `config` that the shared flags give; the I/O settings of --io-config
// FILE fill those that --io and --io-block leave out. Errors (with *failed set to the
// flag): the flag's parse error ("--device-mem lots is not a size; ...", "--device gpu:
// expected auto, cpu or cuda", ...), or what is wrong with --io-config's file, naming it.
Status ApplyRunFlags(const RunFlags& flags, trainer::RunConfig* config, std::string* failed);

}  // namespace strata::cli
