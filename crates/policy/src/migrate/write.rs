//! Writing OUT_DIR: refused when it already holds files (unless `force`),
//! each file written to a temporary beside it and renamed into place (a
//! failed run leaves no partial file), the report last.

use std::path::Path;

use pmstate_ckpt::{save_torch, Checkpoint, UnsafeGlobals, WriteOptions};

use super::MigrateError;

/// The files a migration writes, in order.
pub const OUTPUT_FILES: [&str; 4] =
    ["last.ckpt", "resolved_configs.pt", "resolved_configs_inference.pt", "migrate_report.json"];

/// Checks OUT_DIR may be written and creates it.
pub(crate) fn prepare(dir: &Path, force: bool) -> Result<(), MigrateError> {
    let shown = dir.display().to_string();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                let e = e.map_err(|source| MigrateError::Io { path: shown.clone(), source })?;
                let name = e.file_name().to_string_lossy().into_owned();
                if !force || !OUTPUT_FILES.contains(&name.as_str()) {
                    return Err(MigrateError::OutDirNotEmpty { dir: shown, first: name });
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|source| MigrateError::Io { path: shown, source })
        }
        Err(source) => Err(MigrateError::Io { path: shown, source }),
    }
}

/// One torch archive, atomically. The configs name today's ProtoMotions
/// classes (what train_agent.py's save_configs writes and its loader
/// reads with `weights_only=False`), so they are written as such.
pub(crate) fn torch_file(ckpt: &Checkpoint, path: &Path, configs: bool) -> Result<(), MigrateError> {
    let opts = WriteOptions {
        unsafe_globals: if configs { UnsafeGlobals::Allow } else { UnsafeGlobals::Refuse },
        ..WriteOptions::default()
    };
    Ok(save_torch(ckpt, path, &opts)?)
}

/// The report as JSON, atomically (temporary file, fsync, rename).
pub(crate) fn json_file(bytes: &[u8], path: &Path) -> Result<(), MigrateError> {
    use std::io::Write;
    let shown = path.display().to_string();
    let io = |source| MigrateError::Io { path: shown.clone(), source };
    let tmp = path.with_file_name(format!(".pmstate-{}-migrate_report.json.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}
