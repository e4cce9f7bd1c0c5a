// `src/lib.rs` declares a module for every file of `src/` (`automod`): a new file must rebuild
// the crate, which cargo does not do on its own for a file nothing declared yet.
fn main() {
    println!("cargo:rerun-if-changed=src");
}
