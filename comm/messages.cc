// The trainer's multi-rank protocols; see messages.h.
#include "comm/messages.h"

namespace strata {

Status AgreeOnResumedStep(Communicator& comm, int64_t step) {
  struct ResumedStep {
    int64_t step;
  };
  STRATA_ASSIGN_OR_RETURN(std::vector<ResumedStep> all,
                          AllGatherMessages(comm, ResumedStep{step}, "all-gather resumed step"));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].step != step) {
      return Status::InvalidArgument("rank " + std::to_string(r) + " resumes step " +
                                     std::to_string(all[r].step) + " but this rank step " +
                                     std::to_string(step) +
                                     "; resume every rank from the same run (same world size)");
    }
  }
  return Status::OK();
}

}  // namespace strata
