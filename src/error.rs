//! Error: every way a solid-notify call can fail, typed so callers can react.

use sea_orm::DbErr;

/// A definition that failed validation, with where it came from.
///
/// `origin` is a file path for definitions loaded from `definitions/`, or
/// `notify_def#<id>` for a row edited directly in the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: definition `{def}`: field `{field}`: {problem}")]
pub struct DefinitionError {
    /// File path or table row the definition was read from.
    pub origin: String,
    /// Name of the definition (empty when the name itself is missing).
    pub def: String,
    /// The offending field (a `notify_def` column name, or `target.<key>`).
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Errors returned by the solid-notify API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused or failed a statement (unreachable, constraint, …).
    #[error("database error: {0}")]
    Db(#[from] DbErr),

    /// `add_notice` named a definition that is not in `notify_def`.
    #[error("unknown notify definition `{0}`")]
    UnknownDef(String),

    /// A notice refers to a `notify_def.id` that no longer exists.
    #[error("notice refers to notify_def id {0}, which does not exist")]
    UnknownDefId(i64),

    /// The definition exists but its row does not validate (edited badly in place).
    #[error("notify definition is invalid: {0}")]
    InvalidDef(#[from] DefinitionError),

    /// The notice's param could not be serialised to JSON.
    #[error("param of a `{def}` notice is not serialisable to JSON: {source}")]
    Param {
        /// Definition the notice was for.
        def: String,
        /// What serde_json reported.
        source: serde_json::Error,
    },

    /// The notice cannot be stored as given (a NUL character, a key over 255
    /// characters, a param over the size limit, a bad override); nothing was
    /// written and the caller's transaction is untouched.
    #[error("invalid notice for `{def}`: {problem}")]
    InvalidNotice {
        /// Definition the notice was for.
        def: String,
        /// What is wrong.
        problem: String,
    },

    /// A notice of a definition with `encrypt = true` cannot be sealed (no
    /// key configured, or the `encrypt` feature is off), or a value cannot
    /// be opened; nothing was written and the caller's transaction is
    /// untouched.
    #[error("encryption for `{def}`: {source}")]
    Crypto {
        /// The definition.
        def: String,
        /// Why.
        source: crate::crypto::CryptoError,
    },

    /// A definitions file could not be read or parsed.
    #[error("cannot read definitions from {path}: {problem}")]
    DefinitionFile {
        /// The file or directory.
        path: String,
        /// The I/O or TOML error.
        problem: String,
    },

    /// The database could not be reached in time.
    #[error("cannot reach the database at {target} within {}: {problem}", humantime::format_duration(*.timeout))]
    Unreachable {
        /// Host, port and database (no credentials).
        target: String,
        /// The connect timeout.
        timeout: std::time::Duration,
        /// What failed.
        problem: String,
    },

    /// The database's backend is not compiled into this build: its cargo
    /// feature (`postgres`, `mysql` or `sqlite`) is off. Refused by
    /// `NotifierBuilder::build`, `migrate` and `worker::connect`, even if
    /// sea-orm itself has the driver (another crate in the build may enable
    /// it): what solid-notify does for that backend would be missing.
    #[error(
        "this build of solid-notify does not support {backend}: enable its cargo feature `{feature}`"
    )]
    BackendNotCompiled {
        /// The backend: PostgreSQL, MySQL/MariaDB or SQLite.
        backend: &'static str,
        /// The cargo feature that compiles it in (empty for a backend
        /// solid-notify does not know).
        feature: &'static str,
    },

    /// A purge could not write its archive.
    #[error("cannot write the purge archive {path}: {problem}; the batch was not deleted")]
    Archive {
        /// The archive file.
        path: String,
        /// The I/O error.
        problem: String,
    },

    /// The database's schema is older than this build: a migration it
    /// knows has not run. Workers refuse to start on it, and
    /// [`Notifier::begin`](crate::Notifier::begin) to add notices.
    #[error(
        "the schema is older than this build: {count} migration(s) to run, the first {first} (run `solid-notify migrate`)"
    )]
    SchemaBehind {
        /// The first migration not run.
        first: String,
        /// How many are not run.
        count: usize,
    },

    /// PostgreSQL behind a pooler that cannot serve this process (transaction
    /// mode without prepared statements): the reason, and what to change.
    #[error("{0}")]
    Pooler(String),

    /// The notifier configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A text an operator or a client gave (a filter, a search, a name)
    /// holds what no database stores (a NUL character): refused before any
    /// statement.
    #[error("{field}: {problem}")]
    InvalidInput {
        /// The field, as the caller named it.
        field: String,
        /// What is wrong.
        problem: String,
    },

    /// The notice kept changing under an operator action; try again.
    #[error("notice {0} kept changing meanwhile; try again")]
    Conflict(i64),

    /// No notice with this id is in `notify_msg` (or, for history calls, in history).
    #[error("notice {0} not found")]
    NoticeNotFound(i64),

    /// The notice is not in a state that allows the operation.
    #[error("notice {id} is {status}: {problem}")]
    WrongState {
        /// The notice.
        id: i64,
        /// Its state.
        status: crate::status::Status,
        /// What cannot be done.
        problem: &'static str,
    },

    /// The database rolled the transaction back (a statement in it failed in
    /// a way that aborts it, or its notices could not be written at the
    /// commit); nothing was committed.
    #[error("the transaction was aborted by the database and rolled back: {0}")]
    TransactionAborted(String),

    /// The connection failed while the transaction was committing: it may
    /// have committed or not. Its notices, if they were committed, are due at
    /// once for any worker (their after-commit attempt does not run); look
    /// the business data up before doing the work again.
    #[error("the connection failed during the commit; it may or may not have committed: {0}")]
    CommitOutcomeUnknown(String),
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Refuses a text input `field` that holds a NUL character (PostgreSQL's
/// text refuses it; SQLite's `LIKE` ends its pattern there, so `%\0%`
/// would match everything): [`Error::InvalidInput`] naming `field`.
pub(crate) fn check_text(field: &str, text: &str) -> Result<()> {
    match text.contains('\0') {
        true => Err(Error::InvalidInput {
            field: field.to_string(),
            problem: "contains a NUL character, which no database stores".into(),
        }),
        false => Ok(()),
    }
}
