// strata: the command-line tool. `strata --help` lists the subcommands; each has --help.
#include <cstdio>

#include "strata/env.h"
#include "tools/strata/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "strata: memory-tiered offload engine (device memory, pinned host memory, NVMe).\n"
      "Trains models larger than device memory and measures every link a swap crosses."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  int exit_code = 0;

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
  app.add_subcommand("env", "List the STRATA_* environment variables, defaults and values")
      ->callback([] {
        for (const strata::EnvVar& v : strata::kEnvVars) {
          std::printf("%-20s default=%-6s now=%-8s %s\n", v.name, v.default_value,
                      strata::EnvGet(v.name).c_str(), v.help);
        }
      });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
