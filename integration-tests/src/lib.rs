//! Test harness for the emulator-backed tests of the leader-lease suite.
