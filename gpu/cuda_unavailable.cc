// CreateCudaDevice / CudaAvailable for a build without CUDA (STRATA_WITH_CUDA=OFF or no
// toolkit found): no CUDA header is included here, so this file builds everywhere.
#include "strata/device.h"

namespace strata {

Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions&) {
  return Status::NotSupported(
      "this build of strata has no CUDA support; rebuild with CUDA (STRATA_WITH_CUDA=ON, "
      "with the CUDA toolkit in /usr/local/cuda) or use the host device");
}

bool CudaAvailable() { return false; }

}  // namespace strata
