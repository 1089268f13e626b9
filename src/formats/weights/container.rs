//! What a reader needs to know of moestream's own container (docs/FORMAT.md):
//! the header key that marks a container shard, the format version, and the
//! converter's manifest, whose census says whether a conversion into the
//! directory finished. The writer is [`crate::convert`].

use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The manifest of finished output files.
pub const MANIFEST: &str = "moestream-convert.json";

/// Header metadata key marking a container file (value: format version).
pub const CONTAINER_KEY: &str = "moestream.container";

/// Container format version.
pub const FORMAT_VERSION: &str = "1";

/// The two fields of the manifest a reader looks at.
#[derive(Deserialize)]
struct ManifestHead {
    input: PathBuf,
    /// Present once the conversion finished.
    census: Option<serde_json::Value>,
}

/// Refuses a directory holding a conversion that has not finished (its
/// manifest has no census yet): some of its files may still be the
/// source's, others converted.
pub fn check_finished(dir: &Path) -> Result<()> {
    let path = dir.join(MANIFEST);
    if !path.exists() {
        return Ok(());
    }
    let text = crate::fs::read_to_string(&path, crate::fs::read::JSON_SIDE_FILE)?;
    let m: ManifestHead = serde_json::from_str(&text)
        .map_err(|e| Error::config(&path, "(file)", format!("not a conversion manifest: {e}")))?;
    if m.census.is_none() {
        return Err(Error::config(
            &path,
            "census",
            format!(
                "{} holds an unfinished conversion (from {}); finish it with convert's resume, or convert again",
                dir.display(),
                m.input.display()
            ),
        ));
    }
    Ok(())
}
