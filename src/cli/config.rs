//! Settings from outside the command line: a `MOESTREAM_<FLAG>`
//! environment variable per long flag and the `--config FILE` (TOML) file,
//! merged into clap's command *before* parsing as each flag's default. So
//! one precedence holds for every command (run, chat, serve, bench, ...):
//!
//! | source | example |
//! | --- | --- |
//! | 1. the flag | `--ram-gb 8` |
//! | 2. the environment | `MOESTREAM_RAM_GB=8` |
//! | 3. the `--config` file (`MOESTREAM_CONFIG`) | `ram-gb = 8`, or under `[run]` |
//! | 4. the tuned profile (`--io`, `--pipeline`, `--prefetch` left `auto`) | `moestream tune` |
//! | 5. the built-in default | `run -h` |
//!
//! The file's keys are the long flags (`ram-gb` or `ram_gb`); top-level
//! keys apply to every command that has the flag, a `[run]` (or
//! `[bench.decode]`) section to that command only and wins over the top
//! level. A key no command has, a section no command is called, or a key
//! its section's command lacks is an error naming the file and the key;
//! so is a value the flag refuses (the same checks as on the command
//! line). The file is read through the bounded reader.

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, Command};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The flag naming the file, and its environment variable.
pub(super) const CONFIG_FLAG: &str = "config";
const CONFIG_ENV: &str = "MOESTREAM_CONFIG";

/// The environment variable of a long flag: `MOESTREAM_RAM_GB` for
/// `--ram-gb`.
pub(super) fn env_name(long: &str) -> String {
    format!("MOESTREAM_{}", long.to_uppercase().replace('-', "_"))
}

/// A value set from outside the command line: the flag, the values, and
/// where they came from (`MOESTREAM_SEED`, `FILE: `key``).
pub(super) struct Outside {
    long: String,
    values: Vec<String>,
    source: String,
}

/// The values set from outside the command line, to name their source
/// when the flag's parser refuses one.
pub(super) struct Merged(Vec<Outside>);

impl Merged {
    /// `e` prefixed with the source of the value it refuses, when that
    /// value came from the environment or the file.
    pub(super) fn explain(&self, e: &clap::Error) -> Option<anyhow::Error> {
        use clap::error::{ContextKind, ContextValue};
        let text = |k| match e.get(k) {
            Some(ContextValue::String(s)) => Some(s.as_str()),
            _ => None,
        };
        let (arg, value) = (
            text(ContextKind::InvalidArg)?,
            text(ContextKind::InvalidValue)?,
        );
        let o = self.0.iter().find(|o| {
            let flag = format!("--{}", o.long);
            (arg == flag || arg.starts_with(&format!("{flag} ")))
                && o.values
                    .iter()
                    .any(|v| v == value || v.split(',').any(|p| p == value))
        })?;
        let msg = e.to_string();
        let msg = msg.trim().trim_start_matches("error: ");
        Some(anyhow::anyhow!(
            "{}: {}",
            o.source,
            msg.lines().next().unwrap_or_default()
        ))
    }
}

/// `cmd` with the environment's and the file's values as defaults of the
/// flags of the command `argv` runs.
pub(super) fn merge(cmd: Command, argv: &[OsString]) -> Result<(Command, Merged)> {
    let path = subcommand_path(&cmd, argv);
    let file = match config_path(argv) {
        Some(p) => Some(File::read(&p, &cmd)?),
        None => None,
    };
    let mut merged = Merged(Vec::new());
    // The top level's own flags (logs), then the command's.
    let cmd = with_defaults(cmd, &[], file.as_ref(), &mut merged)?;
    if path.is_empty() {
        return Ok((cmd, merged));
    }
    let cmd = nested(cmd, &path, 0, file.as_ref(), &mut merged)?;
    Ok((cmd, merged))
}

/// Applies the defaults to the subcommand `path[depth..]` below `cmd`.
fn nested(
    cmd: Command,
    path: &[String],
    depth: usize,
    file: Option<&File>,
    merged: &mut Merged,
) -> Result<Command> {
    let mut err = None;
    let cmd = cmd.mut_subcommand(&path[depth], |sc| {
        let res = if depth + 1 == path.len() {
            with_defaults(sc.clone(), &path[..=depth], file, merged)
        } else {
            nested(sc.clone(), path, depth + 1, file, merged)
        };
        match res {
            Ok(sc) => sc,
            Err(e) => {
                err = Some(e);
                sc
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(cmd),
    }
}

/// `sc` (the command at `path`) with each of its flags' default taken
/// from the environment, else the file.
fn with_defaults(
    sc: Command,
    path: &[String],
    file: Option<&File>,
    merged: &mut Merged,
) -> Result<Command> {
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    for arg in sc.get_arguments().filter(|a| configurable(a)) {
        let long = arg.get_long().expect("configurable flags have a long name");
        let env = env_name(long);
        let (values, source) = match std::env::var_os(&env) {
            Some(v) => {
                let v = v
                    .into_string()
                    .map_err(|_| anyhow::anyhow!("{env}: not UTF-8"))?;
                (vec![v], env)
            }
            None => match file.and_then(|f| f.value(path, long)) {
                Some((values, key)) => (values, key),
                None => continue,
            },
        };
        let values = normalized(arg, values, &source)?;
        found.push((arg.get_id().to_string(), values.clone()));
        merged.0.push(Outside {
            long: long.to_string(),
            values,
            source,
        });
    }
    let mut sc = sc;
    for (id, values) in found {
        // clap keeps defaults as `&'static str`: a few short strings, once
        // per process.
        let values: Vec<&'static str> = values
            .into_iter()
            .map(|v| &*Box::leak(v.into_boxed_str()))
            .collect();
        // A value from outside satisfies a required flag as one typed does.
        sc = sc.mut_arg(id, |a| a.required(false).default_values(values));
    }
    Ok(sc)
}

/// A flag a setting can come from outside for: one with a long name that
/// takes a value or is a switch, except `--help`, `--version`, `--config`
/// and flags with their own environment variable (`--api-key`).
fn configurable(a: &Arg) -> bool {
    let wanted = matches!(
        a.get_action(),
        ArgAction::Set
            | ArgAction::Append
            | ArgAction::SetTrue
            | ArgAction::SetFalse
            | ArgAction::Count
    );
    wanted && a.get_long().is_some_and(|l| l != CONFIG_FLAG) && a.get_env().is_none()
}

/// Switch values spelled as a person might (`1`, `yes`, `on`) as the
/// parser's `true`/`false`; several values only where the flag takes them.
fn normalized(arg: &Arg, values: Vec<String>, source: &str) -> Result<Vec<String>> {
    let long = arg.get_long().unwrap_or_default();
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        let [v] = values.as_slice() else {
            bail!("{source}: --{long} is a switch: true or false, not a list");
        };
        let b = match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => "true",
            "0" | "false" | "no" | "off" | "" => "false",
            _ => bail!("{source}: --{long} is a switch: `{v}` is neither true nor false"),
        };
        return Ok(vec![b.into()]);
    }
    if matches!(arg.get_action(), ArgAction::Count) {
        return match values.as_slice() {
            [v] if v.parse::<u8>().is_ok() => Ok(values),
            _ => bail!("{source}: --{long} is a count (0, 1, 2, ...)"),
        };
    }
    let many = matches!(arg.get_action(), ArgAction::Append)
        || arg.get_num_args().is_some_and(|n| n.max_values() > 1);
    match (values.len(), arg.get_value_delimiter()) {
        (1, _) => Ok(values),
        (_, Some(d)) => Ok(vec![values.join(&d.to_string())]),
        (_, None) if many => Ok(values),
        _ => bail!("{source}: --{long} takes one value, not a list"),
    }
}

/// The settings from outside the command line, for `status`: each
/// `MOESTREAM_<FLAG>` variable set that names a flag of some command, and
/// the `--config` file with its keys (sections as `run.port`).
pub(super) fn summary(cmd: &Command, argv: &[OsString]) -> Result<Vec<String>> {
    let mut longs = all_longs(cmd);
    longs.sort();
    longs.dedup();
    let mut lines: Vec<String> = longs
        .iter()
        .filter_map(|l| {
            let env = env_name(l);
            let v = std::env::var_os(&env)?;
            Some(format!("{env}={}", v.to_string_lossy()))
        })
        .collect();
    if let Some(p) = config_path(argv) {
        let f = File::read(&p, cmd)?;
        let mut keys = Vec::new();
        keys_of(&f.table, "", &mut keys);
        lines.push(format!("{}: {}", p.display(), keys.join(", ")));
    }
    Ok(lines)
}

/// The dotted keys of `t` (`ram-gb`, `run.port`).
fn keys_of(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        match v {
            toml::Value::Table(sub) => keys_of(sub, &format!("{prefix}{k}."), out),
            v => out.push(format!("{prefix}{k} = {v}")),
        }
    }
}

/// The `--config` file named on the command line (`--config FILE` or
/// `--config=FILE`, before any `--`), else by `MOESTREAM_CONFIG`.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let flag = format!("--{CONFIG_FLAG}");
    let with_eq = format!("{flag}=");
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a == flag {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix(&with_eq) {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os(CONFIG_ENV).map(PathBuf::from)
}

/// The names of the subcommands `argv` runs (`["bench", "decode"]`):
/// each word that names a subcommand of the one before.
fn subcommand_path(cmd: &Command, argv: &[OsString]) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = cmd;
    for a in argv.iter().skip(1) {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a.starts_with('-') {
            continue;
        }
        match at.find_subcommand(a.as_ref()) {
            Some(sc) => {
                path.push(sc.get_name().to_string());
                at = sc;
            }
            // A value of a top-level flag (`--log-format json run`).
            None if path.is_empty() => continue,
            None => break,
        }
    }
    path
}

/// A parsed `--config` file, its keys checked against the commands.
struct File {
    path: PathBuf,
    table: toml::Table,
}

impl File {
    fn read(path: &Path, cmd: &Command) -> Result<File> {
        let text = moestream::fs::read_to_string(path, moestream::fs::read::CONFIG)
            .with_context(|| format!("--{CONFIG_FLAG}"))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}: {}", path.display(), e.message()))
            .with_context(|| format!("--{CONFIG_FLAG}"))?;
        let f = File {
            path: path.to_path_buf(),
            table,
        };
        f.check(cmd)?;
        Ok(f)
    }

    /// Refuses a key or section no command has, naming the file and key.
    fn check(&self, cmd: &Command) -> Result<()> {
        let longs = all_longs(cmd);
        check_table(&self.path, &self.table, "", cmd, &longs)
    }

    /// The values for `--long` of the command at `path`: its section's,
    /// else the top level's; and the key's name for errors.
    fn value(&self, path: &[String], long: &str) -> Option<(Vec<String>, String)> {
        let mut tables = vec![(String::new(), &self.table)];
        for name in path {
            let (prefix, t) = tables.last().expect("the top level");
            match t.get(name.as_str()) {
                Some(toml::Value::Table(sub)) => {
                    tables.push((format!("{prefix}{name}."), sub));
                }
                _ => break,
            }
        }
        let key_of = |t: &toml::Table| {
            [long.to_string(), long.replace('-', "_")]
                .into_iter()
                .find(|k| t.get(k).is_some_and(|v| !v.is_table()))
        };
        tables.iter().rev().find_map(|(prefix, t)| {
            let key = key_of(t)?;
            let source = format!("{}: `{prefix}{key}`", self.path.display());
            Some((strings(&t[&key]), source))
        })
    }
}

/// Every long flag of `cmd` and its subcommands, as a file may name them.
fn all_longs(cmd: &Command) -> Vec<String> {
    let mut v: Vec<String> = cmd
        .get_arguments()
        .filter(|a| configurable(a))
        .filter_map(|a| a.get_long())
        .map(String::from)
        .collect();
    for sc in cmd.get_subcommands() {
        v.extend(all_longs(sc));
    }
    v
}

fn check_table(
    path: &Path,
    t: &toml::Table,
    prefix: &str,
    cmd: &Command,
    longs: &[String],
) -> Result<()> {
    let own: Vec<&str> = cmd
        .get_arguments()
        .filter(|a| configurable(a))
        .filter_map(|a| a.get_long())
        .collect();
    for (key, value) in t {
        let long = key.replace('_', "-");
        match value {
            toml::Value::Table(sub) => match cmd.find_subcommand(key.as_str()) {
                Some(sc) => check_table(path, sub, &format!("{prefix}{key}."), sc, longs)?,
                None => bail!(
                    "{}: unknown section `[{prefix}{key}]` (sections are named by command: [run], [serve], [bench.decode], ...)",
                    path.display()
                ),
            },
            // The top level may set any command's flag; a section only its
            // command's.
            _ if prefix.is_empty() && longs.contains(&long) => {}
            _ if own.contains(&long.as_str()) => {}
            _ if prefix.is_empty() => bail!(
                "{}: unknown key `{key}`: no command has a flag --{long}",
                path.display()
            ),
            _ => bail!(
                "{}: unknown key `{prefix}{key}`: `{}` has no flag --{long}",
                path.display(),
                prefix.trim_end_matches('.').replace('.', " ")
            ),
        }
    }
    Ok(())
}

/// A TOML value as the command line would spell it.
fn strings(v: &toml::Value) -> Vec<String> {
    match v {
        toml::Value::String(s) => vec![s.clone()],
        toml::Value::Array(a) => a.iter().flat_map(strings).collect(),
        other => vec![other.to_string()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_follow_the_long_flags() {
        assert_eq!(env_name("ram-gb"), "MOESTREAM_RAM_GB");
        assert_eq!(env_name("temperature"), "MOESTREAM_TEMPERATURE");
    }

    #[test]
    fn no_flag_takes_a_variable_the_program_reads_for_something_else() {
        let reserved = [
            "MOESTREAM_ISA",
            "MOESTREAM_CACHE",
            "MOESTREAM_COMMIT",
            "MOESTREAM_PROFILE",
            "MOESTREAM_CONFIG",
            "MOESTREAM_ORACLE_DIRS",
            "MOESTREAM_PYTHON",
            "MOESTREAM_REAL_TEMPLATES",
            "MOESTREAM_SPIN_US",
        ];
        for long in all_longs(&super::super::command()) {
            assert!(!reserved.contains(&env_name(&long).as_str()), "--{long}");
        }
    }

    #[test]
    fn the_subcommand_path_skips_flags_and_their_values() {
        let cmd = super::super::command();
        let argv = |s: &str| -> Vec<OsString> { s.split(' ').map(OsString::from).collect() };
        assert_eq!(subcommand_path(&cmd, &argv("m -v run -m d")), ["run"]);
        assert_eq!(
            subcommand_path(&cmd, &argv("m --log-format json bench decode -m run")),
            ["bench", "decode"]
        );
        assert!(subcommand_path(&cmd, &argv("m -- run")).is_empty());
    }
}
