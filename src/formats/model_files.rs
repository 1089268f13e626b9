//! The metadata files of a model (config.json, tokenizer.json,
//! tokenizer_config.json, generation_config.json, chat_template.jinja):
//! read from its directory, or derived from a GGUF file's header
//! ([`crate::formats::gguf::GgufModel::document`]). Every reader of a model's
//! metadata goes through [`read`], so a `.gguf` path works wherever a model
//! directory does.

use crate::error::{Error, Result};
use crate::formats::config::ModelConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One metadata file's text, with the path that errors about it name (the
/// GGUF file itself for a derived document).
pub struct Document {
    pub path: PathBuf,
    pub text: String,
}

/// The metadata file `name` of the model at `model` (a directory or a
/// `.gguf` file), or `None` if the model has none.
pub fn read(model: &Path, name: &str) -> Result<Option<Document>> {
    if crate::formats::gguf::is_gguf(model) {
        let g = crate::formats::gguf::GgufModel::open(model)?;
        return Ok(g.document(name)?.map(|text| Document {
            path: model.to_path_buf(),
            text,
        }));
    }
    let path = model.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::fs::read_to_string(&path, crate::fs::read::JSON_SIDE_FILE)?;
    Ok(Some(Document { path, text }))
}

/// Where `name` would be for error messages when it is missing.
pub fn expected_path(model: &Path, name: &str) -> PathBuf {
    if crate::formats::gguf::is_gguf(model) {
        model.to_path_buf()
    } else {
        model.join(name)
    }
}

// Loading sits here, not in config.rs, because the file may be derived
// from a GGUF header, and the GGUF reader checks what it derives with the
// config parser: config.rs stays a pure parser.
impl ModelConfig {
    /// Reads and validates `dir/config.json`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let doc = read(dir, "config.json")?.ok_or_else(|| {
            Error::file(
                expected_path(dir, "config.json"),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        let (path, text) = (doc.path, doc.text);
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::config(&path, "(file)", format!("not valid JSON: {e}")))?;
        ModelConfig::from_json(&path, &v)
    }
}
