# aarch64-linux-clang.cmake — the cross build of aarch64-linux-gnu.cmake
# with clang instead of GCC: the same Debian sysroot, multiarch libraries and
# QEMU emulator, only the compiler differs.
#
# Why.  macOS builds with Apple clang, which no machine here has; what can be
# checked here is that clang (LLVM 16 or later, as Apple clang 15 is) accepts
# the NEON kernels' per-function target attributes and intrinsics and that
# what it makes passes the emulated suite (README.md, "macOS").  CC names the
# clang to use; otherwise the newest of clang-19 .. clang-16 found
# (`apt-get install clang-19` on Debian 12).  Clang's driver finds
# Debian's cross GCC runtime (crt files, libgcc) and binutils by the target
# triple.
include(${CMAKE_CURRENT_LIST_DIR}/aarch64-linux-gnu.cmake)
if(DEFINED ENV{CC} AND "$ENV{CC}" MATCHES "clang")
  set(ks_clang "$ENV{CC}")
else()
  find_program(ks_clang NAMES clang-19 clang-18 clang-17 clang-16 REQUIRED)
endif()
set(CMAKE_C_COMPILER ${ks_clang})
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
