// Interruption of a long run (SIGINT from Ctrl-C, SIGTERM from a scheduler) and what the
// CLI prints and writes around it.
//
// InstallInterruptHandlers makes the first SIGINT or SIGTERM only set a flag: the run
// finishes the step in progress (so the committed state stays intact), writes its --json and
// --trace, prints how to resume and exits 128 + the signal (130, 143). A second one
// aborts at once with the default action. The handlers use SA_RESTART, so blocking system
// calls in flight are restarted rather than failed with EINTR.
//
// The command line is recorded once at start (SetCommandLine) so that ResumeCommand can
// print the exact command that continues the run. Internal to the CLI.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace strata::cli {

// Records argv, for ResumeCommand. Called once by main before parsing.
void SetCommandLine(int argc, char** argv);

// Installs the handlers (idempotent). Safe to call from any thread before the run starts.
void InstallInterruptHandlers();

// The first signal received (SIGINT or SIGTERM), or 0. Async-signal-safe to set, safe to
// read from any thread.
int InterruptSignal();

// 128 + signal: the exit code of an interrupted run.
int InterruptExitCode(int signal);

// "SIGINT"/"SIGTERM".
const char* InterruptName(int signal);

// The recorded command line with every --resume (and its value) replaced by
// `--resume <resume_folder>` and any --run-secret (and its value) left out, each argument
// quoted for a POSIX shell where needed. Under
// `strata launch` (STRATA_LAUNCH_COMMAND set) it starts with the launch's own command
// (`strata launch -n 2 -- strata train ...`): one rank alone cannot resume a store of several.
std::string ResumeCommand(const std::string& resume_folder);

// How to continue the run: "resume with: <ResumeCommand>", saying where to run it when that
// is not this one command (on every host of a multi-host launch, on every rank of a run
// that another launcher started: torchrun, mpirun, srun), and to give the run secret again
// when the command line (or the launch's, STRATA_LAUNCH_COMMAND_HAD_SECRET) had one.
std::string ResumeHint(const std::string& resume_folder);

// The recorded command line without its last `drop_last` arguments, quoted as in
// ResumeCommand: what `strata launch` passes its ranks as STRATA_LAUNCH_COMMAND (its own
// arguments, up to the command it starts).
std::string CommandLinePrefix(size_t drop_last);

// Whether the recorded command line has a --run-secret (which printed commands leave out).
bool CommandLineHasSecret();

}  // namespace strata::cli
