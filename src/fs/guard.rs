//! Outputs that are inputs: a command that writes `--out` (or `--csv`,
//! `--plot`) over the file it reads destroys its input. [`check_not_input`]
//! refuses, before anything is written, an output that is an input — the
//! same canonical path or the same (device, inode), so a hard link or a
//! symlink is caught — or an existing file inside an input directory (a
//! model's shard or config).

use super::read::refused;
use crate::error::Result;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The identity of an existing file: its canonical path and (dev, inode).
fn identity(path: &Path) -> Option<(PathBuf, (u64, u64), bool)> {
    let md = std::fs::metadata(path).ok()?;
    let canon = path.canonicalize().ok()?;
    Some((canon, (md.dev(), md.ino()), md.is_dir()))
}

/// Refuses any of `outputs` that is one of `inputs` or an existing file
/// inside an input directory, naming both. Outputs that do not exist yet
/// cannot be inputs.
pub fn check_not_input(outputs: &[&Path], inputs: &[&Path]) -> Result<()> {
    let inputs: Vec<_> = inputs
        .iter()
        .filter_map(|p| Some((*p, identity(p)?)))
        .collect();
    for out in outputs {
        let Some((canon, id, _)) = identity(out) else {
            continue;
        };
        for (input, (in_canon, in_id, in_dir)) in &inputs {
            let inside = *in_dir && canon.starts_with(in_canon);
            if id == *in_id || canon == *in_canon || inside {
                let what = if inside && id != *in_id {
                    "lies inside the input"
                } else {
                    "is the input"
                };
                return Err(refused(
                    out,
                    format!(
                        "{what} {}; writing it would destroy what is read (choose another output)",
                        input.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_that_is_an_input_by_path_link_or_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("trace.parquet");
        std::fs::write(&input, b"x").unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&input, &hard).unwrap();
        let model = dir.path().join("m");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("config.json"), b"{}").unwrap();
        let i: &[&Path] = &[&input, &model];
        for out in [input.clone(), hard, model.join("config.json")] {
            let e = check_not_input(&[&out], i).unwrap_err().to_string();
            assert!(e.contains(&out.display().to_string()), "{e}");
        }
        let fresh = dir.path().join("new.csv");
        check_not_input(&[&fresh, &model.join("new.gguf")], i).unwrap();
    }
}
