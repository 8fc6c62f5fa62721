# LibTorch: finds it and adapts the build to its version. One source, two supported builds (README, "Two LibTorch
# builds"):
#   build/      Debian 12's LibTorch 1.13 (CPU). C++17. The default (scripts/setup).
#   build-pip/  the LibTorch inside PyPI's torch 2.x wheel, with CUDA (scripts/setup --torch pip). C++20 (its headers
#               need it), the cxx11 ABI like every Debian C++ library, and a CUDA toolkit at configure time.
# Differences in the C++ API between the two live in one header, worker/lm/torch_compat.h.
#
# Sets DILOCO_TORCH_MAJOR (1 or 2) and DILOCO_TORCH_CUDA (ON when the LibTorch has CUDA: the NCCL process group and the
# CUDA-only sources are compiled in).
# TorchConfig looks for libtorch.so in the default paths before its own prefix: with Debian's libtorch-dev installed
# too, the wheel's build would report Debian's library. Point it at the prefix that holds the config it uses.
foreach(_prefix ${CMAKE_PREFIX_PATH})
  if(EXISTS "${_prefix}/Torch/TorchConfig.cmake" AND EXISTS "${_prefix}/../../lib")
    get_filename_component(_lib "${_prefix}/../../lib" ABSOLUTE)
    find_library(TORCH_LIBRARY torch PATHS "${_lib}" NO_DEFAULT_PATH)
  endif()
endforeach()
find_package(Torch REQUIRED)
string(REGEX MATCH "^[0-9]+" DILOCO_TORCH_MAJOR "${Torch_VERSION}")
if(DILOCO_TORCH_MAJOR GREATER_EQUAL 2)
  set(CMAKE_CXX_STANDARD 20)
else()
  set(CMAKE_CXX_STANDARD 17)
endif()
set(CMAKE_CXX_STANDARD_REQUIRED ON)

set(DILOCO_TORCH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(DILOCO_TORCH_CUDA ON)
endif()
message(STATUS "LibTorch ${Torch_VERSION} (C++${CMAKE_CXX_STANDARD}, CUDA ${DILOCO_TORCH_CUDA}) from ${TORCH_INSTALL_PREFIX}")

if(DILOCO_TORCH_MAJOR GREATER_EQUAL 2)
  # The wheel's include/ also holds the headers of what it bundles: fmt 12 and protobuf among them. They would shadow
  # Debian's (spdlog is built against fmt 9, our generated .pb.h against protobuf 3.21), so the torch target gets a
  # tree of its own with links to LibTorch's own headers only.
  set(_torch_include "${CMAKE_BINARY_DIR}/torch-include")
  file(MAKE_DIRECTORY "${_torch_include}")
  foreach(_dir ATen c10 caffe2 torch)
    file(CREATE_LINK "${TORCH_INSTALL_PREFIX}/include/${_dir}" "${_torch_include}/${_dir}" SYMBOLIC)
  endforeach()
  # The wheel ships no gloo headers, yet ProcessGroupGloo.hpp includes them: Debian's libgloo-dev provides them
  # (/usr/include/gloo, found like any system header). The header only holds gloo objects by shared_ptr and calls
  # gloo through LibTorch's own compiled code, so the older headers' layout of gloo classes never crosses the call.
  set_property(TARGET torch PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_torch_include}"
                                     "${_torch_include}/torch/csrc/api/include")
  if(TARGET torch_cpu)
    set_property(TARGET torch_cpu PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_torch_include}"
                                           "${_torch_include}/torch/csrc/api/include")
  endif()
  if(TARGET c10)
    set_property(TARGET c10 PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_torch_include}")
  endif()
  if(DILOCO_TORCH_CUDA)
    # ProcessGroupNCCL.hpp includes nccl.h and the CUDA runtime headers: from the toolkit the configure step found.
    find_path(DILOCO_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include REQUIRED)
  endif()
endif()
