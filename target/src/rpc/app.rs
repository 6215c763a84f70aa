//! `spdk_kill_instance`: SPDK sends itself the named signal. nvmf-tgt shuts down cleanly for
//! every signal SPDK accepts except SIGKILL (the same path as SIGTERM: hosts disconnected, I/O
//! drained, the socket removed, exit 0); SIGKILL kills the process at once, as in SPDK.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

use super::{parse, Control};

/// What `spdk_kill_instance` asks for, handed to [`Control::on_kill`].
pub type KillHook = Box<dyn Fn(KillSignal) + Send>;

/// The signals SPDK's `spdk_kill_instance` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillSignal {
    Int,
    Term,
    Quit,
    Hup,
    Kill,
    Usr1,
}

impl KillSignal {
    const ALL: [(KillSignal, &'static str, i32); 6] = [
        (KillSignal::Int, "SIGINT", libc::SIGINT),
        (KillSignal::Term, "SIGTERM", libc::SIGTERM),
        (KillSignal::Quit, "SIGQUIT", libc::SIGQUIT),
        (KillSignal::Hup, "SIGHUP", libc::SIGHUP),
        (KillSignal::Kill, "SIGKILL", libc::SIGKILL),
        (KillSignal::Usr1, "SIGUSR1", libc::SIGUSR1),
    ];

    /// By name (`SIGTERM`; `TERM` and any case too) or number (`15`, `"15"`).
    pub fn parse(v: &Value) -> Option<Self> {
        let number = match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        if let Some(n) = number {
            return Self::ALL
                .iter()
                .find(|(_, _, no)| i64::from(*no) == n)
                .map(|e| e.0);
        }
        let name = v.as_str()?.trim().to_ascii_uppercase();
        let name = if name.starts_with("SIG") {
            name
        } else {
            format!("SIG{name}")
        };
        Self::ALL.iter().find(|(_, n, _)| *n == name).map(|e| e.0)
    }

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|e| e.0 == self).map_or("?", |e| e.1)
    }

    pub fn number(self) -> i32 {
        Self::ALL.iter().find(|e| e.0 == self).map_or(0, |e| e.2)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillParams {
    pub sig_name: Value,
}

pub fn spdk_kill_instance(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: KillParams = parse(params)?;
    let signal = KillSignal::parse(&p.sig_name).ok_or_else(|| {
        RpcError::invalid_params(format!(
            "Invalid parameters: sig_name: {} is not SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGKILL or SIGUSR1",
            p.sig_name
        ))
    })?;
    let hook = c.on_kill.as_ref().ok_or_else(|| {
        RpcError::errno(libc::EOPNOTSUPP, "this target cannot be stopped over RPC")
    })?;
    tracing::debug!(signal = signal.name(), "spdk_kill_instance");
    hook(signal);
    Ok(Value::Bool(true))
}
