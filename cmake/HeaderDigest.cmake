# Run at build time (cmake -P): writes OUT, a header defining STRATA_MODULE_HEADERS as the SHA-256 (first 16
# hex digits) of every header named in the file LIST, in its order, each hashed with its path. Rewritten only
# when the digest changes, so an unchanged tree recompiles nothing. runtime/base/module.cc puts it in the
# build string the core and the CUDA module must share (runtime/base/module.h).
file(STRINGS "${LIST}" headers)
set(text "")
foreach(h IN LISTS headers)
  file(SHA256 "${ROOT}/${h}" d)
  string(APPEND text "${h} ${d}\n")
endforeach()
string(SHA256 digest "${text}")
string(SUBSTRING "${digest}" 0 16 digest)
set(content "#define STRATA_MODULE_HEADERS \"${digest}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL content)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${content}")
