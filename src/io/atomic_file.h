// atomic_file.h: output files written whole or not at all. A file is written as "<path>.tmp.<pid>", fsync'ed and
// renamed over path, and the directory fsync'ed, so that a run that fails, is killed or loses its machine leaves an
// earlier file under path as it was (io::H5Writer does the same for HDF5 files). A kill leaves the temporary behind
// (nothing in the killed process can remove it): the next writer of the same path removes it, with a line.
#pragma once
#include <string>

namespace mgrl::io {

// "<path>.tmp.<this process's pid>".
std::string temporary_name(const std::string& path);

// Makes the entries of a directory durable (fsync of the directory: after a rename into it); best effort.
void sync_directory(const std::string& dir);
// The same for the directory that holds path ("." for a bare name).
void sync_parent_directory(const std::string& path);

// Whether the process that wrote a "<...>.tmp.<pid>" file may still be writing it: pid is this process, or a
// process of that pid runs on this host.
bool writer_may_be_running(long pid);

// Fails early when path cannot be written: it exists and is not a regular file (renaming over it would replace a
// directory, a FIFO or a device), or its directory does not accept a new file (a temporary is created and removed).
// UserError naming path.
void check_output_writable(const std::string& path);

// Writes bytes to path as described above. UserError naming path when it cannot (a full disk, an I/O error); the
// temporary is removed and an earlier file under path is left as it was.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Removes the temporaries "<path>.tmp.<pid>" of interrupted writers of path (processes no longer running on this
// host), one line each; other files are left alone. Returns how many were removed. Never throws.
int remove_stale_temporaries_of(const std::string& path);

}  // namespace mgrl::io
