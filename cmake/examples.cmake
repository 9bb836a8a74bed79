# examples/: programs that use kvsieve only through a public header, built and
# run by `make test`.  Each sees include/ and nothing else of kvsieve: it
# links the module libraries ($<LINK_ONLY:...>: their code, not their include
# roots), so an include of anything under src/ fails to compile.
#
# The libraries without their usage requirements: an INTERFACE target whose
# link interface names them through $<LINK_ONLY:...> (linked directly, a
# target's PUBLIC include directories would come along).
add_library(ks_examples_link INTERFACE)
target_link_libraries(ks_examples_link INTERFACE $<LINK_ONLY:ks_select> m)

# select_loop: a toy engine with its own KV cache asking kvsieve's selection
# policies which entries to attend (include/kvsieve_select.h).
add_executable(select_loop examples/select_loop.c)
target_include_directories(select_loop PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(select_loop PRIVATE ks_examples_link)
add_test(NAME example_select_loop COMMAND select_loop)
set_tests_properties(example_select_loop PROPERTIES TIMEOUT 300)
