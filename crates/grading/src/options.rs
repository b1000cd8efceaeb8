//! Reading strategy options at compile time.
//!
//! A strategy option lives in `evaluation.options` or, for the shorter form authors write,
//! among `expected`'s extra fields ([`TestCase::option`]). These helpers read one option, check
//! its type, and on a wrong type push a [`Problem`] whose pointer names where the option
//! actually is, so the author is sent to the right place.

use serde_json::Value;

use super::field::Field;
use super::CompileContext;
use skilleval_model::definition::TestCase;
use skilleval_model::problem::{escape_token, Problem};

/// The pointer suffix (below the case) of option `key`: under `evaluation.options` when set
/// there, else under `expected`.
pub(crate) fn option_pointer(case: &TestCase, key: &str) -> String {
    if case.evaluation.options.contains_key(key) {
        format!("/evaluation/options/{}", escape_token(key))
    } else {
        format!("/expected/{}", escape_token(key))
    }
}

/// Reads options of one case, collecting problems.
pub(crate) struct OptionReader<'a, 'c> {
    pub case: &'a TestCase,
    pub ctx: &'a CompileContext<'c>,
    /// The strategy, named in problem messages.
    pub strategy: &'static str,
    pub problems: Vec<Problem>,
}

impl<'a, 'c> OptionReader<'a, 'c> {
    pub fn new(case: &'a TestCase, ctx: &'a CompileContext<'c>, strategy: &'static str) -> Self {
        OptionReader {
            case,
            ctx,
            strategy,
            problems: Vec::new(),
        }
    }

    /// A problem at `suffix` below the case.
    pub fn problem(&mut self, suffix: &str, message: impl Into<String>) {
        self.problems.push(self.ctx.problem(suffix, message));
    }

    /// A problem about option `key`.
    pub fn option_problem(&mut self, key: &str, message: impl Into<String>) {
        let pointer = option_pointer(self.case, key);
        self.problem(&pointer, message);
    }

    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.case.option(key)
    }

    pub fn has(&self, key: &str) -> bool {
        self.case.option(key).is_some()
    }

    pub fn bool(&mut self, key: &str, default: bool) -> bool {
        match self.raw(key) {
            None | Some(Value::Null) => default,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                let msg = format!(
                    "{}: option `{key}` must be true or false, not {}",
                    self.strategy,
                    describe(other)
                );
                self.option_problem(key, msg);
                default
            }
        }
    }

    /// A finite number.
    pub fn f64(&mut self, key: &str) -> Option<f64> {
        match self.raw(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_f64().is_some_and(f64::is_finite) => n.as_f64(),
            Some(other) => {
                let msg = format!(
                    "{}: option `{key}` must be a number, not {}",
                    self.strategy,
                    describe(other)
                );
                self.option_problem(key, msg);
                None
            }
        }
    }

    /// A number in [0, 1].
    pub fn unit(&mut self, key: &str) -> Option<f64> {
        let v = self.f64(key)?;
        if (0.0..=1.0).contains(&v) {
            Some(v)
        } else {
            let msg = format!(
                "{}: option `{key}` must be between 0 and 1, not {v}",
                self.strategy
            );
            self.option_problem(key, msg);
            None
        }
    }

    /// A non-negative integer.
    pub fn u64(&mut self, key: &str) -> Option<u64> {
        match self.raw(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(other) => {
                let msg = format!(
                    "{}: option `{key}` must be a non-negative integer, not {}",
                    self.strategy,
                    describe(other)
                );
                self.option_problem(key, msg);
                None
            }
        }
    }

    pub fn string(&mut self, key: &str) -> Option<&'a str> {
        match self.raw(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => {
                let msg = format!(
                    "{}: option `{key}` must be a string, not {}",
                    self.strategy,
                    describe(other)
                );
                self.option_problem(key, msg);
                None
            }
        }
    }

    /// An array of non-empty strings (a single string counts as a one-item list). `None` when
    /// the option is absent or wrong (a problem is pushed for the latter).
    pub fn string_list(&mut self, key: &str) -> Option<Vec<String>> {
        let value = self.raw(key)?;
        let items: Vec<&Value> = match value {
            Value::Null => return None,
            Value::String(_) => vec![value],
            Value::Array(items) => items.iter().collect(),
            other => {
                let msg = format!(
                    "{}: option `{key}` must be an array of strings, not {}",
                    self.strategy,
                    describe(other)
                );
                self.option_problem(key, msg);
                return None;
            }
        };
        let base = option_pointer(self.case, key);
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let pointer = if value.is_array() {
                format!("{base}/{i}")
            } else {
                base.clone()
            };
            match item {
                Value::String(s) if !s.trim().is_empty() => out.push(s.clone()),
                Value::String(_) => {
                    let msg = format!("{}: `{key}` entries must not be empty", self.strategy);
                    self.problem(&pointer, msg);
                    ok = false;
                }
                other => {
                    let msg = format!(
                        "{}: `{key}` entries must be strings, not {}",
                        self.strategy,
                        describe(other)
                    );
                    self.problem(&pointer, msg);
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    /// A field option ([`Field`]): `default` when absent or wrong (a problem is pushed for
    /// the latter). A field that reads `expected.output` when the case sets none is a problem
    /// at the option.
    pub fn field(&mut self, key: &str, default: Field) -> Field {
        let Some(name) = self.string(key) else {
            return default;
        };
        match Field::parse(name) {
            Ok(field) => {
                if field == Field::Expected && self.case.expected.output.is_none() {
                    let msg = format!(
                        "{}: option `{key}` reads expected.output, which this case does not set",
                        self.strategy
                    );
                    self.option_problem(key, msg);
                }
                field
            }
            Err(why) => {
                let msg = format!("{}: option `{key}`: {why}", self.strategy);
                self.option_problem(key, msg);
                default
            }
        }
    }

    /// The pass threshold: option `threshold`, then `evaluation.passingThreshold`, then
    /// `default`. Either must be in [0, 1].
    pub fn threshold(&mut self, default: f64) -> f64 {
        if self.has("threshold") {
            return self.unit("threshold").unwrap_or(default);
        }
        self.passing_threshold().unwrap_or(default)
    }

    /// `evaluation.passingThreshold`, checked to be in [0, 1].
    pub fn passing_threshold(&mut self) -> Option<f64> {
        let t = self.case.evaluation.passing_threshold?;
        if t.is_finite() && (0.0..=1.0).contains(&t) {
            Some(t)
        } else {
            let msg = format!(
                "{}: evaluation.passingThreshold must be between 0 and 1, not {t}",
                self.strategy
            );
            self.problem("/evaluation/passingThreshold", msg);
            None
        }
    }

    /// `Ok(value)` when no problem was pushed.
    pub fn finish<T>(self, value: T) -> Result<T, Vec<Problem>> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(self.problems)
        }
    }
}

/// How a JSON value is named in a problem message.
pub(crate) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
