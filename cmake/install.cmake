# Install rules: the header, the library, the msa program with its
# workloads, a CMake package (find_package(msa) -> msa::msa) and a
# pkg-config file (msa.pc).  Included from the top-level CMakeLists.txt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MSA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/msa CACHE STRING
    "Where msaConfig.cmake is installed (relative to the prefix)")

target_include_directories(msa INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS msa EXPORT msaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/msa/msa.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/msa)
install(EXPORT msaTargets NAMESPACE msa:: FILE msaTargets.cmake DESTINATION ${MSA_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/msaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/msaConfig.cmake
                              INSTALL_DESTINATION ${MSA_INSTALL_CMAKEDIR})
# 0.x releases may change the ABI with the minor version (0.2 renamed
# msa_plan_limits), so a request for 0.2 accepts 0.2.x only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/msaConfig.cmake ${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
        DESTINATION ${MSA_INSTALL_CMAKEDIR})

# pkg-config: the prefix is found from the .pc file's own place, so the
# installed tree can be moved (and installed with --prefix).  Libs.private
# lists what a static link needs beside libmsa.a.
file(RELATIVE_PATH MSA_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" MSA_PC_TO_PREFIX "${MSA_PC_TO_PREFIX}")
set(MSA_PC_LIBS_PRIVATE "")
if(MSA_HAVE_CJSON)
  get_filename_component(MSA_CJSON_DIR ${CJSON_LIBRARY} DIRECTORY)
  if(NOT MSA_CJSON_DIR IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
    string(APPEND MSA_PC_LIBS_PRIVATE " -L${MSA_CJSON_DIR}")
  endif()
  string(APPEND MSA_PC_LIBS_PRIVATE " -lcjson")
endif()
if(MSA_HAVE_CUDA)
  # The CUDA runtime, and what it and the C++ of the CUDA sources need.
  string(APPEND MSA_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lstdc++")
endif()
string(APPEND MSA_PC_LIBS_PRIVATE " -lpthread -lm")
string(STRIP "${MSA_PC_LIBS_PRIVATE}" MSA_PC_LIBS_PRIVATE)
configure_file(${PROJECT_SOURCE_DIR}/msa.pc.in ${PROJECT_BINARY_DIR}/msa.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/msa.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(TARGET msa_cli)
  install(TARGETS msa_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/bench/workloads/ DESTINATION ${CMAKE_INSTALL_DATADIR}/msa/workloads
          FILES_MATCHING PATTERN "*.json")
endif()
