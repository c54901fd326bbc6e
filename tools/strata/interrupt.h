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
// `--resume <resume_folder>`, each argument quoted for a POSIX shell where needed.
std::string ResumeCommand(const std::string& resume_folder);

}  // namespace strata::cli
