#include "engine/rank_collectives.h"

namespace strata::engine_internal {

Status RankCollectives::Init() {
  ctx_.comm->SetObserver([this](const CommOpRecord& r) { OnCommOp(r); });
  if (ctx_.host_comm != ctx_.comm) {
    ctx_.host_comm->SetObserver([this](const CommOpRecord& r) { OnCommOp(r); });
  }
  comm_thread_ = std::thread([this] {
    ctx_.RunStepWorker([this] { return seq_.size(); }, [this](size_t i) { return RunItem(i); });
  });
  watch_thread_ = std::thread([this] { WatchLoop(); });
  return Status::OK();
}

void RankCollectives::JoinCommThread() {
  if (comm_thread_.joinable()) comm_thread_.join();
}

void RankCollectives::JoinWatcher() {
  if (watch_thread_.joinable()) watch_thread_.join();
}

void RankCollectives::Detach() {
  {
    MutexLock lock(&ctx_.mu);
    for (const CommHandle& h : ag_handle_) (void)h.Wait();
    for (const CommHandle& h : rs_handle_) (void)h.Wait();
  }
  ctx_.comm->SetObserver(nullptr);
  ctx_.host_comm->SetObserver(nullptr);
}

void RankCollectives::OnCommOp(const CommOpRecord& r) {
  const std::string label = r.label.empty() ? std::string(r.op) : std::string(r.label);
  ctx_.timeline.Add(TraceLane::kComm, label, r.start, r.end, r.bytes);
}

void RankCollectives::BeginStepLocked() {
  BuildSequence();
  const size_t n = ctx_.schedule.size();
  comm_pos_ = 0;
  ag_issued_.assign(n, false);
  ag_handle_.assign(n, CommHandle());
  rs_after_.assign(n, nullptr);
  rs_issued_.assign(n, false);
  rs_handle_.assign(n, CommHandle());
}

// The step's collectives in the planner's order (PlanCommSequence: the same on every rank,
// and never a wait on something that waits for a later collective).
void RankCollectives::BuildSequence() {
  CommSequenceOptions co;
  co.host_budget_unlimited = ctx_.opt.host_mem_bytes == 0;
  co.device_collectives = gather_waits_for_grad_frees_;
  seq_ = PlanCommSequence(ctx_.schedule, ctx_.dplan, ctx_.hplan, co);
}

Status RankCollectives::RunItem(size_t i) {
  const CommItem& item = seq_[i];
  MutexLock lock(&ctx_.mu);
  switch (item.kind) {
    case CommItem::kGather:
      STRATA_RETURN_IF_ERROR(IssueGatherLocked(item));
      break;
    case CommItem::kReduce:
      STRATA_RETURN_IF_ERROR(IssueReduceLocked(item));
      break;
    case CommItem::kNorm:
      STRATA_RETURN_IF_ERROR(CombineNormLocked());
      break;
  }
  comm_pos_ = i + 1;
  ctx_.NotifyLocked();
  return Status::OK();
}

// This rank's sum in block order, then the ranks' sums in rank order: exact doubles
// gathered as bytes, so every rank computes the same norm bit for bit.
Status RankCollectives::CombineNormLocked() {
  STRATA_RETURN_IF_ERROR(
      ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return optimizer_.AllNormsKnownLocked(); }));
  const NormPart mine = optimizer_.LocalNormPartLocked();
  std::vector<NormPart> all(static_cast<size_t>(ctx_.ws));
  ctx_.mu.Unlock();
  CollectiveOptions co;
  co.label = "all-gather grad norm";
  Status st =
      ctx_.host_comm->AllGather(&mine, all.data(), sizeof(NormPart), CommDataType::kByte, co)
          .Wait();
  ctx_.mu.Lock();
  if (!st.ok()) return st.Annotate("gradient norm across ranks");
  optimizer_.FinalizeNormLocked(all);
  return Status::OK();
}

void RankCollectives::WatchLoop() {
  for (;;) {
    CommHandle h;
    {
      MutexLock lock(&ctx_.mu);
      while (!ctx_.shutdown && watch_.empty()) ctx_.cv.Wait();
      if (watch_.empty()) return;  // shut down, everything waited for
      h = watch_.front();
      watch_.pop_front();
    }
    Status s = h.Wait();
    // An Aborted after another failure is only its echo (a broken communicator).
    if (!s.ok()) ctx_.SetWorkerError(std::move(s));
  }
}

Status RankCollectives::AllGatherHost(const float* shard, float* all, uint64_t n,
                                      const std::string& label) const {
  CollectiveOptions co;
  co.label = label;
  return ctx_.host_comm->AllGather(shard, all, n, CommDataType::kFloat32, co).Wait();
}

}  // namespace strata::engine_internal
