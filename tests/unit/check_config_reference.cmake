# ctest config_reference: docs/configuration.md must be exactly what `diloco-ctl config-reference` prints (the
# reference generated from Fields() in config/config_fields.cc). Run as
#   cmake -DCTL=<diloco-ctl> -DDOC=<docs/configuration.md> -DOUT=<scratch file> -P check_config_reference.cmake
execute_process(COMMAND ${CTL} config-reference OUTPUT_FILE ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${CTL} config-reference failed (exit ${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${DOC} ${OUT} RESULT_VARIABLE differ)
if(differ)
  execute_process(COMMAND diff -u ${DOC} ${OUT})
  message(FATAL_ERROR "docs/configuration.md differs from `diloco-ctl config-reference` (diff above: - committed, + "
                      "generated). A config key, default, range or doc changed: regenerate it with\n"
                      "  build/diloco-ctl config-reference > docs/configuration.md\nand commit the result.")
endif()
