# ppo.cmake: PPO tests (included by tests/CMakeLists.txt): the objective against trl's PPOTrainer and the value head
# (unit.ppo_loss), the model side of a step (unit.ppo_step).
add_executable(test_ppo_loss unit/test_ppo_loss.cpp)
target_link_libraries(test_ppo_loss PRIVATE mgrl_rl GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_ppo_loss PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data")
add_test(NAME unit.ppo_loss COMMAND test_ppo_loss)
set_tests_properties(unit.ppo_loss PROPERTIES LABELS unit TIMEOUT 60)
# The model side of a PPO step on the tiny Llama fixture: scoring rows, gradients by finite differences, rank splits.
add_executable(test_ppo_step unit/test_ppo_step.cpp)
target_link_libraries(test_ppo_step PRIVATE mgrl_rl mgrl_model GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_ppo_step PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data")
add_test(NAME unit.ppo_step COMMAND test_ppo_step)
set_tests_properties(unit.ppo_step PROPERTIES LABELS unit TIMEOUT 60)
