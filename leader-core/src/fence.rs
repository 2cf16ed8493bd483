//! The resource side of fencing: accept work only with a token at least as high as any seen.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::token::FencingToken;

/// Kept by a protected resource: admits work whose token is at least the highest admitted so
/// far, and rejects older tokens.
///
/// Equal tokens are admitted (one term writes many times); a higher token raises the gate for
/// good. The check and the raise are one atomic step, so concurrent callers cannot both pass
/// with tokens on either side of each other.
///
/// ```
/// use leader_core::{FenceGate, FencingToken};
///
/// let gate = FenceGate::new();
/// assert!(gate.admit(FencingToken(3)).is_ok());
/// assert!(gate.admit(FencingToken(3)).is_ok());
/// assert!(gate.admit(FencingToken(4)).is_ok());
/// let stale = gate.admit(FencingToken(3)).unwrap_err();
/// assert_eq!(stale.highest, FencingToken(4));
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
}

/// A token lower than one the resource already admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fencing token {presented}: the resource has admitted token {highest}; the sender is no longer leader"
)]
pub struct StaleToken {
    /// The rejected token.
    pub presented: FencingToken,
    /// The highest token admitted so far.
    pub highest: FencingToken,
}

impl FenceGate {
    /// A gate that has admitted nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A gate that starts at `highest` (restored from the resource's own storage).
    pub fn starting_at(highest: FencingToken) -> Self {
        Self {
            highest: AtomicU64::new(highest.0),
        }
    }

    /// Admits `token` if it is at least the highest admitted so far, and raises the gate.
    ///
    /// # Errors
    /// [`StaleToken`] if a higher token was admitted before.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let previous = self.highest.fetch_max(token.0, Ordering::AcqRel);
        if token.0 >= previous {
            Ok(())
        } else {
            Err(StaleToken {
                presented: token,
                highest: FencingToken(previous),
            })
        }
    }

    /// The highest token admitted so far (0 if none).
    pub fn highest(&self) -> FencingToken {
        FencingToken(self.highest.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn concurrent_admits_never_let_a_lower_token_after_a_higher() {
        let gate = Arc::new(FenceGate::new());
        let threads: Vec<_> = (1..=8u64)
            .map(|t| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|i| gate.admit(FencingToken(t * 1000 + i % 7)).is_ok())
                        .count()
                })
            })
            .collect();
        let admitted: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(admitted > 0);
        assert_eq!(gate.highest(), FencingToken(8006));
        assert!(gate.admit(FencingToken(8005)).is_err());
    }
}
