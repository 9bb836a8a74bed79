# check_layering.cmake — the layering checks CTest runs (layering_includes,
# layering_symbols), invoked by CMakeLists.txt as
#   cmake -DKS_CHECK=includes|symbols -DKS_MODULES=core|tensor|... \
#         -DKS_CLOSURE_<m>=m|deps...  -DKS_HEADER_<m>=<m>/x.h \
#         -DKS_INCS_<m>=dir|dir...    -DKS_LIB_<m>=libks_<m>.a \
#         -DKS_CC=cc -DKS_NM=nm -DKS_WORK=dir -P check_layering.cmake
# KS_CLOSURE_<m> is module m and every module under it (from the DEPS of the
# ks_module() declarations); KS_INCS_<m> are the include directories m's own
# sources compile with.
#
# includes: for every pair of modules (m, u), a file compiled with m's include
#   directories that includes u's header must compile when u is under m and
#   must fail with "u/x.h: No such file" (gcc) or "'u/x.h' file not found"
#   (clang) otherwise.
# symbols: every function or object a module's library uses that some module
#   library defines must be defined in the module or under it.
cmake_minimum_required(VERSION 3.20)

string(REPLACE "|" ";" modules "${KS_MODULES}")
set(work ${KS_WORK}/${KS_CHECK})
file(REMOVE_RECURSE ${work})
file(MAKE_DIRECTORY ${work})
set(failures 0)
macro(ks_fail msg)
  message(SEND_ERROR "${msg}")
  math(EXPR failures "${failures} + 1")
endmacro()

if(KS_CHECK STREQUAL "includes")
  set(n_probe 0)
  foreach(m ${modules})
    string(REPLACE "|" ";" closure "${KS_CLOSURE_${m}}")
    string(REPLACE "|" ";" incs "${KS_INCS_${m}}")
    set(flags "")
    foreach(dir ${incs})
      list(APPEND flags "-I${dir}")
    endforeach()
    foreach(u ${modules})
      if(u STREQUAL m)
        continue()
      endif()
      set(hdr ${KS_HEADER_${u}})
      set(probe ${work}/${m}_includes_${u}.c)
      file(WRITE ${probe} "/* a file of module ${m} */\n#include \"${hdr}\"\nint ks_probe_;\n")
      execute_process(COMMAND ${KS_CC} -std=c11 -fsyntax-only ${flags} ${probe}
                      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
      math(EXPR n_probe "${n_probe} + 1")
      list(FIND closure ${u} under)
      string(REGEX REPLACE "([.+])" "\\\\\\1" hdr_re "${hdr}")
      if(under GREATER -1)
        if(NOT rc EQUAL 0)
          ks_fail("${m} depends on ${u} but cannot include \"${hdr}\":\n${out}")
        endif()
      elseif(rc EQUAL 0)
        ks_fail("${m} can include \"${hdr}\", but ${u} is not under ${m}")
      elseif(NOT out MATCHES "${hdr_re}'?:? (No such file|file not found)")
        ks_fail("${m} including \"${hdr}\" failed, but not for want of the header:\n${out}")
      else()
        message(STATUS "ok: ${m} cannot include ${hdr}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "${n_probe} include probes")
elseif(KS_CHECK STREQUAL "symbols")
  # defined / undefined external symbols of each module's library (nm -P: "name type ...")
  foreach(m ${modules})
    execute_process(COMMAND ${KS_NM} -P -g ${KS_LIB_${m}} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      ks_fail("${KS_NM} ${KS_LIB_${m}} failed: ${err}")
    endif()
    string(REPLACE "\n" ";" lines "${out}")
    set(undef_${m} "")
    foreach(line ${lines})
      if(line MATCHES "^([A-Za-z_][A-Za-z0-9_.]*) ([A-Za-z])( |$)")
        set(sym ${CMAKE_MATCH_1})
        set(type ${CMAKE_MATCH_2})
        if(type STREQUAL "U")
          list(APPEND undef_${m} ${sym})
        elseif(NOT type MATCHES "^[wv]$")   # weak definitions do not own a name
          set(owner_${sym} ${m})
        endif()
      endif()
    endforeach()
  endforeach()
  set(n_checked 0)
  foreach(m ${modules})
    string(REPLACE "|" ";" closure "${KS_CLOSURE_${m}}")
    list(REMOVE_DUPLICATES undef_${m})
    foreach(sym ${undef_${m}})
      if(NOT DEFINED owner_${sym})
        continue()   # libc, libm, PCRE2, cJSON, ...
      endif()
      math(EXPR n_checked "${n_checked} + 1")
      list(FIND closure ${owner_${sym}} under)
      if(under EQUAL -1)
        ks_fail("${m} uses ${sym}, which is defined in ${owner_${sym}}, not under ${m}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "${n_checked} references to symbols of module libraries checked")
else()
  message(FATAL_ERROR "KS_CHECK must be includes or symbols")
endif()

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} layering violation(s)")
endif()
