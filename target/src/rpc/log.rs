//! SPDK's log methods (`log_set_level`, `log_get_level`, `log_set_print_level`,
//! `log_get_print_level`, `log_set_flag`, `log_clear_flag`, `log_get_flags`) over `tracing`.
//!
//! SPDK has two thresholds, one for syslog (`level`) and one for the console (`print_level`);
//! we write one stream, so a message passes when either threshold lets it through. SPDK's
//! levels map onto tracing's: ERROR -> error, WARNING -> warn, NOTICE and INFO -> info,
//! DEBUG -> debug. A flag (SPDK's debug log component, `-L nvmf`) turns on debug output of the
//! modules that do that component's work. Every change rebuilds the filter and swaps it in
//! through `tracing_subscriber`'s reload layer, so it takes effect at once.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{Map, Value};
use tracing_subscriber::{reload, EnvFilter, Registry};

use super::{parse, Control};

/// Installs a filter directive string (`EnvFilter` syntax) in the running subscriber.
pub type ApplyFilter = Box<dyn Fn(&str) -> Result<(), String> + Send>;

/// SPDK's log flags and the module targets (tracing's default targets are module paths, and
/// a directive covers every module below it) that do each one's work.
pub const FLAGS: &[(&str, &[&str])] = &[
    ("aio", &["nvmf_target::bdev::aio"]),
    ("app_rpc", &["nvmf_target::rpc::app"]),
    ("bdev", &["nvmf_target::bdev"]),
    ("bdev_malloc", &["nvmf_target::bdev::malloc"]),
    ("bdev_null", &["nvmf_target::bdev::null"]),
    ("log_rpc", &["nvmf_target::rpc::log"]),
    (
        "nvmf",
        &[
            "nvmf_target::core",
            "nvmf_target::cmd",
            "nvmf_target::target",
            "nvmf_target::transport::options",
            "nvmf_target::transport::loopback",
        ],
    ),
    ("nvmf_rdma", &["nvmf_target::transport::rdma"]),
    ("rdma", &["nvmf_common::rdma"]),
    ("reactor", &["nvmf_common::reactor", "nvmf_target::reactor"]),
    ("rpc", &["nvmf_rpc", "nvmf_target::rpc"]),
    ("thread", &["nvmf_target::core::poll_group"]),
    ("uring", &["nvmf_target::bdev::uring"]),
    ("vbdev_delay", &["nvmf_target::bdev::delay"]),
];

/// SPDK's log levels (`enum spdk_log_level`), least verbose first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warning,
    Notice,
    Info,
    Debug,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warning => "WARNING",
            Level::Notice => "NOTICE",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        }
    }

    /// SPDK's names, any case (and `WARN`, which SPDK's parser also takes).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "ERROR" => Level::Error,
            "WARNING" | "WARN" => Level::Warning,
            "NOTICE" => Level::Notice,
            "INFO" => Level::Info,
            "DEBUG" => Level::Debug,
            _ => return None,
        })
    }

    /// From `--log-level`'s tracing names.
    pub fn from_tracing(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warning,
            "info" => Level::Notice,
            "debug" | "trace" => Level::Debug,
            _ => return None,
        })
    }

    fn tracing(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warn",
            Level::Notice | Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// The log settings the methods read and change.
pub struct LogControl {
    level: Level,
    print_level: Level,
    /// The filter given at start (`--log-level` or `RUST_LOG`), used until a level is set.
    initial: Option<String>,
    enabled: Vec<bool>,
    apply: Option<ApplyFilter>,
}

impl Default for LogControl {
    /// SPDK's defaults: NOTICE for both, no flag set.
    fn default() -> Self {
        Self::new(Level::Notice, None)
    }
}

impl LogControl {
    /// `initial` is the filter to start with (`--log-level` or `RUST_LOG`); `level` is what
    /// `log_get_level` reports for it.
    pub fn new(level: Level, initial: Option<String>) -> Self {
        Self {
            level,
            print_level: level,
            initial,
            enabled: vec![false; FLAGS.len()],
            apply: None,
        }
    }

    /// Where changes go: the running subscriber's reload handle.
    pub fn set_apply(&mut self, apply: ApplyFilter) {
        self.apply = Some(apply);
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn print_level(&self) -> Level {
        self.print_level
    }

    /// Each flag and whether it is on, in SPDK's (alphabetical) order.
    pub fn flags(&self) -> impl Iterator<Item = (&'static str, bool)> + '_ {
        FLAGS
            .iter()
            .zip(&self.enabled)
            .map(|((name, _), &on)| (*name, on))
    }

    /// Sets or clears the flags `pattern` names: `all`, or a glob (`*`, `?`) matched without
    /// regard to case, as SPDK's `fnmatch`. `Err` when it names no flag.
    pub fn set_flag(&mut self, pattern: &str, on: bool) -> Result<(), String> {
        let mut hit = false;
        for ((name, _), enabled) in FLAGS.iter().zip(self.enabled.iter_mut()) {
            if pattern.eq_ignore_ascii_case("all") || glob(pattern, name) {
                *enabled = on;
                hit = true;
            }
        }
        if hit {
            Ok(())
        } else {
            Err(format!(
                "unknown log flag {pattern:?} (flags: all, {})",
                FLAGS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
            ))
        }
    }

    /// The filter for the current settings, in `EnvFilter` syntax.
    pub fn directives(&self) -> String {
        let base = match &self.initial {
            Some(initial) => initial.clone(),
            None => self.level.max(self.print_level).tracing().to_string(),
        };
        let mut out = vec![base];
        for ((_, targets), &on) in FLAGS.iter().zip(&self.enabled) {
            if on {
                out.extend(targets.iter().map(|t| format!("{t}=debug")));
            }
        }
        out.join(",")
    }

    /// Swaps the current filter into the subscriber (nothing to do without one).
    pub fn apply(&self) -> Result<(), String> {
        match &self.apply {
            Some(apply) => apply(&self.directives()),
            None => Ok(()),
        }
    }
}

/// `fnmatch` without brackets: `*` any run, `?` one character, case-insensitive.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (
        pattern.to_ascii_lowercase().chars().collect(),
        name.to_ascii_lowercase().chars().collect(),
    );
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A reload layer holding `initial` and the function that swaps a new filter into it.
pub fn reload_filter(
    initial: &str,
) -> Result<(reload::Layer<EnvFilter, Registry>, ApplyFilter), String> {
    let filter = EnvFilter::try_new(initial).map_err(|e| format!("log filter {initial:?}: {e}"))?;
    let (layer, handle) = reload::Layer::new(filter);
    let apply: ApplyFilter = Box::new(move |directives: &str| {
        let filter = EnvFilter::try_new(directives)
            .map_err(|e| format!("log filter {directives:?}: {e}"))?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    Ok((layer, apply))
}

fn applied(c: &Control) -> Result<Value, RpcError> {
    c.log.apply().map_err(RpcError::internal)?;
    Ok(Value::Bool(true))
}

fn no_params(method: &str, params: Option<Value>) -> Result<(), RpcError> {
    match params {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) if m.is_empty() => Ok(()),
        Some(_) => Err(RpcError::invalid_params(format!(
            "{method} requires no parameters"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelParams {
    pub level: String,
}

fn parse_level(params: Option<Value>) -> Result<Level, RpcError> {
    let p: LevelParams = parse(params)?;
    Level::parse(&p.level).ok_or_else(|| {
        RpcError::invalid_params(format!(
            "Invalid parameters: level: {:?} is not ERROR, WARNING, NOTICE, INFO or DEBUG",
            p.level
        ))
    })
}

pub fn log_set_level(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let level = parse_level(params)?;
    c.log.level = level;
    c.log.initial = None;
    applied(c)
}

pub fn log_get_level(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params("log_get_level", params)?;
    Ok(c.log.level.name().into())
}

pub fn log_set_print_level(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let level = parse_level(params)?;
    c.log.print_level = level;
    c.log.initial = None;
    applied(c)
}

pub fn log_get_print_level(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params("log_get_print_level", params)?;
    Ok(c.log.print_level.name().into())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlagParams {
    pub flag: String,
}

fn change_flag(c: &mut Control, params: Option<Value>, on: bool) -> Result<Value, RpcError> {
    let p: FlagParams = parse(params)?;
    // SPDK's answer to an unknown flag.
    c.log
        .set_flag(&p.flag, on)
        .map_err(|_| RpcError::invalid_params("invalid log flag"))?;
    applied(c)
}

pub fn log_set_flag(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    change_flag(c, params, true)
}

pub fn log_clear_flag(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    change_flag(c, params, false)
}

pub fn log_get_flags(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params("log_get_flags", params)?;
    let flags: Map<String, Value> = c
        .log
        .flags()
        .map(|(name, on)| (name.to_string(), Value::Bool(on)))
        .collect();
    Ok(Value::Object(flags))
}
