// log.h: rank-aware logging. Rank 0 prints info; every rank may print warnings and errors.
#pragma once
#include <string>

namespace mgrl::log {

void set_rank(int rank);
int rank();  // -1 before the MPI environment is up

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };
void set_level(Level level);
Level level();
Level parse_level(const std::string& name);  // throws UserError on an unknown name

// On rank 0 only (or any rank before MPI is up).
void info(const std::string& msg);
void debug(const std::string& msg);
void warn_once(const std::string& msg);  // rank 0 only
// On the calling rank, prefixed with its rank when there is more than one: for rank-local trouble.
void warn(const std::string& msg);
void error(const std::string& msg);

}  // namespace mgrl::log
