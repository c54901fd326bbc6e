#include "tools/strata/train_args.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>

#include "strata/atomic_file.h"
#include "strata/engine.h"
#include "strata/input_file.h"
#include "strata/log.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/store_layout.h"

namespace strata::cli {

std::vector<Setting> TrainSettings(TrainArgs& a) {
  const OnResume fixed = OnResume::kFixed, free = OnResume::kFree;
  const OnResume schedule = OnResume::kSchedule;
  // Under a cosine schedule the total steps shape the learning rate too.
  const OnResume steps = a.lr_schedule == "cosine" ? schedule : free;
  return {
      {"layers", fixed, &a.layers},
      {"d-model", fixed, &a.d_model},
      {"heads", fixed, &a.heads},
      {"seq-len", fixed, &a.seq_len},
      {"vocab", fixed, &a.vocab},
      {"data", fixed, &a.data, true},
      {"tokenizer", fixed, &a.tokenizer, true},
      {"init", free, &a.init, true},  // read only by a fresh run
      {"batch", fixed, &a.batch},
      {"micro-batches", fixed, &a.run.micro_batches},
      {"micro-batch-order", free, &a.run.micro_batch_order},  // bit-identical either way
      {"seed", fixed, &a.seed},
      {"lr", schedule, &a.lr},
      {"lr-schedule", schedule, &a.lr_schedule},
      {"warmup", schedule, &a.warmup},
      {"weight-decay", fixed, &a.weight_decay},
      {"beta1", fixed, &a.beta1},
      {"beta2", fixed, &a.beta2},
      {"eps", fixed, &a.eps},
      {"grad-clip", fixed, &a.run.grad_clip},
      {"speculate", free, &a.run.speculate},    // bit-identical either way
      {"grad-spill", free, &a.run.grad_spill},  // bit-identical either way
      {"pipeline", free, &a.run.pipeline},      // bit-identical either way
      {"state-dtype", a.allow_state_dtype_change ? free : fixed, &a.run.state_dtype},
      {"master-dtype", fixed, &a.run.master_dtype},
      {"grad-dtype", fixed, &a.run.grad_dtype},
      {"device", fixed, &a.run.device},
      {"comm-backend", fixed, &a.run.comm_backend},
      // The store's folders may move (each holds a record of the run's identity, checked).
      {"nvme", free, &a.run.nvme, true},
      {"steps", steps, &a.steps},
      {"recompute", free, &a.recompute},                          // bit-identical either way
      {"offload-activations", free, &a.run.offload_activations},  // bit-identical either way
      {"max-skipped-steps", free, &a.max_skipped_steps},
      {"device-mem", free, &a.run.device_mem},
      {"host-mem", free, &a.run.host_mem},
      {"durable", free, &a.durable},
      {"io", free, &a.run.io},
      {"io-config", free, &a.run.io_config, true},
      // The store's stripe: recorded as the run resolved it (flag, --io-config or default).
      {"io-block", fixed, &a.run.io_block},
      {"threads", free, &a.run.cpu_threads},
      {"optimizer-threads", free, &a.run.optimizer_threads},
      {"collective-memory", free, &a.run.collective_memory},  // same results either way
      {"comm-timeout", free, &a.run.comm_timeout},
      {"val-every", free, &a.val_every},
      {"log-every", free, &a.log_every},
      {"save-every", free, &a.save_every},
      {"trace-steps", free, &a.run.trace_steps},
      {"save", free, &a.save, true},
      {"json", free, &a.json, true},
      {"trace", free, &a.run.trace, true},
      {"sample", free, &a.sample},
      {"temperature", free, &a.sampling.temperature},
      {"top-k", free, &a.sampling.top_k},
      {"top-p", free, &a.sampling.top_p},
  };
}

std::vector<NamedValue> RankAgreedOptions(const TrainArgs& a, const model::TokenStream& data) {
  TrainArgs copy = a;
  std::vector<NamedValue> out;
  for (const Setting& s : TrainSettings(copy)) {
    const std::string key = s.key;
    if ((s.on_resume == OnResume::kFree && key != "steps") || key == "nvme" || key == "data" ||
        key == "tokenizer" || key == "io-block") {
      continue;
    }
    out.push_back({"--" + key, TomlValue(s)});
  }
  char hash[40];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(
                    XXH3_64bits(data.tokens.data(), data.tokens.size() * sizeof(int32_t))));
  out.push_back(
      {"--data (its tokens)", std::to_string(data.tokens.size()) + " tokens, xxh3 " + hash});
  // Resumed: every rank's store must belong to the same run.
  if (!a.resume.empty()) {
    out.push_back({"the run identity (run-id in strata.run.toml)", a.run_id});
    // Each rank reads its own store for it (a step may still roll forward): they must agree
    // whether to re-shard.
    out.push_back({"the rank count whose stores hold the resumed state",
                   std::to_string(a.stored_world_size)});
  }
  return out;
}

Status CheckTrainFlags(const TrainArgs& a, std::string* what) {
  struct Check {
    const char* flag;
    double value;
    bool ok;
    const char* expected;
  };
  const auto finite_ge0 = [](double v) { return v >= 0 && std::isfinite(v); };
  const Check checks[] = {
      {"--lr", a.lr, finite_ge0(a.lr), "a finite learning rate >= 0"},
      {"--warmup", double(a.warmup), a.warmup >= 0, "a step count >= 0 (0: none)"},
      {"--val-every", double(a.val_every), a.val_every >= 0, "a step count >= 0 (0: off)"},
      {"--sample", double(a.sample), a.sample >= 0, "a token count >= 0 (0: none)"},
      {"--steps", double(a.steps), a.steps >= 0, "a step count >= 0"},
      {"--max-skipped-steps", double(a.max_skipped_steps), a.max_skipped_steps >= 0,
       "a step count >= 0 (0: never stop)"},
      {"--beta1", a.beta1, a.beta1 >= 0 && a.beta1 < 1, "a number in [0, 1)"},
      {"--beta2", a.beta2, a.beta2 >= 0 && a.beta2 < 1, "a number in [0, 1)"},
      {"--eps", a.eps, finite_ge0(a.eps), "a finite number >= 0"},
      {"--weight-decay", a.weight_decay, finite_ge0(a.weight_decay), "a finite number >= 0"},
      {"--grad-clip", a.run.grad_clip, finite_ge0(a.run.grad_clip),
       "a finite gradient norm >= 0 (0: off)"},
      {"--threads", double(a.run.cpu_threads),
       a.run.cpu_threads >= 0 && a.run.cpu_threads <= kMaxThreads,
       "a thread count from 0 (one per core) to 1024"},
      {"--optimizer-threads", double(a.run.optimizer_threads),
       a.run.optimizer_threads >= 0 && a.run.optimizer_threads <= kMaxThreads,
       "a thread count from 0 (as --threads) to 1024"},
      {"--comm-timeout", a.run.comm_timeout, finite_ge0(a.run.comm_timeout),
       "a finite number of seconds >= 0 (0: STRATA_COMM_TIMEOUT)"},
  };
  for (const Check& c : checks) {
    if (c.ok) continue;
    *what = c.flag;
    char value[32];
    std::snprintf(value, sizeof(value), "%g", c.value);
    return Status::InvalidArgument(std::string(c.flag) + " " + value + ": expected " + c.expected);
  }
  *what = "sampling";  // the message names the flag
  STRATA_RETURN_IF_ERROR(a.sampling.Validate());
  if (a.durable && a.durable_given && a.run.nvme.empty() && a.resume.empty()) {
    *what = "--durable";
    return Status::InvalidArgument(
        "--durable commits the state to NVMe every step and needs --nvme folders; add --nvme "
        "DIR, or drop --durable");
  }
  what->clear();
  return Status::OK();
}

Status CheckOutputs(const TrainArgs& a, const RankInfo& rank, std::string* what) {
  const std::pair<const char*, std::string> outputs[] = {
      {"--save", rank.rank == 0 ? a.save : ""},
      {"--json", rank.rank == 0 ? a.json : ""},
      {"--trace", a.run.trace.empty() ? "" : RankPath(a.run.trace, rank)}};
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    *what = flag;
    STRATA_RETURN_IF_ERROR(CheckOutputPath(path, flag));
  }
  what->clear();
  return Status::OK();
}

bool ConvertsMoments(const TrainArgs& a) {
  auto format = [](const std::string& d) { return d == "bf16-rne" ? std::string("bf16") : d; };
  return !a.resume.empty() && a.allow_state_dtype_change &&
         format(a.stored_state_dtype) != format(a.run.state_dtype);
}

namespace {

using GivenFn = std::function<bool(const std::string&)>;

// Whether folder's manifest names a committed step (true when it cannot be read: the store
// then reports it).
bool StoreHasCommitted(const std::string& folder) {
  Result<std::optional<uint64_t>> step = PeekCommittedStep(folder);
  return !step.ok() || step->has_value();
}

// The folder --resume names for this rank must hold a store and its run's record; each is
// checked here, before anything runs or is made there, with a message that names what is
// missing.
Result<RunRecord> ReadResumedRecord(const std::string& folder, const RankInfo& rank) {
  const std::string whose =
      rank.world_size > 1 ? " (rank " + std::to_string(rank.rank) + "'s folder)" : "";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return Status::NotFound(
               "--resume " + folder + whose + ": " +
               (std::filesystem::exists(folder, ec) ? "not a folder" : "no such folder") +
               "; give the folder of the run's swap store" +
               (rank.world_size > 1 ? ", which holds a folder for every rank" : ""))
        .WithPath(folder);
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<RunRecord> record, ReadRunRecord(folder));
  const bool has_store = std::filesystem::exists(folder + "/strata.manifest", ec);
  if (!record && !has_store) {
    return Status::NotFound("--resume " + folder + whose +
                            ": no swap store there (no strata.manifest, no " + kRunRecordFile +
                            "): nothing to resume; start a fresh run (without --resume)")
        .WithPath(folder);
  }
  if (!record && !StoreHasCommitted(folder)) {
    return Status::NotFound("--resume " + folder + whose +
                            ": the swap store there has no committed step: the run stopped "
                            "before its first commit, so there is nothing to resume; start it "
                            "afresh (the same command without --resume works in this folder)")
        .WithPath(folder);
  }
  if (!record) {
    return Status::InvalidArgument(
               "--resume " + folder + whose + ": the swap store there has no run record (" +
               kRunRecordFile +
               " was removed, or the store was made by a strata before records), so its run's "
               "settings are unknown; restore the record from a copy of the folder")
        .WithPath(folder);
  }
  if (record->identity.run_id.empty()) {
    return Status::InvalidArgument("--resume: the run record " + record->path +
                                   " holds no run-id; restore the record as the run wrote it")
        .WithPath(record->path);
  }
  return std::move(*record);
}

// The folders the record names for the store (unexpanded, as recorded).
std::vector<std::string> RecordedFolders(const RunRecord& record) {
  for (const auto& [key, inputs] : record.train) {
    if (key == "nvme") return inputs;
  }
  return {};
}

// A store resumed from another folder than the one its record names (copied or moved): the
// outputs the record names are the original run's, and a copy must not overwrite them. One
// the command line does not give is written inside the store's new folder when it was inside
// the old one, and not at all otherwise (the line says how to get it back).
void KeepOutputsWithTheStore(TrainArgs* a, const std::string& from, const GivenFn& given) {
  const std::pair<const char*, std::string*> outputs[] = {
      {"save", &a->save}, {"json", &a->json}, {"trace", &a->run.trace}};
  const std::string inside = from + "/";
  for (const auto& [key, path] : outputs) {
    if (given(key) || path->empty() || *path == "-") continue;
    if (path->rfind(inside, 0) == 0) {
      const std::string moved = a->resume + "/" + path->substr(inside.size());
      std::printf("# --%s %s: the record's %s, inside the store's folder as it is now\n", key,
                  moved.c_str(), path->c_str());
      *path = moved;
    } else {
      std::printf(
          "# --%s %s (from the record) is not written: it belongs to the store where the "
          "record says it is; give --%s to write one\n",
          key, path->c_str(), key);
      path->clear();
    }
  }
}

// The store moved (another folder or drive): --nvme follows --resume when it was one folder
// and is not given. Each of the run's other folders must hold a record of the same run.
// A copy (the record's folder still holds the run) is told apart from a move, and neither
// writes the outputs the record names outside the store (KeepOutputsWithTheStore).
Status PlaceMovedStore(TrainArgs* a, const RunRecord& record, const RankInfo& rank,
                       const GivenFn& given) {
  auto rank_path = [&](const std::string& p) { return RankPath(p, rank); };
  const std::string resume = rank_path(a->resume);
  const std::vector<std::string> recorded = RecordedFolders(record);
  const bool relocated =
      !recorded.empty() && std::none_of(recorded.begin(), recorded.end(),
                                        [&](const auto& f) { return rank_path(f) == resume; });
  bool copied = false;
  if (relocated) {
    Result<std::optional<RunRecord>> there = ReadRunRecord(rank_path(recorded.front()));
    copied =
        there.ok() && there->has_value() && (*there)->identity.run_id == record.identity.run_id;
    KeepOutputsWithTheStore(a, recorded.front(), given);
  }
  const bool listed = std::any_of(a->run.nvme.begin(), a->run.nvme.end(),
                                  [&](const std::string& f) { return rank_path(f) == resume; });
  if (!listed && !given("nvme")) {
    if (a->run.nvme.size() > 1) {
      return Status::InvalidArgument(
                 "--resume " + resume + ": the run's store spans " +
                 std::to_string(a->run.nvme.size()) + " folders (" +
                 CLI::detail::join(a->run.nvme, ", ") +
                 ") and this is none of them: it moved; give every folder of the store with "
                 "--nvme, in the order of the record, as they are now")
          .WithPath(record.path);
    }
    if (!a->run.nvme.empty() && copied) {
      std::printf(
          "# resuming %s: a copy of the store in %s, which still holds the run (the run "
          "identity matches); this copy trains on its own and writes only inside %s or where "
          "the command line says\n",
          resume.c_str(), rank_path(a->run.nvme.front()).c_str(), resume.c_str());
    } else if (!a->run.nvme.empty()) {
      std::printf(
          "# resuming %s: the store moved here from %s (the run identity matches; nothing of "
          "the run is left there)\n",
          resume.c_str(), rank_path(a->run.nvme.front()).c_str());
    }
    a->run.nvme = {a->resume};
  }
  for (const std::string& f : a->run.nvme) {
    const std::string folder = rank_path(f);
    if (folder == resume) continue;
    STRATA_ASSIGN_OR_RETURN(std::optional<RunRecord> other, ReadRunRecord(folder));
    if (!other || other->identity.run_id != record.identity.run_id) {
      return Status::InvalidArgument("--nvme " + folder + ": " +
                                     (other ? "its record names run " + other->identity.run_id
                                            : std::string("it holds no run record")) +
                                     ", but the run resumed from " + resume + " is " +
                                     record.identity.run_id +
                                     "; give the folders of one run's store")
          .WithPath(folder);
    }
  }
  return Status::OK();
}

// Which rank's record a resume on `rank` reads: its own folder's, which every rank of the
// stored run has (on several hosts, with node-local folders, rank 0's may not be on this
// one); rank 0's only for a rank whose own folder holds no record: a rank a re-sharding adds
// (no folder yet, or one whose store was committed and whose record was not yet written).
// A rank of the stored count whose folder is gone is named as missing. *layout: the count
// and step that hold the state (store_layout.h).
struct ResumedRecord {
  RankInfo source;  // the rank whose folder holds it
  RunRecord record;
};
Result<ResumedRecord> RecordSource(const std::string& resume, const RankInfo& rank,
                                   StoredLayout* layout) {
  auto folder_of = [&](int q) { return RankPath(resume, StoredRank(rank, q)); };
  const std::string own = folder_of(rank.rank);
  Result<std::optional<RunRecord>> own_record = ReadRunRecord(own);
  RankInfo source = rank;
  if (own_record.ok() && !own_record->has_value() && rank.rank != 0) {
    source = StoredRank(rank, 0);
    Result<std::optional<RunRecord>> first = ReadRunRecord(folder_of(0));
    if (!first.ok() || !first->has_value()) {
      // Neither: this rank's folder is the one to name (rank 0's may be on another host).
      Status s = ReadResumedRecord(own, rank).status();
      return s.Annotate("--resume: neither this rank's folder nor rank 0's (" + folder_of(0) +
                        ", read for a rank a re-sharding adds) holds the run's record");
    }
  }
  STRATA_ASSIGN_OR_RETURN(RunRecord record, ReadResumedRecord(folder_of(source.rank), source));
  STRATA_ASSIGN_OR_RETURN(*layout,
                          FindStoredLayout(folder_of, source.rank, record.identity.run_id));
  ResolveStateConversion(layout->step, &record);
  std::error_code ec;
  if (source.rank != rank.rank && (layout->world_size == 0 || rank.rank < layout->world_size) &&
      !std::filesystem::exists(own, ec)) {
    return ReadResumedRecord(own, rank).status();  // names the missing folder
  }
  return ResumedRecord{source, std::move(record)};
}

// A re-sharding resume cuts each extent of the old ranks' stores as elements: an int8
// moment extent holds codes and a scale per quantization block, which a shard boundary would
// cut (and a conversion would re-shard what it has not committed yet). Refused by name here,
// before anything is opened or printed about the re-sharding (the engine refuses it too).
Status RefuseUnsupportedResharding(const TrainArgs& a, const StoredLayout& layout,
                                   const RankInfo& rank) {
  if (layout.world_size == 0 || layout.world_size == rank.world_size) return Status::OK();
  const std::string why =
      ConvertsMoments(a) ? "--allow-state-dtype-change converts its Adam moments (--state-dtype " +
                               a.stored_state_dtype + " -> " + a.run.state_dtype + ")"
      : a.run.state_dtype == "int8" ? "its Adam moments are int8 (--state-dtype int8)"
                                    : "";
  if (why.empty()) return Status::OK();
  const std::string n = std::to_string(layout.world_size);
  return Status::NotSupported("--resume " + a.resume + ": the stored state of " + n +
                              " rank(s) would be re-sharded onto " +
                              std::to_string(rank.world_size) + ", but " + why +
                              ", which a re-sharding cannot cut yet; resume it on the " + n +
                              " ranks that wrote it (converting it there first to fp32 or bf16 "
                              "with --allow-state-dtype-change, then re-shard that)")
      .WithPath(a.resume);
}

// --resume: merges the stored run's record into the flags (run_record.h) and takes its
// identity.
Status MergeStoredRun(TrainArgs* a, const GivenFn& given) {
  STRATA_ASSIGN_OR_RETURN(const RankInfo rank, RankFromEnvOrSingle());
  // The record's folders are absolute: so is --resume, to be found among them.
  a->resume = AbsolutePath(a->resume);
  // The state may be held by another number of ranks than this run's (a resume on another
  // rank count re-shards): the stores say how many.
  StoredLayout layout;
  STRATA_ASSIGN_OR_RETURN(const ResumedRecord resumed, RecordSource(a->resume, rank, &layout));
  const RankInfo& source = resumed.source;
  const RunRecord& record = resumed.record;
  a->stored_world_size = layout.world_size;
  a->stored_step = layout.step;
  const std::string folder = RankPath(a->resume, source);
  // The recorded schedule decides whether --steps may change (it shapes a cosine one).
  a->stored_state_dtype = RunFlags{}.state_dtype;  // a record before --state-dtype: fp32
  for (const auto& [key, inputs] : record.train) {
    if (key == "lr-schedule" && !given(key) && !inputs.empty()) a->lr_schedule = inputs[0];
    if (key == "state-dtype" && !inputs.empty()) a->stored_state_dtype = inputs[0];
  }
  std::vector<std::string> applied;
  auto identity = [&](RunIdentity* id) -> Status {
    // Another rank count is no change of the run: the store is re-sharded as it loads. A
    // store that records no rank count cannot be: it resumes on the count its record names.
    id->world_size = layout.world_size != 0 ? record.identity.world_size : rank.world_size;
    id->rank = source.rank;
    if (!a->data.empty()) {
      STRATA_ASSIGN_OR_RETURN(id->data, HashFile("--data", a->data));
    }
    if (!a->tokenizer.empty()) {
      STRATA_ASSIGN_OR_RETURN(id->tokenizer, HashFile("--tokenizer", a->tokenizer));
    }
    return Status::OK();
  };
  STRATA_RETURN_IF_ERROR(
      MergeRecord(record, TrainSettings(*a), given, identity, a->allow_schedule_change, &applied));
  for (const std::string& line : applied) {
    std::printf("# resuming %s with %s\n", folder.c_str(), line.c_str());
  }
  STRATA_RETURN_IF_ERROR(RefuseUnsupportedResharding(*a, layout, rank));
  for (std::string& f : a->run.nvme) f = AbsolutePath(f);
  STRATA_RETURN_IF_ERROR(PlaceMovedStore(a, record, source, given));
  a->run_id = record.identity.run_id;
  a->recorded_cuda_kernels = record.identity.cuda_kernels;
  return Status::OK();
}

}  // namespace

Status ResolveFlags(CLI::App* sub, const std::string& config, TrainArgs* a, bool* done) {
  a->durable_given = a->durable_opt->count() > 0;  // before the file adds its own
  if (!config.empty()) STRATA_RETURN_IF_ERROR(ApplyConfigFile(sub, config));
  auto given = [sub](const std::string& key) { return sub->get_option("--" + key)->count() > 0; };
  a->recompute_given = given("recompute") || given("no-recompute");
  if (given("layers")) a->init_given.layers = a->layers;
  if (given("d-model")) a->init_given.d_model = a->d_model;
  if (given("heads")) a->init_given.heads = a->heads;
  if (given("vocab")) a->init_given.vocab = a->vocab;
  if (given("io-block") && !a->run.io_block.empty()) {
    // In bytes, as the record keeps it (1M and 1048576 are the same store).
    STRATA_ASSIGN_OR_RETURN(const uint64_t bytes, ParseBytes("--io-block", a->run.io_block));
    a->run.io_block = std::to_string(bytes);
  }
  // With --resume the settings come from the stored run's record.
  if (!a->resume.empty()) STRATA_RETURN_IF_ERROR(MergeStoredRun(a, given));
  const bool recorded = !a->resume.empty();
  if (!a->tokenizer.empty()) {
    auto tok = model::Tokenizer::Load(a->tokenizer);
    if (!tok.ok()) {
      return Status(tok.status().code(), "--tokenizer: " + tok.status().message());
    }
    a->tok = std::make_shared<const model::Tokenizer>(std::move(tok).value());
    // The model's vocabulary is the tokenizer's unless --vocab, --init or the record says.
    if (!given("vocab") && a->init.empty() && !recorded) a->vocab = a->tok->vocab_size();
  }
  if (a->print_config) {
    TrainArgs shown = *a;
    if (shown.heads == 0 && shown.init.empty()) shown.heads = model::DefaultHeads(shown.d_model);
    std::printf(
        "# strata train --print-config: the effective configuration (--config FILE "
        "reads it)\n%s",
        TomlTable("train", TrainSettings(shown)).c_str());
    *done = true;
  }
  return Status::OK();
}

void AddTrainFlags(CLI::App* sub, TrainArgs* a) {
  sub->add_option("--layers", a->layers, "Transformer layers")->capture_default_str();
  sub->add_option("--d-model", a->d_model, "Channels (embedding width)")->capture_default_str();
  sub->add_option("--heads", a->heads,
                  "Attention heads (must divide --d-model); default: d_model / 64, or 1 when "
                  "d_model is not a multiple of 64; with --init, the n_head the file records");
  sub->add_option("--seq-len", a->seq_len, "Tokens per row (at most wpe's rows with --init)")
      ->capture_default_str();
  sub->add_option("--vocab", a->vocab,
                  "Vocabulary size (256 for byte-level text; with --tokenizer, its size)")
      ->capture_default_str();
  sub->add_option("--data", a->data,
                  "Training data: a text file (byte tokens, or --tokenizer's) or an llm.c "
                  "uint16 token file; default: the built-in generated corpus");
  sub->add_option("--tokenizer", a->tokenizer,
                  "Hugging Face tokenizer.json (GPT-2 byte-level BPE) that encodes a text "
                  "--data and --sample; fixed for the run (give the same to generate and eval)");
  sub->add_option("--val-every", a->val_every,
                  "Every K steps, report the loss on the held-out last 10% of the data (0: off)")
      ->capture_default_str();
  sub->add_option("--log-every", a->log_every,
                  "When standard output is not a terminal, print a step line every N steps "
                  "(and the first and last); 0: every step up to 50 steps, else a round "
                  "interval giving at most 50 lines. A terminal shows a progress bar instead")
      ->capture_default_str();
  sub->add_option("--init", a->init, "Initial weights: Hugging Face GPT-2 .safetensors file");
  sub->add_option("--save", a->save,
                  "Write the trained weights to this .safetensors file (replaced atomically)");
  sub->add_option("--save-every", a->save_every,
                  "With --save: also write the weights every N steps (0: only at the end)")
      ->capture_default_str();
  sub->add_option("--resume", a->resume,
                  "Continue the run whose swap store is in this folder from its last "
                  "committed step, with the settings the store recorded (a flag that would "
                  "train another run is refused; steps, budgets and outputs may change)");
  sub->add_option("--lr", a->lr, "Peak learning rate")->capture_default_str();
  sub->add_option("--lr-schedule", a->lr_schedule, "constant or cosine (to 10% of --lr)")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "Linear warm-up steps")->capture_default_str();
  sub->add_option("--weight-decay", a->weight_decay,
                  "AdamW decoupled weight decay (matrices and embeddings only)")
      ->capture_default_str();
  sub->add_option("--beta1", a->beta1, "Adam beta1")->capture_default_str();
  sub->add_option("--beta2", a->beta2, "Adam beta2")->capture_default_str();
  sub->add_option("--eps", a->eps, "Adam epsilon")->capture_default_str();
  sub->add_option("--batch", a->batch, "Rows per micro-batch")->capture_default_str();
  sub->add_option("--steps", a->steps, "Optimizer steps (total, counting resumed ones)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the initialisation and of --sample")
      ->capture_default_str();
  a->recompute_option = AddSwitch(
      sub, "recompute", &a->recompute,
      "Activation checkpointing: keep only each block's input, recompute in backward. Neither "
      "--recompute nor --no-recompute: off, unless layer-major order with several micro-batches "
      "needs it to fit or to offload activations and (on the host device) its predicted time "
      "is less than the weight traffic it saves (the start-up report says so). Same results");
  sub->add_option("--max-skipped-steps", a->max_skipped_steps,
                  "A step whose gradient is not finite (NaN or infinity) updates nothing and is "
                  "skipped with a warning; this many in a row stop the run, its last commit "
                  "intact (0: never stop)")
      ->capture_default_str();
  AddRunFlags(sub, &a->run,
              "Folder for NVMe-resident states (repeatable: striped); {rank} and {local_rank} "
              "are replaced by the rank's numbers (one folder per rank)");
  a->durable_opt = AddSwitch(sub, "durable", &a->durable,
                             "With --nvme: commit a complete state to NVMe every step "
                             "(host-resident states too), so a killed or interrupted run can be "
                             "resumed with --resume");
  sub->add_option("--json", a->json,
                  "Write the configuration, per-step results and totals as JSON to FILE (-: "
                  "standard output, which then carries the JSON alone; the report goes to "
                  "standard error)");
  sub->add_option("--sample", a->sample, "After training, print this many generated tokens")
      ->capture_default_str();
  AddSamplingFlags(*sub, &a->sampling);
  sub->add_flag("--print-config", a->print_config,
                "Print the effective configuration as TOML (a file --config reads) and exit; "
                "with --resume, the stored run's");
  sub->add_flag("--allow-schedule-change", a->allow_schedule_change,
                "With --resume: let --lr, --lr-schedule, --warmup (and --steps under a cosine "
                "schedule) differ from the stored run's");
  sub->add_flag("--allow-state-dtype-change", a->allow_state_dtype_change,
                "With --resume: let --state-dtype differ from the stored run's; the Adam "
                "moments are converted when the engine opens (fp32/bf16 <-> int8, rounded to "
                "nearest) and committed in the new format with the next step");
}

}  // namespace strata::cli
