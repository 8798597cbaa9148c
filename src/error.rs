//! The crate's one error type.
use std::path::PathBuf;

use crate::cache::CacheError;

/// Every fallible specdec operation returns this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed inside candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A cache operation was refused (unreachable target, wrong kind, misuse of a transaction).
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file, config key or value is malformed; the message names it.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// An [`Error::Invalid`] from anything printable.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    /// An [`Error::Io`] naming the file.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
