// Re-sharding (engine/reshard.h): the byte-range arithmetic, and the engine's re-sharding
// resume (HostTier::ReshardFromOldStores).
#include "engine/reshard.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine/host_tier.h"
#include "engine/rank_commit.h"
#include "strata/log.h"

namespace strata::engine_internal {

uint64_t ShardNumel(uint64_t end, uint32_t alignment, int ranks) {
  const uint64_t unit = uint64_t(alignment) * uint64_t(ranks);
  return (end + unit - 1) / unit * unit / uint64_t(ranks);
}

Status ReadNewShard(std::span<StoreReader* const> old, const ShardedExtent& e,
                    const ReshardGeometry& g, std::span<uint8_t> out) {
  const uint64_t new_begin = uint64_t(g.new_rank) * g.new_shard;
  const uint64_t new_end = new_begin + g.new_shard;
  auto bytes_of = [&](uint64_t elems) { return elems / e.elems_per_unit * e.unit_bytes; };
  if (out.size() != bytes_of(g.new_shard)) {
    return Status::InvalidArgument("re-sharding " + e.key + ": a buffer of " +
                                   std::to_string(out.size()) + " bytes for a shard of " +
                                   std::to_string(bytes_of(g.new_shard)));
  }
  for (int q = 0; q < g.old_ranks; ++q) {
    const uint64_t old_begin = uint64_t(q) * g.old_shard;
    const uint64_t lo = std::max(new_begin, old_begin);
    const uint64_t hi = std::min(new_end, old_begin + g.old_shard);
    if (lo >= hi) continue;
    StoreReader& r = *old[size_t(q)];
    const StoreExtentInfo* info = r.Find(e.key);
    if (info == nullptr || info->length != bytes_of(g.old_shard)) {
      return Status::Corruption(
                 "re-sharding: the store " + r.manifest_path() + " of rank " + std::to_string(q) +
                 " of " + std::to_string(g.old_ranks) +
                 (info ? " holds " + std::to_string(info->length) + " bytes of " : " has no ") +
                 e.key + ", not the " + std::to_string(bytes_of(g.old_shard)) +
                 " bytes of its shard; was it written by another model?")
          .WithPath(r.manifest_path());
    }
    // The old extent's bytes [src_lo, src_hi) land at out[dst, ...).
    const uint64_t src_lo = bytes_of(lo - old_begin), src_hi = bytes_of(hi - old_begin);
    const uint64_t dst = bytes_of(lo - new_begin);
    const std::string key = e.key;
    STRATA_RETURN_IF_ERROR(
        r.Read(std::span<const std::string>(&key, 1),
               [&](size_t, uint64_t offset, std::span<const uint8_t> piece) -> Status {
                 const uint64_t a = std::max(offset, src_lo);
                 const uint64_t b = std::min(offset + piece.size(), src_hi);
                 if (a < b)
                   std::memcpy(out.data() + dst + (a - src_lo), piece.data() + (a - offset), b - a);
                 return Status::OK();
               }));
  }
  return Status::OK();
}

}  // namespace strata::engine_internal

namespace strata::engine_internal {

// Runs before any thread starts. See EngineOptions::ReshardSource.
Status HostTier::ResumeResharded() NO_THREAD_SAFETY_ANALYSIS {
  const EngineOptions::ReshardSource& src = ctx_.opt.reshard_from;
  const int n = src.world_size;
  if (n < 1 || src.nvme_paths.size() != size_t(n) || src.run_ids.size() != size_t(n)) {
    return Status::InvalidArgument("re-sharding resume: " + std::to_string(n) + " old ranks but " +
                                   std::to_string(src.nvme_paths.size()) + " folder lists and " +
                                   std::to_string(src.run_ids.size()) + " run identities");
  }
  // The old stores, read-only and unlocked: this rank's own (rank < n) is opened below for
  // writing too, and no space of a committed extent is reused before the re-sharding
  // commit finishes, which no rank does before every rank has prepared it (after its reads).
  // An int8 moment extent holds codes and a scale per quantization block, and a block that
  // a shard boundary cuts is two partial blocks: its bytes cannot be cut as elements.
  if (ctx_.opt.state_format == StateFormat::kInt8 || ctx_.opt.convert_state_format) {
    return Status::InvalidArgument(
        "re-sharding resume: a store with int8 moments (or one whose moments change format on "
        "this resume) cannot be re-sharded yet; resume it on the " +
        std::to_string(n) +
        " ranks that wrote it, or convert it there first (--allow-state-dtype-change to fp32 "
        "or bf16) and re-shard that");
  }
  std::vector<std::unique_ptr<StoreReader>> readers;
  std::vector<StoreReader*> old;
  StoreReaderOptions ro;
  ro.io = ctx_.opt.io;
  ro.lock = false;
  for (int q = 0; q < n; ++q) {
    STRATA_ASSIGN_OR_RETURN(auto r, StoreReader::Open(src.nvme_paths[size_t(q)], ro));
    if (!r->problems().empty()) return r->problems().front();
    if (r->run_id() != src.run_ids[size_t(q)] || !r->step() ||
        r->step() != (readers.empty() ? r->step() : readers[0]->step())) {
      return Status::Corruption("re-sharding resume: the store in " + src.nvme_paths[size_t(q)][0] +
                                " records run '" + r->run_id() + "' at step " +
                                (r->step() ? std::to_string(*r->step()) : "none") + ", expected '" +
                                src.run_ids[size_t(q)] + "' at rank 0's step; " +
                                "resume with every rank's folder of one run")
          .WithPath(r->manifest_path());
    }
    old.push_back(r.get());
    readers.push_back(std::move(r));
  }
  const uint64_t step = *readers[0]->step();
  if (ctx_.rank < n) {
    for (const StoreDataFile& f : readers[size_t(ctx_.rank)]->data_files()) {
      reshard_extra_capacity_ += f.bytes;  // the old committed extents stay until the commit
    }
  }
  STRATA_RETURN_IF_ERROR(OpenStore());

  uint64_t moved = 0;
  for (int o = 0; o < int(objs_.size()); ++o) {
    const HostObj& h = objs_[o];
    const Component c = ObjComponent(o);
    if (!h.exists || !h.needs_write || c == Component::kGrad) continue;
    const ShardedExtent e{ctx_.Key(o), ctx_.place.elem_bytes[int(c)], 1};
    if (old[0]->Find(e.key) == nullptr && step == 0) continue;  // moments never written
    const BlockLayout& bl = ctx_.layout[size_t(ObjBlock(o))];
    const TensorLayout& last = bl.tensors.back();
    const ReshardGeometry g{ShardNumel(last.offset + last.numel, ctx_.opt.tensor_alignment, n), n,
                            bl.shard_numel, ctx_.rank};
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(
        static_cast<uint8_t*>(
            std::aligned_alloc(4096, RoundUp(std::max<uint64_t>(h.bytes, 1), 4096))),
        &std::free);
    if (!buf) return Status::OutOfMemory("re-sharding " + e.key + ": " + FormatBytes(h.bytes));
    std::memset(buf.get(), 0, h.bytes);
    STRATA_RETURN_IF_ERROR(ReadNewShard(old, e, g, std::span<uint8_t>(buf.get(), h.bytes)));
    STRATA_RETURN_IF_ERROR(store_->Write(e.key, buf.get(), h.bytes));
    moved += h.bytes;
  }
  // The new layout, committed as the resumed step under this rank's new identity, two-phase
  // across the ranks: until a rank finishes it, every old store is as it was. No rank
  // finishes before every rank prepared, which each does after its reads (so no space of an
  // old extent is reused under a peer's reader).
  readers.clear();
  old.clear();
  STRATA_RETURN_IF_ERROR(
      (ctx_.ws > 1 ? CommitWithRanks(ctx_, *store_, step) : store_->Commit(step))
          .Annotate("committing the re-sharded state of step " + std::to_string(step)));
  resharded_bytes_ = moved;
  ctx_.resumed_step = int64_t(step);
  return ResumeFromStore();
}

}  // namespace strata::engine_internal
