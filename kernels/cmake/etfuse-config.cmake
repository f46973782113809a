# The etfuse kernels as a CMake package (the folder etfuse.kernels.cmake_prefix_path names):
#
#   find_package(executorch CONFIG REQUIRED)
#   find_package(etfuse CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE etfuse::kernels executorch::kernels_optimized)
#
# etfuse::kernels compiles the kernel sources shipped with the package (../csrc) with the
# consumer's own toolchain, so a toolchain file is all a cross build needs. Its kernels register
# themselves in static initializers: the target links the archive whole (or the shared library
# --no-as-needed), so linking it is all an application does.
#
# Cache variables a consumer may set:
#   ETFUSE_KERNELS_SHARED=ON    libetfuse_kernels.so.<major> instead of a static archive
#   ETFUSE_SELECT_OPS_LIST      "etfuse::conv2d_bn_act.out,etfuse::add_relu.out": build only the
#                               op files these ops need (the names executorch's runtime uses)
#   ETFUSE_SELECT_OPS_MODEL     "a.pte;b.pte": only the etfuse ops these programs call, read at
#                               configure time by `${ETFUSE_PYTHON} -m etfuse ops` (relative
#                               paths are taken from CMAKE_SOURCE_DIR); with the LIST, the union
#   ETFUSE_PYTHON               a Python with etfuse installed (default: find_package(Python3))
#   ETFUSE_BUILD_RUNNER=ON      also the executable etfuse_runner (../runner/etfuse_runner.cpp)
#
# Sets ETFUSE_KERNELS_OPS (the ops etfuse::kernels registers) and ETFUSE_KERNELS_OP_FILES_BUILT.

# $<LINK_LIBRARY:WHOLE_ARCHIVE> needs 3.24; executorch's imported targets need 3.28.
if(CMAKE_VERSION VERSION_LESS 3.28)
  set(etfuse_FOUND FALSE)
  string(CONCAT etfuse_NOT_FOUND_MESSAGE "etfuse::kernels needs CMake 3.28 or newer (this is ${CMAKE_VERSION}), "
                                        "as executorch's imported targets do")
  return()
endif()

if(NOT TARGET executorch::runtime)
  include(CMakeFindDependencyMacro)
  find_dependency(executorch CONFIG)
endif()
foreach(_etfuse_dependency IN ITEMS executorch::runtime executorch::threadpool)
  if(NOT TARGET ${_etfuse_dependency})
    set(etfuse_FOUND FALSE)
    string(CONCAT etfuse_NOT_FOUND_MESSAGE "etfuse::kernels needs ${_etfuse_dependency}, which the ExecuTorch package "
                                          "(${executorch_DIR}) does not define: the kernels run on executorch's thread pool")
    return()
  endif()
endforeach()
unset(_etfuse_dependency)

option(ETFUSE_KERNELS_SHARED "etfuse::kernels as a shared library (libetfuse_kernels.so.<major>)" OFF)
set(ETFUSE_SELECT_OPS_LIST "" CACHE STRING "Build only the op files of these ops (etfuse::<op>.out, comma separated)")
set(ETFUSE_SELECT_OPS_MODEL "" CACHE STRING "Build only the op files the etfuse ops of these .pte files need (a ;-list)")
set(ETFUSE_PYTHON "" CACHE FILEPATH "Python with etfuse installed, for ETFUSE_SELECT_OPS_MODEL (default: find_package(Python3))")
option(ETFUSE_BUILD_RUNNER "Also build the executable etfuse_runner" OFF)

# The etfuse ops the programs `models` call, by `python -m etfuse ops` (executorch's .pte
# reader), into `out_var`. Cached by the files' hashes: the interpreter takes seconds to start.
function(_etfuse_model_ops out_var models)
  set(files)
  set(key)
  foreach(model IN LISTS models)
    cmake_path(ABSOLUTE_PATH model BASE_DIRECTORY "${CMAKE_SOURCE_DIR}" NORMALIZE OUTPUT_VARIABLE file)
    if(NOT EXISTS "${file}" OR IS_DIRECTORY "${file}")
      message(FATAL_ERROR "ETFUSE_SELECT_OPS_MODEL: ${model}: no such file (${file}; relative paths are taken "
                          "from CMAKE_SOURCE_DIR)")
    endif()
    file(SHA256 "${file}" hash)
    list(APPEND files "${file}")
    string(APPEND key "${file}:${hash};")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
  endforeach()

  if(ETFUSE_PYTHON)
    set(python "${ETFUSE_PYTHON}")
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(NOT Python3_Interpreter_FOUND)
      message(FATAL_ERROR "ETFUSE_SELECT_OPS_MODEL: no Python found to read the programs' ops with; "
                          "set -DETFUSE_PYTHON=<python with etfuse installed>")
    endif()
    set(python "${Python3_EXECUTABLE}")
  endif()
  string(APPEND key "${python}")
  if(key STREQUAL "$CACHE{_ETFUSE_MODEL_OPS_KEY}")
    set(${out_var} "$CACHE{_ETFUSE_MODEL_OPS}" PARENT_SCOPE)
    return()
  endif()

  execute_process(
    COMMAND "${python}" -m etfuse ops --format cmake ${files}
    OUTPUT_VARIABLE ops
    ERROR_VARIABLE error
    RESULT_VARIABLE status
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0)
    string(STRIP "${error}" error)
    message(FATAL_ERROR "ETFUSE_SELECT_OPS_MODEL: `${python} -m etfuse ops` failed (${status}): ${error}\n"
                        "(set -DETFUSE_PYTHON=<python with etfuse installed> if this Python lacks etfuse)")
  endif()
  set(_ETFUSE_MODEL_OPS_KEY "${key}" CACHE INTERNAL "")
  set(_ETFUSE_MODEL_OPS "${ops}" CACHE INTERNAL "")
  set(${out_var} "${ops}" PARENT_SCOPE)
endfunction()

function(_etfuse_define_kernels)
  set(package_dir "${CMAKE_CURRENT_FUNCTION_LIST_DIR}")
  cmake_path(SET csrc NORMALIZE "${package_dir}/../csrc")
  include("${package_dir}/etfuse-kernels-sources.cmake")

  # op name -> its file, and every name, for the selection
  set(all_ops)
  foreach(file IN LISTS ETFUSE_KERNELS_OP_FILES)
    foreach(op IN LISTS ETFUSE_KERNELS_OPS_${file})
      set(file_of_${op} "${file}")
      list(APPEND all_ops "${op}")
    endforeach()
  endforeach()
  list(JOIN all_ops ", " valid)

  set(selected)
  set(selecting FALSE)
  if(NOT ETFUSE_SELECT_OPS_LIST STREQUAL "")
    set(selecting TRUE)
    string(REPLACE "," ";" listed "${ETFUSE_SELECT_OPS_LIST}")
    foreach(op IN LISTS listed)
      string(STRIP "${op}" op)
      if(op STREQUAL "")
        continue()
      endif()
      if(NOT DEFINED file_of_${op})
        set(hint "")
        if(DEFINED file_of_${op}.out)
          set(hint " (did you mean ${op}.out?)")
        endif()
        message(FATAL_ERROR "ETFUSE_SELECT_OPS_LIST: unknown op ${op}${hint}; etfuse's ops are: ${valid}")
      endif()
      list(APPEND selected "${op}")
    endforeach()
  endif()
  if(NOT ETFUSE_SELECT_OPS_MODEL STREQUAL "")
    set(selecting TRUE)
    _etfuse_model_ops(model_ops "${ETFUSE_SELECT_OPS_MODEL}")
    foreach(op IN LISTS model_ops)
      if(NOT DEFINED file_of_${op})
        message(FATAL_ERROR "ETFUSE_SELECT_OPS_MODEL: the programs (${ETFUSE_SELECT_OPS_MODEL}) call ${op}, which "
                            "this etfuse (${ETFUSE_KERNELS_VERSION}, ${package_dir}) has no kernel for; "
                            "its ops are: ${valid}")
      endif()
      list(APPEND selected "${op}")
    endforeach()
  endif()

  if(selecting)
    list(REMOVE_DUPLICATES selected)
    set(files)
    foreach(op IN LISTS selected)
      list(APPEND files "${file_of_${op}}")
    endforeach()
    list(REMOVE_DUPLICATES files)
    list(SORT files)
  else()
    set(files ${ETFUSE_KERNELS_OP_FILES})
  endif()
  # a file registers all its ops: those are what the library holds
  set(registered)
  foreach(file IN LISTS files)
    list(APPEND registered ${ETFUSE_KERNELS_OPS_${file}})
  endforeach()
  list(LENGTH files n_files)
  list(LENGTH ETFUSE_KERNELS_OP_FILES n_all)
  if(selecting)
    list(JOIN files ", " shown)
    message(STATUS "etfuse kernels: ${n_files} of ${n_all} op files, for the selected ops: ${shown}")
  else()
    message(STATUS "etfuse kernels: all ${n_all} op files")
  endif()

  set(sources ${ETFUSE_KERNELS_CORE_SOURCES} ${ETFUSE_KERNELS_ENTRY_SOURCE})
  foreach(file IN LISTS files)
    list(APPEND sources "ops/${file}.cpp")
  endforeach()
  list(TRANSFORM sources PREPEND "${csrc}/")

  if(ETFUSE_KERNELS_SHARED)
    add_library(etfuse_kernels SHARED ${sources})
    string(REGEX MATCH "^[0-9]+" major "${ETFUSE_KERNELS_VERSION}")
    set_target_properties(etfuse_kernels PROPERTIES VERSION "${ETFUSE_KERNELS_VERSION}" SOVERSION "${major}")
    target_link_libraries(etfuse_kernels PRIVATE executorch::runtime executorch::threadpool)
  else()
    add_library(etfuse_kernels STATIC ${sources})
    target_link_libraries(etfuse_kernels PUBLIC executorch::runtime executorch::threadpool)
  endif()
  set_target_properties(etfuse_kernels PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    CXX_STANDARD "${ETFUSE_KERNELS_CXX_STANDARD}"
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  target_compile_options(etfuse_kernels PRIVATE ${ETFUSE_KERNELS_COMPILE_OPTIONS})
  target_compile_definitions(etfuse_kernels PRIVATE ${ETFUSE_KERNELS_COMPILE_DEFINITIONS})
  target_include_directories(etfuse_kernels PRIVATE "${csrc}")
  set_source_files_properties("${csrc}/${ETFUSE_KERNELS_ENTRY_SOURCE}" TARGET_DIRECTORY etfuse_kernels
                              PROPERTIES COMPILE_DEFINITIONS "${ETFUSE_KERNELS_ENTRY_DEFINITIONS}")

  # What the application links: nothing in the kernels is referenced by name, so the archive
  # goes in whole, and the shared library stays needed under -Wl,--as-needed (one option with
  # the file in it: CMake drops repeated link options, executorch's targets do the same).
  add_library(etfuse_kernels_registered INTERFACE)
  if(ETFUSE_KERNELS_SHARED)
    target_link_libraries(etfuse_kernels_registered INTERFACE etfuse_kernels)
    if(CMAKE_SYSTEM_NAME STREQUAL "Linux" OR CMAKE_SYSTEM_NAME STREQUAL "Android")
      target_link_options(etfuse_kernels_registered INTERFACE
                          "LINKER:--push-state,--no-as-needed,$<TARGET_FILE:etfuse_kernels>,--pop-state")
    endif()
  else()
    target_link_libraries(etfuse_kernels_registered INTERFACE "$<LINK_LIBRARY:WHOLE_ARCHIVE,etfuse_kernels>")
  endif()

  set(ETFUSE_KERNELS_OPS "${registered}" PARENT_SCOPE)
  set(ETFUSE_KERNELS_OP_FILES_BUILT "${files}" PARENT_SCOPE)
endfunction()

function(_etfuse_define_runner)
  cmake_path(SET runner NORMALIZE "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../runner/etfuse_runner.cpp")
  if(NOT EXISTS "${runner}")
    message(FATAL_ERROR "ETFUSE_BUILD_RUNNER: ${runner} is missing from this etfuse package")
  endif()
  if(NOT TARGET executorch::kernels_optimized)
    message(FATAL_ERROR "ETFUSE_BUILD_RUNNER: etfuse_runner needs executorch::kernels_optimized, which the "
                        "ExecuTorch package (${executorch_DIR}) does not define")
  endif()
  add_executable(etfuse_runner "${runner}")
  set_target_properties(etfuse_runner PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_link_libraries(etfuse_runner PRIVATE etfuse::kernels executorch::kernels_optimized executorch::runtime
                                              executorch::threadpool)
  # etfuse's names no longer clash with executorch's quantized kernels: a program may use both;
  # and delegated programs run (as kernels/runner/CMakeLists.txt links them by default)
  foreach(optional IN ITEMS executorch::kernels_quantized executorch::backend_xnnpack)
    if(TARGET ${optional})
      target_link_libraries(etfuse_runner PRIVATE ${optional})
    endif()
  endforeach()
endfunction()

# Once per build: a second find_package (another subdirectory) only adds its alias.
if(NOT TARGET etfuse_kernels_registered)
  _etfuse_define_kernels()
  set(_ETFUSE_KERNELS_OPS "${ETFUSE_KERNELS_OPS}" CACHE INTERNAL "")
  set(_ETFUSE_KERNELS_OP_FILES_BUILT "${ETFUSE_KERNELS_OP_FILES_BUILT}" CACHE INTERNAL "")
else()
  set(ETFUSE_KERNELS_OPS "$CACHE{_ETFUSE_KERNELS_OPS}")
  set(ETFUSE_KERNELS_OP_FILES_BUILT "$CACHE{_ETFUSE_KERNELS_OP_FILES_BUILT}")
endif()
if(NOT TARGET etfuse::kernels)
  add_library(etfuse::kernels ALIAS etfuse_kernels_registered)
endif()
if(ETFUSE_BUILD_RUNNER AND NOT TARGET etfuse_runner)
  _etfuse_define_runner()
endif()
set(etfuse_FOUND TRUE)
