# distill.cmake: knowledge distillation (`mgrl distill`, trl's DistillationTrainer): the divergence against trl's own
# (unit.distill).
add_executable(test_distill unit/test_distill.cpp)
target_link_libraries(test_distill PRIVATE mgrl_train mgrl_model GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_distill PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data"
                                                MGRL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME unit.distill COMMAND test_distill)
set_tests_properties(unit.distill PROPERTIES LABELS unit TIMEOUT 120)
