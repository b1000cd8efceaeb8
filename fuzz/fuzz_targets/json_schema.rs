//! JSON-Schema compilation (`expected.jsonSchema`) on arbitrary JSON, and a compiled schema
//! validating the same document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_schema as json_schema;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(validator) = json_schema::compile_schema(&schema) {
        let _ = json_schema::schema_errors(&validator, &schema);
    }
});
