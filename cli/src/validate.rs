//! `skilleval validate`: open and check a package without running anything; every problem is
//! listed with its file and JSON pointer, then the package's risk findings (docs/security.md).

use skilleval_execution::validate::validate as validate_package;
use skilleval_grading::StrategyRegistry;
use skilleval_model::package::{Package, PackageLimits};

use crate::run::{no_eval_hint, print_problems, print_risk, report_package_error};
use crate::{ValidateArgs, EXIT_BAD_INPUT, EXIT_NO_EVAL, EXIT_PASS};

/// Validates the package at `args.path`; 0 when it has no error, 3 when it has no eval
/// definition, 2 for any other error.
pub fn validate(args: &ValidateArgs) -> u8 {
    let package = match Package::open(&args.path, &PackageLimits::default()) {
        Ok(p) => p,
        Err(e) => {
            if args.json {
                let body = serde_json::json!({
                    "valid": false,
                    "error": e.to_string(),
                    "limit": e.limit(),
                    "entry": e.entry(),
                    "problems": e.problems(),
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&body).unwrap_or_default()
                );
                return EXIT_BAD_INPUT;
            }
            return report_package_error(&args.path, &e);
        }
    };
    let registry = StrategyRegistry::builtin()
        .zod(std::sync::Arc::new(
            skilleval_grading::zod::ZodConverter::detect(
                skilleval_sandbox::SandboxPolicy::default(),
                crate::zod_dir(),
            ),
        ))
        .build();
    let validation = validate_package(&package, &registry);
    let ok = validation.is_ok();
    // A skill with no eval yet is not a broken package: it gets its own code and the way on.
    let no_eval = package.format.is_none();
    let risk = package.risk_report();
    if args.json {
        let body = serde_json::json!({
            "valid": ok,
            "name": package.manifest.name,
            "format": package.format.map(|f| f.as_str()),
            "test_cases": package.config.test_cases.len(),
            "content_hash": package.content_hash,
            "problems": validation.problems,
            "risk": risk,
            "no_eval_definition": no_eval,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
    } else if validation.problems.is_empty() {
        println!(
            "{}: valid ({} test case(s), {} format, profile {})",
            args.path.display(),
            package.config.test_cases.len(),
            package.format.map_or("no", |f| f.as_str()),
            package.config.profile.as_str()
        );
    } else {
        print_problems(&args.path, &validation.problems);
        if ok {
            println!("{}: valid, with warnings", args.path.display());
        }
    }
    if !args.json {
        // Findings are for a reviewer to read; they do not make a package invalid.
        print_risk(&args.path, &risk);
        if no_eval {
            eprintln!("{}", no_eval_hint(&args.path));
        }
    }
    if no_eval {
        EXIT_NO_EVAL
    } else if ok {
        EXIT_PASS
    } else {
        EXIT_BAD_INPUT
    }
}
