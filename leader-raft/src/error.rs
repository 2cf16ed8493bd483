//! Errors of starting a member: each says what to fix.
//!
//! Store calls ([`LeaseBackend`](leader_core::LeaseBackend) and
//! [`FencedCas`](leader_core::backend::FencedCas)) answer with the suite's own
//! [`leader_core::Error`].

use std::path::PathBuf;

/// Why a member could not start (or a setting is wrong).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RaftError {
    /// A setting of [`RaftConfig`](crate::RaftConfig) is wrong.
    #[error("invalid raft configuration: {message}")]
    InvalidConfig {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The data folder cannot be created, opened or trusted.
    #[error("data folder {}: {message}", path.display())]
    DataFolder {
        /// The folder or file concerned.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
        /// The operating system's error.
        #[source]
        source: Option<std::io::Error>,
    },
    /// Another running member holds the data folder.
    #[error(
        "data folder {} is in use by another member (its lock file is held); give each member \
         its own folder",
        path.display()
    )]
    FolderInUse {
        /// The folder.
        path: PathBuf,
    },
    /// A file of the data folder is damaged (not a torn last record, which is dropped).
    #[error(
        "{} is damaged: {detail}; empty the whole folder and start the member once with rejoin \
         (`--raft-rejoin`); never restore it from an old backup (see the crate docs on wiped \
         members)",
        file.display()
    )]
    Damaged {
        /// The damaged file.
        file: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// This member's data folder is empty but the group already has history, and rejoining
    /// was not allowed ([`RaftConfig::rejoin`](crate::RaftConfig::rejoin)).
    #[error(
        "data folder {} is empty, but member {peer} holds the group's history (term {term}): \
         the group knows this member by a folder it no longer has. If its data was lost, \
         start it once with rejoin \
         (`--raft-rejoin`): it then takes no part in elections until it has caught up with the \
         group. Never empty a member's folder to repair anything else",
        path.display()
    )]
    EmptyFolder {
        /// This member's folder.
        path: PathBuf,
        /// A member that has history.
        peer: String,
        /// The highest term the members reported.
        term: u64,
    },
    /// The TLS material cannot be used.
    #[error("TLS setup: {message}")]
    Tls {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The member's own address cannot be listened on.
    #[error("cannot listen on {address}: {source}; is another process using the port?")]
    Listen {
        /// The address.
        address: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The Raft node failed to start or to initialize the group.
    #[error("raft node: {message}")]
    Raft {
        /// What openraft said.
        message: String,
    },
}

impl RaftError {
    pub(crate) fn config(message: impl Into<String>) -> Self {
        RaftError::InvalidConfig {
            message: message.into(),
        }
    }

    pub(crate) fn folder(
        path: impl Into<PathBuf>,
        message: impl Into<String>,
        source: Option<std::io::Error>,
    ) -> Self {
        RaftError::DataFolder {
            path: path.into(),
            message: message.into(),
            source,
        }
    }

    pub(crate) fn damaged(file: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        RaftError::Damaged {
            file: file.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn tls(message: impl Into<String>) -> Self {
        RaftError::Tls {
            message: message.into(),
        }
    }
}
