# find_package(Spconv): the spconv op library for C++ programs, as the imported target spconv::ops.
# Linking spconv::ops registers the spconv::* torch operators (what an AOTInductor package of a spconv model
# calls); the public header is <spconv/ops.h>. Put spconv.deploy.cmake_prefix_path in CMAKE_PREFIX_PATH.
# Needs Torch (found here if the project hasn't found it yet).
get_filename_component(_spconv_pkg "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
file(GLOB _spconv_libs "${_spconv_pkg}/_C_hip*.so")
if(NOT _spconv_libs)
  set(Spconv_FOUND FALSE)
  set(Spconv_NOT_FOUND_MESSAGE "no spconv/_C_hip*.so in ${_spconv_pkg}: build or install spconv first")
  return()
endif()
list(GET _spconv_libs 0 SPCONV_LIBRARY)

if(NOT TARGET torch)
  include(CMakeFindDependencyMacro)
  find_dependency(Torch)
endif()

if(NOT TARGET spconv::ops)
  add_library(spconv::ops SHARED IMPORTED)
  set_target_properties(spconv::ops PROPERTIES
    IMPORTED_LOCATION "${SPCONV_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${_spconv_pkg}/include"
    INTERFACE_LINK_LIBRARIES torch)
endif()
set(SPCONV_INCLUDE_DIRS "${_spconv_pkg}/include")
set(Spconv_FOUND TRUE)
