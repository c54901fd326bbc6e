// A run's stores, every rank's, read-only; see run_store.h.
#include "tools/strata/run_store.h"

#include <filesystem>

#include "strata/bytes.h"
#include "strata/state_layout.h"

namespace strata::cli {

namespace {

std::string WithRank(std::string path, int rank) {
  const std::string key = "{rank}", v = std::to_string(rank);
  for (size_t p = path.find(key); p != std::string::npos; p = path.find(key, p + v.size())) {
    path.replace(p, key.size(), v);
  }
  return path;
}

const std::vector<std::string>* Recorded(const RunRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.train) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string RecordedString(const RunRecord& r, const std::string& key) {
  const auto* v = Recorded(r, key);
  return v && !v->empty() ? v->front() : "";
}

bool RecordedInt(const RunRecord& r, const std::string& key, int* out) {
  const std::string s = RecordedString(r, key);
  try {
    size_t used = 0;
    *out = std::stoi(s, &used);
    return used == s.size();
  } catch (...) {
    return false;
  }
}

// The folders of rank `rank`, folder 0 being `folder0`: the run's recorded --nvme (with the
// rank put in) when folder 0 is among them, else `folder0` alone (a store moved since).
std::vector<std::string> RankFolders(const RunRecord* record, const std::string& folder0,
                                     int rank) {
  if (record != nullptr) {
    if (const auto* nvme = Recorded(*record, "nvme"); nvme && nvme->size() > 1) {
      std::vector<std::string> out;
      for (const std::string& t : *nvme) out.push_back(WithRank(t, rank));
      if (AbsolutePath(out[0]) == AbsolutePath(folder0)) return out;
    }
  }
  return {folder0};
}

// Folder 0 of every rank: from a {rank} pattern, or from one rank's folder and its record.
Result<std::vector<std::string>> RankFolder0s(const std::string& dir, int world_size,
                                              const RunRecord& record) {
  std::vector<std::string> out(world_size);
  if (dir.find("{rank}") != std::string::npos) {
    for (int r = 0; r < world_size; ++r) out[r] = WithRank(dir, r);
    return out;
  }
  const int me = record.identity.rank;
  const std::string abs = AbsolutePath(dir);
  if (const auto* nvme = Recorded(record, "nvme"); nvme && !nvme->empty()) {
    if (AbsolutePath(WithRank(nvme->front(), me)) == abs &&
        nvme->front().find("{rank}") != std::string::npos) {
      for (int r = 0; r < world_size; ++r) out[r] = WithRank(nvme->front(), r);
      return out;
    }
  }
  const std::filesystem::path p(abs);
  if (p.filename() == std::to_string(me)) {
    for (int r = 0; r < world_size; ++r) out[r] = (p.parent_path() / std::to_string(r)).string();
    return out;
  }
  return Status::InvalidArgument(dir + " holds rank " + std::to_string(me) + " of " +
                                 std::to_string(world_size) +
                                 "'s store, and the other ranks' folders cannot be told from it; "
                                 "name them all with a {rank} pattern (e.g. /nvme/{rank})");
}

// wpe's rows when the run started from --init: the one P whose embedding block has the
// recorded master extent's length.
std::optional<int> PositionsFromExtent(const model::Gpt2Config& c, uint64_t master_bytes,
                                       int world_size, uint32_t alignment) {
  const uint64_t unit = uint64_t(alignment) * uint64_t(world_size);
  const uint64_t padded = master_bytes / 4 * uint64_t(world_size);
  const uint64_t base = RoundUp(uint64_t(c.vocab) * uint64_t(c.d_model), uint64_t(alignment));
  std::optional<int> found;
  for (uint64_t p = 1; base + p * uint64_t(c.d_model) <= padded; ++p) {
    if (RoundUp(base + p * uint64_t(c.d_model), unit) != padded) continue;
    if (found) return std::nullopt;  // ambiguous
    found = int(p);
  }
  return found;
}

// The model from the record; problems when the record does not say it.
void ModelFromRecord(const RunRecord& record, RunStore* s) {
  model::Gpt2Config& c = s->config;
  int seq = 0;
  if (!RecordedInt(record, "layers", &c.layers) || !RecordedInt(record, "d-model", &c.d_model) ||
      !RecordedInt(record, "heads", &c.heads) || !RecordedInt(record, "vocab", &c.vocab) ||
      !RecordedInt(record, "seq-len", &seq)) {
    s->problems.push_back(Status::InvalidArgument(record.path +
                                                  " does not record the model's geometry "
                                                  "(layers, d-model, heads, vocab, seq-len)")
                              .WithPath(record.path));
    return;
  }
  c.max_seq = seq;
  s->state_dtype = RecordedString(record, "state-dtype");
  if (s->state_dtype.rfind("bf16", 0) == 0) s->state_dtype = "bf16";
  if (s->state_dtype.empty()) s->state_dtype = "fp32";  // a record from before the flag
  s->master_dtype = RecordedString(record, "master-dtype");
  if (s->master_dtype.empty()) s->master_dtype = "fp32";  // a record from before the flag
  const uint32_t alignment = EngineOptions{}.tensor_alignment;
  if (!RecordedString(record, "init").empty() && !s->ranks.empty() && s->ranks[0].reader) {
    // --init's wpe may have more rows than --seq-len: the stored embedding block says.
    if (const StoreExtentInfo* e = s->ranks[0].reader->Find(ExtentKey(0, "master"))) {
      if (auto p = PositionsFromExtent(c, e->length, s->world_size, alignment)) c.max_seq = *p;
    }
  }
  if (Status v = c.Validate(); !v.ok()) {
    s->problems.push_back(Status::InvalidArgument(record.path + ": " + v.message()));
    return;
  }
  s->specs = model::Gpt2BlockSpecs(c);
  auto layouts = ComputeBlockLayout(s->specs, alignment, s->world_size);
  if (!layouts.ok()) {
    s->problems.push_back(layouts.status());
    return;
  }
  s->layouts = std::move(layouts).value();
  s->have_model = true;
}

// Each rank's extents against the model: every block's master (and moments) of a shard's
// length; problems name the extent, its file and offset.
void CheckExtents(RunStore* s) {
  for (const RankStore& r : s->ranks) {
    if (!r.reader) continue;
    for (size_t b = 0; b < s->layouts.size(); ++b) {
      for (const char* comp : {"master", "exp_avg", "exp_avg_sq"}) {
        const std::string key = ExtentKey(int(b), comp);
        const uint64_t want = ExtentBytes(*s, int(b), r.rank, comp);
        const StoreExtentInfo* e = r.reader->Find(key);
        // A state format this build does not know (want 0): present, its length unchecked.
        // The initial commit (step 0) holds no moments: never updated, they are zeros.
        if (e == nullptr && r.reader->step() == uint64_t(0) && std::string(comp) != "master") {
          continue;
        }
        if (e == nullptr) {
          s->problems.push_back(Status::Corruption("rank " + std::to_string(r.rank) + ": " +
                                                   r.reader->manifest_path() + " has no extent " +
                                                   key + " (block '" + s->layouts[b].name + "')")
                                    .WithPath(r.reader->manifest_path()));
        } else if (want != 0 && e->length != want) {
          s->problems.push_back(
              Status::Corruption("rank " + std::to_string(r.rank) + ": extent " + key + " (at " +
                                 std::to_string(e->file_offset) + " of " + e->file + ") is " +
                                 std::to_string(e->length) + " bytes; the recorded model gives " +
                                 std::to_string(want) + " at " + std::to_string(s->world_size) +
                                 " ranks")
                  .WithPath(e->file)
                  .WithOffset(e->file_offset));
        }
      }
    }
  }
}

// Rank r's record and manifest against the run's: the same run id, this rank, N ranks.
void CheckRank(const RankStore& r, RunStore* s) {
  const std::string who = "rank " + std::to_string(r.rank) + " of " + std::to_string(s->world_size);
  if (r.record) {
    const RunIdentity& id = r.record->identity;
    if (id.rank != r.rank || id.world_size != s->world_size || id.run_id != s->run_id) {
      s->problems.push_back(Status::Corruption(who + ": " + r.record->path + " records run " +
                                               id.run_id + " rank " + std::to_string(id.rank) +
                                               " of " + std::to_string(id.world_size) +
                                               ", not run " + s->run_id + " " + who +
                                               "; a folder of another run or rank was put here")
                                .WithPath(r.record->path));
    }
  }
  if (!r.reader) return;
  const std::string want = StoreRunId(s->run_id, r.rank, s->world_size);
  if (!s->run_id.empty() && r.reader->run_id() != want) {
    s->problems.push_back(Status::Corruption(who + ": " + r.reader->manifest_path() +
                                             " belongs to '" + r.reader->run_id() + "', not '" +
                                             want + "'")
                              .WithPath(r.reader->manifest_path()));
  }
  if (r.reader->step() != s->step) {
    auto text = [](std::optional<uint64_t> v) { return v ? std::to_string(*v) : "none"; };
    s->problems.push_back(Status::Corruption(who + ": " + r.reader->manifest_path() +
                                             " committed step " + text(r.reader->step()) +
                                             ", rank 0 step " + text(s->step) +
                                             "; a resume would roll the ranks to one step")
                              .WithPath(r.reader->manifest_path()));
  }
  for (const Status& p : r.reader->problems()) s->problems.push_back(p);
}

}  // namespace

std::string ExtentKey(int block, const std::string& component) {
  std::string key = "b";  // appended: GCC 12 warns -Wrestrict on "b" + ...
  key += std::to_string(block);
  key += '.';
  key += component;
  return key;
}

namespace {

// The recorded --master-dtype as the engine's format; nullopt for one this build does not know.
std::optional<MasterFormat> RecordedMaster(const RunStore& store) {
  if (store.master_dtype == "fp32") return MasterFormat::kFp32;
  if (store.master_dtype == "bf16") return MasterFormat::kBf16Stochastic;
  return std::nullopt;
}

}  // namespace

uint64_t ElementBytes(const RunStore& store, const std::string& component) {
  if (component == "param") return 2;
  if (component == "master") {
    const std::optional<MasterFormat> m = RecordedMaster(store);
    return m ? MasterElemBytes(*m) : 0;
  }
  if (component == "exp_avg" || component == "exp_avg_sq") {
    const Result<StateFormat> f = ParseStateFormat(store.state_dtype);
    return f.ok() ? MomentElemBytes(*f) : 0;
  }
  return 4;
}

uint64_t ExtentBytes(const RunStore& store, int block, int rank, const std::string& component) {
  const uint64_t elem = ElementBytes(store, component);
  if (elem == 0 || component == "param") return store.layouts[block].shard_numel * elem;
  // (A master's length does not depend on the moments' format.)
  const Result<StateFormat> moments = ParseStateFormat(store.state_dtype);
  const BlockStateLayout st =
      DescribeBlockState(store.layouts[block], rank, store.world_size,
                         StateFormats{moments.ok() ? *moments : StateFormat::kFp32,
                                      RecordedMaster(store).value_or(MasterFormat::kFp32)});
  const Component c = component == "master"    ? Component::kMaster
                      : component == "exp_avg" ? Component::kExpAvg
                                               : Component::kExpAvgSq;
  return st.Extent(c)->bytes;
}

Result<RunStore> OpenRunStore(const std::string& dir, const StoreReaderOptions& options) {
  RunStore s;
  const std::string first = WithRank(dir, 0);
  auto record = ReadRunRecord(first);
  if (!record.ok()) {
    s.problems.push_back(record.status());
  } else if (!record->has_value()) {
    s.problems.push_back(Status::NotFound(first + " holds no " + kRunRecordFile +
                                          " (a store made by strata train has one): the model "
                                          "and the other ranks are unknown")
                             .WithPath(first));
  }
  const RunRecord* rec = record.ok() && record->has_value() ? &**record : nullptr;
  s.world_size = rec ? rec->identity.world_size : 1;
  s.run_id = rec ? rec->identity.run_id : "";
  std::vector<std::string> folder0s = {first};
  if (rec && s.world_size > 1) {
    STRATA_ASSIGN_OR_RETURN(folder0s, RankFolder0s(dir, s.world_size, *rec));
  }
  for (int r = 0; r < int(folder0s.size()); ++r) {
    RankStore rs;
    rs.rank = rec && folder0s.size() == 1 ? rec->identity.rank : r;
    if (rec && AbsolutePath(folder0s[r]) == AbsolutePath(first)) {
      rs.record = *rec;
    } else if (rec) {
      auto rr = ReadRunRecord(folder0s[r]);
      if (!rr.ok()) {
        s.problems.push_back(rr.status());
      } else if (!rr->has_value()) {
        s.problems.push_back(Status::NotFound("rank " + std::to_string(r) + " of " +
                                              std::to_string(s.world_size) + ": " + folder0s[r] +
                                              " holds no " + kRunRecordFile +
                                              " (its folder is missing or was emptied)")
                                 .WithPath(folder0s[r]));
      } else {
        rs.record = std::move(**rr);
      }
    }
    rs.folders = RankFolders(rs.record ? &*rs.record : rec, folder0s[r], r);
    auto reader = StoreReader::Open(rs.folders, options);
    if (reader.ok()) {
      rs.reader = std::move(reader).value();
    } else {
      s.problems.push_back(Status(reader.status()).Annotate("rank " + std::to_string(r)));
    }
    s.ranks.push_back(std::move(rs));
  }
  if (!s.ranks[0].reader && folder0s.size() == 1 && !rec) {
    return s.problems.back();  // no store here at all
  }
  for (const RankStore& r : s.ranks) {
    if (r.reader) {
      s.step = r.reader->step();
      break;
    }
  }
  for (const RankStore& r : s.ranks) CheckRank(r, &s);
  if (rec) {
    RunRecord resolved = *rec;
    ResolveStateConversion(s.step, &resolved);
    ModelFromRecord(resolved, &s);
  }
  if (s.have_model) CheckExtents(&s);
  return s;
}

}  // namespace strata::cli
