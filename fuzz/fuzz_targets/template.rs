//! Prompt templating: `{{var}}` placeholders on arbitrary text. The first line of the input
//! names the variables that are defined (comma-separated); the rest is the template.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::template;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (names, body) = text.split_once('\n').unwrap_or(("", text));
    let variables: BTreeMap<String, String> = names
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_string(), format!("<{n}>")))
        .collect();
    for p in template::placeholders(body) {
        assert!(
            body.get(p.range.clone()).is_some(),
            "a placeholder's range is not in the text"
        );
    }
    if let Err(unknown) = template::render(body, &variables) {
        assert!(
            !unknown.is_empty(),
            "a failed rendering names what is unknown"
        );
    }
});
