//! The OpenAPI 3.1 document, maintained by hand in `openapi.json` next to this file and
//! served as is. `tests/api/openapi.rs` keeps it true: the routes it lists are exactly the
//! router's, and real responses validate against its schemas.

/// The document, as served at `/v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");
