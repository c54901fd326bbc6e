// libstrata's own source: its version. Everything else in the shared library comes whole from
// the module archives (see cmake/StrataInstall.cmake).
#include "strata/version.h"

namespace strata {

const char* Version() { return STRATA_VERSION_STRING; }

}  // namespace strata
