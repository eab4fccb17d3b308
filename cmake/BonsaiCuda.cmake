# The CUDA backend (kernels/cuda/). On by default when a CUDA compiler is found
# (nvcc on PATH, in /usr/local/cuda/bin, or named by CUDACXX / CMAKE_CUDA_COMPILER),
# so a machine with the toolkit but no GPU still compiles and links it; the GPU
# tests skip at run time when no device is present.
#
# Targets: real sm_90a code (Hopper: H100/H200) plus compute_80 PTX, which the
# driver compiles for any newer GPU (Ampere and later). Override with
# -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "native" on a GPU machine).
include(CheckLanguage)
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(BONSAI_CUDA_DEFAULT ON)
else()
  set(BONSAI_CUDA_DEFAULT OFF)
endif()
option(BONSAI_CUDA "Build the CUDA backend (kernels/cuda)" ${BONSAI_CUDA_DEFAULT})

if(BONSAI_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "BONSAI_CUDA=ON but no CUDA compiler was found (set CUDACXX or CMAKE_CUDA_COMPILER)")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90a-real 80-virtual)
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 has no CUDA20 dialect for nvcc; the .cu files need only 17
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "bonsai: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "bonsai: CUDA backend OFF")
endif()

# Adds the CUDA backend to `target` (libbonsai): the kernels as an object library
# with nvcc flags (the C++ warning set does not apply to nvcc), the host-side
# backend (kernels/cuda/*.cpp) as ordinary sources, the static CUDA runtime, and
# BONSAI_HAVE_CUDA=1 for code that registers or tests the backend.
function(bonsai_add_cuda target)
  file(GLOB cu_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  file(GLOB cpp_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cpp)
  add_library(bonsai_cuda_kernels OBJECT ${cu_sources})
  target_include_directories(bonsai_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  set_target_properties(bonsai_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_compile_options(bonsai_cuda_kernels PRIVATE -lineinfo -Xcompiler=-Wall,-Wextra)
  if(BONSAI_WERROR)
    target_compile_options(bonsai_cuda_kernels PRIVATE -Werror=all-warnings -Xcompiler=-Werror)
  endif()
  target_sources(${target} PRIVATE ${cpp_sources} $<TARGET_OBJECTS:bonsai_cuda_kernels>)
  target_link_libraries(${target} PUBLIC CUDA::cudart_static)
  target_compile_definitions(${target} PUBLIC BONSAI_HAVE_CUDA=1)
endfunction()
