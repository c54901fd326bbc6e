// strata: the command-line tool. `strata --help` lists the subcommands; each has --help.
#include <cstdio>
#include <exception>
#include <new>
#include <string_view>

#include "strata/env.h"
#include "strata/kernel_record.h"
#include "strata/optim.h"
#include "tools/strata/commands.h"
#include "tools/strata/interrupt.h"

int main(int argc, char** argv) {
  CLI::App app{
      "strata: memory-tiered offload engine (device memory, pinned host memory, NVMe).\n"
      "Trains models larger than device memory and measures every link a swap crosses."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  int exit_code = 0;
  strata::cli::SetCommandLine(argc, argv);  // for the resume command an interrupted run prints

  CLI::App* bench =
      app.add_subcommand("bench", "Measure one part of the engine")->require_subcommand(1);
  strata::cli::AddBenchIo(*bench, &exit_code);

  strata::cli::AddLaunch(app, &exit_code);
  strata::cli::AddBenchAdam(*bench, &exit_code);
  strata::cli::AddBenchStep(*bench, &exit_code);
  strata::cli::AddTrain(app, &exit_code);
  strata::cli::AddGenerate(app, &exit_code);
  strata::cli::AddEval(app, &exit_code);
  strata::cli::AddBenchModel(*bench, &exit_code);
  strata::cli::AddBenchComm(*bench, &exit_code);
  strata::cli::AddVerify(app, &exit_code);
  strata::cli::AddExport(app, &exit_code);
  app.add_subcommand("env",
                     "List the STRATA_* environment variables, defaults and values, and each CUDA "
                     "kernel family's default variant and where it last passed on a GPU")
      ->callback([] {
        for (const strata::EnvVar& v : strata::kEnvVars) {
          const std::string now = strata::EnvGet(v.name);
          std::printf("%-20s default=%-6s now=%-8s %s\n", v.name, v.default_value,
                      v.secret ? (now.empty() ? "" : "(set)") : now.c_str(), v.help);
        }
        std::printf(
            "\nCUDA kernel families: the default runs each family's newest variant that passed "
            "tools/gpu_check.sh on a GPU (docs/gpu_record.md); STRATA_CUDA_KERNELS=tuned runs "
            "every tuned kernel\n%s",
            strata::KernelRecordTable().c_str());
      });

  // STRATA_CPU_ISA is checked before anything starts, not when the first optimizer step
  // runs (`strata env` still lists the variables whatever their values).
  if (!(argc > 1 && std::string_view(argv[1]) == "env") &&
      !strata::EnvGet("STRATA_CPU_ISA").empty()) {
    const auto isa = strata::ResolveCpuIsa(strata::CpuIsa::kAuto);
    if (!isa.ok()) {
      std::fprintf(stderr, "strata: %s\n", isa.status().message().c_str());
      return 1;
    }
  }

  // No exception leaves main: the library returns Status, so one reaching here is a defect
  // on some path; it still ends as one line and exit code 1, never an abort with a core.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "strata: error: out of memory; lower --batch, --seq-len or the model size, or "
                 "raise the memory limit\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: error: %s (unexpected exception; please report it)\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "strata: error: unexpected exception; please report it\n");
    return 1;
  }
  return exit_code;
}
