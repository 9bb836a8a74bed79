# server.cmake — the scheduler and the OpenAI-compatible server (issue 19),
# included at the end of CMakeLists.txt.
#
# ks_sched (src/sched/) and ks_server (src/server/) sit above the engine and
# use only its public API (include/kvsieve.h).  CMakeLists.txt declares
# ks_sched as an engine module (ks_module, inside the umbrella `kvsieve`);
# where it does not, it is declared here the same way by hand.  ks_server is
# declared with ks_module above sched, so "server/server.h" resolves only for
# targets that link it.  HTTP is Debian's libmicrohttpd (pkg-config).
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)

function(ks_server_own_module name)   # a module by hand, for trees without ks_module
  cmake_parse_arguments(PARSE_ARGV 1 M "" "" "LIBS")
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/include-roots/${name})
  file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${name} ${CMAKE_BINARY_DIR}/include-roots/${name}/${name} SYMBOLIC)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${name}/*.c)
  add_library(ks_${name} STATIC ${srcs})
  target_include_directories(ks_${name} PUBLIC ${CMAKE_BINARY_DIR}/include-roots/${name})
  target_link_libraries(ks_${name} PUBLIC ${M_LIBS})
endfunction()

if(NOT TARGET ks_sched)
  ks_server_own_module(sched LIBS kvsieve Threads::Threads)
endif()
if(COMMAND ks_module)
  ks_module(server HEADER server.h DEPS sched LIBS PkgConfig::MHD PkgConfig::CJSON Threads::Threads m)
else()
  ks_server_own_module(server LIBS ks_sched kvsieve PkgConfig::MHD PkgConfig::CJSON Threads::Threads m)
endif()

# `kvsieve serve` (app/cmd_serve.c is picked up by the CLI's glob)
target_link_libraries(ks_cli_link INTERFACE $<LINK_ONLY:ks_server>)   # include/kvsieve_server.h is its API

# ---------------------------------------------------------------- tests --
# cmocka programs in tests/server/test_*.c, and shell drivers that start the
# server on a free loopback port (--port 0) and talk to it with curl, Python
# (load.py, tools/bench_serve.py) and the official OpenAI Node client: curl
# (routes, errors, disconnects, shutdown), invariance (outputs equal to
# `kvsieve run` among other requests and policies), openai_node, load (64
# requests over 16 clients), memcap (offload under --mem-cap, waiting,
# refusal), bench (a smoke run of tools/bench_serve.py), prefix (the prefix
# cache: follow-ups, replicas and restarts on one --cache-dir, bad files),
# prefix_load (64 requests on 4 shared documents under a small cache and a
# memory cap), structured (response_format: schema-constrained answers).  A driver lacking an
# optional tool exits 77 (skipped).  Every test is bounded in time.
file(GLOB KS_SERVER_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/server/test_*.c)
foreach(src ${KS_SERVER_TESTS})
  get_filename_component(name ${src} NAME_WE)
  string(REGEX REPLACE "^test_" "server_" tname ${name})
  add_executable(${tname} ${src} ${CMAKE_SOURCE_DIR}/tests/testutil.c)
  target_include_directories(${tname} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(${tname} PRIVATE KS_FIXTURES_DIR="${KS_FIXTURES_DIR}" KS_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(${tname} PRIVATE ks_server PkgConfig::CMOCKA)
  add_test(NAME ${tname} COMMAND ${tname})
  set_tests_properties(${tname} PROPERTIES TIMEOUT 120 ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=stdout")
endforeach()

foreach(drv curl invariance openai_node load memcap bench prefix prefix_load structured)
  add_test(NAME server_${drv}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/server/${drv}.sh ${KS_CLI_RUN} ${KS_FIXTURES_DIR}
                   ${CMAKE_BINARY_DIR}/server_${drv})
  set_tests_properties(server_${drv} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endforeach()
# structured.sh's 28 constrained answers mask the vocabulary at every step
set_tests_properties(server_structured PROPERTIES TIMEOUT 400)
# Multi-turn chat: multiturn.sh (a python client, bundled model and a
# phi-3-template model) and openai_node_chat.sh (the OpenAI Node SDK, streaming);
# openai_node_tools.sh: a tool-call round trip through the SDK;
# chat_page.sh: the chat page (GET /) in headless chromium through puppeteer-core;
# tokens.sh: /tokenize, /detokenize, /apply-template.
foreach(drv multiturn openai_node_chat openai_node_tools chat_page tokens)
  add_test(NAME server_${drv}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/server/${drv}.sh ${KS_CLI_RUN} ${KS_FIXTURES_DIR}
                   ${CMAKE_BINARY_DIR}/server_${drv})
  set_tests_properties(server_${drv} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endforeach()

# libFuzzer on the request-body parser (see `make fuzz`).
if(CMAKE_C_COMPILER_ID STREQUAL "Clang" AND KVSIEVE_FUZZ)
  add_executable(fuzz_request ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_request.c)
  target_compile_options(fuzz_request PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_request PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_request PRIVATE ks_server)
endif()

# The chat page (GET /): src/server/web/* as byte arrays (cmake/embed_web.cmake),
# compiled into ks_server, rebuilt when a file of the page changes.
file(GLOB KS_WEB_FILES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/server/web/*)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/web_assets.c
                   COMMAND ${CMAKE_COMMAND} -DWEB_DIR=${CMAKE_SOURCE_DIR}/src/server/web
                           -DOUT=${CMAKE_BINARY_DIR}/web_assets.c -P ${CMAKE_SOURCE_DIR}/cmake/embed_web.cmake
                   DEPENDS ${KS_WEB_FILES} ${CMAKE_SOURCE_DIR}/cmake/embed_web.cmake
                   COMMENT "Embedding the chat page (src/server/web)")
target_sources(ks_server PRIVATE ${CMAKE_BINARY_DIR}/web_assets.c)
