//! The core's conformance suite against moto's S3 (behind the serialising launcher), in real
//! time, ttl 3 s.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

leader_core::conformance_tests!(support::harness(support::Emu::Moto));
