//! Validation problems: every problem in a package is collected, each with a JSON pointer into
//! the file it comes from, so an author fixes them all in one pass.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One thing wrong with a package.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Problem {
    /// The package file the problem is in (`eval/tests.json`, `SKILL.md`, ...).
    pub file: String,
    /// RFC 6901 pointer into that file (`/testCases/3/expected/patterns/0`); empty for the whole file.
    pub pointer: String,
    /// Which rule broke, as a person would say it.
    pub message: String,
    /// `error` refuses the package; `warning` is reported and accepted.
    #[serde(default)]
    pub severity: Severity,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Error,
    Warning,
    /// The host could not check this (a tool it needs is missing or failed): a problem of the
    /// host's configuration, not of the package. It refuses the package like an error, and a
    /// service answers it as unavailable, never as an invalid package.
    Host,
}

impl Problem {
    pub fn error(
        file: impl Into<String>,
        pointer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            file: file.into(),
            pointer: pointer.into(),
            message: message.into(),
            severity: Severity::Error,
        }
    }

    pub fn warning(
        file: impl Into<String>,
        pointer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            severity: Severity::Warning,
            ..Problem::error(file, pointer, message)
        }
    }

    /// A problem of the host's configuration (see [`Severity::Host`]).
    pub fn host(
        file: impl Into<String>,
        pointer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            severity: Severity::Host,
            ..Problem::error(file, pointer, message)
        }
    }

    /// Whether it refuses the package: an error, or a check the host could not make.
    pub fn is_error(&self) -> bool {
        matches!(self.severity, Severity::Error | Severity::Host)
    }

    /// Whether it is the host's problem rather than the package's.
    pub fn is_host(&self) -> bool {
        self.severity == Severity::Host
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Host => "configuration",
        };
        write!(f, "{sev}: {}#{}: {}", self.file, self.pointer, self.message)
    }
}

/// Escapes one reference token of a JSON pointer (RFC 6901: `~` -> `~0`, `/` -> `~1`).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Builds a pointer from tokens.
pub fn pointer<I, T>(tokens: I) -> String
where
    I: IntoIterator<Item = T>,
    T: AsRef<str>,
{
    tokens
        .into_iter()
        .map(|t| format!("/{}", escape_token(t.as_ref())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escapes_slash_and_tilde() {
        assert_eq!(pointer(["testCases", "3", "a/b~c"]), "/testCases/3/a~1b~0c");
    }

    #[test]
    fn display_names_file_pointer_and_rule() {
        let p = Problem::error("eval/tests.json", "/testCases/0/id", "must not be empty");
        assert_eq!(
            p.to_string(),
            "error: eval/tests.json#/testCases/0/id: must not be empty"
        );
    }
}
