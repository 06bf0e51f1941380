//! include/pmstate_deploy.h is what cbindgen generates from src/lib.rs
//! today; `PMSTATE_BLESS=1 cargo test -p pmstate-deploy-c --test header`
//! rewrites it after a change to the ABI.

use std::path::Path;

#[test]
fn the_committed_header_is_cbindgens() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new().with_crate(dir).with_config(config).generate().expect("cbindgen").write(&mut generated);
    let path = dir.join("include/pmstate_deploy.h");
    if std::env::var_os("PMSTATE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let committed = std::fs::read(&path).expect("include/pmstate_deploy.h");
    assert!(
        committed == generated,
        "include/pmstate_deploy.h is stale: rerun with PMSTATE_BLESS=1 (cbindgen's output:\n{})",
        String::from_utf8_lossy(&generated)
    );
}
