# Uses the library as an outside project would, from a fresh install tree (run by CTest).
#   cmake -DSTEP=install|cmake|pkgconfig|symbols|readme -DBUILD=<build dir> -DPREFIX=<install prefix>
#         -DLIBDIR=<lib dir under PREFIX> -DWORK=<scratch dir> -DEXAMPLES=<examples dir>
#         -DVERSION=<x.y.z> -DSOVERSION=<soname suffix> -DCC=<C compiler> -P consume.cmake
cmake_minimum_required(VERSION 3.25)

function(run)  # run(<command...>) : fails the test with the output on a non-zero exit
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` exited with ${rc}\n${out}\n${err}")
  endif()
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect text regex)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "expected /${regex}/ in:\n${text}")
  endif()
endfunction()

set(lib ${PREFIX}/${LIBDIR})

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE ${PREFIX})
  run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX})
  foreach(f include/sparsek/sparsek.h include/sparsek/version.h include/sparsek/gemm.hpp
            ${LIBDIR}/libsparsek.so ${LIBDIR}/libsparsek.so.${SOVERSION} ${LIBDIR}/libsparsek.so.${VERSION}
            ${LIBDIR}/cmake/sparsek/sparsekConfig.cmake ${LIBDIR}/cmake/sparsek/sparsekConfigVersion.cmake
            ${LIBDIR}/pkgconfig/sparsek.pc bin/sparsek)
    if(NOT EXISTS ${PREFIX}/${f})
      message(FATAL_ERROR "not installed: ${PREFIX}/${f}")
    endif()
  endforeach()
  run(${PREFIX}/bin/sparsek doctor)  # the installed CLI runs outside the build tree
  expect("${out}" "sparsek ${VERSION} doctor")
  message("installed into ${PREFIX}")

elseif(STEP STREQUAL "cmake")
  # find_package(sparsek) + sparsek::sparsek from the install tree; then run both examples.
  file(REMOVE_RECURSE ${WORK}/cmake)
  run(${CMAKE_COMMAND} -S ${EXAMPLES} -B ${WORK}/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${PREFIX})
  expect("${out}" "Found sparsek ${VERSION} in ${lib}/cmake/sparsek")
  run(${CMAKE_COMMAND} --build ${WORK}/cmake)
  run(${WORK}/cmake/dsd_cpp)
  message("dsd_cpp:\n${out}")
  expect("${out}" "host: [0-9]+ blocks, variant cpu, C\\[0\\]\\[0\\] = ")
  expect("${out}" "error, as expected \\(invalid argument\\): .*B")
  run(${WORK}/cmake/dsd_c)
  message("dsd_c:\n${out}")
  expect("${out}" "sparsek ${VERSION} \\(headers ${VERSION}\\)")
  expect("${out}" "max \\|C - reference\\| = 0\n")
  expect("${out}" "bad col_idx -> invalid argument: .*col_idx\\[1\\]=3")

elseif(STEP STREQUAL "pkgconfig")
  # A plain compiler line from `pkg-config --cflags --libs sparsek`.
  set(ENV{PKG_CONFIG_PATH} ${lib}/pkgconfig)
  run(pkg-config --modversion sparsek)
  expect("${out}" "^${VERSION}")
  run(pkg-config --cflags --libs sparsek)
  separate_arguments(flags UNIX_COMMAND "${out}")
  run(pkg-config --variable=libdir sparsek)
  string(STRIP "${out}" libdir)
  file(MAKE_DIRECTORY ${WORK})
  run(${CC} ${EXAMPLES}/dsd.c ${flags} -lm -Wl,-rpath,${libdir} -o ${WORK}/dsd_c_pkgconfig)
  run(${WORK}/dsd_c_pkgconfig)
  expect("${out}" "max \\|C - reference\\| = 0\n")

elseif(STEP STREQUAL "symbols")
  # The shared library exports the public API only, under a versioned SONAME.
  run(readelf -d ${lib}/libsparsek.so)
  expect("${out}" "SONAME\\)[^\n]*\\[libsparsek\\.so\\.${SOVERSION}\\]")
  run(nm -D --defined-only -C ${lib}/libsparsek.so)
  set(exports "${out}")
  foreach(sym "T sparsek_dsd\n" "T sparsek_plan_create\n" "T sparsek::plan\\(sparsek::GemmArgs const&"
              "T sparsek::dsd\\(" "T sparsek::tune\\(" "sparsek::BsrMatrix::fill_random\\("
              "T sparsek_dist_plan_create\n" "T sparsek::plan_distributed\\(" "T sparsek::partition_block_rows\\("
              "T sparsek_attention_cp_plan_create\n" "T sparsek::plan_distributed_attention\\(")
    string(REGEX MATCH "[^\n]*${sym}" hit "${exports}")
    if(hit STREQUAL "")
      message(FATAL_ERROR "libsparsek.so does not export /${sym}/")
    endif()
  endforeach()
  # Internals (the variant table, device info, kernels' hosts, C API helpers) stay hidden.
  foreach(sym "sparsek::variants\\(\\)" "sparsek::device_info\\(\\)" "sparsek::capi::" "sparsek::peers::"
              "sparsek::json::" "sparsek::tune_detail::" "sparsek::oracle" "sparsek::make_plan"
              "sparsek::cpu_variants" "sparsek::portable_variants" "sparsek::hopper_variants"
              "sparsek::nccl::" "sparsek::check_same_problem" "sparsek::cp_gpu::")
    string(REGEX MATCH "[^\n]*${sym}[^\n]*" hit "${exports}")
    if(NOT hit STREQUAL "")
      message(FATAL_ERROR "libsparsek.so exports an internal symbol: ${hit}")
    endif()
  endforeach()
  string(REGEX MATCHALL "\n[0-9a-f]+ [TWVBDR] " all "\n${exports}")
  list(LENGTH all n)
  string(REGEX MATCHALL "\n[0-9a-f]+ [TWVBDR] sparsek" own "\n${exports}")
  list(LENGTH own n_own)
  message("libsparsek.so exports ${n} symbols (${n_own} in sparsek:: or sparsek_*)")

elseif(STEP STREQUAL "readme")
  # The C++ guide's program is examples/dsd.cpp verbatim, and every line of the README's short C++
  # example is a line of it (so the code the docs show compiles and runs).
  file(READ ${EXAMPLES}/dsd.cpp program)
  file(READ ${EXAMPLES}/../docs/guide-cpp.md guide)
  string(FIND "${guide}" "```cpp\n${program}```" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "docs/guide-cpp.md does not hold examples/dsd.cpp verbatim in a ```cpp block")
  endif()
  file(READ ${EXAMPLES}/../README.md readme)
  string(FIND "${readme}" "```cpp\n" start)
  if(start EQUAL -1)
    message(FATAL_ERROR "README.md has no ```cpp block")
  endif()
  math(EXPR start "${start} + 7")
  string(SUBSTRING "${readme}" ${start} -1 block)
  string(FIND "${block}" "```" end)
  string(SUBSTRING "${block}" 0 ${end} block)
  string(REPLACE ";" "<semicolon>" block "${block}")
  string(REPLACE "\n" ";" block_lines "${block}")
  set(checked 0)
  foreach(line IN LISTS block_lines)
    string(REPLACE "<semicolon>" ";" line "${line}")
    if(NOT line STREQUAL "")
      string(FIND "${program}" "${line}" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "README.md's C++ example has a line that examples/dsd.cpp does not: ${line}")
      endif()
      math(EXPR checked "${checked} + 1")
    endif()
  endforeach()
  if(checked LESS 10)
    message(FATAL_ERROR "README.md's C++ example: only ${checked} lines found")
  endif()
else()
  message(FATAL_ERROR "STEP='${STEP}': must be install, cmake, pkgconfig, symbols or readme")
endif()
