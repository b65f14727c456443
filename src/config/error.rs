//! What is wrong with a config, in words that name the rule and the field
//! (Y2).

/// A config that cannot be used, in words that name the rule and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown field.
    #[error("config file {path} is not valid: {message}")]
    Parse {
        /// The path.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A rule is invalid.
    #[error("{rule}: {field}: {problem}")]
    Invalid {
        /// Which rule: `rule 2 ("payments/*")`, `[default]` or `[server]`.
        rule: String,
        /// The field's path.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

impl ConfigError {
    /// An invalid field of `[server]`.
    pub(super) fn server(field: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            rule: "[server]".into(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}
