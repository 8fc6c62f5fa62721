# LibTorch: finds it and adapts the build to its version. One source, two supported builds (docs/operations.md, "Two
# LibTorch
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
# The same for the other libraries it looks up by name (c10 would otherwise be Debian's libc10.so).
foreach(_prefix ${CMAKE_PREFIX_PATH})
  if(EXISTS "${_prefix}/Torch/TorchConfig.cmake" AND EXISTS "${_prefix}/../../lib")
    get_filename_component(_lib "${_prefix}/../../lib" ABSOLUTE)
    find_library(TORCH_LIBRARY torch PATHS "${_lib}" NO_DEFAULT_PATH)
    find_library(c10_LIBRARY c10 PATHS "${_lib}" NO_DEFAULT_PATH)
    find_library(C10_CUDA_LIBRARY c10_cuda PATHS "${_lib}" NO_DEFAULT_PATH)
    find_library(kineto_LIBRARY kineto PATHS "${_lib}" NO_DEFAULT_PATH)
  endif()
endforeach()
find_package(Torch REQUIRED)
# Some LibTorch 2.x configs link torch::nvtoolsext to CUDA::nvToolsExt when they find no header-only NVTX (nvtx3),
# and CUDA 12.9 and later ship no libnvToolsExt: the generate step stops ("CUDA::nvToolsExt ... the target was not
# found", pytorch/pytorch#152756). A link interface is resolved only then, so an empty target of that name made here
# lets it through (our code calls no NVTX, and LibTorch's own libraries carry theirs).
if(TARGET torch::nvtoolsext AND NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()
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
  # Every imported target of LibTorch's config (torch, torch_cpu, c10, c10_cuda, ...) that names the wheel's include/
  # gets the filtered tree instead.
  get_property(_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_target ${_imported})
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs)
      list(TRANSFORM _dirs REPLACE "^${TORCH_INSTALL_PREFIX}/include" "${_torch_include}")
      set_property(TARGET ${_target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${_dirs})
    endif()
  endforeach()
  if(DILOCO_TORCH_CUDA)
    # libtorch_cuda.so needs the NCCL, cuDNN, ... of the wheel's nvidia-* packages (its RPATH finds them at run time);
    # at link time ld would take the CUDA toolkit's older libnccl instead and miss symbols: point it at the wheel's.
    file(GLOB _nvidia_libs "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
    foreach(_dir ${_nvidia_libs})
      add_link_options("LINKER:-rpath-link,${_dir}")
    endforeach()
    # The CUDA runtime and NVRTC too: the wheel's own (its LibTorch was built against them), not the toolkit's older
    # ones, so that the binaries' run path holds the wheel's libraries only.
    foreach(_name cudart nvrtc)
      file(GLOB _wheel_lib "${TORCH_INSTALL_PREFIX}/../nvidia/cu*/lib/lib${_name}.so.*")
      if(_wheel_lib AND TARGET CUDA::${_name})
        list(GET _wheel_lib 0 _path)
        get_filename_component(_path "${_path}" ABSOLUTE)
        set_property(TARGET CUDA::${_name} PROPERTY IMPORTED_LOCATION "${_path}")
      endif()
      if(_wheel_lib)  # TorchConfig also lists NVRTC by path in TORCH_LIBRARIES
        list(TRANSFORM TORCH_LIBRARIES REPLACE "^.*/lib${_name}\\.so$" "${_path}")
      endif()
    endforeach()
    # ProcessGroupNCCL.hpp includes nccl.h and decides members by NCCL_VERSION_CODE: take the header of the NCCL the
    # wheel was built with (its nvidia-nccl package), the toolkit's only when there is none.
    find_path(DILOCO_NCCL_INCLUDE nccl.h HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include"
              ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include NO_DEFAULT_PATH REQUIRED)
    # CUDA 13 moved CCCL's headers (cuda/std, nv/target, cub, thrust) to include/cccl; CMake adds that directory to
    # the toolkit's include directories only from 3.31.9 on (3.25 here). Every imported target that carries the
    # toolkit's include/ (c10_cuda, torch_cuda, CUDA::cudart, ...) gets include/cccl after it.
    set(_cccl "")
    foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
      if(IS_DIRECTORY "${_dir}/cccl" AND NOT "${_dir}/cccl" IN_LIST CUDAToolkit_INCLUDE_DIRS)
        list(APPEND _cccl "${_dir}/cccl")
      endif()
    endforeach()
    if(_cccl)
      get_property(_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
      foreach(_target ${_imported})
        get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
        if(_dirs)
          foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
            if("${_dir}" IN_LIST _dirs)
              set_property(TARGET ${_target} APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${_cccl})
              break()
            endif()
          endforeach()
        endif()
      endforeach()
      message(STATUS "CUDA ${CUDAToolkit_VERSION}: CCCL headers from ${_cccl}")
    endif()
  endif()
endif()
