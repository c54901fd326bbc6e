# The installable public API: libstrata.so (every module's archive linked whole into one shared
# library, so a consumer sees only include/strata/ and none of the private dependencies), the
# public headers, the `strata` tool, and a CMake package:
#
#   cmake --install build/release --prefix /opt/strata
#   # consumer: find_package(Strata REQUIRED)  target_link_libraries(app PRIVATE Strata::strata)
#
# tests/install builds a small consumer against such an install (CTest: install_consumer).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(STRATA_LIBRARY_MODULES strata_engine strata_io strata_cpu_optim strata_gpu)
foreach(m strata_comm)
  if(TARGET ${m})
    list(APPEND STRATA_LIBRARY_MODULES ${m})
  endif()
endforeach()

add_library(strata_shared SHARED ${CMAKE_CURRENT_LIST_DIR}/libstrata.cc)
target_compile_definitions(strata_shared PRIVATE STRATA_VERSION_STRING="${PROJECT_VERSION}")
# Every object of every module archive goes in (--whole-archive), then the modules again as
# ordinary link items so that their own dependencies (TBB, Gloo, CUDA, ...) follow them.
# (CMake's $<LINK_LIBRARY:WHOLE_ARCHIVE> refuses an item that also appears without it, and the
# modules appear again through each other's link interfaces.)
set(_strata_archives)
foreach(m ${STRATA_LIBRARY_MODULES})
  list(APPEND _strata_archives $<TARGET_FILE:${m}>)
endforeach()
add_dependencies(strata_shared ${STRATA_LIBRARY_MODULES})
target_link_libraries(strata_shared PRIVATE strata_headers
  -Wl,--whole-archive ${_strata_archives} -Wl,--no-whole-archive ${STRATA_LIBRARY_MODULES})
target_include_directories(strata_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(strata_shared INTERFACE cxx_std_20)
set_target_properties(strata_shared PROPERTIES OUTPUT_NAME strata EXPORT_NAME strata
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_FLAGS "-Wl,--no-undefined")

install(TARGETS strata_shared EXPORT StrataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET strata)
  install(TARGETS strata RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT StrataTargets NAMESPACE Strata:: FILE StrataTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/StrataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/StrataConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/StrataConfig.cmake ${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
