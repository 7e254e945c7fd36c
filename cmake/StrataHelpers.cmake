# Shared compile settings for every strata target.
add_library(strata_flags INTERFACE)
target_compile_options(strata_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${STRATA_WERROR}>>:-Werror>)

if(STRATA_SANITIZER STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(STRATA_SANITIZER STREQUAL "undefined")
  add_compile_options(-fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=undefined)
elseif(STRATA_SANITIZER STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT STRATA_SANITIZER STREQUAL "")
  message(FATAL_ERROR "STRATA_SANITIZER must be address, undefined or thread (got '${STRATA_SANITIZER}')")
endif()

# The fuzz build (STRATA_BUILD_FUZZERS, preset `fuzz`): every library is compiled with libFuzzer's coverage
# instrumentation plus ASan+UBSan, so that a bug deep in a parser is seen; only the harnesses link the
# libFuzzer driver (-fsanitize=fuzzer, in tests/fuzz/CMakeLists.txt). UBSan findings abort, so that
# libFuzzer records them as crashes.
if(STRATA_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRATA_BUILD_FUZZERS needs clang (libFuzzer); use `cmake --preset fuzz` "
                        "(got ${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(NOT STRATA_SANITIZER STREQUAL "")
    message(FATAL_ERROR "STRATA_BUILD_FUZZERS brings its own sanitizers; leave STRATA_SANITIZER empty")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()

# strata_library(NAME SOURCES ... DEPS ...): one library per folder, PUBLIC deps in layer order.
function(strata_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE strata_flags ${ARG_PRIVATE_DEPS})
endfunction()

# strata_keep_optimised(TARGET ...): -O1 for these targets in an unoptimised (Debug) sanitizer build, the
# asan preset: for the compute loops its tests spend their time in (cpu_kernels_test took 255 s of its
# 300 s timeout at -O0, 72 s at -O1). Still instrumented.
function(strata_keep_optimised)
  if(STRATA_SANITIZER AND CMAKE_BUILD_TYPE STREQUAL "Debug")
    foreach(t IN LISTS ARGN)
      target_compile_options(${t} PRIVATE -O1)
    endforeach()
  endif()
endfunction()

# strata_test(NAME SOURCES ... DEPS ... LABELS ...): a GoogleTest binary registered with ctest.
function(strata_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main strata_flags)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "unit;${ARG_LABELS}")
  strata_label_targets(LABELS unit ${ARG_LABELS} TARGETS ${name})
endfunction()

# strata_label_targets(LABELS ... TARGETS ...): the tests of these labels need these targets built.
# strata_test calls it; a test added with add_test and labelled unit or tsan calls it itself. The
# target strata_tests_<label> (strata_test_label_targets) builds them, so that a sanitizer preset builds
# only what its tests run (CMakePresets.json: asan builds strata_tests_unit, tsan strata_tests_tsan).
function(strata_label_targets)
  cmake_parse_arguments(ARG "" "" "LABELS;TARGETS" ${ARGN})
  foreach(label IN LISTS ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY STRATA_LABEL_TARGETS_${label} ${ARG_TARGETS})
  endforeach()
endfunction()

# strata_test_label_targets(LABEL ...): after every test is added, one target strata_tests_<label> each.
function(strata_test_label_targets)
  foreach(label IN LISTS ARGN)
    get_property(targets GLOBAL PROPERTY STRATA_LABEL_TARGETS_${label})
    add_custom_target(strata_tests_${label})
    if(targets)
      list(REMOVE_DUPLICATES targets)
      add_dependencies(strata_tests_${label} ${targets})
    endif()
  endforeach()
endfunction()
