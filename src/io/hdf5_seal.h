// hdf5_seal.h: the seal of an HDF5 file: checksums of all its bytes kept in its user block (the bytes before the
// HDF5 superblock, which libhdf5 leaves to the application), so that a reader verifies every byte with plain file
// I/O before libhdf5 parses the file (libhdf5 1.10 reads out of bounds on some damaged files). It holds the file's
// length, one checksum of the HDF5 metadata (every byte outside the datasets' stored values) and one per dataset
// (its name, where its values lie, their checksum), so that damaged values name their dataset.
// Layout and messages: docs/checkpoint.md#integrity. Detects accidents (flipped bits, zeroed blocks, truncation),
// not tampering: a file crafted with a matching seal is parsed by libhdf5 like any other.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace mgrl::io {

// The stored values of one dataset (contiguous layout, not empty): where they lie and their BlockChecksum.
struct SealEntry {
  std::string name;
  std::uint64_t offset = 0;  // from the start of the file (user block included)
  std::uint64_t size = 0;    // bytes
  std::uint64_t checksum = 0;
};

// The user block size (a power of two, at least 512, as HDF5 requires) that holds the seal of a file whose
// datasets have these names.
std::uint64_t seal_userblock_size(const std::vector<std::string>& dataset_names);

// Seals a closed HDF5 file created with this user block size: reads the file back, checks that every entry's
// bytes in the file have the checksum the entry holds (the checksum of the values the writer handed to HDF5),
// computes the metadata checksum, writes the seal into the user block and fsyncs the file. Entries' offsets are
// as H5Dget_offset gave them (from the start of the file or, in HDF5 versions that leave the user block out,
// from the superblock: both are recognised). FatalError naming the file on any failure (an I/O error, a full
// disk, values that do not read back as written).
void seal_file(int fd, const std::string& path, std::uint64_t userblock, std::vector<SealEntry> entries);

enum class SealState {
  sealed,        // every byte verified
  unsealed_hdf5  // no seal, but the HDF5 signature at byte 0: a file written before seals (nothing verified)
};

// A seal of a newer format than this mgrl reads: the file is not damaged, this mgrl is old.
class NewerSeal : public UserError {
 public:
  explicit NewerSeal(const std::string& what) : UserError(what) {}
};

// Verifies the seal of the file at path before anything else reads it. `noun` names the kind of file in messages
// ("checkpoint": "PATH: damaged checkpoint: ..."). UserError starting with the path when the file cannot be read,
// is not HDF5 (neither a seal nor the HDF5 signature at its start), is truncated, or any checksum differs (naming
// the dataset for damaged values); NewerSeal for a seal format this mgrl does not know.
SealState verify_seal(const std::string& path, const std::string& noun);

// The entries of a sealed file in the order written, its header checksum verified (tests and tools: where a
// dataset's values lie); an empty list for a file without a seal. UserError as verify_seal.
std::vector<SealEntry> read_seal_entries(const std::string& path);

}  // namespace mgrl::io
