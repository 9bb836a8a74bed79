# aarch64-linux-gnu.cmake — cross-compile kvsieve for 64-bit ARM Linux on a
# Debian x86-64 host, and run its tests under QEMU user-mode emulation.
#
# Why this shape.  Debian ships everything needed: the cross compiler
# (gcc-aarch64-linux-gnu), QEMU's user-mode emulator (qemu-user) and, through
# multiarch (`dpkg --add-architecture arm64`), the arm64 builds of the -dev
# packages kvsieve links (PCRE2, cJSON, cmocka, libmicrohttpd), installed
# beside the host's in /usr/lib/aarch64-linux-gnu.  `scripts/deps.sh --arm`
# installs all of it and `make test-arm` uses this file (README.md, "aarch64
# Linux").  CMAKE_CROSSCOMPILING_EMULATOR makes CTest start every test
# program through qemu-aarch64; the shell-level tests that start the CLI
# themselves get a wrapper script instead (CMakeLists.txt, KS_CLI_RUN).  The
# emulated CPU is QEMU's default, or the one named by the QEMU_CPU
# environment variable, which qemu-user reads at start: `max` has every
# extension QEMU implements (dotprod, i8mm), `cortex-a53` none of them, so
# the suite runs once per family of kernels (src/core/platform.c decides).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and headers of the target only; programs (cmake, pkg-config) of
# the host.  Multiarch keeps arm64 libraries in /usr/lib/aarch64-linux-gnu,
# under the host's own root, so the root path is / and pkg-config is pointed
# at the arm64 .pc files alone.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

find_program(KS_QEMU_AARCH64 qemu-aarch64)
if(KS_QEMU_AARCH64)
  # The dynamic loader must come from the same glibc build as the libc.so.6
  # it loads.  With multiarch libc6:arm64 installed (the -dev:arm64 packages
  # pull it in) both are under / and QEMU needs no prefix; `-L
  # /usr/aarch64-linux-gnu` would take the cross toolchain's loader (a
  # different Debian revision) with multiarch's libc, whose private layouts
  # differ: pthread_create then walks a garbage stack-cache list forever.
  # The prefix serves hosts that have only the cross toolchain's libc.
  if(EXISTS /lib/ld-linux-aarch64.so.1)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${KS_QEMU_AARCH64})
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${KS_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
  endif()
endif()
