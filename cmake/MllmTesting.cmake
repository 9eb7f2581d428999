# Test registration helpers.
#
# mllm_add_unit_tests(NAME name SOURCES ...)     one gtest binary, each TEST discovered by ctest.
# mllm_add_mpi_test(NAME name SOURCES ... NP 2 4 [TIMEOUT s] [LABELS ...])
#   one gtest binary run under `mpirun -np N` for each N, as ctest tests `name.npN`.
#   The helper (not the user) sets what OpenMPI needs as root and with more ranks than cores,
#   pins each rank to one intra-op thread, and exports MLLM_TEST_WORLD_SIZE=N so that a test can
#   fail when MPI came up with another world size (a world of one must not pass by accident).
include(GoogleTest)

set(MLLM_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMP_NUM_THREADS=1
  # No interconnect probing on a single machine: shared memory + loopback only.
  OMPI_MCA_btl=self,vader,tcp
  OMPI_MCA_btl_tcp_if_include=lo
  OMPI_MCA_oob_tcp_if_include=lo
  OMPI_MCA_pml=ob1)

function(mllm_test_target target)
  target_link_libraries(${target} PRIVATE mllm GTest::gtest GTest::gtest_main)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${target} PRIVATE
    MLLM_SOURCE_DIR="${PROJECT_SOURCE_DIR}" MLLM_BINARY_DIR="${PROJECT_BINARY_DIR}")
  mllm_use_pch(${target})
endfunction()

function(mllm_add_unit_tests)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  mllm_test_target(${T_NAME})
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 120
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit\\;${T_LABELS}" ENVIRONMENT "OMP_NUM_THREADS=2")
endfunction()

function(mllm_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;NP;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT TARGET ${T_NAME})
    add_executable(${T_NAME} ${T_SOURCES})
    mllm_test_target(${T_NAME})
  endif()
  foreach(np IN LISTS T_NP)
    add_test(NAME ${T_NAME}.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --bind-to none
              $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${T_NAME}.np${np} PROPERTIES
      TIMEOUT ${T_TIMEOUT}
      LABELS "mpi;${T_LABELS}"
      PROCESSORS ${np}
      ENVIRONMENT "${MLLM_MPI_TEST_ENV};MLLM_TEST_WORLD_SIZE=${np}")
  endforeach()
endfunction()
