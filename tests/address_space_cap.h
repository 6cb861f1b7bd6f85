// The process's address space capped at what it has mapped plus `headroom` bytes for one scope
// (restored after, even when the scope throws): a test that a call refuses or avoids an
// allocation the machine might otherwise grant. AddressSanitizer's shadow memory does not fit.
#pragma once
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace smla::test {

class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(rlim_t headroom) {
    ok_ = getrlimit(RLIMIT_AS, &old_) == 0;
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t mapped = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGE_SIZE));
    rlimit capped = old_;
    capped.rlim_cur = std::min<rlim_t>(old_.rlim_cur, mapped + headroom);
    ok_ = ok_ && setrlimit(RLIMIT_AS, &capped) == 0;
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;
  ~AddressSpaceCap() {
    if (ok_) setrlimit(RLIMIT_AS, &old_);
  }
  bool ok() const { return ok_; }  // false: no cap was set

 private:
  rlimit old_{};
  bool ok_ = false;
};

}  // namespace smla::test
