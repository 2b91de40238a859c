# dpo.cmake: `mgrl dpo`: the objective against the real trl (unit.dpo) and the binary end to end (cli.dpo.*).
add_executable(test_dpo unit/test_dpo.cpp)
target_link_libraries(test_dpo PRIVATE mgrl_train mgrl_model GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_dpo PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data"
                                            MGRL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME unit.dpo COMMAND test_dpo)
set_tests_properties(unit.dpo PROPERTIES LABELS unit TIMEOUT 120)
