# Cross-compiling for 64-bit Arm Linux with the GNU cross toolchain
# (Debian/Ubuntu: g++-aarch64-linux-gnu), e.g. against the aarch64 ExecuTorch
# wheel's C++ SDK:
#
#   cmake -S kernels/runner -B build-aarch64 \
#     -DCMAKE_TOOLCHAIN_FILE=kernels/cmake/aarch64-linux-gnu.toolchain.cmake \
#     -DCMAKE_PREFIX_PATH=<aarch64 sdk>/executorch/share/cmake
#
# Run the result with qemu-user:
#   qemu-aarch64 -L /usr/aarch64-linux-gnu ./build-aarch64/etfuse_runner m.pte
#
# Overridable on the command line: AARCH64_TOOLCHAIN_PREFIX (default
# aarch64-linux-gnu-) and AARCH64_SYSROOT (default /usr/aarch64-linux-gnu).

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DEFINED AARCH64_TOOLCHAIN_PREFIX)
  set(AARCH64_TOOLCHAIN_PREFIX aarch64-linux-gnu-)
endif()
if(NOT DEFINED AARCH64_SYSROOT)
  set(AARCH64_SYSROOT /usr/aarch64-linux-gnu)
endif()
# Try-compiles run in their own projects; hand them the same settings.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES AARCH64_TOOLCHAIN_PREFIX
     AARCH64_SYSROOT)

set(CMAKE_C_COMPILER ${AARCH64_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${AARCH64_TOOLCHAIN_PREFIX}g++)

set(CMAKE_FIND_ROOT_PATH ${AARCH64_SYSROOT})
# Programs (code generators, python) come from the build machine.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Packages, libraries and headers: the sysroot first, then the host paths as
# given. BOTH rather than ONLY so that a package outside the sysroot, such as
# an unpacked aarch64 wheel named in CMAKE_PREFIX_PATH, is still found.
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)

# Tests run through qemu-user when CMake needs to execute a target binary
# (try_run, add_test with a target), if qemu-aarch64 is installed.
find_program(_aarch64_qemu qemu-aarch64)
if(_aarch64_qemu AND NOT CMAKE_CROSSCOMPILING_EMULATOR)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${_aarch64_qemu} -L ${AARCH64_SYSROOT})
endif()
unset(_aarch64_qemu)
