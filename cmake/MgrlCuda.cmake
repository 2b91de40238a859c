# MgrlCuda.cmake: decides whether the CUDA backend is built (MGRL_CUDA = AUTO|ON|OFF) and
# picks default CUDA architectures from the toolkit version unless the user gave some.
include(CheckLanguage)
string(TOUPPER "${MGRL_CUDA}" _mgrl_cuda)
if(NOT _mgrl_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MGRL_CUDA must be AUTO, ON or OFF (got '${MGRL_CUDA}')")
endif()

set(MGRL_WITH_CUDA OFF)
if(NOT _mgrl_cuda STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MGRL_WITH_CUDA ON)
  elseif(_mgrl_cuda STREQUAL "ON")
    message(FATAL_ERROR "MGRL_CUDA=ON but no CUDA compiler was found: put nvcc on PATH or set CMAKE_CUDA_COMPILER")
  else()
    message(STATUS "mgrl: no nvcc found, building the CPU backend only (MGRL_CUDA=AUTO)")
  endif()
endif()

if(MGRL_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    # The toolkit version decides the default: CUDA 13 dropped compute_70 (V100).
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE _nvcc_out ERROR_QUIET)
    if(_nvcc_out MATCHES "release ([0-9]+)\\.([0-9]+)")
      set(_cuda_major "${CMAKE_MATCH_1}")
    else()
      message(FATAL_ERROR "could not read the CUDA version from '${CMAKE_CUDA_COMPILER} --version'")
    endif()
    if(_cuda_major LESS 13)
      set(_archs "70;80;90")
    else()
      set(_archs "75;80;90")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES "${_archs}" CACHE STRING "CUDA architectures (default from the toolkit version)")
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # A toolkit without the static CUDA runtime (the CUDA 11.8 of scripts/cuda118.sh, assembled from NVIDIA's wheels,
  # has libcudart.so only) links the shared one: else nvcc's -lcudart_static could find another toolkit's archive in
  # the linker's default paths.
  if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY AND CMAKE_CUDA_COMPILER_TOOLKIT_ROOT AND
     NOT EXISTS "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}/lib64/libcudart_static.a" AND
     NOT EXISTS "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}/lib/libcudart_static.a" AND
     EXISTS "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}/lib64/libcudart.so")
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  endif()
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13 AND "70" IN_LIST CMAKE_CUDA_ARCHITECTURES)
    message(FATAL_ERROR "CUDA ${CMAKE_CUDA_COMPILER_VERSION} cannot build for sm_70 (V100): use a CUDA 12.x toolkit "
                        "for V100, or drop 70 from CMAKE_CUDA_ARCHITECTURES")
  endif()
endif()
