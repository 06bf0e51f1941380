//! With the `mujoco` feature, the binaries and tests of this package find
//! `libmujoco.so` where the build found it (an rpath to
//! MUJOCO_DYNAMIC_LINK_DIR, which scripts/mujoco-lib.sh sets), so they run
//! without LD_LIBRARY_PATH. Without the feature this does nothing.
fn main() {
    println!("cargo:rerun-if-env-changed=MUJOCO_DYNAMIC_LINK_DIR");
    if std::env::var_os("CARGO_FEATURE_MUJOCO").is_none() {
        return;
    }
    if let Some(dir) = std::env::var_os("MUJOCO_DYNAMIC_LINK_DIR") {
        if let Some(dir) = dir.to_str() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
