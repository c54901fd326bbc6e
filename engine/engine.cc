// The step coordinator: the Engine the model calls. It checks the model's calls against the
// step's access schedule, fixes each step's plans at BeginStep, and hands the work to the
// parts that own the state (see engine_context.h for the map):
//
//  - the model's thread calls the step API (Acquire/Release/GradBuffer/SubmitGrads);
//  - the host tier's I/O thread runs the host plan (evict, load = NVMe read, allocate) in
//    order and submits the NVMe writes of updated components as soon as the optimizer
//    hands them over (host_tier.h);
//  - the device tier's feeder runs the device plan in order and its lander lands each
//    submitted gradient (device_tier.h);
//  - the optimizer stage's thread runs the blocks' AdamW steps in plan order, each as soon
//    as its gradient is final and its states are loaded (optimizer_stage.h);
//  - with a communicator, the comm thread issues every collective of the step in an order
//    fixed at BeginStep, and the watcher waits for each (collectives.h).
// All of them block on one condition variable (or on an I/O completion, or a device
// event); nothing spins.
//
// Each step's plan is fixed at BeginStep, so every thread knows what comes next; the
// model's calls are checked against the plan's access schedule.
#include <chrono>
#include <cmath>

#include "engine/engine_impl.h"
#include "strata/log.h"

namespace strata {
namespace engine_internal {

namespace {

// EngineOptions::master_format against the resolved working dtype.
Status CheckMasterFormat(const EngineOptions& opt, WorkingDtype dtype) {
  switch (opt.master_format) {
    case MasterFormat::kFp32:
      return Status::OK();
    case MasterFormat::kBf16Stochastic:
      if (dtype == WorkingDtype::kBf16) return Status::OK();
      return Status::InvalidArgument(
          "master_format bf16-sr needs the bf16 working dtype (the bf16 master is the device's "
          "params); got working dtype " +
          std::string(WorkingDtypeName(dtype)));
    case MasterFormat::kBf16Kahan:
      return Status::NotSupported(
          "master_format bf16-kahan is not an engine format: its compensation is a second "
          "2-byte extent per block, so the master would move 4 bytes per parameter like fp32's "
          "(docs/design.md \"Compact optimizer states\"); use bf16-sr");
  }
  return Status::InvalidArgument("unknown MasterFormat value " +
                                 std::to_string(int(opt.master_format)));
}

}  // namespace

// Runs before any thread starts.
Status EngineImpl::Init() NO_THREAD_SAFETY_ANALYSIS {
  const EngineOptions& opt = ctx_.opt;
  if (!ctx_.dev) return Status::InvalidArgument("EngineOptions::device is required");
  if (opt.micro_batches < 1) {
    return Status::InvalidArgument("micro_batches is " + std::to_string(opt.micro_batches) +
                                   "; it must be >= 1");
  }
  // First, before anything that could fail on one rank only and leave the others waiting in
  // a collective.
  if (ctx_.comm && ctx_.ws > 1) STRATA_RETURN_IF_ERROR(CheckOptionsAgreeAcrossRanks(ctx_));
  STRATA_RETURN_IF_ERROR(CheckOptimizerOptions(ctx_.opt));
  ctx_.dtype = opt.dtype;
  const bool bf16_master = opt.master_format != MasterFormat::kFp32;
  if (ctx_.dtype == WorkingDtype::kAuto) {
    ctx_.dtype = ctx_.dev->Kind() == DeviceKind::kCuda || bf16_master ? WorkingDtype::kBf16
                                                                      : WorkingDtype::kFp32;
  }
  STRATA_RETURN_IF_ERROR(CheckMasterFormat(opt, ctx_.dtype));
  ctx_.separate = ctx_.dtype != WorkingDtype::kFp32 && !bf16_master;
  ctx_.durable = opt.durable || opt.resume;
  ctx_.kernel_options.threads = opt.optimizer_threads;

  STRATA_ASSIGN_OR_RETURN(ctx_.place, PlanPlacement(ctx_.layout, PlanOptionsFrom(opt, ctx_.dtype)));
  ctx_.schedule = ctx_.place.schedule;
  ctx_.param_bytes = ctx_.place.param_bytes;
  ctx_.grad_bytes = ctx_.place.grad_bytes;
  ctx_.dplan = ctx_.place.device;

  // The pool's allocations in a fixed order: staging, the collectives' buffers, the cache,
  // the home copies.
  STRATA_RETURN_IF_ERROR(host_.InitPool());
  STRATA_RETURN_IF_ERROR(collectives_->AllocateBuffers());
  STRATA_RETURN_IF_ERROR(host_.InitObjects());
  STRATA_RETURN_IF_ERROR(stash_.Init());  // the activations' host slots and scratch files

  if (!opt.trace_path.empty()) {
    STRATA_RETURN_IF_ERROR(ctx_.timeline.OpenTrace(
        opt.trace_path, opt.trace_process_name.empty() ? "strata engine" : opt.trace_process_name,
        opt.trace_pid));
    ctx_.timeline.SetTraceRecording(opt.trace_first_step <= ctx_.resumed_step + 1);
  }
  ctx_.dev->SetObserver([this](const DeviceOpRecord& r) { OnDeviceOp(r); });
  STRATA_RETURN_IF_ERROR(collectives_->Init());
  host_.Start();
  device_.Start();
  optimizer_.Start();
  return Status::OK();
}

EngineImpl::~EngineImpl() {
  {
    MutexLock lock(&ctx_.mu);
    // A step that EndStep returned is committed, as if the next step had run its updates.
    if (ctx_.error.ok() && !ctx_.step_open) {
      Status s = DrainLocked();
      if (!s.ok()) LogWarning("closing the engine: " + s.ToString());
    } else if (ctx_.error.ok() && ctx_.ws <= 1 && optimizer_.CarriedAppliedLocked()) {
      // A step in progress is dropped, but the one before it, whose updates it carried and
      // ran, still commits: its writes land without the model. (Before its carried updates
      // all ran, the last commit stays the one before it; a caller that drops a step runs
      // its forward out first, see python/strata/_offload.py abort_step.)
      Status s =
          ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return optimizer_.CarryCommittedLocked(); });
      if (!s.ok()) LogWarning("closing the engine: " + s.ToString());
    }
    ctx_.shutdown = true;
    ctx_.NotifyLocked();
  }
  collectives_->JoinCommThread();
  optimizer_.Join();
  device_.JoinLander();
  device_.JoinFeeder();
  host_.Join();
  stash_.Shutdown();
  if (ctx_.dev) {
    // Lane work may still reference our buffers and call back into us. Collectives still
    // queued read and write our buffers too: the watcher waits for every one of them (a
    // broken communicator fails them at once; a dead peer within its timeout).
    collectives_->JoinWatcher();
    for (Lane l : {Lane::kCompute, Lane::kH2D, Lane::kD2H, Lane::kComm}) {
      (void)ctx_.dev->SynchronizeLane(l);
    }
    ctx_.dev->SetObserver(nullptr);
    collectives_->Detach();
    (void)device_.FreeAll();
    host_.UnregisterFromDevice();
  }
  host_.CloseStore();
  (void)ctx_.timeline.CloseTrace();
}

void EngineImpl::OnDeviceOp(const DeviceOpRecord& r) {
  TraceLane lane;
  switch (r.lane) {
    case Lane::kCompute:
      lane = TraceLane::kCompute;
      break;
    case Lane::kH2D:
      lane = TraceLane::kH2D;
      break;
    case Lane::kD2H:
      lane = TraceLane::kD2H;
      break;
    default:
      return;
  }
  // Bookkeeping host functions on the copy lanes are not transfers; leave them out of the
  // busy time of the link.
  if (lane != TraceLane::kCompute && r.bytes == 0) return;
  ctx_.timeline.Add(lane, r.label, r.start, r.end, r.bytes);
}

// ---------------------------------------------------------------------------------------
// Step API (model thread)
// ---------------------------------------------------------------------------------------

Result<HostPlan> EngineImpl::PlanStepLocked(bool speculative) {
  HostPlanInput hin = HostInputFor(ctx_.place);
  hin.speculative = speculative;
  hin.carried = ctx_.carried;
  host_.PlanStartLocked(&hin.start_resident, &hin.start_offset);
  auto plan = PlanHost(hin);
  // Carried gradients cannot be evicted to start from an empty cache: the caller runs the
  // carried updates first.
  if (!plan.ok() && hin.carried.empty()) {
    // What the last step left in the cache can fragment it; start from an empty cache (the
    // configuration the planner validated) by evicting it first.
    std::vector<int> carried = hin.start_resident;
    hin.start_resident.clear();
    plan = PlanHost(hin);
    if (plan.ok()) {
      std::vector<HostOp> ops;
      for (int o : carried) ops.push_back(HostOp{HostOpKind::kEvict, o, -1, 0});
      ops.insert(ops.end(), plan->ops.begin(), plan->ops.end());
      plan->ops = std::move(ops);
    }
  }
  return plan;
}

Status EngineImpl::BeginStep(const StepArgs& args) {
  MutexLock lk(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(ctx_.error);
  if (ctx_.step_open) return Status::InvalidArgument("BeginStep: a step is already open");
  const int64_t done = ctx_.resumed_step + ctx_.step;
  // A step_offset that counts back to or below the committed step (older moments loaded into
  // a store that counted further) is refused here, before anything changes, not by the commit.
  const std::optional<uint64_t> committed =
      host_.has_store() ? host_.CommittedStep() : std::nullopt;
  STRATA_RETURN_IF_ERROR(CheckStepArgs(args, ctx_.layout, done, committed));
  // A redo needs the committed versions to be the states the step starts from. The store
  // counts steps as the bias correction does (StepArgs::step_offset).
  bool uncommitted = params_dirty_ && host_.has_store();
  const int64_t counted = done + args.step_offset;
  if (uncommitted && (!committed || int64_t(*committed) < counted)) {
    STRATA_RETURN_IF_ERROR(host_.CommitLocked(uint64_t(counted)));
    uncommitted = false;
  }
  params_dirty_ = false;
  const bool speculative = SpeculateLocked() && !uncommitted;
  // The last step's deferred updates run first in this one, each before its block's forward.
  ctx_.carried = pending_blocks_;
  ctx_.carried_args = pending_args_;
  auto plan = PlanStepLocked(speculative);
  if (!plan.ok() && !ctx_.carried.empty()) {
    // What the cache holds now leaves no room for them beside this step: run them first.
    ctx_.carried.clear();
    STRATA_RETURN_IF_ERROR(DrainLocked());
    plan = PlanStepLocked(speculative);
  }
  STRATA_RETURN_IF_ERROR(plan.status());
  if (ctx_.ws > 1 && !ctx_.carried.empty() && OwnUpdatesBeforeEndStep(*plan)) {
    // The ranks commit the carried step at this step's EndStep; an update of this step would
    // start from its uncommitted states (a speculative step): run them first instead.
    ctx_.carried.clear();
    STRATA_RETURN_IF_ERROR(DrainLocked());
    plan = PlanStepLocked(speculative);
    STRATA_RETURN_IF_ERROR(plan.status());
  }
  ctx_.hplan = std::move(plan).value();
  pending_blocks_.clear();
  ctx_.speculative = speculative;

  ++ctx_.step;
  ctx_.args = args;
  ctx_.groups = args.groups.empty()
                    ? nullptr
                    : std::make_shared<const std::vector<OptimizerGroup>>(args.groups);
  acquired_ = -1;
  host_.BeginStepLocked();
  stash_.BeginStep();
  device_.BeginStepLocked();
  optimizer_.BeginStepLocked();
  step_start_ = Clock::now();
  ctx_.timeline.BeginStep(step_start_);
  {
    const int64_t step_number = ctx_.resumed_step + ctx_.step;  // the one beginning
    ctx_.timeline.SetTraceRecording(
        step_number >= ctx_.opt.trace_first_step &&
        (ctx_.opt.trace_last_step == 0 || step_number <= ctx_.opt.trace_last_step));
  }
  collectives_->BeginStepLocked();
  ctx_.step_open = true;
  ++ctx_.generation;
  ctx_.NotifyLocked();
  return Status::OK();
}

Result<int> EngineImpl::CheckAcquireLocked(int block, Pass pass) const {
  STRATA_RETURN_IF_ERROR(ctx_.error);
  const std::vector<Access>& schedule = ctx_.schedule;
  if (!ctx_.step_open) return Status::InvalidArgument("Acquire outside a step (call BeginStep)");
  if (acquired_ >= 0) {
    return Status::InvalidArgument("Acquire of block " + std::to_string(block) + " while block " +
                                   std::to_string(schedule[acquired_].block) +
                                   " is still acquired (Release it first)");
  }
  const int a = device_.model_pos();
  const Access want{block, pass, a < int(schedule.size()) ? schedule[a].micro : 0};
  if (a >= int(schedule.size()) || !(schedule[a] == want)) {
    return Status::InvalidArgument(
        "Acquire(" + std::to_string(block) + ", " +
        (pass == Pass::kForward ? "forward" : "backward") + ") is access " + std::to_string(a) +
        " of the step, but the schedule expects " +
        (a < int(schedule.size()) ? DescribeAccess(schedule[a]) : std::string("EndStep")) +
        (!ctx_.opt.schedule.empty() ? " (EngineOptions::schedule)"
         : ctx_.opt.micro_batch_order == MicroBatchOrder::kLayerMajor
             ? " (layer-major: forward 0..L-1, then backward L-1..0, each block for every "
               "micro-batch in turn)"
             : " (per micro-batch: forward 0..L-1, then backward L-1..0)"));
  }
  return a;
}

Result<BlockView> EngineImpl::Acquire(int block, Pass pass) {
  EventPtr ready;
  BlockView view;
  {
    MutexLock lk(&ctx_.mu);
    STRATA_ASSIGN_OR_RETURN(const int a, CheckAcquireLocked(block, pass));
    STRATA_RETURN_IF_ERROR(ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) {
      return device_.FedLocked(a) && collectives_->MayUseParamsLocked(a);
    }));
    STRATA_ASSIGN_OR_RETURN(ready, device_.EnterParamsLocked(a));
    view.params = device_.ParamsLocked(a);
    acquired_ = a;
    grads_submitted_ = false;
  }
  // Compute enqueued from now on runs after the copy (no host wait).
  if (ready) STRATA_RETURN_IF_ERROR(ctx_.dev->WaitEvent(Lane::kCompute, ready));
  view.block = block;
  view.dtype = ctx_.dtype;
  view.layout = &ctx_.layout[block];
  return view;
}

Status EngineImpl::Release(int block) {
  MutexLock lk(&ctx_.mu);
  if (acquired_ < 0 || ctx_.schedule[acquired_].block != block) {
    return Status::InvalidArgument("Release of block " + std::to_string(block) +
                                   ", which is not acquired");
  }
  const int a = acquired_;
  if (ctx_.schedule[a].pass == Pass::kBackward && !grads_submitted_) {
    return Status::InvalidArgument("Release of block " + std::to_string(block) +
                                   " in backward before SubmitGrads");
  }
  lk.Unlock();
  auto ev = ctx_.dev->Record(Lane::kCompute);
  lk.Lock();
  if (!ev.ok()) {
    ctx_.SetErrorLocked(ev.status());
    return ev.status();
  }
  acquired_ = -1;
  Status s = device_.ReleaseLocked(a, *ev);
  if (!s.ok()) ctx_.SetErrorLocked(s);
  return ctx_.error;
}

Result<float*> EngineImpl::GradBuffer(int block) {
  MutexLock lock(&ctx_.mu);
  if (acquired_ < 0 || ctx_.schedule[acquired_].block != block ||
      ctx_.schedule[acquired_].pass != Pass::kBackward) {
    return Status::InvalidArgument("GradBuffer(" + std::to_string(block) +
                                   ") needs the block acquired for backward");
  }
  return device_.GradLocked(acquired_);
}

Status EngineImpl::SubmitGrads(int block) { return Submit(block, {}).status(); }

Result<uint64_t> EngineImpl::SubmitGradsFrom(int block, std::span<const float* const> grads) {
  if (ctx_.comm != nullptr) {
    return Status::NotSupported("SubmitGradsFrom with " + std::to_string(ctx_.comm->world_size()) +
                                " ranks: the reduce-scatter reads the gradient buffer; write it "
                                "(GradBuffer) and call SubmitGrads");
  }
  if (block < 0 || block >= int(ctx_.layout.size())) {
    return Status::InvalidArgument("SubmitGradsFrom(" + std::to_string(block) +
                                   "): the model has blocks 0.." +
                                   std::to_string(ctx_.layout.size() - 1));
  }
  if (grads.size() != ctx_.layout[block].tensors.size()) {
    return Status::InvalidArgument("SubmitGradsFrom(" + std::to_string(block) + ") with " +
                                   std::to_string(grads.size()) + " gradients; the block has " +
                                   std::to_string(ctx_.layout[block].tensors.size()) + " tensors");
  }
  std::vector<const float*> sources(grads.begin(), grads.end());
  std::vector<const float*> adopted;  // the lander forgets them once copied
  Status s;
  for (size_t t = 0; t < sources.size() && s.ok(); ++t) {
    if (sources[t] == nullptr) continue;
    s = ctx_.dev->AdoptMemory(sources[t], ctx_.layout[block].tensors[t].numel * 4);
    if (s.ok()) adopted.push_back(sources[t]);
  }
  Result<uint64_t> ticket = s.ok() ? Submit(block, std::move(sources)) : Result<uint64_t>(s);
  if (!ticket.ok()) {  // nothing was queued
    for (const float* p : adopted) (void)ctx_.dev->ForgetMemory(p);
  }
  return ticket;
}

Result<uint64_t> EngineImpl::Submit(int block, std::vector<const float*> sources) {
  int a;
  {
    MutexLock lock(&ctx_.mu);
    STRATA_RETURN_IF_ERROR(ctx_.error);
    if (acquired_ < 0 || ctx_.schedule[acquired_].block != block ||
        ctx_.schedule[acquired_].pass != Pass::kBackward || grads_submitted_) {
      return Status::InvalidArgument(
          std::string(sources.empty() ? "SubmitGrads(" : "SubmitGradsFrom(") +
          std::to_string(block) + ") needs the block acquired for backward, once");
    }
    a = acquired_;
    grads_submitted_ = true;
  }
  // The landing (D2H copy into the host accumulator) is enqueued by the lander thread once
  // the host buffer is free, so the model never waits here for host memory.
  STRATA_ASSIGN_OR_RETURN(EventPtr computed, ctx_.dev->Record(Lane::kCompute));
  MutexLock lock(&ctx_.mu);
  const uint64_t ticket = sources.empty() ? 0 : device_.NextTicketLocked();
  if (ticket == 0) collectives_->GradComputedLocked(a, computed);
  Status s = device_.SubmitLocked(a, std::move(computed), std::move(sources), ticket);
  if (!s.ok()) {
    ctx_.SetErrorLocked(s);
    return s;
  }
  return ticket;
}

Status EngineImpl::WaitStepWorkLocked() {
  return ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) {
    return optimizer_.StepDoneLocked() && host_.StepDoneLocked() && device_.StepDoneLocked() &&
           collectives_->StepDoneLocked();
  });
}

Result<double> EngineImpl::GradNorm() {
  MutexLock lk(&ctx_.mu);
  if (!ctx_.step_open) return Status::InvalidArgument("GradNorm without BeginStep");
  if (ctx_.opt.grad_clip <= 0) {
    return Status::InvalidArgument(
        "GradNorm with grad_clip 0: without clipping the updates run before the norm is "
        "known; set grad_clip (AdamW's max_grad_norm) to the norm to clip to");
  }
  const int released = device_.model_pos();
  if (ctx_.error.ok() && released != int(ctx_.schedule.size())) {
    return Status::InvalidArgument("GradNorm after " + std::to_string(released) + " of " +
                                   std::to_string(ctx_.schedule.size()) +
                                   " accesses; the norm is known once every gradient is in");
  }
  STRATA_RETURN_IF_ERROR(WaitStepWorkLocked());
  return optimizer_.NormLocked().grad_norm;
}

Result<StepStats> EngineImpl::EndStep() {
  MutexLock lk(&ctx_.mu);
  if (!ctx_.step_open) return Status::InvalidArgument("EndStep without BeginStep");
  const int released = device_.model_pos();
  if (ctx_.error.ok() && released != int(ctx_.schedule.size())) {
    return Status::InvalidArgument("EndStep after " + std::to_string(released) + " of " +
                                   std::to_string(ctx_.schedule.size()) +
                                   " accesses; the step is incomplete");
  }
  // The activations go first (their spills finished): a failure there fails the step. Without
  // the engine's lock: a spill in flight waits for its device copy, and the lanes' work before
  // that copy may take the lock (the feeder's host functions do).
  ctx_.mu.Unlock();
  const Status dropped = stash_.EndStep();
  ctx_.mu.Lock();
  if (!dropped.ok()) ctx_.SetErrorLocked(dropped);
  Status s = WaitStepWorkLocked();
  if (!s.ok()) {
    ctx_.step_open = false;
    return s;
  }
  const uint64_t step_number = uint64_t(ctx_.resumed_step + ctx_.step);
  StepStats st;
  STRATA_RETURN_IF_ERROR(CommitCarriedWithRanksLocked());
  STRATA_RETURN_IF_ERROR(RedoSpeculativeLocked(&st));
  STRATA_RETURN_IF_ERROR(RefusePartialUpdateLocked(step_number));
  // Updates deferred to the next step: it runs them (a skipped step has none to run; its
  // gradients go now).
  const GradNormResult norm = optimizer_.NormLocked();
  const std::vector<int>& deferred = ctx_.hplan.deferred;
  if (!deferred.empty() && norm.skipped) {
    std::vector<int> grads;
    for (int b : deferred) grads.push_back(ObjIndex(b, Component::kGrad));
    Status released = host_.ReleaseLocked(grads);
    if (!released.ok()) {
      ctx_.step_open = false;
      ctx_.SetErrorLocked(released);
      return released;
    }
  } else if (!deferred.empty()) {
    pending_blocks_ = deferred;
    pending_args_ = StepUpdateArgs(ctx_, &norm);
    st.deferred_blocks = int64_t(deferred.size());
  }
  STRATA_RETURN_IF_ERROR(FinishStepLocked(step_number, /*commit=*/pending_blocks_.empty()));
  StatsLocked(step_number, &st);
  ledger_.EndStep(st, CarriedCostLocked(), /*deferred=*/!pending_blocks_.empty());
  return st;
}

bool EngineImpl::OwnUpdatesBeforeEndStep(const HostPlan& plan) {
  for (int u : plan.opt_uses) {
    if (!plan.uses[u].carried) return true;
  }
  return false;
}

Status EngineImpl::CommitCarriedWithRanksLocked() {
  if (ctx_.ws <= 1 || ctx_.carried.empty()) return Status::OK();
  // The carried updates ran under this step's forward and their writes have landed
  // (OptimizerStage::CommitCarriedLocked waited for them); the commit is a collective, made
  // here on every rank after the step's own collectives, in the same order everywhere.
  const uint64_t step = uint64_t(ctx_.carried_args.step);
  const Clock::time_point t0 = Clock::now();
  Status s = host_.CommitLocked(step);
  if (host_.has_store()) {
    ctx_.timeline.Add(TraceLane::kNvmeWrite, "commit step " + std::to_string(step), t0,
                      Clock::now());
  }
  if (!s.ok()) {
    ctx_.step_open = false;
    ctx_.SetErrorLocked(Status(s).Annotate("committing step " + std::to_string(step)));
    return ctx_.error;
  }
  return Status::OK();
}

std::optional<DeferredCost> EngineImpl::CarriedCostLocked() {
  if (ctx_.carried.empty()) return std::nullopt;
  const Clock::time_point commit = optimizer_.CarryCommitTimeLocked();
  DeferredCost c;
  // The optimizer thread runs the carried updates and the commit before any work of this
  // step's own; the writes of this step before that commit (a spilled gradient landing
  // early) are counted to the last step.
  c.optim_seconds = ctx_.timeline.BusySeconds(TraceLane::kCpuOptim, step_start_, commit);
  c.write_seconds = ctx_.timeline.BusySeconds(TraceLane::kNvmeWrite, step_start_, commit);
  c.write_bytes = host_.UpdateWriteBytesLocked(ctx_.carried);
  c.overlapped_seconds = std::chrono::duration<double>(commit - step_start_).count();
  return c;
}

std::vector<StepStats> EngineImpl::TakeCommittedStats() {
  MutexLock lk(&ctx_.mu);
  return ledger_.Take();
}

Status EngineImpl::DrainLocked() {
  if (pending_blocks_.empty()) return Status::OK();
  const std::vector<int> blocks = std::move(pending_blocks_);
  pending_blocks_.clear();
  const UpdateArgs args = pending_args_;
  std::vector<int> grads;
  for (int b : blocks) grads.push_back(ObjIndex(b, Component::kGrad));
  const Clock::time_point t0 = Clock::now();
  Status s = host_.RollBackLocked(
      blocks, HostTier::StatesFrom::kCurrent, grads,
      [this, args](int b, const BlockBuffers& bufs) { return ApplyAdamW(ctx_, b, bufs, args); });
  const Clock::time_point t1 = Clock::now();
  ctx_.timeline.Add(TraceLane::kCpuOptim,
                    "adam " + std::to_string(blocks.size()) + " deferred updates (step " +
                        std::to_string(args.step) + ")",
                    t0, t1);
  if (s.ok()) s = host_.ReleaseLocked(grads);
  if (s.ok()) s = host_.CommitLocked(uint64_t(args.step));
  const Clock::time_point t2 = Clock::now();
  if (host_.has_store()) {
    ctx_.timeline.Add(TraceLane::kNvmeWrite, "commit step " + std::to_string(args.step), t1, t2);
  }
  if (!s.ok()) {
    ctx_.SetErrorLocked(
        Status(s).Annotate("running the deferred updates of step " + std::to_string(args.step)));
    return ctx_.error;
  }
  // Between steps, nothing beside them: a serial tail of their step.
  using Seconds = std::chrono::duration<double>;
  ledger_.Drained(DeferredCost{.optim_seconds = Seconds(t1 - t0).count(),
                               .write_seconds = host_.has_store() ? Seconds(t2 - t1).count() : 0,
                               .write_bytes = host_.UpdateWriteBytesLocked(blocks),
                               .serial_seconds = Seconds(t2 - t0).count()});
  return Status::OK();
}

Status EngineImpl::Flush() {
  MutexLock lk(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(ctx_.error);
  if (ctx_.step_open) return Status::InvalidArgument("Flush during a step (call EndStep first)");
  return DrainLocked();
}

Status EngineImpl::SetOptimizerThreads(int threads) {
  MutexLock lk(&ctx_.mu);
  if (threads < 0) {
    return Status::InvalidArgument("SetOptimizerThreads(" + std::to_string(threads) +
                                   "): expected 0 (one per core) or more");
  }
  // The optimizer's thread reads the kernel options without the lock, but only while a step
  // runs its updates (or the model's thread drains them, as this call's).
  if (ctx_.step_open) return Status::InvalidArgument("SetOptimizerThreads during a step");
  ctx_.kernel_options.threads = threads;
  return Status::OK();
}

bool EngineImpl::SpeculateLocked() const {
  switch (ctx_.opt.speculation) {
    case Speculation::kOff:
      return false;
    case Speculation::kOn:
      return ctx_.place.speculation;
    case Speculation::kAuto:
      // Pipelined updates hide under the next forward without a redo's risk: prefer them.
      return ctx_.place.speculation && !ctx_.place.pipeline && !last_step_clipped_;
  }
  return false;
}

Status EngineImpl::RedoSpeculativeLocked(StepStats* st) {
  const GradNormResult norm = optimizer_.NormLocked();
  const bool clipped = norm.skipped || (ctx_.opt.grad_clip > 0 && norm.clip_coef != 1.0);
  last_step_clipped_ = clipped;
  st->speculative = ctx_.speculative;
  const std::vector<int> blocks = optimizer_.SpeculativeBlocksLocked();
  Status s;
  if (clipped && !blocks.empty()) {
    const Clock::time_point t0 = Clock::now();
    const UpdateArgs args = StepUpdateArgs(ctx_, &norm);
    std::function<Status(int, const BlockBuffers&)> redo;
    if (!norm.skipped) {
      redo = [this, args](int b, const BlockBuffers& bufs) {
        return ApplyAdamW(ctx_, b, bufs, args);
      };
    }
    s = host_.RollBackLocked(blocks, HostTier::StatesFrom::kCommitted, ctx_.hplan.held, redo);
    const Clock::time_point t1 = Clock::now();
    ctx_.timeline.Add(TraceLane::kCpuOptim,
                      std::string(norm.skipped ? "undo " : "redo ") +
                          std::to_string(blocks.size()) + " speculative updates",
                      t0, t1);
    st->redone_blocks = int64_t(blocks.size());
    st->redo_seconds = std::chrono::duration<double>(t1 - t0).count();
    if (s.ok() && norm.skipped) optimizer_.UndoneLocked(int(blocks.size()));
  }
  if (s.ok()) s = host_.ReleaseLocked(ctx_.hplan.held);
  if (!s.ok()) {
    ctx_.step_open = false;
    ctx_.SetErrorLocked(Status(s).Annotate("redoing the step's speculative updates"));
    return ctx_.error;
  }
  return Status::OK();
}

// A step whose gradient is not finite must not be committed with some blocks updated:
// without clipping a non-finite gradient that lands after other blocks' updates ran is
// found too late to skip the step whole. The step is not committed (the last commit stays
// the last good state) and the engine stops.
Status EngineImpl::RefusePartialUpdateLocked(uint64_t step_number) {
  const GradNormResult norm = optimizer_.NormLocked();
  const int applied = optimizer_.AppliedLocked();
  if (!norm.skipped || applied == 0) return Status::OK();
  ctx_.step_open = false;
  std::string what_now =
      "Run again with --grad-clip > 0 (a non-finite step is then skipped whole) or a lower --lr";
  if (host_.has_store()) {
    const auto committed = host_.CommittedStep();
    what_now =
        "The step is not committed: " +
        (committed ? "step " + std::to_string(*committed) : std::string("the initial state")) +
        " stays the last good commit. Resume from it with --grad-clip > 0 (a non-finite "
        "step is then skipped whole) or a lower --lr";
  }
  ctx_.SetErrorLocked(Status::Aborted(
      "step " + std::to_string(step_number) + ": a gradient became non-finite (norm " +
      std::to_string(norm.grad_norm) + ") after " + std::to_string(applied) + " of " +
      std::to_string(ctx_.hplan.opt_uses.size()) +
      " block updates had run (without --grad-clip an update starts before every gradient is "
      "known). " +
      what_now));
  return ctx_.error;
}

Status EngineImpl::FinishStepLocked(uint64_t step_number, bool commit) {
  ctx_.mu.Unlock();
  // Updates made every device copy stale: free them (their last users are done by now,
  // since every gradient has landed; synchronise anyway for the forward-only buffers).
  Status sync = ctx_.dev->SynchronizeLane(Lane::kCompute);
  Status freed = device_.FreeAll();
  if (sync.ok()) sync = freed;
  ctx_.mu.Lock();
  ctx_.step_open = false;
  if (!sync.ok()) {
    ctx_.SetErrorLocked(sync);
    return sync;
  }
  if (!commit) return Status::OK();
  // The commit flushes the drives (fdatasync) and writes the manifest: NVMe write time. The
  // store counts the step as the bias correction did (StepArgs::step_offset), as the
  // deferred updates' commits do.
  const uint64_t counted = uint64_t(int64_t(step_number) + ctx_.args.step_offset);
  const Clock::time_point commit_start = Clock::now();
  Status s = host_.CommitLocked(counted);
  if (host_.has_store()) {
    ctx_.timeline.Add(TraceLane::kNvmeWrite, "commit step " + std::to_string(counted), commit_start,
                      Clock::now());
  }
  if (!s.ok()) {
    ctx_.SetErrorLocked(Status(s).Annotate("committing step " + std::to_string(counted)));
    return ctx_.error;
  }
  return Status::OK();
}

void EngineImpl::StatsLocked(uint64_t step_number, StepStats* out) {
  Timeline& timeline = ctx_.timeline;
  const Clock::time_point end = Clock::now();
  StepStats& st = *out;
  st.step = int64_t(step_number);
  st.seconds = std::chrono::duration<double>(end - step_start_).count();
  timeline.StepUsage(step_start_, end, &st);  // busy table, bound, per-edge bytes
  Clock::time_point last_compute;
  st.stall_seconds = timeline.ComputeIdleSeconds(step_start_, end, &last_compute);
  st.tail_seconds = std::chrono::duration<double>(end - last_compute).count();
  timeline.AddStallEvents(step_start_, last_compute);
  timeline.Add(TraceLane::kStep, "step " + std::to_string(step_number), step_start_, end);
  st.efficiency = st.seconds > 0 ? st.bound_seconds / st.seconds : 0;
  const GradNormResult norm = optimizer_.NormLocked();
  st.grad_norm = norm.grad_norm;
  st.clip_coef = norm.clip_coef;
  st.skipped = norm.skipped;
  if (!ctx_.carried.empty()) {
    st.overlapped_seconds =
        std::chrono::duration<double>(optimizer_.CarryCommitTimeLocked() - step_start_).count();
  }
  st.peak_device_bytes = device_.PeakBytesLocked();
  st.peak_host_bytes = host_.PeakBytesLocked();
  stash_.AddStats(&st);
}

}  // namespace engine_internal

Result<std::unique_ptr<Engine>> Engine::Create(std::vector<BlockSpec> blocks,
                                               const EngineOptions& options) {
  STRATA_ASSIGN_OR_RETURN(const EngineOptions opt, engine_internal::ResolveRankOptions(options));
  STRATA_ASSIGN_OR_RETURN(
      std::vector<BlockLayout> layout,
      engine_internal::ComputeLayout(blocks, opt.tensor_alignment, opt.world_size));
  auto engine = std::make_unique<engine_internal::EngineImpl>(opt, std::move(layout));
  STRATA_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace strata
