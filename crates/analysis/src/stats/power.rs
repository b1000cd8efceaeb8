//! Power before running: the smallest drop in pass rate a planned run can detect.
//!
//! Miller 2024 §5 sizes an eval from the variance of the difference it will measure:
//! `δ = (z_{1−α/2} + z_{power}) · √(Var(diff) / n)`. The variance is split in two parts:
//! between cases (some cases are hard for every attempt) and within a case (the same case
//! passes on one attempt and fails on the next). Repeats average only the within-case part
//! away, `k` repeats dividing it by `k`; pairing two versions on the same cases cancels the
//! between-case part they share.
//!
//! For pass rates the computation is done on Cohen's arcsine scale `φ = 2·asin(√p)`, where the
//! variance of an observed rate no longer depends on the rate (`Var(φ̂) ≈ f/n` whatever `p` is),
//! so the formula is exact in the same sense as Cohen's power tables (Cohen 1988, ch. 6), and a
//! drop near 95 % is not judged with the variance of 50 %:
//!
//! - per version, a case mean's variance is `f_k = (1 − w) + w/k` (in units of the binomial
//!   variance), `w` the within-case share;
//! - unpaired (different cases or windows, sizes `n₁`, `n₂`): `Var = f_k/n₁ + f_k/n₂`;
//! - paired (the same `n` cases in both runs): `Var = (2·f_k − 2·ρ·(1 − w)) / n`, `ρ` the
//!   correlation of a case's difficulty across the two versions;
//! - `h = (z_α + z_power) · √Var` and the detectable drop is `p − sin²(asin(√p) − h/2)`.
//!
//! `w` and `ρ` are assumptions until a skill has history: [`estimate_within_case_share`]
//! measures `w` from a run with repeats, and the defaults are stated in `docs/comparing.md`.

use serde::{Deserialize, Serialize};

use super::{invalid, z_quantile, StatsError};

/// Assumed share of an attempt's pass/fail variance that is attempt-to-attempt noise, when no
/// run with repeats measured it.
pub const DEFAULT_WITHIN_CASE_SHARE: f64 = 0.3;
/// Assumed correlation of a case's difficulty between two versions of one skill.
pub const DEFAULT_CASE_CORRELATION: f64 = 0.5;

/// How the two measurements being compared relate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Pairing {
    /// Both versions run on the same cases (a version comparison).
    Paired { case_correlation: f64 },
    /// Independent cases or samples; the other side has `other_cases` of them (production
    /// monitoring: the last window against a longer baseline).
    Unpaired { other_cases: u64 },
}

/// One- or two-sided test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sided {
    TwoSided,
    OneSided,
}

/// A planned measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Design {
    /// Cases (or samples) on this side.
    pub cases: u64,
    /// Attempts per case.
    pub repeats: u32,
    /// The pass rate the drop is measured from (the last run's).
    pub baseline_pass_rate: f64,
    /// Share of the per-attempt variance that repeats average away, in [0, 1].
    pub within_case_share: f64,
    pub pairing: Pairing,
    /// Significance level (0.05).
    pub alpha: f64,
    /// Probability of detecting the drop when it is real (0.8).
    pub power: f64,
    pub sided: Sided,
}

impl Design {
    /// A paired version comparison at α = 0.05 (two-sided) and 80 % power with the default
    /// assumptions.
    pub fn paired(cases: u64, repeats: u32, baseline_pass_rate: f64) -> Design {
        Design {
            cases,
            repeats,
            baseline_pass_rate,
            within_case_share: DEFAULT_WITHIN_CASE_SHARE,
            pairing: Pairing::Paired {
                case_correlation: DEFAULT_CASE_CORRELATION,
            },
            alpha: 0.05,
            power: 0.8,
            sided: Sided::TwoSided,
        }
    }

    fn check(&self) -> Result<(), StatsError> {
        if self.cases == 0 {
            return Err(invalid("cases", "must be at least 1"));
        }
        if self.repeats == 0 {
            return Err(invalid("repeats", "must be at least 1"));
        }
        if !(self.baseline_pass_rate > 0.0 && self.baseline_pass_rate <= 1.0) {
            return Err(invalid(
                "baseline_pass_rate",
                "must be above 0 and at most 1 (there is no drop from 0)",
            ));
        }
        if !(0.0..=1.0).contains(&self.within_case_share) {
            return Err(invalid("within_case_share", "must be between 0 and 1"));
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(invalid("alpha", "must be strictly between 0 and 1"));
        }
        if !(self.power > 0.0 && self.power < 1.0) {
            return Err(invalid("power", "must be strictly between 0 and 1"));
        }
        match self.pairing {
            Pairing::Paired { case_correlation } if !(-1.0..=1.0).contains(&case_correlation) => {
                Err(invalid("case_correlation", "must be between -1 and 1"))
            }
            Pairing::Unpaired { other_cases: 0 } => {
                Err(invalid("other_cases", "must be at least 1"))
            }
            _ => Ok(()),
        }
    }

    /// `n · Var(φ̂_head − φ̂_base)`: the variance of the difference per case of this side.
    fn unit_variance(&self) -> f64 {
        let w = self.within_case_share;
        let f = (1.0 - w) + w / f64::from(self.repeats);
        match self.pairing {
            Pairing::Paired { case_correlation } => {
                (2.0 * f - 2.0 * case_correlation * (1.0 - w)).max(0.0)
            }
            Pairing::Unpaired { other_cases } => f * (1.0 + self.cases as f64 / other_cases as f64),
        }
    }

    fn z_sum(&self) -> f64 {
        let a = match self.sided {
            Sided::TwoSided => self.alpha / 2.0,
            Sided::OneSided => self.alpha,
        };
        z_quantile(1.0 - a) + z_quantile(self.power)
    }
}

/// The minimum detectable drop of a design.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mde {
    /// Cohen's effect size `h` the design detects.
    pub h: f64,
    /// The detectable drop in pass rate (0.06 = six points).
    pub drop: f64,
    /// False when even a fall to 0 % is below the design's power: `drop` is then the whole
    /// baseline rate.
    pub reachable: bool,
}

fn phi(p: f64) -> f64 {
    2.0 * p.clamp(0.0, 1.0).sqrt().asin()
}

/// The smallest drop in pass rate `design` detects with its power at its α.
pub fn mde_pass_rate(design: &Design) -> Result<Mde, StatsError> {
    design.check()?;
    let h = design.z_sum() * (design.unit_variance() / design.cases as f64).sqrt();
    let p = design.baseline_pass_rate;
    let target = phi(p) - h;
    if target <= 0.0 {
        return Ok(Mde {
            h,
            drop: p,
            reachable: false,
        });
    }
    Ok(Mde {
        h,
        drop: p - (target / 2.0).sin().powi(2),
        reachable: true,
    })
}

/// The cases `design` needs (its own `cases` ignored; with [`Pairing::Unpaired`] the other side
/// keeps the ratio `other_cases / cases` of the design) to detect a drop of `drop` points.
pub fn cases_for_drop(design: &Design, drop: f64) -> Result<u64, StatsError> {
    design.check()?;
    let p = design.baseline_pass_rate;
    if !(drop > 0.0 && drop <= p) {
        return Err(invalid(
            "drop",
            "must be above 0 and at most the baseline pass rate",
        ));
    }
    let h = phi(p) - phi(p - drop);
    let n = design.unit_variance() * (design.z_sum() / h).powi(2);
    Ok(n.ceil().max(1.0) as u64)
}

/// The within-case share of variance measured from a run with repeats: `(passes, attempts)` per
/// case. The within-case variance of a case is estimated without bias by `c(n−c)/(n(n−1))`;
/// its mean over cases divided by the pooled `p̄(1−p̄)` is the share. `None` without a case of
/// at least two attempts or when every attempt agreed on a constant rate of 0 or 1.
pub fn estimate_within_case_share(cases: &[(u64, u64)]) -> Option<f64> {
    let usable: Vec<(f64, f64)> = cases
        .iter()
        .filter(|(c, n)| *n >= 2 && c <= n)
        .map(|(c, n)| (*c as f64, *n as f64))
        .collect();
    if usable.is_empty() {
        return None;
    }
    let (passes, attempts) = usable
        .iter()
        .fold((0.0, 0.0), |(sc, sn), (c, n)| (sc + c, sn + n));
    let p = passes / attempts;
    let total = p * (1.0 - p);
    if total == 0.0 {
        return None;
    }
    let within = usable
        .iter()
        .map(|(c, n)| c * (n - c) / (n * (n - 1.0)))
        .sum::<f64>()
        / usable.len() as f64;
    Some((within / total).clamp(0.0, 1.0))
}

/// What a planned run can detect, and how to detect a smaller drop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerAdvice {
    pub design: Design,
    pub mde: Mde,
    /// The drop the advice aims at (0.05).
    pub target_drop: f64,
    /// Repeats per case and the drop each would detect (only those that help by half a point
    /// or more).
    pub with_repeats: Vec<(u32, f64)>,
    /// Cases needed at the design's repeats to detect `target_drop`.
    pub cases_for_target: u64,
    /// One or two sentences for a user.
    pub text: String,
}

/// "a 6-point drop", "an 8-point drop", "an 18-point drop".
fn points(drop: f64) -> String {
    let n = (drop * 100.0).round() as u64;
    let an = n == 8 || n == 11 || n == 18 || (80..90).contains(&n);
    format!("{} {n}-point", if an { "an" } else { "a" })
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The MDE of `design` and advice to reach `target_drop` (repeats first: they reuse the
/// existing cases; then more cases).
pub fn power_advice(design: &Design, target_drop: f64) -> Result<PowerAdvice, StatsError> {
    let mde = mde_pass_rate(design)?;
    let cases_for_target = cases_for_drop(design, target_drop.min(design.baseline_pass_rate))?;
    let mut with_repeats = Vec::new();
    for k in [3u32, 5] {
        if k <= design.repeats {
            continue;
        }
        let more = mde_pass_rate(&Design {
            repeats: k,
            ..*design
        })?;
        if more.reachable && mde.drop - more.drop >= 0.005 {
            with_repeats.push((k, more.drop));
        }
    }
    let sides = match design.pairing {
        Pairing::Paired { .. } => "paired",
        Pairing::Unpaired { .. } => "unpaired",
    };
    let size = format!(
        "{} × {}",
        plural(design.cases, "case", "cases"),
        plural(u64::from(design.repeats), "repeat", "repeats")
    );
    let mut text = if mde.reachable {
        format!(
            "{size} at a pass rate of {:.0} % detect {} drop ({sides}, {:.0} % power, α = {}).",
            design.baseline_pass_rate * 100.0,
            points(mde.drop),
            design.power * 100.0,
            design.alpha,
        )
    } else {
        format!(
            "{size} cannot reliably detect any drop from a pass rate of {:.0} %.",
            design.baseline_pass_rate * 100.0,
        )
    };
    if !mde.reachable || mde.drop > target_drop {
        let mut options = Vec::new();
        if let Some(((k, d), rest)) = with_repeats.split_first() {
            let mut s = format!("add repeats: {k} would detect {} drop", points(*d));
            for (k, d) in rest {
                s.push_str(&format!(", {k} {} drop", points(*d)));
            }
            options.push(s);
        }
        options.push(format!(
            "{cases_for_target} cases would detect {} drop",
            points(target_drop)
        ));
        text.push(' ');
        text.push_str(&capitalise(&options.join("; or ")));
        text.push('.');
    }
    Ok(PowerAdvice {
        design: *design,
        mde,
        target_drop,
        with_repeats,
        cases_for_target,
        text,
    })
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Design {
        fn with_power(self, power: f64) -> Design {
            Design { power, ..self }
        }
    }

    /// Independent samples, one attempt each, equal sizes: Cohen's setting.
    fn cohen(n: u64, p: f64) -> Design {
        Design {
            cases: n,
            repeats: 1,
            baseline_pass_rate: p,
            within_case_share: 0.0,
            pairing: Pairing::Unpaired { other_cases: n },
            alpha: 0.05,
            power: 0.8,
            sided: Sided::TwoSided,
        }
    }

    #[test]
    fn matches_cohens_power_tables() {
        // Cohen (1988), Statistical Power Analysis for the Behavioral Sciences, 2nd ed.,
        // Table 2.4.1: n per group for a standardised difference d, two-sided a = .05, at power
        // .80 and .90. On the arcsine scale a proportion's estimate has unit variance per
        // case, so h plays d's role and the normal-theory n = 2·((z.975 + z_power)/h)² is
        // Cohen's; his d table adds about one case for the t distribution (z²/4), so the table
        // is the normal-theory n plus 0 to 2.
        let table = [
            (0.10, 1571u64, 2102u64),
            (0.20, 393, 526),
            (0.30, 175, 234),
            (0.40, 99, 132),
            (0.50, 64, 85),
            (0.60, 45, 59),
            (0.70, 33, 44),
            (0.80, 26, 34),
        ];
        for (h, n80, n90) in table {
            // The drop from 50 % whose effect size is h.
            let drop = 0.5 - (std::f64::consts::FRAC_PI_4 - h / 2.0).sin().powi(2);
            for (power, n) in [(0.8, n80), (0.9, n90)] {
                let design = Design {
                    power,
                    ..cohen(1, 0.5)
                };
                let need = cases_for_drop(&design, drop).unwrap();
                assert!(
                    need <= n && n - need <= 2,
                    "h {h}, power {power}: needs {need}, table {n}"
                );
                // And that many cases detect that drop: the MDE at `need` is at most it.
                let mde = mde_pass_rate(
                    &Design {
                        cases: need,
                        ..cohen(need, 0.5)
                    }
                    .with_power(power),
                )
                .unwrap();
                assert!(
                    mde.drop <= drop + 1e-12 && (mde.h - h).abs() / h < 0.02,
                    "{mde:?}"
                );
            }
        }
    }

    #[test]
    fn repeats_and_pairing_shrink_the_mde() {
        let base = Design::paired(50, 1, 0.8);
        let one = mde_pass_rate(&base).unwrap();
        let three = mde_pass_rate(&Design { repeats: 3, ..base }).unwrap();
        assert!(three.drop < one.drop, "{three:?} vs {one:?}");
        // Without within-case noise, repeats cannot help.
        let fixed = Design {
            within_case_share: 0.0,
            ..base
        };
        let fixed3 = Design {
            repeats: 3,
            ..fixed
        };
        assert_eq!(
            mde_pass_rate(&fixed).unwrap().drop,
            mde_pass_rate(&fixed3).unwrap().drop
        );
        // Pairing with no correlation is the unpaired design on equal sizes.
        let rho0 = Design {
            pairing: Pairing::Paired {
                case_correlation: 0.0,
            },
            ..base
        };
        let unpaired = Design {
            pairing: Pairing::Unpaired { other_cases: 50 },
            ..base
        };
        let (a, b) = (
            mde_pass_rate(&rho0).unwrap(),
            mde_pass_rate(&unpaired).unwrap(),
        );
        assert!((a.drop - b.drop).abs() < 1e-12);
        // Quadrupling the cases halves h.
        let four = mde_pass_rate(&Design { cases: 200, ..base }).unwrap();
        assert!((four.h * 2.0 - one.h).abs() < 1e-12);
    }

    #[test]
    fn a_tiny_suite_cannot_detect_anything() {
        let m = mde_pass_rate(&Design::paired(2, 1, 0.2)).unwrap();
        assert!(!m.reachable);
        assert_eq!(m.drop, 0.2);
    }

    #[test]
    fn advice_suggests_repeats_then_cases() {
        let design = Design::paired(40, 1, 0.85);
        let advice = power_advice(&design, 0.05).unwrap();
        assert!(advice.mde.drop > 0.05);
        assert_eq!(advice.with_repeats.len(), 2);
        assert!(advice.with_repeats[0].1 < advice.mde.drop);
        assert!(
            advice.text.contains("Add repeats: 3 would detect a"),
            "{}",
            advice.text
        );
        assert!(advice.text.contains("cases would detect a 5-point drop"));
        // Enough cases already: no advice beyond the statement.
        let big = power_advice(&Design::paired(5_000, 1, 0.85), 0.05).unwrap();
        assert!(
            big.mde.drop < 0.05 && !big.text.contains("would detect"),
            "{}",
            big.text
        );
        // The suggested case count does reach the target.
        let reached = mde_pass_rate(&Design {
            cases: advice.cases_for_target,
            ..design
        })
        .unwrap();
        assert!(reached.drop <= 0.05 + 1e-9);
    }

    #[test]
    fn within_case_share_from_repeats() {
        // Two cases of 4 attempts: 2/4 and 2/4. Within-case variance 2·2/(4·3) = 1/3 each;
        // pooled p = 0.5, p(1−p) = 0.25: share (1/3)/0.25 > 1, clamped to 1 (all the
        // variance is attempt noise).
        assert_eq!(estimate_within_case_share(&[(2, 4), (2, 4)]), Some(1.0));
        // 4/4 and 0/4: no within-case variance at all.
        assert_eq!(estimate_within_case_share(&[(4, 4), (0, 4)]), Some(0.0));
        // 3/4 and 1/4: within 3/12 = 0.25 each, p(1-p) = 0.25... share 0.25/0.25 = 1 -> but
        // the between part is visible; with 4/4, 1/4: within (0 + 0.25)/2 = 0.125,
        // p = 5/8, p(1−p) = 0.234375, share 0.5333.
        let s = estimate_within_case_share(&[(4, 4), (1, 4)]).unwrap();
        assert!((s - 0.125 / 0.234_375).abs() < 1e-12, "{s}");
        assert_eq!(estimate_within_case_share(&[(1, 1)]), None);
        assert_eq!(estimate_within_case_share(&[(3, 3), (2, 2)]), None);
    }

    #[test]
    fn bad_designs_are_named() {
        let e = mde_pass_rate(&Design::paired(0, 1, 0.5)).unwrap_err();
        assert!(e.to_string().starts_with("cases:"), "{e}");
        assert!(mde_pass_rate(&Design::paired(10, 0, 0.5)).is_err());
        assert!(mde_pass_rate(&Design::paired(10, 1, 0.0)).is_err());
        assert!(cases_for_drop(&Design::paired(10, 1, 0.5), 0.6).is_err());
    }

    /// The rows of the Markdown table between `start` and `end` in docs/comparing.md, as
    /// numbers (`%` and thousands commas dropped).
    fn doc_rows(start: &str, end: &str) -> Vec<Vec<f64>> {
        let doc = include_str!("../../../../docs/comparing.md");
        let from = doc
            .find(start)
            .expect("the table's start marker is in the page");
        let to = doc[from..]
            .find(end)
            .expect("the table's end marker is in the page")
            + from;
        doc[from..to]
            .lines()
            .filter(|l| {
                l.starts_with("| ") && !l.starts_with("| Cases") && !l.starts_with("| Baseline")
            })
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| {
                        c.trim()
                            .trim_end_matches('%')
                            .trim()
                            .replace(',', "")
                            .parse()
                            .unwrap()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_tables_in_docs_comparing_are_what_the_code_computes() {
        let rows = doc_rows("<!-- mde-table baseline=0.8 -->", "<!-- /mde-table -->");
        assert_eq!(rows.len(), 5);
        for row in rows {
            let cases = row[0] as u64;
            for (col, k) in [1u32, 3, 5].into_iter().enumerate() {
                let m = mde_pass_rate(&Design::paired(cases, k, 0.8)).unwrap();
                let shown = (m.drop * 1000.0).round() / 10.0;
                assert_eq!(shown, row[col + 1], "{cases} cases × {k}");
            }
        }
        for (k, need) in [(1u32, 710u64), (3, 492), (5, 448)] {
            assert_eq!(
                cases_for_drop(&Design::paired(1, k, 0.8), 0.05).unwrap(),
                need
            );
        }
        let advice = power_advice(&Design::paired(40, 1, 0.85), 0.05).unwrap();
        let doc = include_str!("../../../../docs/comparing.md").replace('\n', " ");
        assert!(doc.contains(&advice.text), "{}", advice.text);

        let rows = doc_rows("<!-- window-table -->", "<!-- /window-table -->");
        assert_eq!(rows.len(), 4);
        for row in rows {
            let window = Design {
                cases: 100,
                repeats: 1,
                baseline_pass_rate: row[0] / 100.0,
                within_case_share: 0.0,
                pairing: Pairing::Unpaired { other_cases: 600 },
                alpha: 0.01,
                power: 0.8,
                sided: Sided::OneSided,
            };
            let need = cases_for_drop(&window, 0.05).unwrap();
            assert_eq!(need as f64, row[1], "baseline {}", row[0]);
            let m = mde_pass_rate(&window).unwrap();
            assert_eq!(
                (m.drop * 1000.0).round() / 10.0,
                row[2],
                "baseline {}",
                row[0]
            );
        }
    }
}
