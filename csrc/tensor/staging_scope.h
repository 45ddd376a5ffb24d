// StagingScope: one StaticInputs call at a time (stage() or write_rows()).
#pragma once

#include <c10/util/Exception.h>

namespace pinstage {

// The two calls' names, which their errors open with.
inline constexpr const char* kStage = "pinstage.StaticInputs.stage";
inline constexpr const char* kWriteRows = "pinstage.StaticInputs.write_rows";

// Marks the inputs as being staged (or written) for one stage() or write_rows() call; a second one
// meanwhile would move the dirty-row mark or the pending writes under the first one.
class StagingScope {
 public:
  StagingScope(bool& staging, const char* api) : staging_(staging) {
    TORCH_CHECK(!staging_, api,
                ": these inputs are already being staged or written (by Python code that a conversion "
                "ran, or by another thread); one StaticInputs has one writer; this call changed nothing");
    staging_ = true;
  }
  ~StagingScope() { staging_ = false; }
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;

 private:
  bool& staging_;
};

}  // namespace pinstage
