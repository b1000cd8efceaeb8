//! `sqlx::migrate!` embeds `migrations/` at compile time; without this, adding a migration
//! would not rebuild the crate and a cached build would miss it.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
