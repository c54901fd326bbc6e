// `strata export DIR`: the committed weights of a run's stores, any rank count, written without
// running the model: one safetensors file (the bytes `strata train --save` writes for the same
// weights), or a Hugging Face folder (config.json, model.safetensors or model-K-of-N shards
// with model.safetensors.index.json) that GPT2LMHeadModel.from_pretrained loads; fp32 or bf16;
// with --with-optimizer, the Adam moments in files of their own.
//
// Streaming. A file's header is known from the model before any data (SafetensorsPrefix), and
// its data is the blocks' tensors in flat-buffer order, which is the order the ranks' shards
// hold them: each output file is written front to back while the shards of its blocks are
// read rank after rank through a StoreReader (every extent's checksum verified as it is read).
// Memory is the reader's request buffers and one piece's conversion, whatever the model's
// size; an output is renamed into place (AtomicFile) only when every byte of it checked out.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt2.h"
#include "model/safetensors.h"
#include "strata/atomic_file.h"
#include "strata/bytes.h"
#include "strata/optim.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/export_writer.h"
#include "tools/strata/run_store.h"
#include "tools/strata/verify_flags.h"

namespace strata::cli {
namespace {

struct ExportArgs {
  std::string dir, out, format = "auto", dtype = "fp32", max_shard = "5G";
  bool with_optimizer = false;
  StoreReadFlags io;
};

uint64_t PeakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// The Hugging Face config.json of the model (GPT2Config's names; no dropout, as strata trains).
std::string HfConfigJson(const model::Gpt2Config& c, const std::string& dtype) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"vocab_size", c.vocab},
                      {"n_positions", c.max_seq},
                      {"n_ctx", c.max_seq},
                      {"n_embd", c.d_model},
                      {"n_layer", c.layers},
                      {"n_head", c.heads},
                      {"n_inner", nullptr},
                      {"activation_function", "gelu_new"},
                      {"layer_norm_epsilon", 1e-5},
                      {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"attn_pdrop", 0.0},
                      {"initializer_range", 0.02},
                      {"scale_attn_weights", true},
                      {"tie_word_embeddings", true},
                      {"use_cache", true},
                      {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"}};
  return j.dump(2) + "\n";
}

struct ExportTotals {
  uint64_t bytes_written = 0;
  std::vector<std::string> files;
};

// Writes the files of one component ("master", "exp_avg", "exp_avg_sq").
Status WriteComponent(RunStore& store, const ExportArgs& a, const std::string& component, bool hf,
                      const std::string& base, uint64_t max_shard, ExportTotals* totals) {
  ExportPlan plan = PlanExport(store, hf ? "transformer." : "", a.dtype == "bf16" ? 2 : 4);
  std::map<std::string, std::string> meta = model::GeometryMetadata(store.config);
  if (component != "master") {
    meta["state"] = component;
    meta["step"] = store.step ? std::to_string(*store.step) : "none";
  }
  std::vector<ExportFile> files;
  if (!hf || component != "master") {
    files.push_back(ExportFile{base, 0, plan.tensors.size()});
  } else {
    files = SplitIntoShards(plan, max_shard, base);
  }
  for (const ExportFile& f : files) {
    STRATA_RETURN_IF_ERROR(WriteExportFile(store, plan, f, component, meta));
    totals->files.push_back(f.path);
    totals->bytes_written += std::filesystem::file_size(f.path);
  }
  if (hf && component == "master" && files.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", plan.data_bytes}}},
                            {"weight_map", nlohmann::json::object()}};
    for (const ExportFile& f : files) {
      for (size_t t = f.first; t < f.last; ++t) {
        index["weight_map"][plan.tensors[t].name] =
            std::filesystem::path(f.path).filename().string();
      }
    }
    const std::string path = (std::filesystem::path(a.out) / "model.safetensors.index.json");
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(path, index.dump(2) + "\n"));
    totals->files.push_back(path);
  }
  return Status::OK();
}

int RunExport(const ExportArgs& a) {
  auto fail = [](const std::string& what, const Status& s) {
    std::fprintf(stderr, "strata export: %s%s\n", what.empty() ? "" : (what + ": ").c_str(),
                 s.ToString().c_str());
    return 1;
  };
  if (a.dtype != "fp32" && a.dtype != "bf16") {
    return fail("--dtype", Status::InvalidArgument("--dtype " + a.dtype + ": fp32 or bf16"));
  }
  const bool ends_st = a.out.size() > 12 && a.out.ends_with(".safetensors");
  const std::string format = a.format == "auto" ? (ends_st ? "file" : "hf") : a.format;
  if (format != "file" && format != "hf") {
    return fail("--format", Status::InvalidArgument("--format " + a.format + ": auto, file or hf"));
  }
  auto max_shard = ParseBytes("--max-shard-size", a.max_shard);
  if (!max_shard.ok()) return fail("", max_shard.status());
  auto options = a.io.Options();
  if (!options.ok()) return fail("", options.status());

  const auto t0 = std::chrono::steady_clock::now();
  auto store = OpenRunStore(a.dir, *options);
  if (!store.ok()) return fail(a.dir, store.status());
  if (!store->problems.empty()) {
    for (const Status& p : store->problems)
      std::fprintf(stderr, "problem: %s\n", p.message().c_str());
    return fail(a.dir, Status::Corruption("the store is not whole (" +
                                          std::to_string(store->problems.size()) +
                                          " problem(s) above; `strata verify` lists them); "
                                          "nothing was written"));
  }
  if (!store->have_model || !store->step) {
    return fail(a.dir,
                Status::InvalidArgument("the store holds no committed step of a known model"));
  }
  if (a.with_optimizer && ElementBytes(*store, "exp_avg") == 0) {
    return fail("--with-optimizer",
                Status::NotSupported("the Adam moments are stored as " + store->state_dtype +
                                     ", which this export does not read; export without "
                                     "--with-optimizer"));
  }
  const bool hf = format == "hf";
  std::string base = a.out;
  if (hf) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    if (ec)
      return fail("--out",
                  Status::IOError("cannot make the folder " + a.out + ": " + ec.message()));
    base = (std::filesystem::path(a.out) / "model.safetensors").string();
  }
  ExportTotals totals;
  std::vector<std::string> comps = {"master"};
  if (a.with_optimizer) comps.insert(comps.end(), {"exp_avg", "exp_avg_sq"});
  for (const std::string& comp : comps) {
    std::string path = base;
    if (comp != "master") {
      path = hf ? (std::filesystem::path(a.out) / (comp + ".safetensors")).string()
                : a.out.substr(0, a.out.size() - 12) + "." + comp + ".safetensors";
      if (!hf && !ends_st) path = a.out + "." + comp + ".safetensors";
    }
    Status s = WriteComponent(*store, a, comp, hf, path, *max_shard, &totals);
    if (!s.ok()) return fail(comp, s);
  }
  if (hf) {
    const std::string cfg = (std::filesystem::path(a.out) / "config.json").string();
    Status s = WriteFileAtomic(cfg, HfConfigJson(store->config, a.dtype));
    if (!s.ok()) return fail("config.json", s);
    totals.files.push_back(cfg);
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t read = 0;
  for (const RankStore& r : store->ranks) read += r.reader->bytes_read();
  std::printf("# exported step %llu of run %s (%d rank(s)) from %s\n",
              static_cast<unsigned long long>(*store->step), store->run_id.c_str(),
              store->world_size, a.dir.c_str());
  for (const std::string& f : totals.files) std::printf("%s\n", f.c_str());
  std::printf(
      "# read %s, wrote %s in %.3f s (%.1f MiB/s read), peak RSS %s, every extent's "
      "checksum verified\n",
      FormatBytes(read).c_str(), FormatBytes(totals.bytes_written).c_str(), sec,
      sec > 0 ? double(read) / sec / (1 << 20) : 0.0, FormatBytes(PeakRssBytes()).c_str());
  return 0;
}

}  // namespace

void AddExport(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "Write the committed weights of a run's store (any rank count) without running the "
      "model: one safetensors file (as train --save writes), or a Hugging Face folder that "
      "GPT2LMHeadModel.from_pretrained loads. Streams: memory stays at the read buffers "
      "whatever the model's size; every extent's checksum is verified as it is read");
  sub->add_option("DIR", a->dir,
                  "The run's --nvme folder: a pattern with {rank} (/nvme/{rank}), or one rank's "
                  "folder (the others are found from its run record)")
      ->required();
  sub->add_option("--out", a->out,
                  "Where to write: FILE.safetensors, or a folder for the Hugging Face layout")
      ->required();
  sub->add_option("--format", a->format,
                  "auto (file when --out ends in .safetensors, else hf), file or hf")
      ->capture_default_str();
  sub->add_option("--dtype", a->dtype,
                  "fp32 (the master weights as they are) or bf16 (rounded "
                  "to nearest even)")
      ->capture_default_str();
  sub->add_flag("--with-optimizer", a->with_optimizer,
                "Also write the Adam moments, exp_avg and exp_avg_sq, each in a file of its own "
                "(FILE.exp_avg.safetensors, or exp_avg.safetensors in the folder)");
  sub->add_option("--max-shard-size", a->max_shard,
                  "Hugging Face layout: the most bytes of tensors per model-K-of-N file")
      ->capture_default_str();
  a->io.Add(sub);
  sub->callback([a, exit_code] { *exit_code = RunExport(*a); });
}

}  // namespace strata::cli
