# tests/rewards.cmake: the reward functions and the code_exec sandbox (included by tests/CMakeLists.txt).
add_executable(test_rewards unit/test_rewards.cpp)
target_link_libraries(test_rewards PRIVATE mgrl_rewards mgrl_io GTest::gtest_main mgrl_warnings)
add_test(NAME unit.rewards COMMAND test_rewards)
set_tests_properties(unit.rewards PROPERTIES LABELS unit TIMEOUT 120)
