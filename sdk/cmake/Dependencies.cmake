# libtrtmc's other dependencies, each a well-kept library rather than hand-written code:
#   trtmc_zip       libzip (Debian/Ubuntu: apt-get install libzip-dev), through pkg-config (Debian 12's
#                   libzip CMake files name tools the -dev package does not install), else found by name
#   OpenSSL::Crypto SHA-256 (apt-get install libssl-dev)
#   trtmc_json      nlohmann-json, header-only: a system install (nlohmann-json3-dev) or the PyPI
#                   package installed beside torch (pip install nlohmann-json, or trtmc's `sdk` extra)
#   trtmc_tensorrt  optional: TensorRT (libnvinfer) or TensorRT-RTX (libtensorrt_rtx) with its headers
#                   and the CUDA runtime; -DTensorRT_ROOT=DIR where they are not on the default paths

add_library(trtmc_zip INTERFACE)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(TRTMC_LIBZIP QUIET IMPORTED_TARGET libzip>=1.2)
endif()
if(TRTMC_LIBZIP_FOUND)
  target_link_libraries(trtmc_zip INTERFACE PkgConfig::TRTMC_LIBZIP)
else()
  find_path(TRTMC_ZIP_INCLUDE zip.h)
  find_library(TRTMC_ZIP_LIBRARY zip)
  if(NOT TRTMC_ZIP_INCLUDE OR NOT TRTMC_ZIP_LIBRARY)
    message(FATAL_ERROR "libzip not found: install it (Debian/Ubuntu: apt-get install libzip-dev)")
  endif()
  target_include_directories(trtmc_zip SYSTEM INTERFACE "${TRTMC_ZIP_INCLUDE}")
  target_link_libraries(trtmc_zip INTERFACE "${TRTMC_ZIP_LIBRARY}")
endif()

find_package(OpenSSL COMPONENTS Crypto)
if(NOT OpenSSL_FOUND)
  message(FATAL_ERROR "OpenSSL not found: install it (Debian/Ubuntu: apt-get install libssl-dev)")
endif()

add_library(trtmc_json INTERFACE)
find_package(nlohmann_json 3.2 CONFIG QUIET)
if(nlohmann_json_FOUND)
  target_link_libraries(trtmc_json INTERFACE nlohmann_json::nlohmann_json)
else()
  find_path(TRTMC_JSON_INCLUDE nlohmann/json.hpp HINTS "${TRTMC_TORCH_ROOT}/../nlohmann_json/include")
  if(NOT TRTMC_JSON_INCLUDE)
    message(FATAL_ERROR "nlohmann-json not found: `pip install nlohmann-json` into torch's environment "
                        "(or `pip install -e \".[sdk]\"`), or apt-get install nlohmann-json3-dev")
  endif()
  target_include_directories(trtmc_json SYSTEM INTERFACE "${TRTMC_JSON_INCLUDE}")
endif()

set(TRTMC_TENSORRT_FOUND OFF)
find_path(TRTMC_TENSORRT_INCLUDE NvInfer.h HINTS ${TensorRT_ROOT} ENV TensorRT_ROOT PATH_SUFFIXES include)
find_library(TRTMC_TENSORRT_LIBRARY NAMES nvinfer tensorrt_rtx HINTS ${TensorRT_ROOT} ENV TensorRT_ROOT
  PATH_SUFFIXES lib lib64)
find_package(CUDAToolkit QUIET)
if(TRTMC_TENSORRT_INCLUDE AND TRTMC_TENSORRT_LIBRARY AND TARGET CUDA::cudart)
  set(TRTMC_TENSORRT_FOUND ON)
  get_filename_component(_trtmc_trt_name "${TRTMC_TENSORRT_LIBRARY}" NAME)
  if(_trtmc_trt_name MATCHES "tensorrt_rtx")
    set(TRTMC_TENSORRT_BUILDER tensorrt_rtx)
  else()
    set(TRTMC_TENSORRT_BUILDER tensorrt)
  endif()
  add_library(trtmc_tensorrt INTERFACE)
  target_include_directories(trtmc_tensorrt SYSTEM INTERFACE "${TRTMC_TENSORRT_INCLUDE}")
  target_link_libraries(trtmc_tensorrt INTERFACE "${TRTMC_TENSORRT_LIBRARY}" CUDA::cudart)
  message(STATUS "TensorRT: ${TRTMC_TENSORRT_LIBRARY} (${TRTMC_TENSORRT_BUILDER} plans run)")
else()
  message(STATUS "TensorRT: not found (NvInfer.h, libnvinfer or the CUDA runtime missing); libtrtmc passes "
                 "TensorRT plans over as 'built without TensorRT'")
endif()
