// `strata verify DIR`: checks a run's committed state offline, as an operator does before
// restarting a long job (git fsck, ldb checkconsistency): every rank's run record (its seal)
// and manifest (its seal, its run and rank), the extents the recorded model needs, and every
// extent's bytes against its checksum, read with the store's I/O backend. It reports what the
// store holds, lists every problem with its file and offset, and exits 0 only when there is
// none. It never writes: files are opened read-only, and a store a live run holds is refused.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "strata/bytes.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/run_store.h"
#include "tools/strata/verify_flags.h"

namespace strata::cli {
namespace {

struct VerifyArgs {
  std::string dir, json;
  StoreReadFlags io;
};

nlohmann::json ProblemJson(const Status& s) {
  nlohmann::json j = {{"message", s.message()}};
  if (!s.path().empty()) j["path"] = s.path();
  if (s.offset()) j["offset"] = *s.offset();
  return j;
}

// Reads every extent of one rank's store in the order the extents lie on disk (one sequential
// sweep per file), checking each checksum; its problems go to `problems`.
void ReadRank(RankStore& r, std::vector<Status>* problems) {
  std::vector<std::string> keys;
  for (const StoreExtentInfo& e : r.reader->extents()) keys.push_back(e.key);
  std::sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    const StoreExtentInfo *x = r.reader->Find(a), *y = r.reader->Find(b);
    return std::tie(x->file, x->file_offset) < std::tie(y->file, y->file_offset);
  });
  Status s = r.reader->Read(
      keys, [](size_t, uint64_t, std::span<const uint8_t>) { return Status::OK(); },
      [&](size_t, const Status& bad) {
        problems->push_back(Status(bad).Annotate("rank " + std::to_string(r.rank)));
      });
  if (!s.ok()) problems->push_back(s.Annotate("rank " + std::to_string(r.rank)));
}

// Reads every rank's store, the ranks at once (a thread each, as the ranks of a run read their
// own files): each rank's reader has its own queue and buffers, so the drive sees every rank's
// requests in flight together. Problems are listed in rank order whatever finishes first.
void ReadAll(RunStore& store, nlohmann::json* read, std::vector<Status>* problems) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<Status>> rank_problems(store.ranks.size());
  {
    std::vector<std::jthread> readers;
    for (size_t i = 0; i < store.ranks.size(); ++i) {
      if (!store.ranks[i].reader) continue;
      readers.emplace_back(
          [&store, &rank_problems, i] { ReadRank(store.ranks[i], &rank_problems[i]); });
    }
  }  // joined
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  std::string backend;
  bool direct = true;
  for (size_t i = 0; i < store.ranks.size(); ++i) {
    problems->insert(problems->end(), rank_problems[i].begin(), rank_problems[i].end());
    const RankStore& r = store.ranks[i];
    if (!r.reader) continue;
    bytes += r.reader->bytes_read();
    backend = r.reader->backend_name();
    direct = direct && r.reader->direct();
  }
  *read = {{"bytes", bytes},
           {"seconds", sec},
           {"mib_per_s", sec > 0 ? double(bytes) / sec / (1 << 20) : 0.0},
           {"backend", backend},
           {"direct", direct}};
}

nlohmann::json Describe(const RunStore& s) {
  nlohmann::json j;
  j["run_id"] = s.run_id;
  j["step"] = s.step ? nlohmann::json(*s.step) : nlohmann::json(nullptr);
  j["world_size"] = s.world_size;
  if (s.have_model) {
    const model::Gpt2Config& c = s.config;
    j["model"] = {{"layers", c.layers},     {"d_model", c.d_model},
                  {"heads", c.heads},       {"vocab", c.vocab},
                  {"positions", c.max_seq}, {"parameters", model::Gpt2NumParams(c)}};
  }
  std::map<std::string, uint64_t> dtypes;
  j["ranks"] = nlohmann::json::array();
  for (const RankStore& r : s.ranks) {
    nlohmann::json rj = {{"rank", r.rank}, {"folders", nlohmann::json::array()}};
    if (r.reader) {
      std::vector<uint64_t> committed(r.folders.size(), 0);
      for (const StoreExtentInfo& e : r.reader->extents()) {
        const std::string comp = e.key.substr(e.key.find('.') + 1);
        dtypes[comp] = ElementBytes(s, comp);
        for (size_t f = 0; f < r.reader->data_files().size(); ++f) {
          if (r.reader->data_files()[f].path == e.file) committed[f] += e.length;
        }
      }
      rj["extents"] = r.reader->extents().size();
      for (size_t f = 0; f < r.folders.size(); ++f) {
        const StoreDataFile& d = r.reader->data_files()[f];
        // Striped extents start in one file and go on in the next: the committed bytes
        // per folder are counted by where each extent starts.
        rj["folders"].push_back({{"folder", r.folders[f]},
                                 {"data_file", d.path},
                                 {"file_bytes", d.bytes},
                                 {"committed_bytes_starting_here", committed[f]}});
      }
    }
    j["ranks"].push_back(rj);
  }
  nlohmann::json dj;
  for (const auto& [comp, bytes] : dtypes) {
    dj[comp] = comp == "master" ? s.master_dtype
               : bytes == 2     ? "bf16"
               : bytes == 4     ? "fp32"
                                : s.state_dtype;
  }
  j["dtypes"] = dj;
  return j;
}

void PrintText(const std::string& dir, const nlohmann::json& j,
               const std::vector<Status>& problems) {
  std::printf("# strata verify %s\n", dir.c_str());
  std::printf("# run %s, step %s, %d rank(s)\n", j["run_id"].get<std::string>().c_str(),
              j["step"].is_null() ? "none" : std::to_string(j["step"].get<uint64_t>()).c_str(),
              j["world_size"].get<int>());
  if (j.contains("model")) {
    const auto& m = j["model"];
    std::printf(
        "# model: GPT-2, %d layers, d_model %d, %d heads, vocab %d, %d positions (%s "
        "parameters)\n",
        m["layers"].get<int>(), m["d_model"].get<int>(), m["heads"].get<int>(),
        m["vocab"].get<int>(), m["positions"].get<int>(),
        std::to_string(m["parameters"].get<uint64_t>()).c_str());
  }
  std::string dt;
  for (const auto& [k, v] : j["dtypes"].items()) dt += " " + k + " " + v.get<std::string>();
  std::printf("# dtypes:%s\n", dt.c_str());
  for (const auto& r : j["ranks"]) {
    for (const auto& f : r["folders"]) {
      std::printf("# rank %d: %s: data file %s, %s committed (%s extents)\n", r["rank"].get<int>(),
                  f["folder"].get<std::string>().c_str(),
                  FormatBytes(f["file_bytes"].get<uint64_t>()).c_str(),
                  FormatBytes(f["committed_bytes_starting_here"].get<uint64_t>()).c_str(),
                  r.contains("extents") ? std::to_string(r["extents"].get<size_t>()).c_str() : "?");
    }
  }
  const auto& rd = j["read"];
  std::printf("# read %s in %.3f s: %.1f MiB/s (%s%s)\n",
              FormatBytes(rd["bytes"].get<uint64_t>()).c_str(), rd["seconds"].get<double>(),
              rd["mib_per_s"].get<double>(), rd["backend"].get<std::string>().c_str(),
              rd["direct"].get<bool>() ? ", O_DIRECT" : ", buffered");
  for (const Status& p : problems) std::printf("problem: %s\n", p.message().c_str());
  if (problems.empty()) {
    std::printf("ok: every record, manifest and extent is whole\n");
  } else {
    std::printf("FAILED: %zu problem(s)\n", problems.size());
  }
}

int RunVerify(const VerifyArgs& a) {
  JsonDestination json(a.json);
  auto options = a.io.Options();
  if (!options.ok()) {
    std::fprintf(stderr, "strata verify: %s\n", options.status().message().c_str());
    return 2;
  }
  auto store = OpenRunStore(a.dir, *options);
  if (!store.ok()) {
    std::fprintf(stderr, "strata verify: %s\n", store.status().ToString().c_str());
    if (json.enabled()) {
      (void)json.Write("--json", nlohmann::json({{"dir", a.dir},
                                                 {"ok", false},
                                                 {"problems", {ProblemJson(store.status())}}})
                                         .dump(2) +
                                     "\n");
    }
    return 1;
  }
  std::vector<Status> problems = store->problems;
  nlohmann::json j = Describe(*store);
  nlohmann::json read;
  ReadAll(*store, &read, &problems);
  j["read"] = read;
  j["dir"] = a.dir;
  j["ok"] = problems.empty();
  j["problems"] = nlohmann::json::array();
  for (const Status& p : problems) j["problems"].push_back(ProblemJson(p));
  PrintText(a.dir, j, problems);
  if (json.enabled()) {
    Status w = json.Write("--json", j.dump(2) + "\n");
    if (!w.ok()) {
      std::fprintf(stderr, "strata verify: %s\n", w.message().c_str());
      return 1;
    }
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace

void AddVerify(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand(
      "verify",
      "Check a run's committed state without running it: every rank's run record and "
      "manifest (their checksums, run and rank), the extents the recorded model needs, and "
      "every extent's bytes against its checksum. Reports the run, its step, ranks, dtypes, "
      "bytes per folder and the model; exits 0 only when everything is whole. Never writes");
  sub->add_option("DIR", a->dir,
                  "The run's --nvme folder: a pattern with {rank} (/nvme/{rank}), or one rank's "
                  "folder (the others are found from its run record)")
      ->required();
  sub->add_option("--json", a->json, "Also write the report as JSON to FILE (-: standard output)");
  a->io.Add(sub);
  sub->callback([a, exit_code] { *exit_code = RunVerify(*a); });
}

}  // namespace strata::cli
