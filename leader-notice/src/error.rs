//! The one error type of the crate.

/// Why a metadata service, an Auto Scaling, ARM or Kubernetes call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoticeError {
    /// A setting is missing or wrong (an endpoint that does not parse, no region, not on a
    /// scale set): fix the configuration; retrying does not help.
    #[error("{0}")]
    Config(String),
    /// The service did not answer, answered 5xx, or throttled: retried.
    #[error("{service}: {message}")]
    Unavailable {
        /// Which service: `aws`, `azure`, `gcp` (metadata, Auto Scaling, ARM) or `kubernetes`.
        service: &'static str,
        /// What happened, with what to check.
        message: String,
    },
    /// The answer did not parse (a proxy's page, a changed API).
    #[error("{service}: unexpected answer: {message}")]
    Malformed {
        /// Which service: `aws`, `azure`, `gcp` (metadata, Auto Scaling, ARM) or `kubernetes`.
        service: &'static str,
        /// What was wrong, with a prefix of the answer.
        message: String,
    },
    /// The call was refused (401, 403): the identity lacks a permission named in the message.
    #[error("{service}: {message}")]
    Denied {
        /// Which service: `aws`, `azure`, `gcp` or `kubernetes`.
        service: &'static str,
        /// What was refused, and the permission it needs.
        message: String,
    },
}

impl NoticeError {
    /// Whether trying again later may help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            NoticeError::Unavailable { .. } | NoticeError::Malformed { .. }
        )
    }
}
