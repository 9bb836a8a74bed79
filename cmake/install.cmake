# install.cmake — `make install` (cmake --install): the kvsieve binary, the
# public headers (include/*.h), the modules' static libraries and a
# pkg-config file, included at the end of CMakeLists.txt.
#
# The libraries go into LIBDIR/kvsieve/ (their names, libks_core.a and so
# on, are ours alone and should not crowd LIBDIR); kvsieve.pc lists them in
# link order, dependents first, with the Debian libraries they need as
# Requires, so `cc app.c $(pkg-config --cflags --libs kvsieve)` links a
# program against the engine and the server.  The .pc file finds its prefix
# from its own place (${pcfiledir}), so a tree installed with --prefix or
# DESTDIR and moved elsewhere still works.
include(GNUInstallDirs)

install(TARGETS kvsieve_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
file(GLOB KS_PUBLIC_HEADERS ${CMAKE_SOURCE_DIR}/include/*.h)
install(FILES ${KS_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(KS_PC_LIBS "")
set(KS_INSTALL_LIBS "")
foreach(m ${KS_MODULES})          # declaration order: each module after those it uses
  if(m STREQUAL "cuda")           # optional and unused by the engine: not installed
    continue()
  endif()
  list(APPEND KS_INSTALL_LIBS ks_${m})
  set(KS_PC_LIBS "-lks_${m} ${KS_PC_LIBS}")
endforeach()
install(TARGETS ${KS_INSTALL_LIBS} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}/kvsieve)

# from LIBDIR/pkgconfig back up to the prefix
file(RELATIVE_PATH KS_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" KS_PC_UP "${KS_PC_UP}")
set(KS_PC_REQUIRES "libpcre2-8 libcjson")
if(TARGET ks_server)
  string(APPEND KS_PC_REQUIRES " libmicrohttpd")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/kvsieve.pc.in ${CMAKE_BINARY_DIR}/kvsieve.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kvsieve.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The test: install into a scratch prefix, build a program with only
# pkg-config's flags, run it on the fixture model (tests/install/install.sh).
add_test(NAME install_pkgconfig
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/install.sh ${CMAKE_BINARY_DIR} ${KS_FIXTURES_DIR}
                 ${CMAKE_BINARY_DIR}/install_pkgconfig ${CMAKE_C_COMPILER})
set_tests_properties(install_pkgconfig PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
# A sanitized build installs instrumented libraries: whoever links them needs
# the sanitizer runtimes too, as any consumer of such a tree would.
if(KVSIEVE_SANITIZE)
  set_tests_properties(install_pkgconfig PROPERTIES ENVIRONMENT "KS_CONSUMER_LDFLAGS=-fsanitize=address,undefined")
endif()
# A cross build's programs run through its emulator (cmake/cross.cmake).
if(CMAKE_CROSSCOMPILING AND CMAKE_CROSSCOMPILING_EMULATOR)
  list(JOIN CMAKE_CROSSCOMPILING_EMULATOR " " ks_install_emu)
  set_property(TEST install_pkgconfig APPEND PROPERTY ENVIRONMENT "KS_TEST_EMULATOR=${ks_install_emu}")
endif()
