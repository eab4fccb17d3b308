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
option(BONSAI_CUDA_PROBES "Build the standalone H200 probes of tools/cuda (with BONSAI_CUDA; on in the ci preset)" OFF)

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

# The standalone probes and peak tools of tools/cuda (docs/performance.md runs them on the H200):
# sm_90a only (they use Hopper instructions), linked without libbonsai (the matvec probes carry
# the run-time selection themselves, tools/cuda/probe_selection.h). Built in CI so that a change
# to the kernels they include cannot leave them broken unnoticed (sessions 11-12 did: the knobs
# moved to knobs.cpp).
function(bonsai_add_cuda_probes)
  set(probes boundary_probe imma_peak wgmma_peak consumer_probe persistent_probe)
  set(extra_consumer_probe ${PROJECT_SOURCE_DIR}/kernels/cuda/matvec.cu)
  set(extra_persistent_probe ${PROJECT_SOURCE_DIR}/kernels/cuda/matvec.cu)
  foreach(p IN LISTS probes)
    add_executable(${p} ${PROJECT_SOURCE_DIR}/tools/cuda/${p}.cu ${extra_${p}})
    target_include_directories(${p} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
    set_target_properties(${p} PROPERTIES CUDA_ARCHITECTURES 90a-real RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin/probes)
    target_compile_options(${p} PRIVATE -Xcompiler=-Wall,-Wextra)
    if(BONSAI_WERROR)
      target_compile_options(${p} PRIVATE -Werror=all-warnings -Xcompiler=-Werror)
    endif()
  endforeach()
endfunction()
