//! The core's conformance suite against the serialized moto server, in real time, ttl 1.2 s.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

leader_core::conformance_tests!(common::moto());
