# Finds LibTorch inside PyPI's `torch` wheel (pinned by launch/install-deps.sh) and makes it usable
# next to Debian's C++ libraries. Defines the imported target `torch` (find_package(Torch)) and:
#   MLLM_TORCH_VERSION      e.g. 2.11.0
#   MLLM_TORCH_CUDA         CUDA version LibTorch was built with (e.g. 13.0), empty for a CPU build
#   MLLM_TORCH_SITE         the site-packages folder holding torch/ and nvidia/ (empty when LibTorch
#                           was given by Torch_DIR / CMAKE_PREFIX_PATH instead of a Python)
#   MLLM_GPU_COUNT          CUDA devices visible to LibTorch at configure time (0 without a GPU)
#
# Where LibTorch comes from, first match wins:
#   1. -DTorch_DIR=... or a CMAKE_PREFIX_PATH holding TorchConfig.cmake (a LibTorch zip, say);
#   2. -DMLLM_PYTHON=/path/to/python3 whose `import torch` works;
#   3. <source>/.venv/bin/python3 (what launch/install-deps.sh creates);
#   4. python3 on PATH.
# Snags handled here are listed in ../shared/notes/libtorch-from-pip.md.

set(MLLM_TORCH_MIN_VERSION 2.11)   # the version on our GPU machines; older ones are not tested
set(MLLM_PYTHON "" CACHE FILEPATH
    "Python whose torch package provides LibTorch (default: <source>/.venv/bin/python3, then python3)")
# Hopper (H100/H200) by default: the GPU machines we test on. Torch's CMake config otherwise
# probes for a GPU and, finding none, compiles CUDA code for a dozen architectures.
set(MLLM_CUDA_ARCH "9.0" CACHE STRING "TORCH_CUDA_ARCH_LIST for CUDA code (e.g. '8.0;9.0')")

set(MLLM_TORCH_SITE "")
set(MLLM_GPU_COUNT 0)

function(_mllm_query_torch python out_ok)
  # One interpreter start (import torch takes ~2 s): version, cmake prefix, C++ ABI, CUDA, site dir,
  # visible GPUs. device_count() needs no driver: it is 0 where none is installed.
  execute_process(
    COMMAND "${python}" -c
      "import os, torch\nprint(torch.__version__)\nprint(torch.utils.cmake_prefix_path)\nprint(int(torch._C._GLIBCXX_USE_CXX11_ABI))\nprint(torch.version.cuda or '')\nprint(os.path.dirname(os.path.dirname(torch.__file__)))\nprint(torch.cuda.device_count() if torch.version.cuda else 0)"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    set(${out_ok} FALSE PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(LENGTH lines n)
  if(n LESS 6)
    set(${out_ok} FALSE PARENT_SCOPE)
    return()
  endif()
  list(GET lines -6 version)
  list(GET lines -5 prefix)
  list(GET lines -4 abi)
  list(GET lines -3 cuda)
  list(GET lines -2 site)
  list(GET lines -1 gpus)
  set(_mllm_py_version "${version}" PARENT_SCOPE)
  set(_mllm_py_prefix "${prefix}" PARENT_SCOPE)
  set(_mllm_py_abi "${abi}" PARENT_SCOPE)
  set(_mllm_py_cuda "${cuda}" PARENT_SCOPE)
  set(_mllm_py_site "${site}" PARENT_SCOPE)
  set(_mllm_py_gpus "${gpus}" PARENT_SCOPE)
  set(${out_ok} TRUE PARENT_SCOPE)
endfunction()

set(_mllm_from_python FALSE)
# A reconfigure finds Torch_DIR in the cache; it came from a Python when _MLLM_TORCH_PYTHON is set.
if(MLLM_PYTHON AND DEFINED CACHE{_MLLM_TORCH_PYTHON} AND NOT MLLM_PYTHON STREQUAL _MLLM_TORCH_PYTHON)
  unset(Torch_DIR CACHE)   # another Python was asked for: find its LibTorch
endif()
if(DEFINED CACHE{_MLLM_TORCH_PYTHON} OR (NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR}))
  set(_candidates "")
  if(MLLM_PYTHON)
    list(APPEND _candidates "${MLLM_PYTHON}")
  elseif(DEFINED CACHE{_MLLM_TORCH_PYTHON})
    list(APPEND _candidates "${_MLLM_TORCH_PYTHON}")
  else()
    if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
      list(APPEND _candidates "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
    endif()
    find_program(_mllm_system_python NAMES python3)
    if(_mllm_system_python)
      list(APPEND _candidates "${_mllm_system_python}")
    endif()
  endif()
  foreach(py IN LISTS _candidates)
    _mllm_query_torch("${py}" _ok)
    if(_ok)
      set(_mllm_from_python TRUE)
      set(_mllm_python "${py}")
      break()
    endif()
  endforeach()
  if(MLLM_PYTHON AND NOT _mllm_from_python)
    message(FATAL_ERROR "MLLM_PYTHON=${MLLM_PYTHON} cannot `import torch`. Run launch/install-deps.sh "
            "(it creates ${PROJECT_SOURCE_DIR}/.venv with torch ${MLLM_TORCH_MIN_VERSION}) or point "
            "MLLM_PYTHON at a Python that has torch.")
  endif()
endif()

if(_mllm_from_python)
  if(NOT _mllm_py_abi STREQUAL "1")
    # Debian's yaml-cpp, spdlog, fmt and GoogleTest use the C++11 ABI; mixing fails at link time
    # with std::__cxx11::basic_string symbol errors.
    message(FATAL_ERROR "The torch at ${_mllm_py_site} was built with _GLIBCXX_USE_CXX11_ABI=0; "
            "mllm links Debian's C++ libraries, which use the C++11 ABI. Use a torch wheel >= 2.7 "
            "(launch/install-deps.sh installs ${MLLM_TORCH_MIN_VERSION}).")
  endif()
  set(_MLLM_TORCH_PYTHON "${_mllm_python}" CACHE INTERNAL "the Python LibTorch was taken from")
  list(PREPEND CMAKE_PREFIX_PATH "${_mllm_py_prefix}")
  set(MLLM_TORCH_SITE "${_mllm_py_site}")
  set(MLLM_GPU_COUNT "${_mllm_py_gpus}")
  message(STATUS "mllm: LibTorch from ${_mllm_python}: torch ${_mllm_py_version}, "
                 "CUDA ${_mllm_py_cuda}, ${_mllm_py_gpus} GPU(s) visible")
endif()

if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "${MLLM_CUDA_ARCH}")
endif()
# Torch's config enables CUDA and warns that it ignores CMAKE_CUDA_ARCHITECTURES whenever that is
# defined, which enable_language(CUDA) always does. Enable CUDA first and drop the default, so the
# warning only appears for a value the user set; mllm's own CUDA targets set CUDA_ARCHITECTURES
# from MLLM_CUDA_ARCH themselves.
if(_mllm_py_cuda AND NOT CMAKE_CUDA_ARCHITECTURES_USER_SET)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED CACHE{_MLLM_CUDA_ARCH_DEFAULTED})
      set(CMAKE_CUDA_ARCHITECTURES_USER_SET TRUE)   # given on the command line: leave it
    else()
      enable_language(CUDA)
      unset(CMAKE_CUDA_ARCHITECTURES CACHE)
      unset(CMAKE_CUDA_ARCHITECTURES)
      set(_MLLM_CUDA_ARCH_DEFAULTED TRUE CACHE INTERNAL "")
    endif()
  endif()
endif()
# kineto is linked into libtorch_cpu in the wheels; TorchConfig still looks for a separate
# library and warns. Point it at libtorch_cpu, which holds it.
if(_mllm_from_python AND NOT kineto_LIBRARY AND EXISTS "${_mllm_py_site}/torch/lib/libtorch_cpu.so")
  set(kineto_LIBRARY "${_mllm_py_site}/torch/lib/libtorch_cpu.so" CACHE FILEPATH "kineto lives in libtorch_cpu")
endif()

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "LibTorch not found. Run launch/install-deps.sh (it installs torch "
          "${MLLM_TORCH_MIN_VERSION} from PyPI into ${PROJECT_SOURCE_DIR}/.venv), or pass "
          "-DMLLM_PYTHON=<python with torch> or -DTorch_DIR=<libtorch>/share/cmake/Torch.")
endif()
set(MLLM_TORCH_VERSION "${Torch_VERSION}")
if(MLLM_TORCH_VERSION VERSION_LESS MLLM_TORCH_MIN_VERSION)
  message(FATAL_ERROR "LibTorch ${MLLM_TORCH_VERSION} at ${Torch_DIR} is too old: mllm needs "
          ">= ${MLLM_TORCH_MIN_VERSION} (Debian's libtorch-dev 1.13 is no longer supported). Run "
          "launch/install-deps.sh and configure again in a fresh build folder.")
endif()
if(_mllm_from_python)
  set(MLLM_TORCH_CUDA "${_mllm_py_cuda}")
elseif(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(MLLM_TORCH_CUDA "${CUDAToolkit_VERSION}")
  find_program(_mllm_nvidia_smi nvidia-smi)
  if(_mllm_nvidia_smi)
    execute_process(COMMAND ${_mllm_nvidia_smi} -L RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "GPU [0-9]+:" gpus "${out}")
      list(LENGTH gpus MLLM_GPU_COUNT)
    endif()
  endif()
else()
  set(MLLM_TORCH_CUDA "")
endif()

# The wheel ships fmt 12 headers in torch/include, which the compiler would find before Debian's
# fmt 9 (/usr/include is searched last), so spdlog (built for Debian's fmt) would not compile.
# LibTorch's public headers do not use fmt. A folder that holds only a link to Debian's fmt,
# searched before LibTorch's include folders, makes every <fmt/...> Debian's.
get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
list(GET _fmt_includes 0 _fmt_include)
if(EXISTS "${_fmt_include}/fmt/format.h" AND EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt")
  set(MLLM_FMT_SHIM_DIR "${PROJECT_BINARY_DIR}/generated/fmt_shim")
  file(MAKE_DIRECTORY "${MLLM_FMT_SHIM_DIR}")
  file(CREATE_LINK "${_fmt_include}/fmt" "${MLLM_FMT_SHIM_DIR}/fmt" SYMBOLIC)
endif()

# The wheel's libtorch.so exports a few std::filesystem functions of its own (a statically linked
# libstdc++ piece, pytorch/pytorch#133437); when an executable lists libtorch.so before
# libstdc++.so.6, the dynamic linker binds our std::filesystem calls to those copies, and e.g.
# std::filesystem::remove_all jumps to a null pointer. Naming libstdc++ first on every link line
# (before the objects, kept even if "unneeded") puts it first in the lookup order.
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state>")
endif()
