// The version of the Strata library a program runs with (libstrata).
//
// Safe from any thread.
#pragma once

namespace strata {

// "MAJOR.MINOR.PATCH" of the library linked in (the CMake project version).
const char* Version();

}  // namespace strata
