// The Gloo backend of strata::Communicator (strata/comm.h): TCP transport, rendezvous through
// Gloo's FileStore or RedisStore. Create it with CreateGlooCommunicator() (declared in
// strata/comm.h); this header exposes only the pieces tests exercise directly. No Gloo
// headers here, so the users of strata_comm need not see them.
//
// Three files, split by what each owns:
//   comm/gloo_store.*        the rendezvous stores (KeyValueStore and Gloo's Store over one
//                            locked Gloo FileStore/RedisStore);
//   comm/gloo_forensics.*    naming the lost rank when a collective fails;
//   comm/gloo_communicator.* the collective worker and CreateGlooCommunicator.
//
// How it runs: one worker thread per communicator executes the collectives in issue order
// (one FIFO) on one gloo::Context connected as a full mesh: all-gather, all-reduce,
// broadcast and barrier through Gloo's tagged collectives, reduce-scatter through Strata's
// own direct exchange on a tagged slot (gloo_communicator.cc says why: Gloo's
// ReduceScatterHalvingDoubling returned wrong elements under load). Every op has a tag of
// its own, so back-to-back ops never share a slot or a buffer.
// A Gloo exception is caught on the worker and becomes the handle's Status: Timeout when a
// peer stayed silent past the timeout, Comm when a connection broke. The lost rank is named
// as comm/gloo_forensics.h describes.
#pragma once

#include <cstddef>

#include "comm/gloo_forensics.h"

namespace strata::gloo_internal {

// True when this build's Gloo has RedisStore (GLOO_USE_REDIS).
bool HasRedis();

// Reduce-scatter runs in pieces of at most `elements` (summed over ranks) to bound its
// scratch memory (default 2^24, 64 MiB). Lets tests cover the piecewise path with small buffers;
// set it before creating communicators (it is read by every rank's worker).
void SetReduceScatterPieceForTesting(size_t elements);

}  // namespace strata::gloo_internal
