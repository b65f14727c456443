//! What an engine is made with: the rules and the caps. A validated config
//! file turns into them (`fusebox::config`); the engine knows nothing else
//! of the file.

use super::limits::Limits;
use super::rules::Rules;

/// The rules and the caps of an engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// The rules (Y1).
    pub rules: Rules,
    /// The caps (K2, K3).
    pub limits: Limits,
}
