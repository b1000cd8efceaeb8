//! Planning: one validated eval definition becomes one [`Job`] per selected test case.
//!
//! A job is self-contained — the resolved case (templated prompt, strategy name filled in), the
//! runner, the timeout and the package's content hash — so a worker needs no database read to
//! start it and the CLI needs nothing else to execute it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::case_scripts::CaseScripts;
use skilleval_model::definition::{EvalConfig, Given, Profile, RunnerConfig, TestCase};

/// One test case to produce and grade.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub run_id: Uuid,
    /// The case as it will run: prompt templated, `evaluation.strategy` resolved.
    pub case: TestCase,
    /// Position in the eval file, for stable report ordering.
    pub case_index: u32,
    pub profile: Profile,
    pub runner: RunnerConfig,
    /// Wall-clock limit for producing and grading one attempt.
    pub timeout_ms: u64,
    /// Extra attempts for a failing (not erroring) case.
    pub retry_count: u32,
    /// SHA-256 of the package content; workers fetch and cache packages by it.
    pub package_hash: String,
    /// `setup.environment`, passed to the command runner.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// `setup.script` and `teardown.script`, run around each attempt in the case's workspace
    /// ([`crate::case_scripts`]).
    #[serde(default, skip_serializing_if = "CaseScripts::is_empty")]
    pub scripts: CaseScripts,
    /// `setup.dependencies`: with the dependencies the package's files declare (read where
    /// the package is, [`skilleval_model::package::dependencies::read_from_dir`]), what the
    /// case's environment is built from ([`crate::environment`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// A recorded output sent with the job (production samples), overriding the case's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<Given>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suites: Vec<String>,
    /// Which delivery of this job this is (1 on first publish), counted by whoever retries.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

fn first_attempt() -> u32 {
    1
}

impl Job {
    pub fn strategy(&self) -> &str {
        self.case.strategy_name(self.profile)
    }
}

/// Which cases of a definition to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CaseFilter {
    /// Keep cases carrying any of these tags (empty: all).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Keep only these case ids (empty: all).
    #[serde(default)]
    pub case_ids: Vec<String>,
    /// Keep only the cases of this suite.
    #[serde(default)]
    pub suite: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("unknown suite `{0}`; the eval definition has: {1}")]
    UnknownSuite(String, String),
    #[error("unknown test case id `{0}`")]
    UnknownCase(String),
    #[error(
        "no test case matches the filter (tags: {tags:?}, cases: {cases:?}, suite: {suite:?})"
    )]
    Empty {
        tags: Vec<String>,
        cases: Vec<String>,
        suite: Option<String>,
    },
}

/// The runner a case uses when the run names none: the file's `settings.runner`, else `given`
/// when the case carries a recorded output, else `llm`.
pub fn default_runner(config: &EvalConfig, case: &TestCase) -> RunnerConfig {
    match &config.settings.runner {
        Some(spec) => spec.config(),
        None if case.given.is_some() => RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        },
        None => RunnerConfig {
            kind: "llm".into(),
            ..RunnerConfig::default()
        },
    }
}

/// Plans the jobs of a run. `config` must be the resolved (templated) definition.
pub fn plan(
    config: &EvalConfig,
    package_hash: &str,
    run_id: Uuid,
    filter: &CaseFilter,
    runner_override: Option<&RunnerConfig>,
) -> Result<Vec<Job>, PlanError> {
    let suite_ids = check_filter(config, &config.test_cases, filter)?;
    let cases = config.test_cases.iter().map(Cow::Borrowed);
    let planner = Planner::new(config, package_hash, run_id, runner_override);
    planner.plan(cases, filter, suite_ids)
}

/// Checks that the filter's suite and cases exist; returns the suite's case ids when it names
/// one.
fn check_filter<'c>(
    config: &'c EvalConfig,
    cases: &[TestCase],
    filter: &CaseFilter,
) -> Result<Option<&'c [String]>, PlanError> {
    let suite_ids = suite_ids(config, filter)?;
    if !filter.case_ids.is_empty() {
        let known: HashSet<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        if let Some(id) = filter
            .case_ids
            .iter()
            .find(|id| !known.contains(id.as_str()))
        {
            return Err(PlanError::UnknownCase(id.clone()));
        }
    }
    Ok(suite_ids)
}

/// The ids of the filter's suite when it names one; an unknown suite is an error.
fn suite_ids<'c>(
    config: &'c EvalConfig,
    filter: &CaseFilter,
) -> Result<Option<&'c [String]>, PlanError> {
    let Some(name) = &filter.suite else {
        return Ok(None);
    };
    match config.suites.iter().find(|s| &s.name == name) {
        Some(s) => Ok(Some(&s.test_ids)),
        None => {
            let names: Vec<&str> = config.suites.iter().map(|s| s.name.as_str()).collect();
            let known = if names.is_empty() {
                "no suites".to_string()
            } else {
                names.join(", ")
            };
            Err(PlanError::UnknownSuite(name.clone(), known))
        }
    }
}

/// What every job of a run shares.
struct Planner<'a> {
    config: &'a EvalConfig,
    package_hash: &'a str,
    run_id: Uuid,
    runner_override: Option<&'a RunnerConfig>,
    /// Each case id's suites, in definition order (looked up per job: a suite may list every
    /// case of a large definition).
    suites_by_case: HashMap<&'a str, Vec<&'a str>>,
}

impl<'a> Planner<'a> {
    fn new(
        config: &'a EvalConfig,
        package_hash: &'a str,
        run_id: Uuid,
        runner_override: Option<&'a RunnerConfig>,
    ) -> Self {
        // As `EvalConfig::suites_of`: each suite that lists the case, once, in suite order.
        let mut suites_by_case: HashMap<&str, Vec<&str>> = HashMap::new();
        for suite in &config.suites {
            for id in &suite.test_ids {
                let suites = suites_by_case.entry(id.as_str()).or_default();
                if suites
                    .last()
                    .is_none_or(|last| !std::ptr::eq(*last, suite.name.as_str()))
                {
                    suites.push(&suite.name);
                }
            }
        }
        Planner {
            config,
            package_hash,
            run_id,
            runner_override,
            suites_by_case,
        }
    }
}

impl Planner<'_> {
    /// One job per selected case, in definition order (the index is the case's position in
    /// the definition, whatever the filter leaves out).
    fn plan<'c>(
        &self,
        cases: impl Iterator<Item = Cow<'c, TestCase>>,
        filter: &CaseFilter,
        suite_ids: Option<&[String]>,
    ) -> Result<Vec<Job>, PlanError> {
        let selection = Selection::new(filter, suite_ids);
        let jobs: Vec<Job> = cases
            .enumerate()
            .filter(|(_, c)| selection.selects(&c.id, &c.tags))
            .map(|(index, c)| self.job(index, c))
            .collect();
        if jobs.is_empty() {
            return Err(empty(filter));
        }
        Ok(jobs)
    }

    /// The job of the case at `index` of the definition.
    fn job(&self, index: usize, c: Cow<'_, TestCase>) -> Job {
        let config = self.config;
        let runner = self
            .runner_override
            .cloned()
            .unwrap_or_else(|| default_runner(config, &c));
        let timeout_ms = c.timeout_ms(&config.settings);
        let retry_count = c
            .evaluation
            .retry_count
            .unwrap_or(u32::from(config.settings.retry_failed));
        let suites = self
            .suites_by_case
            .get(c.id.as_str())
            .map(|names| names.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default();
        let strategy = c.strategy_name(config.profile).to_string();
        let mut case = c.into_owned();
        case.evaluation.strategy = strategy;
        Job {
            run_id: self.run_id,
            case_index: u32::try_from(index).unwrap_or(u32::MAX),
            profile: config.profile,
            runner,
            timeout_ms,
            retry_count,
            package_hash: self.package_hash.to_string(),
            environment: config
                .setup
                .as_ref()
                .map(|s| s.environment.clone())
                .unwrap_or_default(),
            scripts: CaseScripts {
                setup: config.setup.as_ref().and_then(|s| s.script.clone()),
                teardown: config.teardown.as_ref().and_then(|t| t.script.clone()),
            },
            dependencies: config
                .setup
                .as_ref()
                .map(|s| s.dependencies.clone())
                .unwrap_or_default(),
            given: None,
            suites,
            attempt: 1,
            case,
        }
    }
}

/// Which cases a filter selects; its case ids and its suite's ids as sets (a request may
/// name thousands of cases of a definition of 100,000).
struct Selection<'f> {
    filter: &'f CaseFilter,
    ids: HashSet<&'f str>,
    /// The ids of the filter's suite, when it names one.
    suite: Option<HashSet<&'f str>>,
}

impl<'f> Selection<'f> {
    fn new(filter: &'f CaseFilter, suite_ids: Option<&'f [String]>) -> Self {
        Selection {
            filter,
            ids: filter.case_ids.iter().map(String::as_str).collect(),
            suite: suite_ids.map(|ids| ids.iter().map(String::as_str).collect()),
        }
    }

    /// Whether the filter selects the case with this id and tags.
    fn selects(&self, id: &str, tags: &[String]) -> bool {
        (self.ids.is_empty() || self.ids.contains(id))
            && (self.filter.tags.is_empty() || tags.iter().any(|t| self.filter.tags.contains(t)))
            && self.suite.as_ref().is_none_or(|ids| ids.contains(id))
    }
}

/// The order `jobs` may run in: groups of indices into `jobs`, each run one job at a time in
/// its order, the groups side by side. A suite with `runInSequence` is one group: the jobs of
/// its cases in the suite's `testIds` order (a case's variants — baseline, repeats — together,
/// in job order); every other job is a group of its own. A case listed by several such suites
/// runs in the first. Every index is in exactly one group; groups come in the order of their
/// first job.
pub fn run_order(config: &EvalConfig, jobs: &[Job]) -> Vec<Vec<usize>> {
    // Case id -> (sequential suite, position in it); the first suite that lists a case wins.
    let mut place: HashMap<&str, (usize, usize)> = HashMap::new();
    for (k, suite) in config.suites.iter().enumerate() {
        if !suite.run_in_sequence {
            continue;
        }
        for (position, id) in suite.test_ids.iter().enumerate() {
            place.entry(id.as_str()).or_insert((k, position));
        }
    }
    let mut chains: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match place.get(job.case.id.as_str()) {
            Some(&(suite, position)) => chains.entry(suite).or_default().push((position, i)),
            None => groups.push(vec![i]),
        }
    }
    for (_, mut chain) in chains {
        chain.sort_unstable();
        groups.push(chain.into_iter().map(|(_, i)| i).collect());
    }
    groups.sort_by_key(|g| g.iter().min().copied());
    groups
}

fn empty(filter: &CaseFilter) -> PlanError {
    PlanError::Empty {
        tags: filter.tags.clone(),
        cases: filter.case_ids.clone(),
        suite: filter.suite.clone(),
    }
}

/// A stored definition planned from its JSON text, case by case: what a service holds for a
/// large definition instead of the model (whose in-memory form is several times the text),
/// so planning a run needs the deflated text and one chunk of jobs, whatever the number of
/// cases.
///
/// The text is the serialised [`EvalConfig`], held deflated (a 100,000-case definition is
/// 44 MB of JSON and ~2 MB deflated): from the model ([`DefinitionText::from_config`]), as
/// stored ([`DefinitionText::from_deflated`]), or from plain JSON text
/// ([`DefinitionText::parse`], how earlier versions stored it; deflated on reading). It is
/// read once for everything but the cases, and again, a case at a time and inflated as it is
/// read, by each pass over the cases ([`DefinitionText::count`],
/// [`DefinitionText::plan_chunks`]).
#[derive(Debug)]
pub struct DefinitionText {
    deflated: Vec<u8>,
    /// The definition without its cases.
    header: EvalConfig,
    cases: usize,
}

/// A definition's text that does not parse as one (or does not inflate).
#[derive(Debug, thiserror::Error)]
#[error("the stored eval definition does not parse: {0}")]
pub struct TextError(#[from] serde_json::Error);

/// The parser of a pass over a deflated definition.
type Inflating<'a> = serde_json::Deserializer<
    serde_json::de::IoRead<std::io::BufReader<flate2::read::DeflateDecoder<&'a [u8]>>>,
>;

/// Runs `pass` over the deflated text, then checks that nothing follows the document.
fn over_text<'a, T>(
    deflated: &'a [u8],
    pass: impl FnOnce(&mut Inflating<'a>) -> serde_json::Result<T>,
) -> Result<T, TextError> {
    let inflated =
        std::io::BufReader::with_capacity(64 * 1024, flate2::read::DeflateDecoder::new(deflated));
    let mut de = serde_json::Deserializer::from_reader(inflated);
    let out = pass(&mut de)?;
    de.end()?;
    Ok(out)
}

/// A deflate stream at the fastest level (the text is mostly repeated field names).
fn deflater() -> flate2::write::DeflateEncoder<Vec<u8>> {
    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast())
}

impl DefinitionText {
    /// Reads a definition stored as plain JSON text: everything but its cases now.
    pub fn parse(text: String) -> Result<Self, TextError> {
        use std::io::Write as _;
        let mut deflate = deflater();
        deflate
            .write_all(text.as_bytes())
            .map_err(serde_json::Error::io)?;
        drop(text);
        DefinitionText::from_deflated(deflate.finish().map_err(serde_json::Error::io)?)
    }

    /// Reads a definition stored deflated ([`DefinitionText::deflated`]).
    pub fn from_deflated(deflated: Vec<u8>) -> Result<Self, TextError> {
        let (top, cases) = over_text(&deflated, |de| stored::header(de))?;
        let header: EvalConfig = serde_json::from_value(serde_json::Value::Object(top))?;
        Ok(DefinitionText {
            deflated,
            header,
            cases,
        })
    }

    /// Serialises and deflates a definition for storing, dropping each case once it is
    /// written (the definition is never held both as the model and as text); `config` is
    /// left without its cases.
    pub fn from_config(config: &mut EvalConfig) -> Result<Self, TextError> {
        let mut writer = DefinitionWriter::new();
        writer.write_cases(std::mem::take(&mut config.test_cases));
        writer.finish(config)
    }

    /// The deflated JSON text, as stored.
    pub fn deflated(&self) -> &[u8] {
        &self.deflated
    }

    /// The definition without its cases.
    pub fn header(&self) -> &EvalConfig {
        &self.header
    }

    /// How many cases the definition has.
    pub fn cases(&self) -> usize {
        self.cases
    }

    /// Checks a filter as [`plan`] does (its suite and cases exist, it selects something)
    /// and counts the jobs it selects, reading each case's id and tags only.
    pub fn count(&self, filter: &CaseFilter) -> Result<Result<usize, PlanError>, TextError> {
        let suite_ids = match suite_ids(&self.header, filter) {
            Ok(ids) => ids,
            Err(e) => return Ok(Err(e)),
        };
        if filter.case_ids.is_empty() && filter.tags.is_empty() && suite_ids.is_none() {
            return Ok(if self.cases == 0 {
                Err(empty(filter))
            } else {
                Ok(self.cases)
            });
        }
        let selection = Selection::new(filter, suite_ids);
        let mut unseen = selection.ids.clone();
        let mut count = 0;
        let each = |_, key: stored::CaseKey| {
            unseen.remove(key.id.as_str());
            if selection.selects(&key.id, &key.tags) {
                count += 1;
            }
            true
        };
        over_text(&self.deflated, |de| stored::each_case(de, each))?;
        // The first unknown one in the request's order, as `plan` reports it.
        if let Some(id) = filter
            .case_ids
            .iter()
            .find(|id| unseen.contains(id.as_str()))
        {
            return Ok(Err(PlanError::UnknownCase(id.clone())));
        }
        Ok(if count == 0 {
            Err(empty(filter))
        } else {
            Ok(count)
        })
    }

    /// Plans the jobs of a run in definition order, as [`plan`] does, handing them to `each`
    /// in chunks of at most `chunk` (the last one shorter); `each` returns `false` to stop.
    /// Check the filter with [`DefinitionText::count`] first: a filter naming a suite the
    /// definition lacks plans nothing.
    pub fn plan_chunks(
        &self,
        package_hash: &str,
        run_id: Uuid,
        filter: &CaseFilter,
        runner_override: Option<&RunnerConfig>,
        chunk: usize,
        mut each: impl FnMut(Vec<Job>) -> bool,
    ) -> Result<(), TextError> {
        let Ok(suite_ids) = suite_ids(&self.header, filter) else {
            return Ok(());
        };
        let planner = Planner::new(&self.header, package_hash, run_id, runner_override);
        let chunk = chunk.max(1);
        let mut jobs = Vec::with_capacity(chunk);
        let mut going = true;
        let selection = Selection::new(filter, suite_ids);
        let each_case = |index, case: TestCase| {
            if selection.selects(&case.id, &case.tags) {
                jobs.push(planner.job(index, Cow::Owned(case)));
                if jobs.len() == chunk {
                    going = each(std::mem::replace(&mut jobs, Vec::with_capacity(chunk)));
                }
            }
            going
        };
        over_text(&self.deflated, |de| stored::each_case(de, each_case))?;
        if going && !jobs.is_empty() {
            each(jobs);
        }
        Ok(())
    }
}

/// Writes a definition's deflated text ([`DefinitionText::deflated`]) case by case: the
/// cases as they come ([`DefinitionWriter::write_cases`], each dropped once written), the rest
/// of the definition last ([`DefinitionWriter::finish`]). The text lists `testCases` first,
/// which [`DefinitionText`] reads like any other key order.
pub struct DefinitionWriter {
    out: std::io::BufWriter<flate2::write::DeflateEncoder<Vec<u8>>>,
    cases: usize,
    /// The first write that failed (the rest are skipped); [`DefinitionWriter::finish`]
    /// returns it.
    failed: Option<serde_json::Error>,
}

impl Default for DefinitionWriter {
    fn default() -> Self {
        DefinitionWriter::new()
    }
}

impl DefinitionWriter {
    pub fn new() -> Self {
        let mut writer = DefinitionWriter {
            out: std::io::BufWriter::with_capacity(64 * 1024, deflater()),
            cases: 0,
            failed: None,
        };
        writer.write_raw(br#"{"testCases":["#);
        writer
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        use std::io::Write as _;
        if self.failed.is_none() {
            if let Err(e) = self.out.write_all(bytes) {
                self.failed = Some(serde_json::Error::io(e));
            }
        }
    }

    fn write_json(&mut self, value: &impl Serialize) {
        if self.failed.is_none() {
            if let Err(e) = serde_json::to_writer(&mut self.out, value) {
                self.failed = Some(e);
            }
        }
    }

    /// Appends cases (in definition order), dropping each once written.
    pub fn write_cases(&mut self, cases: Vec<TestCase>) {
        for case in cases {
            if self.cases > 0 {
                self.write_raw(b",");
            }
            self.write_json(&case);
            self.cases += 1;
        }
    }

    /// Ends the text with the rest of the definition (`config`, whose own cases are not
    /// written).
    pub fn finish(mut self, config: &EvalConfig) -> Result<DefinitionText, TextError> {
        let mut header = config.clone();
        header.test_cases = Vec::new();
        let serde_json::Value::Object(fields) = serde_json::to_value(&header)? else {
            return Err(TextError(serde::ser::Error::custom(
                "a definition serialises as an object",
            )));
        };
        self.write_raw(b"]");
        for (key, value) in fields.iter().filter(|(key, _)| *key != "testCases") {
            self.write_raw(b",");
            self.write_json(key);
            self.write_raw(b":");
            self.write_json(value);
        }
        self.write_raw(b"}");
        if let Some(e) = self.failed {
            return Err(TextError(e));
        }
        let deflate = self
            .out
            .into_inner()
            .map_err(|e| TextError(serde_json::Error::io(e.into_error())))?;
        let mut bytes = deflate.finish().map_err(serde_json::Error::io)?;
        bytes.shrink_to_fit();
        Ok(DefinitionText {
            deflated: bytes,
            header,
            cases: self.cases,
        })
    }
}

/// Reading and writing a definition's text case by case. Hand-written serde visitors: reading
/// one large field of a JSON document item by item is what `DeserializeSeed` is for, and no
/// crate does it.
mod stored {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{
        DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, SeqAccess, Visitor,
    };
    use serde::Deserialize;
    use serde_json::Value;

    /// What [`super::DefinitionText::count`] reads of a case.
    #[derive(Deserialize)]
    pub(super) struct CaseKey {
        pub id: String,
        #[serde(default)]
        pub tags: Vec<String>,
    }

    /// The definition without its cases (as JSON fields), and how many cases it has.
    pub(super) fn header<'de, D: Deserializer<'de>>(
        de: D,
    ) -> Result<(serde_json::Map<String, Value>, usize), D::Error> {
        let split = skilleval_model::json_stream::SplitField {
            key: "testCases",
            seed: skilleval_model::json_stream::ListLength,
        };
        let (top, cases) = de.deserialize_map(split)?;
        Ok((top, cases.unwrap_or(0)))
    }

    /// Calls `each(index, case)` for each case of the document, read as a `T`, until it
    /// returns `false`.
    pub(super) fn each_case<'de, D: Deserializer<'de>, T: DeserializeOwned>(
        de: D,
        each: impl FnMut(usize, T) -> bool,
    ) -> Result<(), D::Error> {
        let only = skilleval_model::json_stream::OnlyField {
            key: "testCases",
            seed: ItemsSeed {
                each,
                case: PhantomData,
            },
        };
        de.deserialize_map(only).map(|_| ())
    }

    /// The case list; once `each` says stop, the rest is read without being built (the
    /// parser must still reach the end of the document).
    struct ItemsSeed<F, T> {
        each: F,
        case: PhantomData<fn() -> T>,
    }

    impl<'de, F: FnMut(usize, T) -> bool, T: DeserializeOwned> DeserializeSeed<'de>
        for ItemsSeed<F, T>
    {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_seq(self)
        }
    }

    impl<'de, F: FnMut(usize, T) -> bool, T: DeserializeOwned> Visitor<'de> for ItemsSeed<F, T> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of test cases")
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(case) = seq.next_element::<T>()? {
                if !(self.each)(index, case) {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    break;
                }
                index += 1;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_model::definition::{RunnerSpec, Suite};

    fn config() -> EvalConfig {
        let case = |id: &str, tags: &[&str]| TestCase {
            id: id.into(),
            name: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            weight: 1.0,
            ..TestCase::default()
        };
        EvalConfig {
            version: "2.0".into(),
            profile: Profile::Structured,
            settings: skilleval_model::definition::EvalSettings {
                default_timeout: Some(5_000),
                runner: Some(RunnerSpec::Name("command".into())),
                ..Default::default()
            },
            setup: None,
            teardown: None,
            test_cases: vec![
                case("a", &["smoke"]),
                case("b", &["edge"]),
                case("c", &["smoke", "edge"]),
            ],
            suites: vec![Suite {
                name: "core".into(),
                test_ids: vec!["a".into(), "b".into()],
                run_in_sequence: false,
            }],
        }
    }

    #[test]
    fn plans_one_job_per_case_with_resolved_strategy_and_timeout() {
        let jobs = plan(&config(), "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[0].strategy(), "json_schema");
        assert_eq!(jobs[0].case.evaluation.strategy, "json_schema");
        assert_eq!(jobs[0].timeout_ms, 5_000);
        assert_eq!(jobs[0].runner.kind, "command");
        assert_eq!(jobs[0].suites, vec!["core".to_string()]);
        assert!(jobs[2].suites.is_empty());
    }

    #[test]
    fn setup_and_teardown_scripts_travel_with_every_job() {
        let mut c = config();
        c.setup = Some(skilleval_model::definition::Setup {
            script: Some("scripts/setup.sh".into()),
            ..Default::default()
        });
        c.teardown = Some(skilleval_model::definition::Teardown {
            script: Some("scripts/teardown.py".into()),
        });
        let jobs = plan(&c, "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        for j in &jobs {
            assert_eq!(j.scripts.setup.as_deref(), Some("scripts/setup.sh"));
            assert_eq!(j.scripts.teardown.as_deref(), Some("scripts/teardown.py"));
        }
        let back: Job = serde_json::from_str(&serde_json::to_string(&jobs[0]).unwrap()).unwrap();
        assert_eq!(back, jobs[0]);
        let plain = plan(&config(), "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        assert!(plain[0].scripts.is_empty());
        assert!(!serde_json::to_string(&plain[0])
            .unwrap()
            .contains("scripts"));
    }

    #[test]
    fn a_suite_in_sequence_is_one_group_in_its_own_order_and_the_rest_run_alone() {
        let mut c = config();
        c.test_cases.push(TestCase {
            id: "d".into(),
            weight: 1.0,
            ..TestCase::default()
        });
        c.suites = vec![
            Suite {
                name: "ordered".into(),
                test_ids: vec!["d".into(), "a".into()],
                run_in_sequence: true,
            },
            Suite {
                name: "also".into(),
                test_ids: vec!["a".into(), "c".into()],
                run_in_sequence: true,
            },
            Suite {
                name: "parallel".into(),
                test_ids: vec!["b".into()],
                run_in_sequence: false,
            },
        ];
        let jobs = plan(&c, "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        let ids =
            |g: &Vec<usize>| -> Vec<&str> { g.iter().map(|&i| jobs[i].case.id.as_str()).collect() };
        let order = run_order(&c, &jobs);
        let named: Vec<Vec<&str>> = order.iter().map(ids).collect();
        // `a` runs in the first suite that lists it; `c` alone in the second.
        assert_eq!(named, vec![vec!["d", "a"], vec!["b"], vec!["c"]]);
        // A case's variants run together, in job order.
        let doubled: Vec<Job> = jobs.iter().flat_map(|j| [j.clone(), j.clone()]).collect();
        let order = run_order(&c, &doubled);
        assert_eq!(order[0], vec![6, 7, 0, 1]);
        let mut all: Vec<usize> = order.concat();
        all.sort_unstable();
        assert_eq!(all, (0..doubled.len()).collect::<Vec<_>>());
    }

    #[test]
    fn tag_suite_and_case_filters_combine() {
        let f = CaseFilter {
            tags: vec!["edge".into()],
            suite: Some("core".into()),
            ..CaseFilter::default()
        };
        let jobs = plan(&config(), "h", Uuid::nil(), &f, None).unwrap();
        let ids: Vec<_> = jobs.iter().map(|j| j.case.id.as_str()).collect();
        assert_eq!(ids, vec!["b"]);
    }

    #[test]
    fn unknown_suite_and_case_are_errors() {
        let f = CaseFilter {
            suite: Some("nope".into()),
            ..CaseFilter::default()
        };
        assert!(matches!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::UnknownSuite(..))
        ));
        let f = CaseFilter {
            case_ids: vec!["zzz".into()],
            ..CaseFilter::default()
        };
        assert_eq!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::UnknownCase("zzz".into()))
        );
        let f = CaseFilter {
            tags: vec!["none".into()],
            ..CaseFilter::default()
        };
        assert!(matches!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::Empty { .. })
        ));
    }

    #[test]
    fn runner_override_wins() {
        let r = RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        };
        let jobs = plan(
            &config(),
            "h",
            Uuid::nil(),
            &CaseFilter::default(),
            Some(&r),
        )
        .unwrap();
        assert!(jobs.iter().all(|j| j.runner.kind == "given"));
    }

    fn filters() -> Vec<CaseFilter> {
        let f = |tags: &[&str], ids: &[&str], suite: Option<&str>| CaseFilter {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            case_ids: ids.iter().map(|t| t.to_string()).collect(),
            suite: suite.map(str::to_string),
        };
        vec![
            f(&[], &[], None),
            f(&["edge"], &[], None),
            f(&[], &["c", "a"], None),
            f(&[], &[], Some("core")),
            f(&["smoke"], &[], Some("core")),
            f(&[], &["zz"], None),
            f(&[], &[], Some("nope")),
            f(&["none"], &[], None),
            f(&["edge"], &["a"], None),
        ]
    }

    /// The JSON text of deflated bytes.
    fn inflate(bytes: &[u8]) -> String {
        use std::io::Read as _;
        let mut text = String::new();
        flate2::read::DeflateDecoder::new(bytes)
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    /// The definition of [`config`] in both stored forms: deflated, and as plain text.
    fn both_forms() -> [DefinitionText; 2] {
        let deflated = DefinitionText::from_config(&mut config()).unwrap();
        let text = inflate(deflated.deflated());
        [deflated, DefinitionText::parse(text).unwrap()]
    }

    #[test]
    fn the_stored_text_holds_the_whole_definition() {
        let mut config = config();
        let stored = DefinitionText::from_config(&mut config).unwrap();
        assert!(config.test_cases.is_empty(), "the cases were taken");
        assert_eq!(stored.cases(), 3);
        let bytes = stored.deflated().to_vec();
        let text = inflate(&bytes);
        assert!(bytes.len() < text.len(), "deflated");
        let back: EvalConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(back, self::config());
        for read in [
            DefinitionText::from_deflated(bytes).unwrap(),
            DefinitionText::parse(text).unwrap(),
        ] {
            assert_eq!(read.cases(), 3);
            assert_eq!(read.header(), stored.header());
            assert!(read.header().test_cases.is_empty());
            assert_eq!(read.header().suites, self::config().suites);
        }
        // A text with its cases before the rest reads the same (stored definitions of earlier
        // versions, or any key order).
        let reordered = format!(
            r#"{{"testCases": {}, "version": "2.0", "profile": "structured", "settings": {}, "suites": {}}}"#,
            serde_json::to_string(&self::config().test_cases).unwrap(),
            serde_json::to_string(&self::config().settings).unwrap(),
            serde_json::to_string(&self::config().suites).unwrap(),
        );
        let reordered = DefinitionText::parse(reordered).unwrap();
        assert_eq!(reordered.header(), stored.header());
        assert_eq!(reordered.cases(), 3);
        assert!(DefinitionText::parse("{\"testCases\": [".to_string()).is_err());
        assert!(DefinitionText::parse("[]".to_string()).is_err());
        assert!(DefinitionText::parse("{} {}".to_string()).is_err());
        assert!(DefinitionText::from_deflated(b"not deflate".to_vec()).is_err());
    }

    #[test]
    fn planning_from_the_text_gives_the_jobs_and_errors_of_planning_the_model() {
        let runner = RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        };
        for stored in both_forms() {
            for filter in filters() {
                for runner in [None, Some(&runner)] {
                    let expected = plan(&config(), "h", Uuid::nil(), &filter, runner);
                    let counted = stored.count(&filter).unwrap();
                    assert_eq!(
                        counted,
                        expected.as_ref().map(Vec::len).map_err(Clone::clone),
                        "{filter:?}"
                    );
                    let mut chunks = Vec::new();
                    stored
                        .plan_chunks("h", Uuid::nil(), &filter, runner, 2, |jobs| {
                            chunks.push(jobs);
                            true
                        })
                        .unwrap();
                    assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= 2));
                    let planned: Vec<Job> = chunks.into_iter().flatten().collect();
                    match expected {
                        Ok(jobs) => assert_eq!(planned, jobs, "{filter:?}"),
                        Err(_) => assert!(planned.is_empty(), "{filter:?}: nothing matches"),
                    }
                }
            }
        }
    }

    #[test]
    fn planning_from_the_text_stops_when_told() {
        for stored in both_forms() {
            let mut chunks = Vec::new();
            stored
                .plan_chunks("h", Uuid::nil(), &CaseFilter::default(), None, 2, |jobs| {
                    chunks.push(jobs.len());
                    false
                })
                .unwrap();
            assert_eq!(chunks, [2]);
        }
    }

    #[test]
    fn each_job_lists_the_suites_of_its_case_once_in_suite_order() {
        let mut config = config();
        let suite = |name: &str, ids: &[&str]| Suite {
            name: name.into(),
            test_ids: ids.iter().map(|i| i.to_string()).collect(),
            run_in_sequence: false,
        };
        config.suites = vec![
            suite("core", &["a", "b"]),
            suite("edge", &["b", "c", "b"]),
            suite("all", &["c", "b", "a"]),
        ];
        let jobs = plan(&config, "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        for job in &jobs {
            assert_eq!(
                job.suites,
                config.suites_of(&job.case.id),
                "{}",
                job.case.id
            );
        }
        assert_eq!(jobs[1].suites, ["core", "edge", "all"]);
        assert_eq!(jobs[2].suites, ["edge", "all"]);
    }
}
