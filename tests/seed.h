// The tests' random seeds: fresh per check, replayable (README: a failing test prints its seed).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace smla::test {

// SMLA_TEST_SEED replays a failure; otherwise every call draws a fresh seed.
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("SMLA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// What a failure prints of its seed (a SCOPED_TRACE, a case's summary).
inline std::string seed_note(uint64_t seed) {
  const std::string s = std::to_string(seed);
  return "seed=" + s + " (replay: SMLA_TEST_SEED=" + s + ")";
}

}  // namespace smla::test
