//! The accepted eval-definition formats and their conversion into the one [`EvalConfig`].
//!
//! Discovery, first found wins: `eval/tests.json` (v2, or the v1 shape), `tests.json` at the
//! root (v1; a v2-shaped file is read as v2 too), `eval/eval_metadata.json` (the JSON-shapes
//! seed), `evals/evals.json` (skill-creator). Each converter also records, per case, the JSON
//! pointer of that case in the source file and how v2 field paths map back onto source field
//! paths, so a problem found in the converted case points at what the author wrote
//! (`/3/expectedPatterns/0` rather than `/3/expected/patterns/0`).
//!
//! JSON syntax errors become problems with line and column; type errors become problems with
//! the pointer of the offending value (via `serde_path_to_error`). Each case is decoded on its
//! own, so every broken case is reported at once. A file that is not UTF-8 is refused.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::PackageError;
use crate::definition::{EvalConfig, TestCase};
use crate::problem::{escape_token, Problem};

pub mod eval_metadata;
pub mod skill_creator;
pub mod v1;
pub mod v2;

/// The format an eval definition was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalFormat {
    /// `tests.json` v2, the canonical model.
    V2,
    /// `tests.json` v1: a list of `{name, input, expectedOutput, expectedPatterns, timeout}`.
    V1,
    /// `eval/eval_metadata.json`: `{skill_name, version, test_cases: [{id, prompt, assertions}]}`.
    EvalMetadata,
    /// skill-creator's `evals/evals.json`: `{skill_name, evals: [{id, prompt, expectations}]}`.
    SkillCreator,
}

impl EvalFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            EvalFormat::V2 => "tests.json v2",
            EvalFormat::V1 => "tests.json v1",
            EvalFormat::EvalMetadata => "eval_metadata.json",
            EvalFormat::SkillCreator => "skill-creator evals.json",
        }
    }
}

impl fmt::Display for EvalFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where eval definitions are looked for, in order.
pub const EVAL_FILES: &[&str] = &[
    "eval/tests.json",
    "tests.json",
    "eval/eval_metadata.json",
    "evals/evals.json",
];

/// Where trigger evals are looked for, in order.
pub const TRIGGER_FILES: &[&str] = &["eval/triggers.json", "evals/triggers.json"];

/// How v2 field paths below a case map onto the source file's paths below that case:
/// `(v2 prefix, source prefix)`, most specific first. Empty for v2 (identity).
pub type Renames = &'static [(&'static str, &'static str)];

/// One converted case's origin.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseSource {
    /// Pointer of the case in the source file (`/testCases/3`, `/0`, `/evals/2`).
    pub pointer: String,
    pub renames: Renames,
}

/// An eval definition converted to the canonical model.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub format: EvalFormat,
    pub config: EvalConfig,
    /// One per `config.test_cases`, same order.
    pub sources: Vec<CaseSource>,
    /// Pointer of the case list (`/testCases`, `` for a v1 array, `/evals`).
    pub list_pointer: String,
    /// The `skill_name` the file declares, with its pointer, to compare with `SKILL.md`.
    pub skill_name: Option<(String, String)>,
    pub problems: Vec<Problem>,
}

impl Converted {
    pub(crate) fn empty(format: EvalFormat, list_pointer: &str) -> Self {
        Converted {
            format,
            config: EvalConfig {
                version: "2.0".to_string(),
                profile: Default::default(),
                settings: Default::default(),
                setup: None,
                teardown: None,
                test_cases: Vec::new(),
                suites: Vec::new(),
            },
            sources: Vec::new(),
            list_pointer: list_pointer.to_string(),
            skill_name: None,
            problems: Vec::new(),
        }
    }
}

/// Maps a v2 suffix below a case (`/expected/patterns/0`) onto the source file. A suffix
/// without a source counterpart (a field the converter generated) maps to the case itself.
pub fn source_suffix(renames: Renames, is_v2: bool, suffix: &str) -> Option<String> {
    if is_v2 || suffix.is_empty() {
        return Some(suffix.to_string());
    }
    for (v2, source) in renames {
        if let Some(rest) = suffix.strip_prefix(v2) {
            if rest.is_empty() || rest.starts_with('/') {
                return Some(format!("{source}{rest}"));
            }
        }
    }
    None
}

/// Converts the content of eval file `file` (one of [`EVAL_FILES`]).
pub fn convert(file: &str, bytes: &[u8]) -> Result<Converted, PackageError> {
    if !matches!(file, "eval/eval_metadata.json" | "evals/evals.json") {
        return convert_tests_json_streamed(file, bytes);
    }
    let value = match parse_json(file, bytes)? {
        Ok(v) => v,
        Err(problem) => {
            let format = match file {
                "eval/eval_metadata.json" => EvalFormat::EvalMetadata,
                _ => EvalFormat::SkillCreator,
            };
            let mut converted = Converted::empty(format, "");
            converted.problems.push(problem);
            return Ok(converted);
        }
    };
    Ok(match file {
        "eval/eval_metadata.json" => eval_metadata::convert(&value, file),
        _ => skill_creator::convert(&value, file),
    })
}

/// `tests.json` in one pass, without building the document: an object's `testCases` are
/// converted one by one as the parser reaches them (the largest definitions are v2, and their
/// parsed `Value` tree was several times the size of the model), its other fields are read as
/// JSON values and converted as [`convert_tests_json`] does; any other file is parsed whole
/// and given to [`convert_tests_json`]. Gives the same result as parsing every file whole.
fn convert_tests_json_streamed(file: &str, bytes: &[u8]) -> Result<Converted, PackageError> {
    let text = json_text(file, bytes)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let split = crate::json_stream::SplitField {
        key: "testCases",
        seed: streamed::CasesSeed { file },
    };
    let read = serde::Deserializer::deserialize_map(&mut de, split)
        .and_then(|read| de.end().map(|()| read));
    let Ok((top, cases)) = read else {
        // Not an object with a list of cases (a v1 list, `testCases` that are not a list,
        // not JSON at all): small or broken, read whole, which says what is wrong.
        return Ok(match parse_json(file, bytes)? {
            Ok(value) => convert_tests_json(value, file),
            Err(problem) => {
                let mut converted = Converted::empty(EvalFormat::V2, "");
                converted.problems.push(problem);
                converted
            }
        });
    };
    let is_v2 = cases.is_some()
        || top
            .get("version")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with('2'));
    Ok(if is_v2 {
        v2::convert_parts(top, cases, file)
    } else {
        convert_tests_json(Value::Object(top), file)
    })
}

/// A v2 `tests.json` whose `testCases` is a list, read from `reader` without its cases: the
/// rest converted as [`convert`] converts it (its problems). `None` for any other file (no `testCases` list, not v2, not JSON, not UTF-8): read it whole
/// with [`convert`], which says what is wrong with it.
///
/// With [`v2_case_chunks`], what a caller that must not hold the definition in memory reads
/// instead of [`convert`]: the same definition and problems, the cases a chunk at a time,
/// the file itself read as a stream.
pub fn v2_header(file: &str, reader: impl std::io::Read) -> Option<Converted> {
    if matches!(file, "eval/eval_metadata.json" | "evals/evals.json") {
        return None;
    }
    let mut de =
        serde_json::Deserializer::from_reader(std::io::BufReader::new(Utf8Reader::new(reader)));
    let split = crate::json_stream::SplitField {
        key: "testCases",
        seed: crate::json_stream::ListLength,
    };
    let header = serde::Deserializer::deserialize_map(&mut de, split)
        .and_then(|header| de.end().map(|()| header));
    // The list's length is read only to know it is a list.
    let Ok((top, Some(_))) = header else {
        return None;
    };
    Some(v2::convert_parts(top, Some(v2::CaseList::default()), file))
}

/// The cases of a file [`v2_header`] read, read again from `reader` and converted as
/// [`convert`] converts them, handed to `each` in lists of up to `chunk` consecutive cases
/// (with the problems of the items that did not convert).
pub fn v2_case_chunks(
    file: &str,
    reader: impl std::io::Read,
    chunk: usize,
    each: impl FnMut(v2::CaseList),
) -> Result<(), PackageError> {
    let mut de =
        serde_json::Deserializer::from_reader(std::io::BufReader::new(Utf8Reader::new(reader)));
    let only = crate::json_stream::OnlyField {
        key: "testCases",
        seed: streamed::ChunksSeed {
            file,
            chunk: chunk.max(1),
            each,
        },
    };
    serde::Deserializer::deserialize_map(&mut de, only)
        .and_then(|_| de.end())
        .map_err(|e| {
            PackageError::refused(
                "eval_definition_changed",
                Some(file),
                format!("the eval definition could not be read again: {e}"),
            )
        })
}

/// A reader that passes on only UTF-8 text (an error at the first invalid sequence) and drops
/// a leading byte-order mark, as [`parse_json`] reads a file it holds whole. `serde_json` does
/// not check the strings it skips, and no crate validates a stream this way; written here.
struct Utf8Reader<R> {
    inner: R,
    buf: Box<[u8]>,
    /// `buf[start..valid]` is checked text not yet passed on; `buf[valid..filled]` the start
    /// of a character whose end is not read yet.
    start: usize,
    valid: usize,
    filled: usize,
    eof: bool,
    first: bool,
}

impl<R: std::io::Read> Utf8Reader<R> {
    fn new(inner: R) -> Self {
        Utf8Reader {
            inner,
            buf: vec![0; 64 * 1024].into_boxed_slice(),
            start: 0,
            valid: 0,
            filled: 0,
            eof: false,
            first: true,
        }
    }

    /// Reads more into `buf` after the unfinished character; `false` at the end of input.
    fn fill(&mut self) -> std::io::Result<bool> {
        self.buf.copy_within(self.valid..self.filled, 0);
        self.filled -= self.valid;
        self.start = 0;
        self.valid = 0;
        loop {
            let n = self.inner.read(&mut self.buf[self.filled..])?;
            if n == 0 {
                self.eof = true;
            }
            self.filled += n;
            // The byte-order mark needs the first three bytes.
            if self.first && self.filled < 3 && !self.eof {
                continue;
            }
            break;
        }
        if self.first {
            self.first = false;
            if self.buf[..self.filled].starts_with(&[0xEF, 0xBB, 0xBF]) {
                self.start = 3;
            }
        }
        match std::str::from_utf8(&self.buf[self.start..self.filled]) {
            Ok(_) => self.valid = self.filled,
            Err(e) if e.error_len().is_none() && !self.eof => {
                self.valid = self.start + e.valid_up_to();
            }
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the file is not UTF-8",
                ))
            }
        }
        Ok(self.valid > self.start || !self.eof)
    }
}

impl<R: std::io::Read> std::io::Read for Utf8Reader<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.start == self.valid {
            if self.eof && self.valid == self.filled {
                return Ok(0);
            }
            if !self.fill()? {
                return Ok(0);
            }
        }
        let n = out.len().min(self.valid - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

/// The serde visitors of [`convert_tests_json_streamed`], written here because converting a
/// list's items while it is parsed is what serde's `DeserializeSeed` is for; no crate does it
/// for one large field of a JSON document.
mod streamed {
    use std::fmt;

    use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
    use serde_json::Value;

    use super::v2::CaseList;

    /// The second pass of a file [`super::v2_header`] accepted: its `testCases` in chunks.
    pub(super) struct ChunksSeed<'f, F> {
        pub file: &'f str,
        pub chunk: usize,
        pub each: F,
    }

    impl<'de, F: FnMut(CaseList)> DeserializeSeed<'de> for ChunksSeed<'_, F> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_seq(self)
        }
    }

    impl<'de, F: FnMut(CaseList)> Visitor<'de> for ChunksSeed<'_, F> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of test cases")
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut list = CaseList::default();
            let mut index = 0;
            while let Some(item) = seq.next_element::<Value>()? {
                list.push(index, item, self.file);
                index += 1;
                if index % self.chunk == 0 {
                    (self.each)(std::mem::take(&mut list));
                }
            }
            if !list.is_empty() {
                (self.each)(list);
            }
            Ok(())
        }
    }

    /// `testCases`, converted item by item; anything but a list is an error.
    #[derive(Clone, Copy)]
    pub(super) struct CasesSeed<'f> {
        pub file: &'f str,
    }

    impl<'de> DeserializeSeed<'de> for CasesSeed<'_> {
        type Value = CaseList;

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<CaseList, D::Error> {
            deserializer.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for CasesSeed<'_> {
        type Value = CaseList;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of test cases")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CaseList, A::Error> {
            let mut list = CaseList::default();
            let mut index = 0;
            while let Some(item) = seq.next_element::<Value>()? {
                list.push(index, item, self.file);
                index += 1;
            }
            Ok(list)
        }
    }
}

/// `tests.json`, at the root or in `eval/`: v2 when `version` starts with `2` or there are
/// `testCases`, v1 when it is a list or has `tests`.
fn convert_tests_json(value: Value, file: &str) -> Converted {
    match &value {
        Value::Object(obj) => {
            let is_v2 = obj.contains_key("testCases")
                || obj
                    .get("version")
                    .and_then(Value::as_str)
                    .is_some_and(|v| v.starts_with('2'));
            if is_v2 {
                v2::convert(value, file)
            } else if obj.contains_key("tests") {
                v1::convert(&value, file)
            } else {
                let mut converted = Converted::empty(EvalFormat::V2, "/testCases");
                converted.problems.push(Problem::error(
                    file,
                    "",
                    "unrecognised tests.json: expected a v2 object with `version: \"2.0\"` and \
                     `testCases`, or a v1 list of tests (or `{\"tests\": [...]}`)",
                ));
                converted
            }
        }
        Value::Array(_) => v1::convert(&value, file),
        _ => {
            let mut converted = Converted::empty(EvalFormat::V2, "/testCases");
            converted.problems.push(Problem::error(
                file,
                "",
                "tests.json must be a JSON object (v2) or a list of tests (v1)",
            ));
            converted
        }
    }
}

/// The problem of a JSON file (an eval definition, a trigger file) holding the NUL character
/// (U+0000), which no stored case id, prompt or query can hold, pointing at the first string
/// or key that does; `None` when there is none or the file is not JSON (its syntax problem
/// is reported by the conversion).
pub fn nul_problem(file: &str, bytes: &[u8]) -> Option<Problem> {
    let pointer = crate::text::nul_in_json(bytes)?;
    Some(Problem::error(file, pointer, crate::text::NUL_RULE))
}

/// Parses JSON: `Err` refuses a non-UTF-8 file; `Ok(Err)` is a syntax problem with line and
/// column. A UTF-8 byte-order mark is accepted.
pub fn parse_json(file: &str, bytes: &[u8]) -> Result<Result<Value, Problem>, PackageError> {
    let text = json_text(file, bytes)?;
    Ok(serde_json::from_str(text).map_err(|e| syntax_problem(file, &e)))
}

/// The file as text: `Err` refuses a non-UTF-8 file; a byte-order mark is dropped.
fn json_text<'b>(file: &str, bytes: &'b [u8]) -> Result<&'b str, PackageError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        PackageError::refused(
            "non_utf8_json",
            Some(file),
            format!(
                "the file is not UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            ),
        )
    })?;
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

/// A JSON syntax error as a problem that says where it is.
fn syntax_problem(file: &str, e: &serde_json::Error) -> Problem {
    Problem::error(
        file,
        "",
        format!(
            "invalid JSON at line {}, column {}: {}",
            e.line(),
            e.column(),
            strip_position(&e.to_string())
        ),
    )
}

/// serde_json appends ` at line L column C`; we say it first.
fn strip_position(message: &str) -> &str {
    message
        .find(" at line ")
        .map_or(message, |idx| &message[..idx])
}

/// Decodes `value` (found at `base` in `file`) into `T`; a type error becomes a problem at the
/// pointer of the offending value.
pub fn typed<T: DeserializeOwned>(value: &Value, file: &str, base: &str) -> Result<T, Problem> {
    serde_path_to_error::deserialize(value).map_err(|err| path_problem(&err, file, base))
}

/// [`typed`] consuming the value: its strings move into `T` instead of being copied.
pub fn typed_owned<T: DeserializeOwned>(
    value: Value,
    file: &str,
    base: &str,
) -> Result<T, Problem> {
    serde_path_to_error::deserialize(value).map_err(|err| path_problem(&err, file, base))
}

/// A decoding error as a problem at its JSON pointer (`base` + the error's path).
fn path_problem(
    err: &serde_path_to_error::Error<serde_json::Error>,
    file: &str,
    base: &str,
) -> Problem {
    let mut pointer = base.to_string();
    for segment in err.path().iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => {
                pointer.push('/');
                pointer.push_str(&index.to_string());
            }
            serde_path_to_error::Segment::Map { key } => {
                pointer.push('/');
                pointer.push_str(&escape_token(key));
            }
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {
                break
            }
        }
    }
    Problem::error(
        file,
        pointer,
        strip_position(&err.inner().to_string()).to_string(),
    )
}

/// A `{skill_name, <list_key>: [...]}` format (skill-creator, eval_metadata).
pub(crate) struct NamedListFormat {
    pub format: EvalFormat,
    pub list_key: &'static str,
    /// The top-level fields; others are warned about and ignored.
    pub top_keys: &'static [&'static str],
    /// The error when the document is not an object.
    pub not_object: &'static str,
    pub case: CaseShape,
}

impl NamedListFormat {
    /// Converts the document: unknown top-level keys warned about, `skill_name` recorded, then
    /// each item under `list_key` through [`convert_cases`] and `to_v2`.
    pub(crate) fn convert<T: DeserializeOwned>(
        &self,
        value: &Value,
        file: &str,
        to_v2: impl FnMut(usize, T, &str, &mut Vec<Problem>) -> (TestCase, Renames),
    ) -> Converted {
        let mut out = Converted::empty(self.format, &format!("/{}", self.list_key));
        if let Some(items) = self.case_list(value, file, &mut out) {
            convert_cases(&mut out, items, file, &self.case, to_v2);
        }
        out
    }

    /// Reads the top level into `out` and returns the items under `list_key`, or `None` once
    /// a problem says why there are none.
    fn case_list<'v>(
        &self,
        value: &'v Value,
        file: &str,
        out: &mut Converted,
    ) -> Option<&'v Vec<Value>> {
        #[derive(Deserialize)]
        struct Top {
            #[serde(default)]
            skill_name: Option<String>,
        }

        let list_key = self.list_key;
        let Value::Object(obj) = value else {
            out.problems.push(Problem::error(file, "", self.not_object));
            return None;
        };
        warn_unknown_keys(
            value,
            self.top_keys,
            file,
            "",
            "top-level",
            &mut out.problems,
        );
        // Everything but the cases (which are read one by one), without copying the cases.
        let top: serde_json::Map<String, Value> = obj
            .iter()
            .filter(|(key, _)| key.as_str() != list_key)
            .map(|(key, v)| (key.clone(), v.clone()))
            .collect();
        match typed::<Top>(&Value::Object(top), file, "") {
            Ok(top) => out.skill_name = top.skill_name.map(|n| (n, "/skill_name".to_string())),
            Err(problem) => out.problems.push(problem),
        }
        let pointer = format!("/{list_key}");
        match obj.get(list_key) {
            Some(Value::Array(items)) => Some(items),
            Some(_) => {
                out.problems.push(Problem::error(
                    file,
                    &pointer,
                    format!("`{list_key}` must be a list"),
                ));
                None
            }
            None => {
                out.problems.push(Problem::error(
                    file,
                    &pointer,
                    format!("`{list_key}` is required"),
                ));
                None
            }
        }
    }
}

/// What a format's case items are called and which fields they have, for the problems of
/// [`convert_cases`] and [`CaseShape::check`].
pub(crate) struct CaseShape {
    /// The fields an item may have; others are warned about and ignored.
    pub keys: &'static [&'static str],
    /// The item with its article, for "a test case must be a JSON object".
    pub a_noun: &'static str,
    /// The item in "unknown test case field `x` is ignored".
    pub noun: &'static str,
}

impl CaseShape {
    /// Whether the item at `at` is an object worth decoding; its unknown fields are warned
    /// about, a non-object is an error.
    pub(crate) fn check(
        &self,
        item: &Value,
        file: &str,
        at: &str,
        problems: &mut Vec<Problem>,
    ) -> bool {
        if !item.is_object() {
            problems.push(Problem::error(
                file,
                at,
                format!("{} must be a JSON object", self.a_noun),
            ));
            return false;
        }
        warn_unknown_keys(item, self.keys, file, at, self.noun, problems);
        true
    }
}

/// The per-item loop of the converted formats (v1, eval_metadata, skill-creator): each item
/// of the list at `out.list_pointer` is checked, decoded as `T` and turned into a v2 case by
/// `to_v2` (given its index, pointer and the problem list), with its source recorded; a broken
/// item becomes a problem and the next is read all the same.
pub(crate) fn convert_cases<T: DeserializeOwned>(
    out: &mut Converted,
    items: &[Value],
    file: &str,
    shape: &CaseShape,
    mut to_v2: impl FnMut(usize, T, &str, &mut Vec<Problem>) -> (TestCase, Renames),
) {
    for (i, item) in items.iter().enumerate() {
        let at = format!("{}/{i}", out.list_pointer);
        if !shape.check(item, file, &at, &mut out.problems) {
            continue;
        }
        match typed::<T>(item, file, &at) {
            Ok(decoded) => {
                let (case, renames) = to_v2(i, decoded, &at, &mut out.problems);
                out.config.test_cases.push(case);
                out.sources.push(CaseSource {
                    pointer: at,
                    renames,
                });
            }
            Err(problem) => out.problems.push(problem),
        }
    }
}

/// A warning for each key of `value` (an object at `base`) not in `known`.
pub fn warn_unknown_keys(
    value: &Value,
    known: &[&str],
    file: &str,
    base: &str,
    what: &str,
    problems: &mut Vec<Problem>,
) {
    let Value::Object(obj) = value else {
        return;
    };
    for key in obj.keys() {
        if !known.contains(&key.as_str()) {
            problems.push(Problem::warning(
                file,
                format!("{base}/{}", escape_token(key)),
                format!(
                    "unknown {what} field `{key}` is ignored (known: {})",
                    known.join(", ")
                ),
            ));
        }
    }
}

/// A case id written as a string or an integer (skill-creator uses integers).
pub(crate) fn id_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// Deserializes an id that may be a string or an integer.
pub(crate) fn deserialize_id<'de, D: serde::Deserializer<'de>>(de: D) -> Result<String, D::Error> {
    let value = Value::deserialize(de)?;
    id_string(&value).ok_or_else(|| {
        serde::de::Error::custom(format!("`id` must be a string or an integer, not {value}"))
    })
}

/// A short case name from a prompt: its first non-empty line, at most 80 characters.
pub(crate) fn name_from_prompt(prompt: &str) -> String {
    let line = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if line.chars().count() > 80 {
        let cut: String = line.chars().take(79).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// One trigger eval: should the skill be selected for this query?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerCase {
    #[serde(alias = "prompt")]
    pub query: String,
    #[serde(alias = "shouldTrigger")]
    pub should_trigger: bool,
}

/// Reads a trigger file: `[{query, should_trigger}]` (or `{"evals": [...]}`; `prompt` and
/// `shouldTrigger` are accepted spellings).
pub fn convert_triggers(
    file: &str,
    bytes: &[u8],
) -> Result<(Vec<TriggerCase>, Vec<Problem>), PackageError> {
    let mut problems: Vec<Problem> = nul_problem(file, bytes).into_iter().collect();
    let value = match parse_json(file, bytes)? {
        Ok(v) => v,
        Err(p) => return Ok((Vec::new(), vec![p])),
    };
    let (items, base) = match &value {
        Value::Array(items) => (items, ""),
        Value::Object(obj) => match obj.get("evals") {
            Some(Value::Array(items)) => (items, "/evals"),
            _ => {
                problems.push(Problem::error(
                    file,
                    "",
                    "a trigger file must be a list of `{query, should_trigger}`",
                ));
                return Ok((Vec::new(), problems));
            }
        },
        _ => {
            problems.push(Problem::error(
                file,
                "",
                "a trigger file must be a list of `{query, should_trigger}`",
            ));
            return Ok((Vec::new(), problems));
        }
    };
    let mut triggers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{base}/{i}");
        match typed::<TriggerCase>(item, file, &at) {
            Ok(t) if t.query.trim().is_empty() => {
                problems.push(Problem::error(
                    file,
                    format!("{at}/query"),
                    "`query` must not be empty",
                ));
            }
            Ok(t) => triggers.push(t),
            Err(p) => problems.push(p),
        }
    }
    Ok((triggers, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tests.json` converted the way it was before the streamed reader: the whole document
    /// parsed, then converted.
    fn by_value(file: &str, bytes: &[u8]) -> Converted {
        match parse_json(file, bytes).expect("utf-8") {
            Ok(value) => convert_tests_json(value, file),
            Err(problem) => {
                let mut converted = Converted::empty(EvalFormat::V2, "");
                converted.problems.push(problem);
                converted
            }
        }
    }

    /// Gives its bytes one at a time: every character boundary falls between reads.
    struct Trickle<'a>(&'a [u8]);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            match (self.0.split_first(), out.first_mut()) {
                (Some((b, rest)), Some(slot)) => {
                    *slot = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn through_utf8_reader(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        use std::io::Read as _;
        let mut out = Vec::new();
        Utf8Reader::new(Trickle(bytes)).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn the_utf8_reader_passes_text_drops_a_bom_and_refuses_anything_else() {
        let text = "{\"é\": \"日本 — 🦀\", \"a\": 1}";
        assert_eq!(
            through_utf8_reader(text.as_bytes()).unwrap(),
            text.as_bytes()
        );
        let with_bom = format!("\u{feff}{text}");
        assert_eq!(
            through_utf8_reader(with_bom.as_bytes()).unwrap(),
            text.as_bytes()
        );
        // A byte-order mark is dropped at the start only.
        let inner = "a\u{feff}".to_string();
        assert_eq!(
            through_utf8_reader(inner.as_bytes()).unwrap(),
            inner.as_bytes()
        );
        assert_eq!(through_utf8_reader(b"").unwrap(), b"");
        assert_eq!(through_utf8_reader(b"ab").unwrap(), b"ab");
        for bad in [&b"{\"a\": \"\xff\"}"[..], b"\xe6\x97", b"ok \xf0\x9f\xa6"] {
            let err = through_utf8_reader(bad).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{bad:?}");
        }
        // Large reads go through whole.
        let big = "🦀é".repeat(50_000);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut Utf8Reader::new(big.as_bytes()), &mut out).unwrap();
        assert_eq!(out, big.as_bytes());
    }

    #[test]
    fn the_streamed_tests_json_reader_converts_as_the_whole_document_does() {
        let documents: &[&str] = &[
            // v2, cases first, every kind of case problem, fields after the cases.
            r#"{"testCases": [
                 {"id": "a", "input": {"prompt": "x"}, "metadata": {"tags": ["pii"]}},
                 {"id": "b", "weight": "heavy"},
                 7,
                 {"name": "no id"},
                 {"id": "c", "expectd": {}}
               ],
               "version": "2.0", "profile": "structured", "colour": "blue",
               "settings": {"runner": "given"}, "suites": [{"name": "s", "tests": ["a"]}]}"#,
            // A bad top-level field, a version that is not 2, the cases last.
            r#"{"version": "1.5", "profile": "artsy", "testCases": [{"id": "a"}]}"#,
            // `testCases` that are not a list.
            r#"{"version": "2.0", "testCases": {"id": "a"}}"#,
            r#"{"testCases": "a"}"#,
            r#"{"testCases": null}"#,
            r#"{"testCases": 3, "version": "2.0"}"#,
            // A repeated `testCases`: the last one counts.
            r#"{"testCases": [{"id": "a"}], "testCases": [{"id": "b"}, {"id": "c"}]}"#,
            // v2 by its version alone; v1 as an object and as a list; neither.
            r#"{"version": "2.1", "settings": {}}"#,
            r#"{"tests": [{"name": "t", "input": "hi", "expectedOutput": "hello"}]}"#,
            r#"[{"name": "t", "input": "hi", "expectedPatterns": ["h.*"]}]"#,
            r#"{"cases": []}"#,
            r#""tests""#,
            "42",
            "-1.5",
            "null",
            "true",
            // Syntax errors: inside a case, after the document, an empty file.
            "{\"testCases\": [\n  {\"id\": \"a\"},\n  {\"id\": }\n]}",
            r#"{"testCases": []} x"#,
            "",
            // A byte-order mark.
            "\u{feff}{\"testCases\": [{\"id\": \"a\"}]}",
        ];
        for document in documents {
            for file in ["eval/tests.json", "tests.json"] {
                let streamed = convert(file, document.as_bytes()).expect("utf-8");
                assert_eq!(streamed, by_value(file, document.as_bytes()), "{document}");
            }
        }
        // The comparison is not vacuous: the first document has cases and problems.
        let first = convert("eval/tests.json", documents[0].as_bytes()).expect("utf-8");
        assert_eq!(first.config.test_cases.len(), 2);
        assert_eq!(first.config.test_cases[0].tags, ["pii"]);
        assert_eq!(first.problems.len(), 5, "{:?}", first.problems);
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let err = parse_json("eval/tests.json", b"{\n  \"a\": ,\n}")
            .expect("utf-8")
            .expect_err("bad json");
        assert_eq!(err.pointer, "");
        assert!(
            err.message
                .starts_with("invalid JSON at line 2, column 8: expected value"),
            "{}",
            err.message
        );
    }

    #[test]
    fn non_utf8_json_is_refused() {
        let err = parse_json("eval/tests.json", b"{\"a\": \"\xff\"}").expect_err("refused");
        assert_eq!(err.limit(), Some("non_utf8_json"));
        assert_eq!(err.entry(), Some("eval/tests.json"));
    }

    #[test]
    fn type_error_points_at_the_value() {
        let value: Value =
            serde_json::json!({"testCases": [{"id": "a", "evaluation": {"timeout": "soon"}}]});
        let case = &value["testCases"][0];
        let err = typed::<crate::definition::TestCase>(case, "eval/tests.json", "/testCases/0")
            .expect_err("type error");
        assert_eq!(err.pointer, "/testCases/0/evaluation/timeout");
        assert!(
            err.message.contains("invalid type: string \"soon\""),
            "{}",
            err.message
        );
    }

    #[test]
    fn suffixes_map_back_to_source_fields() {
        let renames: Renames = &[
            ("/expected/patterns", "/expectedPatterns"),
            ("/input/prompt", "/input"),
        ];
        assert_eq!(
            source_suffix(renames, false, "/expected/patterns/2").as_deref(),
            Some("/expectedPatterns/2")
        );
        assert_eq!(
            source_suffix(renames, false, "/input/prompt").as_deref(),
            Some("/input")
        );
        assert_eq!(source_suffix(renames, false, "/evaluation/strategy"), None);
        assert_eq!(
            source_suffix(renames, true, "/evaluation/strategy").as_deref(),
            Some("/evaluation/strategy")
        );
    }

    #[test]
    fn triggers_accept_both_spellings() {
        let (t, problems) = convert_triggers(
            "eval/triggers.json",
            br#"[{"query": "make a pdf", "should_trigger": true}, {"prompt": "weather?", "shouldTrigger": false}, {"query": ""}]"#,
        )
        .expect("utf-8");
        assert_eq!(
            t,
            vec![
                TriggerCase {
                    query: "make a pdf".into(),
                    should_trigger: true
                },
                TriggerCase {
                    query: "weather?".into(),
                    should_trigger: false
                },
            ]
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].pointer, "/2");
        assert!(
            problems[0].message.contains("should_trigger"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn name_from_prompt_takes_first_line() {
        assert_eq!(
            name_from_prompt("\n  Make a chart\nwith data"),
            "Make a chart"
        );
        assert_eq!(name_from_prompt(&"x".repeat(100)).chars().count(), 80);
    }
}
