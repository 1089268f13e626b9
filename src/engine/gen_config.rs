//! A model's sampling defaults from `generation_config.json`, and how they
//! combine with explicit values (command-line flags, a request's fields)
//! into [`SamplingParams`].
//!
//! The rule is vLLM's, per setting: an explicit value wins; else the
//! file's value, when the file has the key; else the caller's base. Keys
//! the file lacks take the base, not transformers' own defaults (such as
//! top_k 50). `do_sample` follows transformers: `false` makes the default
//! greedy (temperature 0) whatever temperature the file names, `true`
//! without a temperature samples at transformers' default of 1 where the
//! base is greedy; an explicit temperature still wins (0 is greedy).
//! Presence and frequency penalties and the seed have no key in the file.
//!
//! The end-of-sequence ids come along: the file's `eos_token_id` (an id or
//! a list), else config.json's, as [`crate::formats::tokenizer::eos_ids`] reads them.

use crate::engine::sampler::SamplingParams;
use crate::error::{Error, Result};
use crate::formats::tokenizer::eos_ids_of;
use serde_json::Value;
use std::path::Path;

/// The file the defaults are read from, in a model directory.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// transformers' default temperature, used when the file says `do_sample:
/// true` without naming one.
pub const TEMPERATURE_TRANSFORMERS: f32 = 1.0;

/// What a model's `generation_config.json` says about sampling; each field
/// is `Some` only when the file has the key (a `null` counts as absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k` (0 is off).
    pub top_k: Option<usize>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `do_sample`: `false` makes the default greedy.
    pub do_sample: Option<bool>,
    /// `eos_token_id` (an id or a list), else config.json's; empty if
    /// neither names one.
    pub eos_ids: Vec<u32>,
}

/// Explicit sampling values (command-line flags or a request's fields);
/// `None` leaves the setting to the model's defaults. The one declaration
/// of the sampling fields: the HTTP API flattens it into its requests
/// (`#[serde(flatten)]`, the same names), the command line maps its
/// `SamplingArgs` onto it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Deserialize)]
pub struct Overrides {
    /// Temperature; 0 is greedy, whatever the file's `do_sample`.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Most likely tokens kept; 0 is off.
    pub top_k: Option<usize>,
    /// min-p factor; 0 is off.
    pub min_p: Option<f32>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// transformers repetition penalty; 1 is off.
    pub repetition_penalty: Option<f32>,
    /// Seed of the sampler's generator.
    pub seed: Option<u64>,
}

impl Overrides {
    /// Per setting, this value, else `fallback`'s (a request's fields over
    /// the server's flags).
    pub fn or(self, fallback: Overrides) -> Overrides {
        Overrides {
            temperature: self.temperature.or(fallback.temperature),
            top_p: self.top_p.or(fallback.top_p),
            top_k: self.top_k.or(fallback.top_k),
            min_p: self.min_p.or(fallback.min_p),
            presence_penalty: self.presence_penalty.or(fallback.presence_penalty),
            frequency_penalty: self.frequency_penalty.or(fallback.frequency_penalty),
            repetition_penalty: self.repetition_penalty.or(fallback.repetition_penalty),
            seed: self.seed.or(fallback.seed),
        }
    }
}

impl GenerationDefaults {
    /// Reads `dir/generation_config.json` (none if the file is missing) and
    /// the end-of-sequence ids. A value of the wrong type or out of range
    /// is an error naming the file and the key.
    pub fn load(dir: &Path) -> Result<GenerationDefaults> {
        let doc = crate::formats::model_files::read(dir, GENERATION_CONFIG_FILE)?;
        let path = crate::formats::model_files::expected_path(dir, GENERATION_CONFIG_FILE);
        let text = doc.map(|d| d.text);
        let mut defaults = match &text {
            Some(text) => parse(&path, text)?,
            None => GenerationDefaults::default(),
        };
        defaults.eos_ids = eos_ids(dir, &path, text.as_deref())?;
        Ok(defaults)
    }

    /// The sampling settings: per setting, `explicit`'s value, else this
    /// file's, else `base`'s (see the module docs for `do_sample`).
    pub fn sampling(&self, base: &SamplingParams, explicit: &Overrides) -> SamplingParams {
        SamplingParams {
            temperature: explicit
                .temperature
                .unwrap_or_else(|| self.temperature_default(base.temperature)),
            top_p: explicit.top_p.or(self.top_p).unwrap_or(base.top_p),
            top_k: explicit.top_k.or(self.top_k).unwrap_or(base.top_k),
            min_p: explicit.min_p.or(self.min_p).unwrap_or(base.min_p),
            presence_penalty: explicit.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: explicit.frequency_penalty.unwrap_or(base.frequency_penalty),
            repetition_penalty: explicit
                .repetition_penalty
                .or(self.repetition_penalty)
                .unwrap_or(base.repetition_penalty),
            seed: explicit.seed.unwrap_or(base.seed),
        }
    }

    /// The temperature when none is given explicitly: greedy under
    /// `do_sample: false`, else the file's, else (under `do_sample: true`)
    /// `base` if it samples or transformers' default, else `base`.
    fn temperature_default(&self, base: f32) -> f32 {
        match (self.do_sample, self.temperature) {
            (Some(false), _) => 0.0,
            (_, Some(t)) => t,
            (Some(true), None) if base <= 0.0 => TEMPERATURE_TRANSFORMERS,
            _ => base,
        }
    }
}

/// The sampling keys of a generation_config.json's `text` (`path` names
/// errors); `eos_ids` is left empty.
fn parse(path: &Path, text: &str) -> Result<GenerationDefaults> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::config(path, "(file)", format!("not valid JSON: {e}")))?;
    let defaults = GenerationDefaults {
        temperature: float(path, &v, "temperature")?,
        top_p: float(path, &v, "top_p")?,
        top_k: count(path, &v, "top_k")?,
        min_p: float(path, &v, "min_p")?,
        repetition_penalty: float(path, &v, "repetition_penalty")?,
        do_sample: flag(path, &v, "do_sample")?,
        eos_ids: Vec::new(),
    };
    check(path, &defaults)?;
    Ok(defaults)
}

/// The value of `key`, `None` when absent or `null`.
fn field<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// A number under `key`.
fn float(path: &Path, v: &Value, key: &str) -> Result<Option<f32>> {
    let Some(x) = field(v, key) else {
        return Ok(None);
    };
    let n = x
        .as_f64()
        .ok_or_else(|| Error::config(path, key, format!("{x} is not a number")))?;
    Ok(Some(n as f32))
}

/// A non-negative integer under `key`.
fn count(path: &Path, v: &Value, key: &str) -> Result<Option<usize>> {
    let Some(x) = field(v, key) else {
        return Ok(None);
    };
    let n = x
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| Error::config(path, key, format!("{x} is not a non-negative integer")))?;
    Ok(Some(n))
}

/// A boolean under `key`.
fn flag(path: &Path, v: &Value, key: &str) -> Result<Option<bool>> {
    let Some(x) = field(v, key) else {
        return Ok(None);
    };
    let b = x
        .as_bool()
        .ok_or_else(|| Error::config(path, key, format!("{x} is not true or false")))?;
    Ok(Some(b))
}

/// Refuses a value of the file that sampling would refuse, naming its key
/// (each checked alone over the engine's defaults).
fn check(path: &Path, d: &GenerationDefaults) -> Result<()> {
    let base = SamplingParams::default();
    let one = |key: &str, p: SamplingParams| {
        p.validate()
            .map_err(|reason| Error::config(path, key, reason))
    };
    if let Some(temperature) = d.temperature {
        one(
            "temperature",
            SamplingParams {
                temperature,
                ..base
            },
        )?;
    }
    if let Some(top_p) = d.top_p {
        one("top_p", SamplingParams { top_p, ..base })?;
    }
    if let Some(min_p) = d.min_p {
        one("min_p", SamplingParams { min_p, ..base })?;
    }
    if let Some(repetition_penalty) = d.repetition_penalty {
        let p = SamplingParams {
            repetition_penalty,
            ..base
        };
        one("repetition_penalty", p)?;
    }
    Ok(())
}

/// The end-of-sequence ids: those of the generation config's `text` (read
/// from `path`), else config.json's in `dir`; empty if neither names one.
fn eos_ids(dir: &Path, path: &Path, text: Option<&str>) -> Result<Vec<u32>> {
    if let Some(text) = text {
        if let Some(ids) = eos_ids_of(path, text)? {
            return Ok(ids);
        }
    }
    match crate::formats::model_files::read(dir, "config.json")? {
        Some(doc) => Ok(eos_ids_of(&doc.path, &doc.text)?.unwrap_or_default()),
        None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "generation_config.json";

    fn parsed(text: &str) -> Result<GenerationDefaults> {
        parse(Path::new(PATH), text)
    }

    #[test]
    fn keys_are_read_only_when_present() {
        let none = GenerationDefaults::default();
        for (text, want) in [
            ("{}", none.clone()),
            (
                r#"{"do_sample": false, "eos_token_id": 383}"#,
                GenerationDefaults {
                    do_sample: Some(false),
                    ..none.clone()
                },
            ),
            (
                r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                    "min_p": 0.05, "repetition_penalty": 1.1}"#,
                GenerationDefaults {
                    temperature: Some(0.6),
                    top_p: Some(0.95),
                    top_k: Some(20),
                    min_p: Some(0.05),
                    repetition_penalty: Some(1.1),
                    do_sample: Some(true),
                    eos_ids: Vec::new(),
                },
            ),
            (
                r#"{"temperature": null, "top_k": null, "do_sample": null}"#,
                none.clone(),
            ),
            (
                r#"{"temperature": 0, "top_k": 0}"#,
                GenerationDefaults {
                    temperature: Some(0.0),
                    top_k: Some(0),
                    ..none.clone()
                },
            ),
        ] {
            assert_eq!(parsed(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn bad_values_name_the_file_and_the_key() {
        for (text, key) in [
            ("not json", "(file)"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"temperature": 1e39}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"top_k": -1}"#, "top_k"),
            (r#"{"top_k": 2.5}"#, "top_k"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"do_sample": "yes"}"#, "do_sample"),
        ] {
            let e = parsed(text).unwrap_err().to_string();
            assert!(
                e.contains(PATH) && e.contains(&format!("`{key}`")),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn explicit_beats_file_beats_base() {
        let greedy = SamplingParams::default();
        let openai = SamplingParams {
            temperature: 1.0,
            ..greedy
        };
        let qwen = GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            do_sample: Some(true),
            ..GenerationDefaults::default()
        };
        let off = GenerationDefaults {
            temperature: Some(0.6),
            do_sample: Some(false),
            ..GenerationDefaults::default()
        };
        let sample_only = GenerationDefaults {
            do_sample: Some(true),
            ..GenerationDefaults::default()
        };
        let none = GenerationDefaults::default();
        let t = |v: f32| Overrides {
            temperature: Some(v),
            ..Overrides::default()
        };
        let no = Overrides::default();
        // (file, base, explicit) -> temperature, top_p, top_k
        for (i, (file, base, explicit, want)) in [
            (&none, &greedy, no, (0.0, 1.0, 0)),
            (&none, &openai, no, (1.0, 1.0, 0)),
            (&qwen, &greedy, no, (0.6, 0.95, 20)),
            (&qwen, &greedy, t(0.0), (0.0, 0.95, 20)),
            (&qwen, &greedy, t(1.3), (1.3, 0.95, 20)),
            (&off, &greedy, no, (0.0, 1.0, 0)),
            (&off, &openai, no, (0.0, 1.0, 0)),
            (&off, &greedy, t(0.8), (0.8, 1.0, 0)),
            (
                &sample_only,
                &greedy,
                no,
                (TEMPERATURE_TRANSFORMERS, 1.0, 0),
            ),
            (&sample_only, &openai, t(0.0), (0.0, 1.0, 0)),
            (
                &qwen,
                &greedy,
                Overrides {
                    top_p: Some(0.5),
                    top_k: Some(0),
                    ..no
                },
                (0.6, 0.5, 0),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let p = file.sampling(base, &explicit);
            assert_eq!((p.temperature, p.top_p, p.top_k), want, "case {i}");
        }
    }

    #[test]
    fn penalties_min_p_and_seed_follow_the_same_rule() {
        let file = GenerationDefaults {
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            ..GenerationDefaults::default()
        };
        let base = SamplingParams {
            seed: 5,
            presence_penalty: 0.1,
            ..SamplingParams::default()
        };
        let from_file = file.sampling(&base, &Overrides::default());
        assert_eq!(
            from_file,
            SamplingParams {
                min_p: 0.05,
                repetition_penalty: 1.1,
                ..base
            }
        );
        let explicit = Overrides {
            min_p: Some(0.0),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.5),
            repetition_penalty: Some(1.0),
            seed: Some(9),
            ..Overrides::default()
        };
        assert_eq!(
            file.sampling(&base, &explicit),
            SamplingParams {
                presence_penalty: 0.5,
                frequency_penalty: -0.5,
                seed: 9,
                ..base
            }
        );
    }

    #[test]
    fn load_reads_the_file_and_falls_back_for_eos() {
        let dir = tempfile::tempdir().unwrap();
        let d = GenerationDefaults::load(dir.path()).unwrap();
        assert_eq!(d, GenerationDefaults::default(), "no file: nothing");
        std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": 2}"#).unwrap();
        let gen = dir.path().join(GENERATION_CONFIG_FILE);
        for (text, eos) in [
            (r#"{"do_sample": false}"#, vec![2]),
            (r#"{"do_sample": false, "eos_token_id": 7}"#, vec![7]),
            (
                r#"{"do_sample": false, "eos_token_id": [7, 8]}"#,
                vec![7, 8],
            ),
            (r#"{"do_sample": false, "eos_token_id": null}"#, vec![2]),
        ] {
            std::fs::write(&gen, text).unwrap();
            let d = GenerationDefaults::load(dir.path()).unwrap();
            assert_eq!(d.do_sample, Some(false), "{text}");
            assert_eq!(d.eos_ids, eos, "{text}");
        }
        std::fs::write(&gen, r#"{"eos_token_id": [7, -1]}"#).unwrap();
        let e = GenerationDefaults::load(dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("eos_token_id"), "{e}");
    }
}
