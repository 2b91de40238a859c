# tests/rewards.cmake: the reward functions and the code_exec sandbox (included by tests/CMakeLists.txt).
add_executable(test_rewards unit/test_rewards.cpp)
target_link_libraries(test_rewards PRIVATE mgrl_rewards mgrl_io GTest::gtest_main mgrl_warnings)
add_test(NAME unit.rewards COMMAND test_rewards)
set_tests_properties(unit.rewards PROPERTIES LABELS unit TIMEOUT 120)
# `mgrl reward` with code_exec: the honest completion scores 1; one walking the harness's frames to print pass
# markers, and one returning an object equal to everything, score 0.
mgrl_add_cli_test(reward.code_exec_verdict_cannot_be_faked 0
  "(?s)^[{].index.:0,.reward.:1[.]0,[^\\n]*\\n[{].index.:1,.reward.:0[.]0,[^\\n]*\\n[{].index.:2,.reward.:0[.]0,[^\\n]*\\n" - -
  -- $<TARGET_FILE:mgrl> reward ${CMAKE_CURRENT_SOURCE_DIR}/data/rewards/code_exec.toml
     --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/rewards/code_exec.jsonl)
# The same tests as an unprivileged user (CI runs as root, where the sandbox drops to nobody; here it is root of a
# user namespace of its own, which must not keep its capabilities there). Skipped where the system gives no
# unprivileged user namespaces, or when not run as root.
find_program(SETPRIV setpriv)
if(SETPRIV)
  add_test(NAME unit.rewards.unprivileged COMMAND bash -c
    "[ \"$(id -u)\" = 0 ] && ${SETPRIV} --reuid=65534 --regid=65534 --clear-groups unshare -Ur true 2>/dev/null || { echo 'skipped: not root, or no unprivileged user namespaces'; exit 77; }
     d=$(mktemp -d) && chmod 777 \"$d\" && cp '$<TARGET_FILE:test_rewards>' \"$d/\" && cd \"$d\" &&
     ${SETPRIV} --reuid=65534 --regid=65534 --clear-groups env TMPDIR=\"$d\" TEST_TMPDIR=\"$d/\" HOME=\"$d\" ./test_rewards; rc=$?
     cd / && rm -rf \"$d\"; exit $rc")
  set_tests_properties(unit.rewards.unprivileged PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
