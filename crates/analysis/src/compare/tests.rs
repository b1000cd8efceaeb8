use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use skilleval_execution::result::JobResult;
use skilleval_model::definition::{Profile, TestCase};

fn attempt(passed: bool, score: f64) -> AttemptOutcome {
    AttemptOutcome {
        passed,
        score: Some(score),
        criteria: BTreeMap::new(),
    }
}

fn case(id: &str, attempts: Vec<AttemptOutcome>) -> CaseRecord {
    CaseRecord {
        test_case_id: id.to_string(),
        name: format!("case {id}"),
        fingerprint: Some(fp("same")),
        attempts,
    }
}

fn fp(definition: &str) -> CaseFingerprint {
    CaseFingerprint {
        definition_hash: definition.to_string(),
        grader: "exact_match".to_string(),
        judge_model: None,
    }
}

fn side(run: &str, cases: Vec<CaseRecord>) -> RunSide {
    RunSide {
        run_id: run.to_string(),
        version: json!(run),
        cases,
    }
}

fn options() -> CompareOptions {
    CompareOptions {
        resamples: 2_000,
        ..CompareOptions::new("cmp-1", "base", "head")
    }
}

/// `n` cases that pass with score `score` in base and head alike.
fn steady(prefix: &str, n: usize, score: f64) -> Vec<CaseRecord> {
    (0..n)
        .map(|i| case(&format!("{prefix}{i}"), vec![attempt(true, score)]))
        .collect()
}

#[test]
fn cases_pair_by_id_and_added_removed_are_listed_not_paired() {
    let base = side(
        "base",
        vec![
            case("a", vec![attempt(true, 0.9)]),
            case("gone", vec![attempt(true, 1.0)]),
            case("b", vec![attempt(false, 0.2)]),
            case("skipped", vec![]),
        ],
    );
    let head = side(
        "head",
        vec![
            case("new", vec![attempt(false, 0.0)]),
            case("b", vec![attempt(true, 0.8), attempt(true, 0.9)]),
            case("a", vec![attempt(true, 0.9)]),
            case("skipped", vec![attempt(true, 1.0)]),
        ],
    );
    let c = compare(&base, &head, &options()).unwrap();
    assert_eq!(c.added, vec!["new"]);
    assert_eq!(c.removed, vec!["gone"]);
    assert_eq!(c.not_run, vec!["skipped"]);
    assert_eq!(c.counts.paired, 2);
    let ids: Vec<&str> = c.cases.iter().map(|d| d.test_case_id.as_str()).collect();
    // Sorted by how much they moved: b (+0.65) before a (0).
    assert_eq!(ids, vec!["b", "a"]);
    let b = &c.cases[0];
    assert_eq!((b.attempts_a, b.attempts_b), (1, 2));
    assert!((b.delta - 0.65).abs() < 1e-12, "{b:?}");
    assert_eq!(b.flip, Some(Flip::FailToPass));
    assert_eq!(c.pass_rate.mcnemar.improvements, 1);
}

#[test]
fn changes_under_one_hundredth_are_unchanged() {
    let base = side(
        "base",
        vec![
            case("up", vec![attempt(true, 0.5)]),
            case("down", vec![attempt(true, 0.5)]),
            case("tiny", vec![attempt(true, 0.5)]),
        ],
    );
    let head = side(
        "head",
        vec![
            case("up", vec![attempt(true, 0.7)]),
            case("down", vec![attempt(true, 0.45)]),
            case("tiny", vec![attempt(true, 0.505)]),
        ],
    );
    let c = compare(&base, &head, &options()).unwrap();
    assert_eq!(
        (c.counts.improved, c.counts.regressed, c.counts.unchanged),
        (1, 1, 1)
    );
    let order: Vec<&str> = c.cases.iter().map(|d| d.test_case_id.as_str()).collect();
    assert_eq!(order, vec!["up", "down", "tiny"]);
}

#[test]
fn the_gate_fails_on_a_real_pass_rate_regression_and_names_the_cases() {
    // 8 of 30 cases go from pass to fail, none the other way: exact McNemar p = 2/256.
    let mut base = steady("s", 22, 0.9);
    let mut head = steady("s", 22, 0.9);
    for i in 0..8 {
        base.push(case(&format!("r{i}"), vec![attempt(true, 0.8)]));
        head.push(case(
            &format!("r{i}"),
            vec![attempt(false, 0.3 + 0.01 * f64::from(i))],
        ));
    }
    let c = compare(&side("base", base), &side("head", head), &options()).unwrap();
    assert_eq!(c.pass_rate.mcnemar.regressions, 8);
    assert!((c.pass_rate.mcnemar.p_two_sided - 2.0 / 256.0).abs() < 1e-12);
    assert_eq!(c.gate.verdict, Verdict::Fail);
    assert!(
        c.gate.reasons[0].contains("McNemar"),
        "{:?}",
        c.gate.reasons
    );
    // Worst first.
    assert_eq!(c.gate.regressed_cases[0], "r0");
    assert_eq!(c.gate.regressed_cases.len(), 8);
    assert_eq!((c.outcome, c.winner), (Outcome::Worse, Winner::A));
    let md = markdown(&c);
    assert!(md.contains("Regression gate: ❌ fail"), "{md}");
    assert!(md.contains("`r0`") && md.contains("pass → fail"), "{md}");
}

#[test]
fn the_gate_passes_on_noise() {
    // 2 regressions and 1 improvement with scores jittering by a few hundredths: nothing a
    // 30-case suite can tell from chance.
    let mut base = Vec::new();
    let mut head = Vec::new();
    for i in 0..30u32 {
        let id = format!("c{i}");
        let wobble = if i % 2 == 0 { 0.02 } else { -0.02 };
        base.push(case(&id, vec![attempt(i % 10 != 0, 0.7)]));
        head.push(case(&id, vec![attempt(i % 10 != 1, 0.7 + wobble)]));
    }
    let c = compare(&side("base", base), &side("head", head), &options()).unwrap();
    let m = c.pass_rate.mcnemar;
    assert!(m.regressions >= 1 && m.improvements >= 1, "{m:?}");
    assert_eq!(c.gate.verdict, Verdict::Pass, "{:?}", c.gate);
    assert!(c.gate.reasons.is_empty());
    assert_eq!(
        (c.outcome, c.winner),
        (Outcome::NoDetectableDifference, Winner::Tie)
    );
}

#[test]
fn the_gate_fails_when_the_score_interval_lies_below_the_margin() {
    // Every case still passes but loses 0.05 ± 0.01: no flip, a clear score regression.
    let mut base = Vec::new();
    let mut head = Vec::new();
    for i in 0..12u32 {
        let id = format!("c{i}");
        base.push(case(&id, vec![attempt(true, 0.9)]));
        head.push(case(
            &id,
            vec![attempt(true, 0.85 + 0.01 * (f64::from(i % 3) - 1.0))],
        ));
    }
    let (base, head) = (side("base", base), side("head", head));
    let c = compare(&base, &head, &options()).unwrap();
    let o = c.overall.as_ref().unwrap();
    assert!(o.difference.ci_high < -0.02, "{o:?}");
    assert!(o.bootstrap.high < -0.02, "{:?}", o.bootstrap);
    assert_eq!(c.pass_rate.mcnemar.regressions, 0);
    assert_eq!(c.gate.verdict, Verdict::Fail);
    assert!(
        c.gate.reasons[0].contains("mean score fell"),
        "{:?}",
        c.gate
    );
    // A margin the interval does not clear passes.
    let lenient = CompareOptions {
        gate: GateConfig {
            alpha: 0.05,
            score_margin: -0.2,
        },
        ..options()
    };
    assert_eq!(
        compare(&base, &head, &lenient).unwrap().gate.verdict,
        Verdict::Pass
    );
}

#[test]
fn three_identical_failures_are_not_enough_to_fail_the_gate() {
    // Three exact_match cases each going from 1 to 0: a zero-variance drop that a t interval
    // would call certain. McNemar (3 flips: p = 0.25) and the sign test agree it is not.
    let base = side("base", steady("c", 3, 1.0));
    let head = side(
        "head",
        (0..3)
            .map(|i| case(&format!("c{i}"), vec![attempt(false, 0.0)]))
            .collect(),
    );
    let c = compare(&base, &head, &options()).unwrap();
    assert_eq!(c.overall.as_ref().unwrap().difference.p_value, 0.25);
    assert_eq!(c.gate.verdict, Verdict::Pass, "{:?}", c.gate);
    assert_eq!(c.outcome, Outcome::NoDetectableDifference);
    // The report still names what moved.
    assert_eq!(c.gate.regressed_cases.len(), 3);
}

#[test]
fn repeats_are_nested_under_their_case() {
    // Two cases, three attempts each; the unit of the statistics is the case.
    let base = side(
        "base",
        vec![
            case(
                "x",
                vec![attempt(true, 1.0), attempt(false, 0.0), attempt(true, 1.0)],
            ),
            case(
                "y",
                vec![attempt(false, 0.0), attempt(false, 0.0), attempt(true, 1.0)],
            ),
        ],
    );
    let head = side(
        "head",
        vec![
            case(
                "x",
                vec![attempt(true, 1.0), attempt(true, 1.0), attempt(true, 1.0)],
            ),
            case(
                "y",
                vec![attempt(true, 1.0), attempt(false, 0.0), attempt(true, 1.0)],
            ),
        ],
    );
    let c = compare(&base, &head, &options()).unwrap();
    let pr = &c.pass_rate;
    // Case pass rates 2/3 -> 1 and 1/3 -> 2/3: both +1/3, so the mean is +1/3 with SE 0.
    assert_eq!(pr.cases, 2);
    assert!((pr.difference.mean - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(pr.difference.se, 0.0);
    // y flips (1/3 < 1/2 to 2/3 >= 1/2); x passed (2/3) and still passes.
    assert_eq!((pr.mcnemar.improvements, pr.mcnemar.regressions), (1, 0));
}

#[test]
fn not_comparable_cases_are_flagged_and_left_out_unless_forced() {
    let mut changed = case("changed", vec![attempt(false, 0.0)]);
    changed.fingerprint = Some(fp("edited"));
    let base = side(
        "base",
        vec![
            case("same", vec![attempt(true, 0.8)]),
            case("changed", vec![attempt(true, 1.0)]),
        ],
    );
    let head = side(
        "head",
        vec![case("same", vec![attempt(true, 0.8)]), changed],
    );
    let c = compare(&base, &head, &options()).unwrap();
    assert_eq!(c.counts.paired, 1);
    assert_eq!(c.not_comparable.len(), 1);
    assert_eq!(
        c.not_comparable[0].reasons,
        vec![NotComparableReason::Definition]
    );
    // Its drop does not count against the head.
    assert_eq!(c.pass_rate.mcnemar.regressions, 0);
    assert!(markdown(&c).contains("`changed` (definition)"));

    // Only the changed case shared: an error, unless forced.
    let only_base = side("base", vec![case("changed", vec![attempt(true, 1.0)])]);
    let mut only = case("changed", vec![attempt(false, 0.0)]);
    only.fingerprint = Some(CaseFingerprint {
        judge_model: Some("other".into()),
        ..fp("same")
    });
    let only_head = side("head", vec![only]);
    let err = compare(&only_base, &only_head, &options()).unwrap_err();
    assert_eq!(err, CompareError::NotComparable { count: 1 });
    assert!(err.to_string().starts_with("not_comparable"));
    let forced = CompareOptions {
        force: true,
        ..options()
    };
    let c = compare(&only_base, &only_head, &forced).unwrap();
    assert_eq!(c.counts.paired, 1);
    assert_eq!(
        c.cases[0].not_comparable,
        vec![NotComparableReason::JudgeModel]
    );

    let disjoint = compare(
        &side("base", steady("a", 2, 1.0)),
        &side("head", steady("b", 2, 1.0)),
        &options(),
    );
    assert!(matches!(disjoint, Err(CompareError::NoCommonCases { .. })));
}

fn with_criteria(passed: bool, criteria: &[(&str, f64)]) -> AttemptOutcome {
    let mean = criteria.iter().map(|(_, v)| v).sum::<f64>() / criteria.len() as f64;
    AttemptOutcome {
        passed,
        score: Some(mean),
        criteria: criteria.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn criteria_get_their_own_statistics_with_holm() {
    let mut base = Vec::new();
    let mut head = Vec::new();
    for i in 0..10u32 {
        let id = format!("c{i}");
        let jitter = 0.01 * f64::from(i % 4);
        base.push(case(
            &id,
            vec![with_criteria(
                true,
                &[("accuracy", 0.9 - jitter), ("tone", 0.6 + jitter)],
            )],
        ));
        // Accuracy falls a lot; tone wobbles.
        head.push(case(
            &id,
            vec![with_criteria(
                true,
                &[
                    ("accuracy", 0.5 + jitter),
                    ("tone", 0.6 + if i % 2 == 0 { 0.02 } else { -0.02 }),
                ],
            )],
        ));
    }
    let c = compare(&side("base", base), &side("head", head), &options()).unwrap();
    let names: Vec<&str> = c
        .criteria_scores
        .iter()
        .map(|k| k.criterion.as_str())
        .collect();
    assert_eq!(names, vec!["accuracy", "tone"]);
    let acc = &c.criteria_scores[0];
    assert!(
        acc.significant && acc.statistics.difference.mean < -0.3,
        "{acc:?}"
    );
    let tone = &c.criteria_scores[1];
    assert!(!tone.significant);
    for k in &c.criteria_scores {
        assert!(k.p_holm >= k.statistics.difference.p_value);
    }
    // Holm over two: the smaller p is doubled, the larger kept but never below it.
    let (p_acc, p_tone) = (
        acc.statistics.difference.p_value,
        tone.statistics.difference.p_value,
    );
    assert!(p_acc < p_tone);
    assert_eq!(acc.p_holm, (2.0 * p_acc).min(1.0));
    assert_eq!(tone.p_holm, p_tone.max(acc.p_holm));
    assert!(markdown(&c).contains("| accuracy |"));
}

#[test]
fn the_same_seed_reproduces_the_comparison_and_the_json_has_the_seed_shape() {
    let base = side(
        "base",
        (0..15)
            .map(|i| {
                case(
                    &format!("c{i}"),
                    vec![attempt(i % 3 != 0, 0.5 + 0.02 * f64::from(i))],
                )
            })
            .collect(),
    );
    let head = side(
        "head",
        (0..15)
            .map(|i| {
                case(
                    &format!("c{i}"),
                    vec![attempt(i % 4 != 0, 0.45 + 0.025 * f64::from(i))],
                )
            })
            .collect(),
    );
    let opts = options();
    let one = compare(&base, &head, &opts).unwrap();
    let two = compare(&base, &head, &opts).unwrap();
    assert_eq!(one, two);
    assert_eq!(opts.seed, seed_for("base", "head"));
    assert_ne!(seed_for("base", "head"), seed_for("head", "base"));
    assert!(opts.seed < 1 << 53, "seeds stay exact as JSON numbers");

    let v = serde_json::to_value(&one).unwrap();
    for key in [
        "comparison_id",
        "timestamp",
        "version_a",
        "version_b",
        "criteria_scores",
        "total_score_a",
        "total_score_b",
        "winner",
        "key_differentiators",
        "summary",
        "overall",
        "pass_rate",
        "gate",
        "cases",
        "added",
        "removed",
        "not_comparable",
        "seed",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(["A", "B", "tie"].contains(&v["winner"].as_str().unwrap()));
    assert_eq!(v["gate"]["verdict"], json!(one.gate.verdict.as_str()));
    let back: Comparison = serde_json::from_value(v).unwrap();
    assert_eq!(back, one);
}

fn result(
    id: &str,
    status: &str,
    score: Option<f64>,
    rubric: Option<serde_json::Value>,
) -> JobResult {
    let mut v = json!({
        "run_id": "00000000-0000-0000-0000-000000000001",
        "test_case_id": id,
        "name": format!("case {id}"),
        "case_index": 0,
        "status": status,
        "strategy": "llm_judge",
        "score": score,
        "details": {},
        "duration_ms": 5,
        "attempts": [],
        "weight": 1.0,
        "critical": false,
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z",
    });
    if let Some(r) = rubric {
        v["rubric_scores"] = r;
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn from_results_nests_repeats_and_reads_rubric_criteria() {
    let rubric = json!({"clarity": {"score": 4, "scale": "likert5", "normalized": 0.75}, "tone": {"score": 0.9}});
    let results = [
        result("a", "passed", Some(0.8), Some(rubric)),
        result("b", "errored", None, None),
        result("a", "failed", Some(0.4), None),
        result("c", "skipped", None, None),
    ];
    let mut fps = BTreeMap::new();
    fps.insert("a".to_string(), fp("x"));
    let s = RunSide::from_results("run", json!(3), &results, &fps);
    let ids: Vec<&str> = s.cases.iter().map(|c| c.test_case_id.as_str()).collect();
    assert_eq!(ids, vec!["a", "b", "c"]);
    let a = &s.cases[0];
    assert_eq!(a.attempts.len(), 2);
    assert_eq!(a.fingerprint, Some(fp("x")));
    assert_eq!(a.attempts[0].criteria.get("clarity"), Some(&0.75));
    assert_eq!(a.attempts[0].criteria.get("tone"), Some(&0.9));
    assert!((a.mean_score().unwrap() - 0.6).abs() < 1e-12);
    assert_eq!(a.pass_rate(), Some(0.5));
    assert!(a.passed(), "half the attempts passed");
    // An errored attempt counts as not passed and has no score.
    let b = &s.cases[1];
    assert_eq!((b.pass_rate(), b.mean_score()), (Some(0.0), None));
    // A skipped case never ran.
    assert!(s.cases[2].attempts.is_empty());
}

#[test]
fn fingerprints_ignore_names_and_see_definitions() {
    let mut case = TestCase {
        id: "t".into(),
        name: "first".into(),
        ..TestCase::default()
    };
    case.input.prompt = "2 + 2?".into();
    case.expected.output = Some("4".into());
    let one = fingerprint(&case, Profile::Deterministic, None);
    let renamed = TestCase {
        name: "renamed".into(),
        tags: vec!["math".into()],
        ..case.clone()
    };
    assert_eq!(fingerprint(&renamed, Profile::Deterministic, None), one);
    assert_eq!(one.grader, "exact_match");
    let mut edited = case.clone();
    edited.expected.output = Some("four".into());
    let two = fingerprint(&edited, Profile::Deterministic, None);
    assert_eq!(
        differences(Some(&one), Some(&two)),
        vec![NotComparableReason::Definition]
    );
    let judged = fingerprint(&case, Profile::Deterministic, Some("judge-1"));
    assert_eq!(
        differences(Some(&one), Some(&judged)),
        vec![NotComparableReason::JudgeModel]
    );
    assert!(differences(None, Some(&one)).is_empty());
}

#[test]
fn a_judge_change_only_touches_the_cases_a_model_grades() {
    let config: skilleval_model::definition::EvalConfig = serde_json::from_value(json!({
        "profile": "deterministic",
        "testCases": [
            {"id": "exact", "input": {"prompt": "2+2"}, "expected": {"output": "4"}},
            {"id": "judged", "input": {"prompt": "a poem"},
             "evaluation": {"strategy": "llm_judge"}},
        ]
    }))
    .unwrap();
    let old = fingerprints(&config, Some("judge-a"));
    let new = fingerprints(&config, Some("judge-b"));
    assert_eq!(old["exact"], new["exact"]);
    assert_eq!(old["exact"].judge_model, None);
    assert_eq!(
        differences(Some(&old["judged"]), Some(&new["judged"])),
        vec![NotComparableReason::JudgeModel]
    );
}
