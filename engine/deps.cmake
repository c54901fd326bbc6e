# Link dependencies of strata_engine beyond the Strata modules.
find_package(Gloo REQUIRED)
target_link_libraries(strata_engine PUBLIC TBB::tbb OpenMP::OpenMP_CXX PRIVATE gloo nlohmann_json::nlohmann_json)
