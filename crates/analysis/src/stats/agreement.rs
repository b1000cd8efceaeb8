//! Agreement between two raters on a binary label: percent agreement and Cohen's kappa.
//!
//! Used to say whether an LLM judge can be trusted: a human reviewer agrees or disagrees with
//! the judge's pass/fail on a case (or on one rubric criterion), which gives the reviewer's own
//! label; kappa corrects the raw agreement for the agreement two raters would reach by chance
//! with the same marginal rates (Cohen 1960). Its interval uses Cohen's large-sample standard
//! error `sqrt(po(1-po) / (n (1-pe)^2))`, the one textbooks quote next to the statistic.

use serde::{Deserialize, Serialize};

use super::{invalid, z_critical, StatsError};

/// The 2×2 table of two raters' binary labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgreementTable {
    /// Both said pass.
    pub both_pass: u64,
    /// The first (the judge) said pass, the second (the reviewer) fail.
    pub first_only: u64,
    /// The first said fail, the second pass.
    pub second_only: u64,
    /// Both said fail.
    pub both_fail: u64,
}

impl AgreementTable {
    /// Adds one item rated by both.
    pub fn add(&mut self, first_pass: bool, second_pass: bool) {
        match (first_pass, second_pass) {
            (true, true) => self.both_pass += 1,
            (true, false) => self.first_only += 1,
            (false, true) => self.second_only += 1,
            (false, false) => self.both_fail += 1,
        }
    }

    pub fn n(&self) -> u64 {
        self.both_pass + self.first_only + self.second_only + self.both_fail
    }
}

/// Percent agreement and Cohen's kappa with its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    pub n: u64,
    /// Observed agreement `po`, 0..=1.
    pub percent_agreement: f64,
    /// Agreement expected by chance from the marginals, `pe`.
    pub chance_agreement: f64,
    /// `(po - pe) / (1 - pe)`; `None` when `pe` is 1 (both raters gave one label to every
    /// item: kappa is undefined, not perfect).
    pub kappa: Option<f64>,
    /// Cohen's large-sample standard error of kappa.
    pub kappa_std_error: Option<f64>,
    /// `kappa ± z·se`, clamped to [-1, 1].
    pub kappa_low: Option<f64>,
    pub kappa_high: Option<f64>,
}

/// Agreement of the table's two raters, with a `confidence` (0.95) interval on kappa.
pub fn cohen_kappa(table: &AgreementTable, confidence: f64) -> Result<Agreement, StatsError> {
    let n = table.n();
    if n == 0 {
        return Err(invalid("n", "needs at least one item rated by both"));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(invalid("confidence", "must be strictly between 0 and 1"));
    }
    let nf = n as f64;
    let po = (table.both_pass + table.both_fail) as f64 / nf;
    let first_pass = (table.both_pass + table.first_only) as f64 / nf;
    let second_pass = (table.both_pass + table.second_only) as f64 / nf;
    let pe = first_pass * second_pass + (1.0 - first_pass) * (1.0 - second_pass);
    let (kappa, se) = if (1.0 - pe).abs() < 1e-12 {
        (None, None)
    } else {
        let kappa = (po - pe) / (1.0 - pe);
        let se = (po * (1.0 - po) / (nf * (1.0 - pe).powi(2))).sqrt();
        (Some(kappa), Some(se))
    };
    let z = z_critical(confidence);
    Ok(Agreement {
        n,
        percent_agreement: po,
        chance_agreement: pe,
        kappa,
        kappa_std_error: se,
        kappa_low: kappa.zip(se).map(|(k, s)| (k - z * s).max(-1.0)),
        kappa_high: kappa.zip(se).map(|(k, s)| (k + z * s).min(1.0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of Cohen's kappa most textbooks and encyclopaedias use: 50
    /// proposals, both readers said yes to 20 and no to 15, A yes/B no 5, A no/B yes 10:
    /// po = 0.7, pe = 0.5·0.6 + 0.5·0.4 = 0.5, kappa = 0.4. The standard error by hand:
    /// sqrt(0.7·0.3 / (50·0.25)) = sqrt(0.0168) = 0.129615; 95 % interval 0.4 ± 1.959964·se
    /// = [0.145958, 0.654042].
    #[test]
    fn kappa_matches_the_textbook_example() {
        let table = AgreementTable {
            both_pass: 20,
            first_only: 5,
            second_only: 10,
            both_fail: 15,
        };
        let a = cohen_kappa(&table, 0.95).unwrap();
        assert_eq!(a.n, 50);
        assert!((a.percent_agreement - 0.7).abs() < 1e-12);
        assert!((a.chance_agreement - 0.5).abs() < 1e-12);
        assert!((a.kappa.unwrap() - 0.4).abs() < 1e-12);
        assert!((a.kappa_std_error.unwrap() - 0.129_615).abs() < 1e-6);
        assert!((a.kappa_low.unwrap() - 0.145_958).abs() < 1e-5);
        assert!((a.kappa_high.unwrap() - 0.654_042).abs() < 1e-5);
    }

    #[test]
    fn perfect_agreement_is_kappa_one_and_one_label_is_undefined() {
        let mut t = AgreementTable::default();
        for i in 0..10 {
            t.add(i % 2 == 0, i % 2 == 0);
        }
        let a = cohen_kappa(&t, 0.95).unwrap();
        assert_eq!(a.kappa, Some(1.0));
        assert_eq!(a.percent_agreement, 1.0);

        let mut same = AgreementTable::default();
        same.add(true, true);
        same.add(true, true);
        let a = cohen_kappa(&same, 0.95).unwrap();
        assert_eq!(a.percent_agreement, 1.0);
        assert_eq!(a.kappa, None);
    }

    #[test]
    fn empty_table_is_refused() {
        assert!(cohen_kappa(&AgreementTable::default(), 0.95).is_err());
    }
}
