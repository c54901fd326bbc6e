// The read flags of `strata verify` and `strata export`; see verify_flags.h.
#include "tools/strata/verify_flags.h"

#include "strata/io.h"
#include "tools/strata/cli_common.h"

namespace strata::cli {

void StoreReadFlags::Add(CLI::App* sub) {
  sub->add_option("--io", io, "Read backend: auto (io_uring, else posix), uring or posix")
      ->capture_default_str();
  sub->add_option("--io-block", block,
                  "Bytes per read request (a multiple of 4K; at most the store's stripe)")
      ->capture_default_str();
  sub->add_option("--queue-depth", queue_depth, "Read requests in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  AddSwitch(sub, "direct", &direct, "Read with O_DIRECT, past the page cache, where supported");
}

Result<StoreReaderOptions> StoreReadFlags::Options() const {
  StoreReaderOptions o;
  STRATA_ASSIGN_OR_RETURN(o.io.kind, ParseIoBackendKind(io));
  STRATA_ASSIGN_OR_RETURN(o.request_bytes, ParseBytes("--io-block", block));
  if (o.request_bytes == 0 || o.request_bytes % kIoAlignment != 0) {
    return Status::InvalidArgument("--io-block " + block + " is not a positive multiple of 4K");
  }
  o.io.queue_depth = static_cast<uint32_t>(queue_depth);
  o.io.direct = direct;
  return o;
}

}  // namespace strata::cli
