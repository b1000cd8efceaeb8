//! Why a package could not be opened: refused by a limit, invalid (every problem listed), or
//! unreadable. The messages are shown to people as they are (CLI output, HTTP error bodies).

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::problem::Problem;

/// A package that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A hardening limit was hit; nothing in the package was trusted beyond that point.
    #[error("{}", refused_message(limit, entry.as_deref(), message))]
    Refused {
        /// Which limit (a [`super::PackageLimits`] field name, or a rule such as `zip_slip`,
        /// `absolute_path`, `symlink`, `duplicate_name`, `not_a_zip`, `encrypted`,
        /// `invalid_name`, `non_utf8_name`, `non_utf8_json`, `corrupt_entry`; the ratio limit
        /// is named `compression_ratio`).
        limit: &'static str,
        /// The archive entry or file concerned, when there is one.
        entry: Option<String>,
        message: String,
    },
    /// The package was read but its definition has errors; every problem (warnings too).
    #[error("{}", invalid_message(.0))]
    Invalid(Vec<Problem>),
    /// A file could not be read or written.
    #[error("cannot access {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PackageError {
    pub(crate) fn refused(
        limit: &'static str,
        entry: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        PackageError::Refused {
            limit,
            entry: entry.map(str::to_string),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PackageError::Io {
            path: path.into(),
            source,
        }
    }

    /// The limit or rule name of a refusal.
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            PackageError::Refused { limit, .. } => Some(limit),
            _ => None,
        }
    }

    /// The entry a refusal names.
    pub fn entry(&self) -> Option<&str> {
        match self {
            PackageError::Refused { entry, .. } => entry.as_deref(),
            _ => None,
        }
    }

    /// The problems of an invalid package.
    pub fn problems(&self) -> &[Problem] {
        match self {
            PackageError::Invalid(problems) => problems,
            _ => &[],
        }
    }

    /// Whether the uploader can fix this (a 4xx); `Io` is the server's or the machine's fault.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, PackageError::Io { .. })
    }
}

fn refused_message(limit: &str, entry: Option<&str>, message: &str) -> String {
    match entry {
        Some(entry) => format!("package refused ({limit}): `{entry}`: {message}"),
        None => format!("package refused ({limit}): {message}"),
    }
}

fn invalid_message(problems: &[Problem]) -> String {
    let errors = problems.iter().filter(|p| p.is_error()).count();
    let warnings = problems.len() - errors;
    let mut out = format!(
        "package is invalid: {errors} error{}{}",
        if errors == 1 { "" } else { "s" },
        match warnings {
            0 => String::new(),
            1 => ", 1 warning".to_string(),
            n => format!(", {n} warnings"),
        }
    );
    for problem in problems {
        let _ = write!(out, "\n  {problem}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_limit_and_entry() {
        let err = PackageError::refused(
            "zip_slip",
            Some("../evil"),
            "the path would leave the package",
        );
        assert_eq!(
            err.to_string(),
            "package refused (zip_slip): `../evil`: the path would leave the package"
        );
        assert_eq!(err.limit(), Some("zip_slip"));
        assert_eq!(err.entry(), Some("../evil"));
    }

    #[test]
    fn invalid_lists_every_problem() {
        let err = PackageError::Invalid(vec![
            Problem::error(
                "eval/tests.json",
                "/testCases/1/id",
                "duplicate test case id `a`",
            ),
            Problem::warning("SKILL.md", "/color", "unknown front-matter key `color`"),
        ]);
        assert_eq!(
            err.to_string(),
            "package is invalid: 1 error, 1 warning\n  \
             error: eval/tests.json#/testCases/1/id: duplicate test case id `a`\n  \
             warning: SKILL.md#/color: unknown front-matter key `color`"
        );
    }
}
