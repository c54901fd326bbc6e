// CreateNcclCommunicator (the public rendezvous form, strata/comm.h) for a build without CUDA
// (STRATA_WITH_CUDA=OFF or no toolkit found): NCCL comes with CUDA, so there is none either.
// No CUDA or NCCL header is included here, so this file builds everywhere.
#include "strata/comm.h"

namespace strata {

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions&,
                                                             std::shared_ptr<KeyValueStore>,
                                                             Device&) {
  return Status::NotSupported(
      "this build has no CUDA/NCCL support, so there is no NCCL communicator; rebuild with "
      "CUDA (STRATA_WITH_CUDA=ON, with the CUDA toolkit and NCCL in /usr/local/cuda) or use "
      "the Gloo communicator");
}

}  // namespace strata
