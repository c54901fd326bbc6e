#include "engine/optimizer_stage.h"

#include <cmath>

#include "strata/log.h"

namespace strata::engine_internal {
namespace {

// The moments' format for the slice of block `b` starting at shard element `lo` (and the key
// of a bf16 master's stochastic rounding, AdamSlice::master_format). Stochastic rounding draws from
// a hash keyed by (step, block, rank) and indexed within the shard, so the bits depend on nothing a
// budget or a tier changes.
void SetMomentFormat(const EngineContext& ctx, int64_t step, int b, uint64_t lo, AdamSlice* s) {
  s->state_format = ctx.opt.state_format;
  s->state_rounding = ctx.opt.state_rounding;
  s->rounding_key = uint64_t(step) * 0x9e3779b97f4a7c15ull + uint64_t(b) * 0xc2b2ae3d27d4eb4full +
                    uint64_t(ctx.rank) * 0x165667b19e3779f9ull;
  s->index_base = lo;
}

// Whether block b's update can turn finite inputs (a finite gradient, as the norm checked,
// and finite states) into a non-finite master weight. AdamW's step m/(sqrt(v)+eps) is bounded
// (about 1/sqrt(1-beta2)) while eps > 0 and 0 <= beta1, beta2 < 1, and a gradient scale of at
// most 1 cannot overflow a finite gradient; what is left is eps 0 over a zero second moment
// (0/0) and learning rates too large to be meant. Only then is the master shard scanned (one
// read of it per update).
bool MayTurnNonFinite(const EngineContext& ctx, int b, const UpdateArgs& args) {
  auto risky = [](double lr, double beta1, double beta2, double eps) {
    return !(eps > 0) || !(std::abs(lr) <= 1e6) || !(beta1 >= 0 && beta1 < 1) ||
           !(beta2 >= 0 && beta2 < 1);
  };
  if (!(std::abs(args.scale) <= 1.0f)) return true;
  if (!args.groups) return risky(args.lr, ctx.opt.beta1, ctx.opt.beta2, ctx.opt.eps);
  for (const TensorLayout& t : ctx.layout[b].tensors) {
    const OptimizerGroup& g = (*args.groups)[t.group];
    if (risky(g.lr, g.beta1, g.beta2, g.eps)) return true;
  }
  return false;
}

}  // namespace

UpdateArgs StepUpdateArgs(const EngineContext& ctx, const GradNormResult* norm) {
  const double clip_coef = ctx.opt.grad_clip > 0 && norm ? norm->clip_coef : 1.0;
  return UpdateArgs{ctx.args.lr, ctx.resumed_step + ctx.step + ctx.args.step_offset,
                    float(ctx.args.grad_scale * clip_coef), ctx.groups};
}

Status ApplyAdamW(const EngineContext& ctx, int b, const BlockBuffers& bufs,
                  const UpdateArgs& args) {
  const EngineOptions& opt = ctx.opt;
  float* master = static_cast<float*>(bufs[int(Component::kMaster)]);
  // A bf16 master (EngineOptions::master_format): updated in place, and it is the params.
  uint16_t* master_bf16 = static_cast<uint16_t*>(bufs[int(Component::kMaster)]);
  const bool bf16_master = opt.master_format == MasterFormat::kBf16Stochastic;
  char* m = static_cast<char*>(bufs[int(Component::kExpAvg)]);
  char* v = static_cast<char*>(bufs[int(Component::kExpAvgSq)]);
  const BlockStateLayout& state = ctx.place.state[b];
  const size_t moment_bytes = state.exp_avg.elem_bytes;
  // int8: each moment's scales follow its codes; one AdamStep per quantization run.
  float* m_scale = reinterpret_cast<float*>(m + state.exp_avg.scale_offset);
  float* v_scale = reinterpret_cast<float*>(v + state.exp_avg_sq.scale_offset);
  const bool int8 = state.formats.moments == StateFormat::kInt8;
  size_t next_run = 0;
  const float* grad = static_cast<const float*>(bufs[int(Component::kGrad)]);
  uint16_t* param = static_cast<uint16_t*>(bufs[int(Component::kParam)]);
  AdamHyperParams hp;
  hp.lr = args.lr;
  hp.beta1 = opt.beta1;
  hp.beta2 = opt.beta2;
  hp.eps = opt.eps;
  hp.step = args.step;
  hp.mode = opt.optimizer == OptimizerKind::kAdamW ? AdamMode::kAdamW : AdamMode::kAdam;
  for (const TensorLayout& t : ctx.layout[b].tensors) {
    // This rank's part of the tensor (all of it with one rank).
    const auto [lo, hi] = ctx.ShardPart(b, t.offset, t.offset + t.numel);
    if (lo == hi) continue;
    hp.weight_decay = opt.weight_decay;
    if (args.groups) {  // the tensor's optimizer group (CheckStepArgs checked the index)
      const OptimizerGroup& g = (*args.groups)[t.group];
      hp.lr = g.lr;
      hp.beta1 = g.beta1;
      hp.beta2 = g.beta2;
      hp.eps = g.eps;
      hp.weight_decay = g.weight_decay;
    }
    if (!t.weight_decay) hp.weight_decay = 0.0;
    // The part's slices: itself, or its int8 runs (strata/state_layout.h), in shard order.
    std::vector<Int8Run> slices = {Int8Run{lo, hi, 0}};
    if (int8) {
      slices.clear();
      while (next_run < state.runs.size() && state.runs[next_run].lo < hi) {
        slices.push_back(state.runs[next_run++]);
      }
    }
    for (const Int8Run& r : slices) {
      AdamSlice s;
      if (bf16_master) {
        s.master_format = MasterFormat::kBf16Stochastic;
        s.master_bf16 = master_bf16 + r.lo;
      } else {
        s.master = master + r.lo;
      }
      s.exp_avg = m + r.lo * moment_bytes;
      s.exp_avg_sq = v + r.lo * moment_bytes;
      SetMomentFormat(ctx, hp.step, b, r.lo, &s);
      if (int8) {
        s.exp_avg_scale = m_scale + r.scale;
        s.exp_avg_sq_scale = v_scale + r.scale;
        s.state_rounding = StateRounding::kNearestEven;
      }
      s.grad = grad + r.lo;
      s.n = r.hi - r.lo;
      if (param) {
        s.param_out = param + r.lo;
        s.param_out_format = ParamOut::kBf16;
      }
      STRATA_RETURN_IF_ERROR(AdamStep(s, hp, args.scale, ctx.kernel_options));
    }
  }
  return Status::OK();
}

void OptimizerStage::BeginStepLocked() {
  opts_done_ = 0;
  grads_in_.assign(ctx_.L, 0);
  norm_sq_.assign(ctx_.L, 0);
  non_finite_.assign(ctx_.L, 0);
  norm_known_.assign(ctx_.L, false);
  norm_ = GradNormResult{};
  norm_final_ = false;
  applied_ = 0;
  speculated_.assign(ctx_.L, false);
  updated_.assign(ctx_.L, false);
  update_not_finite_ = false;
  carried_left_ = ctx_.carried.size();
  carry_committed_ = ctx_.carried.empty();
  norms_done_ = ctx_.hplan.deferred.empty();
}

template <class Pred>
Status OptimizerStage::WaitComputingNormsLocked(Pred ready) {
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(const bool computed, ComputeOneNormLocked());
    if (computed) continue;
    if (!ctx_.error.ok()) return ctx_.error;
    if (ctx_.shutdown) return Status::Aborted("engine is shutting down");
    if (ready()) return Status::OK();
    ctx_.cv.Wait();
  }
}

Status OptimizerStage::ComputeNorms() {
  MutexLock lk(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(
      WaitComputingNormsLocked([&]() REQUIRES(ctx_.mu) { return AllNormsKnownLocked(); }));
  if (!ranks_combine_norm_ && !norm_final_) {
    const NormPart mine = LocalNormPartLocked();
    FinalizeNormLocked(std::span<const NormPart>(&mine, 1));
  }
  norms_done_ = true;
  ctx_.NotifyLocked();
  return Status::OK();
}

std::vector<int> OptimizerStage::SpeculativeBlocksLocked() const {
  std::vector<int> blocks;
  for (int b = 0; b < ctx_.L; ++b) {
    if (speculated_[b]) blocks.push_back(b);
  }
  return blocks;
}

bool OptimizerStage::NormAllowsUpdateLocked(int b) {
  if (ctx_.opt.grad_clip <= 0 || norm_final_) return true;
  if (ctx_.speculative && ctx_.place.Restorable(b))
    return true;  // redone at EndStep if clipping applies
  // Clipping scales every update by the step's norm: wait for all of it.
  if (ranks_combine_norm_ || !AllNormsKnownLocked()) return false;
  const NormPart mine = LocalNormPartLocked();
  FinalizeNormLocked(std::span<const NormPart>(&mine, 1));
  return true;
}

bool OptimizerStage::AllNormsKnownLocked() const {
  for (int x = 0; x < ctx_.L; ++x) {
    if (!norm_known_[x]) return false;
  }
  return true;
}

NormPart OptimizerStage::LocalNormPartLocked() const {
  NormPart mine;
  for (int x = 0; x < ctx_.L; ++x) {
    mine.sum_squares += norm_sq_[x];
    mine.non_finite += non_finite_[x];
  }
  return mine;
}

void OptimizerStage::FinalizeNormLocked(std::span<const NormPart> parts) {
  double sum = 0;
  uint64_t bad = 0;
  for (const NormPart& p : parts) sum += p.sum_squares, bad += p.non_finite;
  norm_.grad_norm = std::sqrt(sum) * ctx_.args.grad_scale;
  // A non-finite element, or squares whose sum overflows: the step updates nothing.
  norm_.skipped = bad > 0 || !std::isfinite(norm_.grad_norm) || update_not_finite_;
  const double clip = ctx_.opt.grad_clip;
  if (clip > 0 && !norm_.skipped) {
    norm_.clip_coef = norm_.grad_norm > clip ? clip / (norm_.grad_norm + 1e-6) : 1.0;
  }
  norm_final_ = true;
}

GradNormResult OptimizerStage::NormLocked() {
  if (!norm_final_) {
    const NormPart mine = LocalNormPartLocked();
    FinalizeNormLocked(std::span<const NormPart>(&mine, 1));
  }
  return norm_;
}

Result<bool> OptimizerStage::ComputeOneNormLocked() {
  int x = 0;
  while (x < ctx_.L && (norm_known_[x] || grads_in_[x] != ctx_.opt.micro_batches)) ++x;
  if (x == ctx_.L) return false;
  const float* grad = static_cast<const float*>(host_.Obj(ObjIndex(x, Component::kGrad)).buf);
  const size_t n = ctx_.layout[x].shard_numel;
  ctx_.mu.Unlock();
  const Clock::time_point t0 = Clock::now();
  auto r = GradNormSquared(grad, FloatFormat::kFp32, n, ctx_.kernel_options);
  ctx_.timeline.Add(TraceLane::kCpuOptim, "norm " + ctx_.layout[x].name, t0, Clock::now());
  ctx_.mu.Lock();
  if (!r.ok()) return Status(r.status()).Annotate("gradient norm");
  norm_sq_[x] = r->sum_squares;
  non_finite_[x] = r->non_finite;
  norm_known_[x] = true;
  host_.SetNormPendingLocked(ObjIndex(x, Component::kGrad), false);
  ctx_.NotifyLocked();  // the collectives combine the ranks' norms once all are known
  return true;
}

Status OptimizerStage::WaitForUpdateLocked(const HostUse& u) {
  const int b = u.block;
  // Norms of blocks whose gradient is final, computed while waiting (clipping needs all).
  return WaitComputingNormsLocked([&]() REQUIRES(ctx_.mu) {
    bool ready = grads_in_[b] == ctx_.opt.micro_batches && norm_known_[b];
    for (const UseObj& uo : u.objs) {
      if (host_.Obj(uo.obj).exists) ready = ready && host_.UsableLocked(uo.obj, uo.seq);
    }
    return ready && NormAllowsUpdateLocked(b);
  });
}

Status OptimizerStage::WaitForCarriedLocked(const HostUse& u) {
  return ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) {
    for (const UseObj& uo : u.objs) {
      if (host_.Obj(uo.obj).exists && !host_.UsableLocked(uo.obj, uo.seq)) return false;
    }
    return true;
  });
}

Status OptimizerStage::CommitCarriedLocked() {
  // The writes land while this step's backward may have begun: its final gradients' norms
  // are computed meanwhile. A gradient stays in memory until its norm is known, so the
  // landings behind it would otherwise wait for the commit (the home copies' writes, held
  // until now, take a second at GPT-2 large).
  STRATA_RETURN_IF_ERROR(WaitComputingNormsLocked(
      [&]() REQUIRES(ctx_.mu) { return host_.WritesLandedLocked(ctx_.carried); }));
  const uint64_t step = uint64_t(ctx_.carried_args.step);
  if (ctx_.ws > 1) {
    // The ranks' commit is a collective: EndStep makes it, after the step's own collectives
    // (EngineImpl::CommitCarriedWithRanksLocked). This step updates nothing before then.
    carry_commit_time_ = Clock::now();
    carry_committed_ = true;
    ctx_.NotifyLocked();
    return Status::OK();
  }
  const Clock::time_point t0 = Clock::now();
  Status s = host_.CommitLocked(step);
  carry_commit_time_ = Clock::now();
  if (host_.has_store()) {
    ctx_.timeline.Add(TraceLane::kNvmeWrite, "commit step " + std::to_string(step), t0,
                      carry_commit_time_);
  }
  if (!s.ok()) return s.Annotate("committing step " + std::to_string(step));
  carry_committed_ = true;
  ctx_.NotifyLocked();
  return Status::OK();
}

Status OptimizerStage::RunUpdate(int use_index) {
  const HostUse& u = ctx_.hplan.uses[use_index];
  const int b = u.block;
  const int g = ObjIndex(b, Component::kGrad);
  {
    MutexLock lk(&ctx_.mu);
    if (u.carried) {
      STRATA_RETURN_IF_ERROR(WaitForCarriedLocked(u));
    } else {
      // The states this update starts from are the previous step's, committed.
      STRATA_RETURN_IF_ERROR(ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return carry_committed_; }));
      STRATA_RETURN_IF_ERROR(WaitForUpdateLocked(u));
    }
    for (const UseObj& uo : u.objs) {
      if (host_.Obj(uo.obj).exists) STRATA_RETURN_IF_ERROR(host_.EnterLocked(uo.obj));
    }
  }
  bool applied = false;
  Status status = AdamBlock(b, u.carried, &applied);
  MutexLock lock(&ctx_.mu);
  if (!status.ok()) return status.Annotate("optimizer step of block '" + ctx_.layout[b].name + "'");
  for (const UseObj& uo : u.objs) {
    if (!host_.Obj(uo.obj).exists) continue;
    STRATA_RETURN_IF_ERROR(host_.LeaveLocked(uo.obj, applied && uo.obj != g));
  }
  if (applied && !u.carried) ++applied_;
  ++opts_done_;
  ctx_.NotifyLocked();
  if (u.carried && --carried_left_ == 0) {
    host_.ReleaseHomeWritesLocked();
    STRATA_RETURN_IF_ERROR(CommitCarriedLocked());
  }
  return Status::OK();
}

// The block's AdamW step over this rank's part of each tensor, unless the step is skipped:
// the global norm, once known, says whether any gradient is non-finite; before it is known
// (no clipping, or a speculative update), every gradient known so far must be finite (the
// optimizer computes the norm of every landed gradient before it decides, so a non-finite
// loss, whose gradient lands first, skips every block).
Status OptimizerStage::AdamBlock(int b, bool carried, bool* applied) {
  BlockBuffers bufs{};
  GradNormResult norm;
  bool final_norm;
  {
    MutexLock lock(&ctx_.mu);
    for (int c = 0; c < kNumComponents; ++c) {
      const HostObj& h = host_.Obj(ObjIndex(b, Component(c)));
      bufs[c] = h.exists ? h.buf : nullptr;
    }
    if (!ctx_.separate) bufs[int(Component::kParam)] = nullptr;
    norm = norm_;
    final_norm = norm_final_;
    if (!norm_final_ && !carried) {
      for (int x = 0; x < ctx_.L; ++x) {
        norm.skipped = norm.skipped || non_finite_[x] > 0 || !std::isfinite(norm_sq_[x]);
      }
    }
  }
  const Clock::time_point t0 = Clock::now();
  Status status;
  // A carried update's step was not skipped (a skipped step carries none).
  *applied = carried || !norm.skipped;
  bool scan = false;
  if (*applied) {
    const UpdateArgs args =
        carried ? ctx_.carried_args : StepUpdateArgs(ctx_, final_norm ? &norm : nullptr);
    scan = MayTurnNonFinite(ctx_, b, args);
    status = ApplyAdamW(ctx_, b, bufs, args);
  }
  if (scan && status.ok()) {
    // No update may leave a non-finite master weight behind (a finite gradient can still
    // give one: --eps 0 over a zero second moment divides zero by zero).
    const FloatFormat format =
        ctx_.opt.master_format == MasterFormat::kFp32 ? FloatFormat::kFp32 : FloatFormat::kBf16;
    const auto scan = GradNormSquared(bufs[int(Component::kMaster)], format,
                                      ctx_.layout[b].shard_numel, ctx_.kernel_options);
    if (!scan.ok()) {
      status = scan.status();
    } else if (scan->non_finite > 0) {
      MutexLock lock(&ctx_.mu);
      status = CheckUpdateFiniteLocked(b, carried, scan->non_finite);
      if (status.ok()) return status;  // skipped: rolled back at EndStep
    }
  }
  ctx_.timeline.Add(
      TraceLane::kCpuOptim,
      "adam " + ctx_.layout[b].name +
          (carried ? " (step " + std::to_string(ctx_.carried_args.step) + ")" : std::string()),
      t0, Clock::now(), ctx_.layout[b].shard_numel * 4);
  if (carried) return status;
  MutexLock lock(&ctx_.mu);
  if (*applied) updated_[b] = true;
  // Updated before the norm: a restorable block can be redone (clipping) or undone (a late
  // non-finite gradient, with or without clipping).
  if (*applied && !final_norm && ctx_.place.Restorable(b)) speculated_[b] = true;
  return status;
}

Status OptimizerStage::CheckUpdateFiniteLocked(int b, bool carried, uint64_t non_finite) {
  updated_[b] = !carried;
  const int64_t step = carried ? ctx_.carried_args.step : ctx_.resumed_step + ctx_.step;
  // Skipped whole when every block this step updated can be restored from the last commit
  // (one rank: ranks would disagree on the step).
  bool undoable = !carried && ctx_.ws == 1;
  for (int x = 0; x < ctx_.L && undoable; ++x) {
    undoable = !updated_[x] || ctx_.place.Restorable(x);
  }
  const std::string what = "step " + std::to_string(step) + ": the update of block '" +
                           ctx_.layout[b].name + "' made " + std::to_string(non_finite) +
                           " master weight(s) non-finite (a zero second moment with eps " +
                           std::to_string(ctx_.opt.eps) + ", or a learning rate too large)";
  if (undoable) {
    LogWarning(what + "; the step is skipped, the weights keep their last committed values");
    update_not_finite_ = true;
    norm_.skipped = true;  // the blocks still to come update nothing
    for (int x = 0; x < ctx_.L; ++x) speculated_[x] = speculated_[x] || updated_[x];
    return Status::OK();
  }
  std::string kept = "nothing to resume (no NVMe store): run again";
  if (host_.has_store()) {
    const auto committed = host_.CommittedStep();
    kept = "the step is not committed, " +
           (committed ? "step " + std::to_string(*committed) : std::string("the initial state")) +
           " stays the last good commit: resume from it";
  }
  return Status::Aborted(what + ". The engine stops; " + kept +
                         " with a larger eps (1e-8 is Adam's usual) or a lower learning rate. "
                         "A step like this is skipped instead where its updates can be undone "
                         "(one rank, --nvme with --durable, --pipeline off)");
}

}  // namespace strata::engine_internal
