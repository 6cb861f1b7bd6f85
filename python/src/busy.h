// A flag that marks an object busy while one of its calls runs without the GIL, so that a call
// which would interleave with it (another thread's, or a callback's) can be refused. It is read
// and written under the GIL only.
#pragma once

namespace smla::py {

class Busy {
 public:
  class Hold {  // busy from construction to destruction
   public:
    explicit Hold(bool& flag) : flag_(flag) { flag_ = true; }
    ~Hold() { flag_ = false; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    bool& flag_;
  };

  explicit operator bool() const { return busy_; }
  [[nodiscard]] Hold hold() { return Hold(busy_); }

 private:
  bool busy_ = false;
};

}  // namespace smla::py
