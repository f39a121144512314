# The libtorch a torch wheel ships (headers and shared libraries under site-packages/torch), as the
# target trtmc_torch. Found through CMAKE_PREFIX_PATH=$(python -c 'import torch;
# print(torch.utils.cmake_prefix_path)') or -DTorch_DIR=.../share/cmake/Torch.
#
# Why not find_package(Torch): for a CUDA wheel, TorchConfig.cmake stops with a fatal error unless
# a full CUDA toolkit (nvcc, cuBLAS headers, ...) is installed, although libtrtmc includes no CUDA
# header. The wheel's own libraries are all that is needed: libtorch_cuda is linked when the wheel
# has it, so AOTInductor packages for CUDA load on a GPU machine.

find_path(TRTMC_TORCH_CMAKE_DIR TorchConfig.cmake
  HINTS ${Torch_DIR} ${CMAKE_PREFIX_PATH}
  PATH_SUFFIXES Torch share/cmake/Torch
  NO_DEFAULT_PATH)
if(NOT TRTMC_TORCH_CMAKE_DIR)
  message(FATAL_ERROR
    "libtorch not found. Point CMake at the torch wheel:\n"
    "  cmake -S sdk -B build -DCMAKE_PREFIX_PATH=\"$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')\"")
endif()
get_filename_component(TRTMC_TORCH_ROOT "${TRTMC_TORCH_CMAKE_DIR}/../../.." ABSOLUTE)

foreach(name torch torch_cpu c10)
  find_library(TRTMC_LIB_${name} ${name} PATHS "${TRTMC_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
  if(NOT TRTMC_LIB_${name})
    message(FATAL_ERROR "lib${name}.so not found in ${TRTMC_TORCH_ROOT}/lib: is this a complete torch install?")
  endif()
endforeach()
find_library(TRTMC_LIB_torch_cuda torch_cuda PATHS "${TRTMC_TORCH_ROOT}/lib" NO_DEFAULT_PATH)

add_library(trtmc_torch INTERFACE)
target_include_directories(trtmc_torch SYSTEM INTERFACE
  "${TRTMC_TORCH_ROOT}/include" "${TRTMC_TORCH_ROOT}/include/torch/csrc/api/include")
# AOTInductor's model library needs libtorch.so already loaded (it is dlopened from a temporary
# folder, where its own dependencies would not be found), and libtorch_cuda registers the CUDA
# runner when it loads: keep both although no symbol of theirs is referenced.
set(_trtmc_always ${TRTMC_LIB_torch})
if(TRTMC_LIB_torch_cuda)
  list(APPEND _trtmc_always ${TRTMC_LIB_torch_cuda})
endif()
target_link_libraries(trtmc_torch INTERFACE
  "-Wl,--no-as-needed" ${_trtmc_always} "-Wl,--as-needed" ${TRTMC_LIB_torch_cpu} ${TRTMC_LIB_c10})
if(TRTMC_LIB_torch_cuda)
  message(STATUS "libtorch: ${TRTMC_TORCH_ROOT} (with CUDA)")
else()
  message(STATUS "libtorch: ${TRTMC_TORCH_ROOT} (CPU only)")
endif()
