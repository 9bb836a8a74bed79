# cross.cmake — what a cross build (cmake/aarch64-linux-gnu.cmake) needs
# beyond the toolchain file, included by CMakeLists.txt before its tests.
#
# KS_CLI_RUN is the command the shell-level tests (tests/cli/*.sh,
# tests/server/*.sh) and the tests that spawn the CLI (KS_CLI) run as
# `kvsieve`.  Natively it is the CLI itself.  In a cross build CTest starts
# the test programs through CMAKE_CROSSCOMPILING_EMULATOR, but a script that
# runs the CLI itself would hand an arm64 binary to the host kernel, and
# containers rarely have binfmt_misc to forward it to QEMU: so the CLI is
# reached through a generated two-line wrapper that execs the emulator.
if(CMAKE_CROSSCOMPILING AND CMAKE_CROSSCOMPILING_EMULATOR)
  list(JOIN CMAKE_CROSSCOMPILING_EMULATOR " " ks_emu)
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/emu/kvsieve
       CONTENT "#!/bin/sh\nexec ${ks_emu} $<TARGET_FILE:kvsieve_cli> \"$@\"\n"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(KS_CLI_RUN ${CMAKE_BINARY_DIR}/emu/kvsieve)
else()
  set(KS_CLI_RUN $<TARGET_FILE:kvsieve_cli>)
endif()

# GCC 12 for aarch64 stops with an internal compiler error
# (vect_transform_reduction) on a double-precision reduction loop in
# tests/test_spec.c; the test's arithmetic is its reference, not a kernel,
# so its vectorisation is simply turned off there.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64" AND CMAKE_C_COMPILER_ID STREQUAL "GNU"
   AND CMAKE_C_COMPILER_VERSION VERSION_LESS 13)
  set(KS_TEST_SPEC_OPTIONS -fno-tree-vectorize)
endif()

# Tests left out of the emulated run (`make test-arm` passes -LE emu_slow).
# QEMU's user-mode emulation runs NEON code one to two orders of magnitude
# slower than the host runs its own, so tests that take seconds natively
# take many minutes emulated: the HTTP server drivers (each starts servers
# and streams hundreds of requests; they test the scheduler and the protocol,
# which have no architecture-specific code), the CLI end-to-end scripts that
# generate and run whole models (cli_run, cli_eval, cli_chess,
# cli_perplexity, cli_model, cli_prefill_policy, cli_bad_input), and the
# long sweeps whose subject is not a kernel: test_alloc_fail (every
# allocation of a forward pass refused in turn), test_prefix (prefix-cache
# files), test_memplan, test_p_freekv.  The kernels' own tests, the goldens
# and the full-budget equality of every policy with dense (test_policy) all
# stay in.
function(ks_label_emu_slow)
  set(slow test_alloc_fail test_prefix test_memplan test_p_freekv
      cli_run cli_eval cli_chess cli_perplexity cli_model cli_prefill_policy cli_bad_input)
  foreach(drv curl invariance openai_node load memcap bench prefix prefix_load multiturn openai_node_chat
              api chat oom sched)
    list(APPEND slow server_${drv})
  endforeach()
  foreach(t ${slow})
    if(TEST ${t})
      set_tests_properties(${t} PROPERTIES LABELS emu_slow)
    endif()
  endforeach()
  # The rest keep their native time limits times six: emulated, the goldens
  # (a few seconds natively) ran past 600 s on a loaded 2-core host.
  get_property(all DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY TESTS)
  foreach(t ${all})
    # Scripts that read the host's /proc/cpuinfo for x86 features must know
    # the CLI they run is another architecture's (tests/cli/model.sh).
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "KS_TEST_TARGET=${CMAKE_SYSTEM_PROCESSOR}")
    get_test_property(${t} TIMEOUT limit)
    if(limit)
      math(EXPR limit "${limit} * 6")
      set_tests_properties(${t} PROPERTIES TIMEOUT ${limit})
    endif()
  endforeach()
endfunction()
if(CMAKE_CROSSCOMPILING)
  cmake_language(DEFER CALL ks_label_emu_slow)
endif()
