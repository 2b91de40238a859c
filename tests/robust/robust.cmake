# tests/robust/robust.cmake: the catalogue of bad inputs (label robust), one CTest test per line `c NAME ...` of
# tests/robust/cases.sh, each run by tests/robust/robust.sh in its own directory. robust.setup (a fixture) first
# writes the checkpoints the cases copy.
add_executable(robust_tool robust/robust_tool.cpp)
target_link_libraries(robust_tool PRIVATE mgrl_train HDF5::HDF5 MPI::MPI_C nlohmann_json::nlohmann_json mgrl_warnings)

set(ROBUST_ROOT "${CMAKE_CURRENT_BINARY_DIR}/robust")
set(ROBUST_DRIVER bash ${CMAKE_CURRENT_SOURCE_DIR}/robust/robust.sh $<TARGET_FILE:mgrl> $<TARGET_FILE:robust_tool>
    ${PROJECT_SOURCE_DIR} ${ROBUST_ROOT} ${MPIEXEC_EXECUTABLE})
add_test(NAME robust.setup COMMAND ${ROBUST_DRIVER} _setup)
set_tests_properties(robust.setup PROPERTIES LABELS robust FIXTURES_SETUP robust_checkpoints TIMEOUT 60)

set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/robust/cases.sh")
file(READ "${CMAKE_CURRENT_SOURCE_DIR}/robust/cases.sh" _robust_text)
string(REGEX MATCHALL "\nc [A-Za-z0-9_]+ [0-9]+ " _robust_heads "${_robust_text}")
foreach(_head IN LISTS _robust_heads)
  string(REGEX MATCH "c ([A-Za-z0-9_]+) ([0-9]+) " _m "${_head}")
  set(_name "${CMAKE_MATCH_1}")
  set(_ranks "${CMAKE_MATCH_2}")
  add_test(NAME robust.${_name} COMMAND ${ROBUST_DRIVER} ${_name})
  set_tests_properties(robust.${_name} PROPERTIES LABELS robust FIXTURES_REQUIRED robust_checkpoints TIMEOUT 90
                       PROCESSORS ${_ranks} ENVIRONMENT "${MGRL_MPI_ENV}")
endforeach()
