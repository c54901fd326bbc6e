// The configuration a run describes itself with: each flag that defines a `strata train` run,
// typed, written as TOML (`--print-config`, and the record a fresh run leaves in its swap
// store), read back and compared when the run is resumed.
//
// The record. A fresh run with --nvme writes "strata.run.toml" into each of its store
// folders (0600, through a temporary file that is fsync'd and renamed, then the folder
// fsync'd), right after the store is created and before the first step: a [train] table of
// flags (paths absolute), an [identity] table of what no flag says (the run's random id,
// which the store's manifest carries too, the rank and world size, the size and XXH3-64 of
// the --data and --tokenizer files), and a last line holding the XXH3-64 of the text
// before it: a truncated, damaged or edited record is refused, never read in part.
// `--resume DIR` reads DIR's record: the settings the
// command line leaves out come from it; one given with another value is applied and
// printed when it may change (OnResume::kFree), and otherwise refused, every difference
// listed in one message.
//
// Internal to the CLI. Nothing here prints. Plain functions over values; a Setting points
// into the caller's flags, which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "strata/status.h"

namespace strata::cli {

// What a resumed run may do with a setting that differs from its record.
enum class OnResume : uint8_t {
  kFixed,     // defines the run (model, data, optimizer, batch geometry): refused
  kSchedule,  // the learning-rate schedule: refused unless --allow-schedule-change
  kFree,      // steps, budgets, outputs, threads, I/O: applied and printed
};

// One flag and where its parsed value lives.
struct Setting {
  const char* key;  // the flag without its dashes: "d-model"
  OnResume on_resume;
  std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*>
      value;
  bool path = false;  // a file or folder: recorded absolute (so a resume may run elsewhere)
};

// `path` made absolute and normal ("" stays ""); `path` itself when that fails.
std::string AbsolutePath(const std::string& path);

// The value as a TOML value: 0.003, 12, true, "text", ["a", "b"] (numbers in their shortest
// exact form, so that reading them back gives the same bits).
std::string TomlValue(const Setting& s);
// `settings` as a TOML table: "[section]" then one `key = value` line each.
std::string TomlTable(const std::string& section, const std::vector<Setting>& settings);

// Sets *s.value from a TOML value as CLI11 reads it (`inputs`: one string, or an array's).
// InvalidArgument naming the key and the text when it does not fit the type.
Status SetFromToml(const Setting& s, const std::vector<std::string>& inputs);

// A file's size and XXH3-64 (16 hex digits); bytes unset when no file is named.
struct FileHash {
  std::optional<uint64_t> bytes;
  std::string xxh3;
  bool operator==(const FileHash&) const = default;
};

// What identifies the run besides its flags.
struct RunIdentity {
  // Random, made by rank 0 when the run starts (NewRunId) and shared by its ranks; also in
  // each rank's swap store manifest (StoreRunId), so that a store copied from another run
  // or rank is refused. Empty in a record written before identities.
  std::string run_id;
  int rank = 0;  // the rank whose store the folder holds
  int world_size = 1;
  FileHash data;       // --data's; unset for the built-in corpus
  FileHash tokenizer;  // --tokenizer's; unset without one
  // The CUDA kernels the run uses, one variant per family ("attention=naive,...";
  // tools/strata/train_kernels.h); empty on the host device or in a record written before
  // records named them. A resume keeps them (the same bits) unless STRATA_CUDA_KERNELS says.
  std::string cuda_kernels;
};

// 128 random bits as 32 hex digits (getrandom).
std::string NewRunId();
// What the swap store of `rank` of the run records as its identity: "<run id> rank R of N".
std::string StoreRunId(const std::string& run_id, int rank, int world_size);

// The size and XXH3-64 of the file at `path` (read in 1 MiB pieces). IOError naming `flag`
// ("--data") and the path.
Result<FileHash> HashFile(const std::string& flag, const std::string& path);

inline constexpr char kRunRecordFile[] = "strata.run.toml";

// A resume that converts the Adam moments (--allow-state-dtype-change) is recorded before its
// first step, while the store still holds the old format: [train] state-dtype names the format
// of the commits up to `after_step` (the resumed one), and this the format of every later
// commit. So the record is right whether or not a kill comes before the first converted
// commit, or after it and before the plain record replaces this one. Written as a
// [state-conversion] table.
struct StateConversion {
  std::string to;  // a --state-dtype value
  uint64_t after_step = 0;
};

// The record's text: a comment saying what it is, TomlTable("train", ...), [identity], the
// [state-conversion] table when there is one, and a last line that seals it:
// "# xxh3-64 of the text above: <16 hex digits>".
std::string RunRecordText(const std::vector<Setting>& settings, const RunIdentity& identity,
                          const std::optional<StateConversion>& conversion = std::nullopt);
// `body` with its sealing line appended (a record's text is SealRunRecord of the rest).
std::string SealRunRecord(const std::string& body);
// Writes `text` as folder/strata.run.toml: 0600, atomic (temporary, fsync, rename, folder
// fsync), never through a symbolic link. IOError naming the file.
Status WriteRunRecord(const std::string& folder, const std::string& text);

// A record as read back: the [train] values as CLI11 gives them, and the identity.
struct RunRecord {
  std::string path;
  std::vector<std::pair<std::string, std::vector<std::string>>> train;
  RunIdentity identity;
  std::optional<StateConversion> conversion;
};
// folder/strata.run.toml, or nullopt when the folder has none. InvalidArgument naming the
// file, never echoing its bytes, when it is not a regular file, is empty, longer than
// 1 MiB, lacks its sealing line (truncated, or written by a strata before records were
// sealed), fails its checksum (edited or damaged), or is not the TOML a record holds.
// A [state-conversion] is kept in `conversion`, for ResolveStateConversion.
Result<std::optional<RunRecord>> ReadRunRecord(const std::string& folder);
// Applies and clears record->conversion given the committed step of the store the record
// describes: past the conversion's step, state-dtype becomes its format (what the plain record
// written after that commit says); otherwise the stored format stays. Every reader of a
// record's state-dtype calls this first.
void ResolveStateConversion(std::optional<uint64_t> committed_step, RunRecord* record);

// Merges `record` into `settings` for a resumed run. `given(key)` says whether the command
// line (or --config) set the flag. A setting not given takes the recorded value; a given
// one that differs is applied and noted in *applied ("--steps: 30 -> 50") when it may
// change, else it is listed in the error (--data and --tokenizer at another path are
// accepted when the file's content is the recorded one). `identity` is this run's (world
// size, rank, data and tokenizer files; its run_id is not compared), compared with the
// recorded one. InvalidArgument listing every refused difference, each
// with the recorded and the new value, and how to proceed.
Status MergeRecord(const RunRecord& record, const std::vector<Setting>& settings,
                   const std::function<bool(const std::string&)>& given,
                   const std::function<Status(RunIdentity*)>& identity, bool allow_schedule_change,
                   std::vector<std::string>* applied);

}  // namespace strata::cli
