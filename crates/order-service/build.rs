fn main() {
    // embed_migrations! reads the folder once; a migration added to it must
    // rebuild the crate too.
    println!("cargo:rerun-if-changed=../../migrations");
}
