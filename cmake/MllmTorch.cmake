# Finds LibTorch inside PyPI's `torch` wheel (pinned by launch/install-deps.sh) and makes it usable
# next to Debian's C++ libraries. Defines the imported target `torch` (find_package(Torch), or the
# CPU part alone, below) and:
#   MLLM_TORCH_VERSION      e.g. 2.11.0
#   MLLM_TORCH_CUDA         CUDA version of the LibTorch this build links with its CUDA part (e.g.
#                           13.0), empty for a CPU build
#   MLLM_CUDA_BUILD         TRUE when LibTorch's CUDA part is linked (a CUDA toolkit was found)
#   MLLM_CUDA_BUILD_NOTE    for a CPU build: why, and how to get the GPU build
#   MLLM_CUDA_TOOLKIT       where the CUDA toolkit came from: "system" | "wheels" | "" (CPU build)
#   MLLM_TORCH_HAS_CUDA_PART  the LibTorch found has a CUDA part (libtorch_cuda.so), linked or not
#   MLLM_TORCH_SITE         the site-packages folder holding torch/ and nvidia/ (empty when LibTorch
#                           was given by Torch_DIR / CMAKE_PREFIX_PATH instead of a Python)
#   MLLM_GPU_COUNT          CUDA devices visible to LibTorch at configure time (0 without a GPU,
#                           and 0 in a CPU build)
#
# Where LibTorch comes from, first match wins:
#   1. -DTorch_DIR=... or a CMAKE_PREFIX_PATH holding TorchConfig.cmake (a LibTorch zip, say);
#   2. -DMLLM_PYTHON=/path/to/python3 whose `import torch` works;
#   3. <source>/.venv/bin/python3 (what launch/install-deps.sh creates);
#   4. python3 on PATH.
#
# CUDA or not (MLLM_WITH_CUDA: AUTO | ON | OFF). PyPI's Linux torch wheel is a CUDA build, and its
# CMake config (Caffe2Config -> public/cuda.cmake) stops without a CUDA toolkit ("Your installed
# Caffe2 version uses CUDA but I cannot find the CUDA libraries"), which most machines that first
# try mllm do not have. The toolkit is looked for in this order: CMAKE_CUDA_COMPILER / CUDACXX,
# nvcc on PATH or in /usr/local/cuda (CMake's own search), then NVIDIA's PyPI wheels of the
# torch wheel's CUDA version in the same site-packages (nvidia/cuNN/bin/nvcc, which
# `launch/install-deps.sh --cuda-wheels` installs). With one, the build is the CUDA build it
# always was (NCCL, GPU tests). Without one (AUTO), or with MLLM_WITH_CUDA=OFF, it is a CPU
# build: the wheel's libtorch_cpu and libc10 are imported without TorchConfig, nothing of
# LibTorch's CUDA part is linked or loaded, so the programs train on CPUs and refuse
# train.device=cuda / dist.backend=nccl with a message saying how to build for GPUs.
# MLLM_WITH_CUDA=ON stops here when no toolkit is found.
# Snags handled here are listed in ../shared/notes/libtorch-from-pip.md.

set(MLLM_TORCH_MIN_VERSION 2.11)   # the version on our GPU machines; older ones are not tested
set(MLLM_PYTHON "" CACHE FILEPATH
    "Python whose torch package provides LibTorch (default: <source>/.venv/bin/python3, then python3)")
# Hopper (H100/H200) by default: the GPU machines we test on. Torch's CMake config otherwise
# probes for a GPU and, finding none, compiles CUDA code for a dozen architectures.
set(MLLM_CUDA_ARCH "9.0" CACHE STRING "TORCH_CUDA_ARCH_LIST for CUDA code (e.g. '8.0;9.0')")

set(MLLM_WITH_CUDA AUTO CACHE STRING
    "LibTorch's CUDA part: AUTO (when a CUDA toolkit is found) | ON (required) | OFF (a CPU build)")
set_property(CACHE MLLM_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MLLM_WITH_CUDA}" _mllm_cuda_mode)
if(NOT _mllm_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MLLM_WITH_CUDA must be AUTO, ON or OFF, not '${MLLM_WITH_CUDA}'")
endif()

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

# The LibTorch folder (lib/, include/, share/cmake/), known before find_package(Torch): whether
# it has a CUDA part decides whether a toolkit is needed at all.
set(_mllm_torch_root "")
if(_mllm_from_python)
  set(_mllm_torch_root "${_mllm_py_site}/torch")
else()
  set(_mllm_torch_dir_hint "${Torch_DIR}")
  if(NOT _mllm_torch_dir_hint AND DEFINED ENV{Torch_DIR})
    set(_mllm_torch_dir_hint "$ENV{Torch_DIR}")
  endif()
  find_path(_mllm_torch_config_dir TorchConfig.cmake HINTS ${_mllm_torch_dir_hint}
            PATH_SUFFIXES share/cmake/Torch NO_CACHE)
  if(_mllm_torch_config_dir)
    get_filename_component(_mllm_torch_root "${_mllm_torch_config_dir}/../../.." ABSOLUTE)
  endif()
endif()
set(_mllm_torch_has_cuda FALSE)
if(_mllm_torch_root AND EXISTS "${_mllm_torch_root}/lib/libtorch_cuda.so")
  set(_mllm_torch_has_cuda TRUE)
endif()
set(MLLM_TORCH_HAS_CUDA_PART ${_mllm_torch_has_cuda})

# nvcc's "release 13.0," as 13.0; empty when it does not run (a broken or hidden copy).
function(_mllm_nvcc_release nvcc out)
  execute_process(COMMAND "${nvcc}" --version RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_QUIET)
  set(release "")
  if(rc EQUAL 0 AND text MATCHES "release ([0-9]+\\.[0-9]+)")
    set(release "${CMAKE_MATCH_1}")
  endif()
  set(${out} "${release}" PARENT_SCOPE)
endfunction()

set(MLLM_CUDA_BUILD FALSE)
set(MLLM_CUDA_TOOLKIT "")
set(MLLM_CUDA_BUILD_NOTE "")
if(NOT _mllm_torch_has_cuda)
  set(MLLM_CUDA_BUILD_NOTE "the LibTorch at ${_mllm_torch_root} has no CUDA (a CPU-only torch)")
elseif(_mllm_cuda_mode STREQUAL "OFF")
  set(MLLM_CUDA_BUILD_NOTE "LibTorch's CUDA part left out: configured with -DMLLM_WITH_CUDA=OFF")
else()
  # NVIDIA's PyPI wheels next to torch put a CUDA major version in one folder (nvidia/cu13).
  set(_mllm_wheel_toolkit "")
  string(REGEX REPLACE "\\..*" "" _mllm_cuda_major "${_mllm_py_cuda}")
  if(_mllm_cuda_major)
    get_filename_component(_mllm_wheel_toolkit "${_mllm_torch_root}/../nvidia/cu${_mllm_cuda_major}"
                           ABSOLUTE)
  endif()
  # 1. A compiler given (CMAKE_CUDA_COMPILER, CUDACXX) or nvcc on PATH: CMake's own search, as
  #    before. A failed search is not kept in the cache, so a toolkit installed later is found
  #    by the next configure.
  if(IS_ABSOLUTE "${CMAKE_CUDA_COMPILER}" AND NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    unset(CMAKE_CUDA_COMPILER CACHE)   # found by an earlier configure, gone since
    unset(CMAKE_CUDA_COMPILER)
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    unset(CMAKE_CUDA_COMPILER CACHE)
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  # 2. The toolkit's usual place, off PATH (NVIDIA's Debian packages do not add it to PATH);
  # 3. the compiler from NVIDIA's wheels (launch/install-deps.sh --cuda-wheels).
  if(NOT CMAKE_CUDA_COMPILER)
    # check_language leaves NOTFOUND behind, as a cache entry and a variable.
    unset(CMAKE_CUDA_COMPILER CACHE)
    unset(CMAKE_CUDA_COMPILER)
    set(_mllm_candidates /usr/local/cuda/bin/nvcc)
    if(_mllm_wheel_toolkit)
      list(APPEND _mllm_candidates "${_mllm_wheel_toolkit}/bin/nvcc")
    endif()
    foreach(_mllm_candidate IN LISTS _mllm_candidates)
      if(EXISTS "${_mllm_candidate}")
        _mllm_nvcc_release("${_mllm_candidate}" _mllm_release)
        if(_mllm_release)
          set(CMAKE_CUDA_COMPILER "${_mllm_candidate}" CACHE FILEPATH "CUDA compiler" FORCE)
          set(CMAKE_CUDA_COMPILER "${_mllm_candidate}")
          break()
        endif()
      endif()
    endforeach()
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(MLLM_CUDA_BUILD TRUE)
    set(MLLM_CUDA_TOOLKIT "system")
    if(_mllm_wheel_toolkit AND CMAKE_CUDA_COMPILER MATCHES "^${_mllm_wheel_toolkit}/")
      set(MLLM_CUDA_TOOLKIT "wheels")
      # FindCUDAToolkit and LibTorch's FindCUDA look for lib64/ and libcudart.so; the wheels ship
      # lib/libcudart.so.13 only. install-deps adds the two links.
      if(NOT EXISTS "${_mllm_wheel_toolkit}/lib64" OR
         NOT EXISTS "${_mllm_wheel_toolkit}/lib/libcudart.so")
        message(FATAL_ERROR "mllm: the CUDA toolkit from NVIDIA's wheels at "
                "${_mllm_wheel_toolkit} lacks lib64/ or lib/libcudart.so (the links "
                "launch/install-deps.sh --cuda-wheels makes). Run launch/install-deps.sh "
                "--cuda-wheels, or configure with -DMLLM_WITH_CUDA=OFF for a CPU build.")
      endif()
      set(CUDAToolkit_ROOT "${_mllm_wheel_toolkit}")
      set(CUDA_TOOLKIT_ROOT_DIR "${_mllm_wheel_toolkit}" CACHE PATH "CUDA toolkit (NVIDIA's wheels)"
          FORCE)
    endif()
  else()
    set(_mllm_places "on PATH or in /usr/local/cuda/bin")
    if(_mllm_wheel_toolkit)
      set(_mllm_places "on PATH, in /usr/local/cuda/bin or in ${_mllm_wheel_toolkit}/bin")
    endif()
    set(MLLM_CUDA_BUILD_NOTE
        "LibTorch's CUDA part left out: no CUDA toolkit found (no working nvcc ${_mllm_places})")
    if(_mllm_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "MLLM_WITH_CUDA=ON, but ${MLLM_CUDA_BUILD_NOTE}. Install the compiler "
              "from NVIDIA's PyPI wheels with launch/install-deps.sh --cuda-wheels, or set "
              "CMAKE_CUDA_COMPILER, or configure with -DMLLM_WITH_CUDA=AUTO or OFF for a CPU "
              "build.")
    endif()
  endif()
endif()

if(MLLM_CUDA_BUILD)
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "${MLLM_CUDA_ARCH}")
  endif()
  # Torch's config enables CUDA and warns that it ignores CMAKE_CUDA_ARCHITECTURES whenever that
  # is defined, which enable_language(CUDA) always does. Enable CUDA first and drop the default,
  # so the warning only appears for a value the user set; mllm's own CUDA targets set
  # CUDA_ARCHITECTURES from MLLM_CUDA_ARCH themselves.
  if(NOT (DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED CACHE{_MLLM_CUDA_ARCH_DEFAULTED}))
    enable_language(CUDA)
    unset(CMAKE_CUDA_ARCHITECTURES CACHE)
    unset(CMAKE_CUDA_ARCHITECTURES)
    set(_MLLM_CUDA_ARCH_DEFAULTED TRUE CACHE INTERNAL "")
  endif()
  # kineto is linked into libtorch_cpu in the wheels; TorchConfig still looks for a separate
  # library and warns. Point it at libtorch_cpu, which holds it.
  if(_mllm_from_python AND NOT kineto_LIBRARY AND EXISTS "${_mllm_torch_root}/lib/libtorch_cpu.so")
    set(kineto_LIBRARY "${_mllm_torch_root}/lib/libtorch_cpu.so" CACHE FILEPATH "kineto lives in libtorch_cpu")
  endif()
endif()

if(_mllm_torch_has_cuda AND NOT MLLM_CUDA_BUILD)
  # The CPU part of a CUDA LibTorch, imported by hand: TorchConfig would look for the toolkit.
  # libtorch.so is left out (it needs libtorch_cuda.so); libtorch_cpu.so and libc10.so hold every
  # CPU operator, the autograd engine and the C++ API. The definitions are torch_cpu's own
  # (share/cmake/Caffe2/Caffe2Targets.cmake), so that headers compile as they do for the CUDA
  # build. libtorch_cpu.so still needs libcudart and libcupti at load time (its profiler), which
  # it finds through its RPATH in the nvidia wheels; no CUDA code runs.
  foreach(_mllm_lib c10 torch_cpu)
    if(NOT EXISTS "${_mllm_torch_root}/lib/lib${_mllm_lib}.so")
      message(FATAL_ERROR "mllm: ${_mllm_torch_root}/lib/lib${_mllm_lib}.so not found; the "
              "LibTorch there is incomplete. Run launch/install-deps.sh again.")
    endif()
    add_library(${_mllm_lib} SHARED IMPORTED GLOBAL)
    set_target_properties(${_mllm_lib} PROPERTIES
      IMPORTED_LOCATION "${_mllm_torch_root}/lib/lib${_mllm_lib}.so"
      INTERFACE_INCLUDE_DIRECTORIES "${_mllm_torch_root}/include")
  endforeach()
  set_target_properties(torch_cpu PROPERTIES
    INTERFACE_LINK_LIBRARIES c10
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE")
  add_library(torch INTERFACE IMPORTED GLOBAL)
  set_target_properties(torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${_mllm_torch_root}/include;${_mllm_torch_root}/include/torch/csrc/api/include"
    INTERFACE_LINK_LIBRARIES "torch_cpu;c10"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
  set(TORCH_INSTALL_PREFIX "${_mllm_torch_root}")
  set(Torch_DIR "${_mllm_torch_root}/share/cmake/Torch" CACHE PATH "LibTorch's CMake folder" FORCE)
  file(STRINGS "${Torch_DIR}/TorchConfigVersion.cmake" _mllm_version_line
       REGEX "set\\(PACKAGE_VERSION \"[0-9.]+\"\\)")
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" Torch_VERSION "${_mllm_version_line}")
  set(Torch_FOUND TRUE)
else()
  find_package(Torch QUIET)
endif()
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
if(NOT MLLM_CUDA_BUILD)
  set(MLLM_TORCH_CUDA "")
  set(MLLM_GPU_COUNT 0)
elseif(_mllm_from_python)
  set(MLLM_TORCH_CUDA "${_mllm_py_cuda}")
else()
  set(MLLM_TORCH_CUDA "${CUDAToolkit_VERSION}")
  find_program(_mllm_nvidia_smi nvidia-smi)
  if(_mllm_nvidia_smi)
    execute_process(COMMAND ${_mllm_nvidia_smi} -L RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "GPU [0-9]+:" gpus "${out}")
      list(LENGTH gpus MLLM_GPU_COUNT)
    endif()
  endif()
endif()

# The one configure line that says which build this is.
if(MLLM_CUDA_BUILD)
  if(MLLM_CUDA_TOOLKIT STREQUAL "wheels")
    set(_mllm_from "NVIDIA's wheels at ${CUDAToolkit_ROOT}")
  else()
    set(_mllm_from "${CMAKE_CUDA_COMPILER}")
  endif()
  message(STATUS "mllm: build: CUDA ${MLLM_TORCH_CUDA} (LibTorch ${MLLM_TORCH_VERSION} with its "
                 "CUDA part; nvcc from ${_mllm_from})")
else()
  set(_mllm_gpu_hint "")
  if(_mllm_py_gpus GREATER 0)
    string(CONCAT _mllm_gpu_hint "; ${_mllm_py_gpus} GPU(s) visible: launch/install-deps.sh "
           "--cuda-wheels, then configure again, gives the GPU build")
  endif()
  message(STATUS "mllm: build: CPU only (LibTorch ${MLLM_TORCH_VERSION}; ${MLLM_CUDA_BUILD_NOTE}; "
                 "NCCL and the GPU tests left out${_mllm_gpu_hint})")
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
