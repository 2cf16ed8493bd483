//! The fencing token: the one value every layer of the suite speaks of, from the store's
//! records to the errors of a refused write.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A fencing token: constant within a term, strictly greater than every token of every earlier
/// term of the same key.
///
/// A protected resource keeps the highest token it has accepted and rejects work that carries
/// a lower one (see [`FenceGate`](crate::FenceGate)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The next token, or `None` at `u64::MAX`.
    pub fn next(self) -> Option<Self> {
        self.0.checked_add(1).map(Self)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
