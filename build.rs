//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the
//! `migrations/` directories at compile time, and cargo does not otherwise
//! know to look at them again (what `sqlx migrate build-script` writes).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
