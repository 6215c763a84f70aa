//! Subcommands for the methods admins use beyond the core configuration ones: namespace
//! masking, discovery referrals, statistics, logging and stopping the target. Flags are rpc.py's
//! (SPDK 26.x `spdk/cli/{nvmf,bdev,app,log}.py`).

use clap::Subcommand;
use serde_json::{Map, Value};

use super::{insert, subsystem_nqn, Request};

/// SPDK's log levels, as rpc.py offers them.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum LogLevel {
    Error,
    Warning,
    Notice,
    Info,
    Debug,
}

impl LogLevel {
    fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "ERROR",
            LogLevel::Warning => "WARNING",
            LogLevel::Notice => "NOTICE",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
        }
    }
}

#[derive(clap::Args)]
pub struct NsHost {
    nqn: String,
    nsid: u32,
    host: String,
    #[arg(short = 't', long = "tgt-name")]
    tgt_name: Option<String>,
}

#[derive(clap::Args)]
pub struct Referral {
    #[arg(short = 't', long = "trtype")]
    trtype: String,
    #[arg(short = 'a', long = "traddr")]
    traddr: String,
    #[arg(short = 'p', long = "tgt-name")]
    tgt_name: Option<String>,
    #[arg(short = 'f', long = "adrfam")]
    adrfam: Option<String>,
    #[arg(short = 's', long = "trsvcid")]
    trsvcid: Option<String>,
    /// `discovery` stands for the discovery NQN, as in rpc.py.
    #[arg(short = 'n', long = "subnqn")]
    subnqn: Option<String>,
}

#[derive(Subcommand)]
pub enum AdminCmd {
    /// Make a namespace added with --no-auto-visible visible to a host.
    #[command(name = "nvmf_ns_add_host")]
    NvmfNsAddHost(NsHost),
    /// Hide a namespace from a host again.
    #[command(name = "nvmf_ns_remove_host")]
    NvmfNsRemoveHost(NsHost),
    #[command(name = "nvmf_discovery_add_referral")]
    NvmfDiscoveryAddReferral {
        #[command(flatten)]
        referral: Referral,
        #[arg(short = 'k', long = "secure-channel")]
        secure_channel: bool,
    },
    #[command(name = "nvmf_discovery_remove_referral")]
    NvmfDiscoveryRemoveReferral(Referral),
    #[command(name = "nvmf_discovery_get_referrals")]
    NvmfDiscoveryGetReferrals {
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "bdev_get_iostat")]
    BdevGetIostat {
        #[arg(short = 'b', long = "name")]
        name: Option<String>,
        #[arg(short = 'c', long = "per-channel")]
        per_channel: bool,
    },
    #[command(name = "thread_get_stats")]
    ThreadGetStats,
    #[command(name = "framework_get_reactors")]
    FrameworkGetReactors,
    #[command(name = "log_set_level")]
    LogSetLevel { level: LogLevel },
    #[command(name = "log_get_level")]
    LogGetLevel,
    #[command(name = "log_set_print_level")]
    LogSetPrintLevel { level: LogLevel },
    #[command(name = "log_get_print_level")]
    LogGetPrintLevel,
    /// FLAG names a log component (e.g. nvmf, rdma) or `all`.
    #[command(name = "log_set_flag")]
    LogSetFlag { flag: String },
    #[command(name = "log_clear_flag")]
    LogClearFlag { flag: String },
    #[command(name = "log_get_flags")]
    LogGetFlags,
    /// Stop the target the way the named signal would (SIGTERM, SIGINT, ...).
    #[command(name = "spdk_kill_instance")]
    SpdkKillInstance { sig_name: String },
}

fn object(pairs: Vec<(&str, Value)>) -> Option<Map<String, Value>> {
    let mut m = Map::new();
    for (k, v) in pairs {
        if !v.is_null() {
            m.insert(k.to_string(), v);
        }
    }
    Some(m)
}

fn opt(v: Option<String>) -> Value {
    v.map(Value::String).unwrap_or(Value::Null)
}

fn ns_host(a: NsHost) -> Option<Map<String, Value>> {
    object(vec![
        ("nqn", Value::String(a.nqn)),
        ("nsid", Value::from(a.nsid)),
        ("host", Value::String(a.host)),
        ("tgt_name", opt(a.tgt_name)),
    ])
}

/// rpc.py groups the address fields under `address` and sends the rest beside it.
fn referral(r: Referral, secure_channel: bool) -> Option<Map<String, Value>> {
    let mut address = Map::new();
    insert(&mut address, "trtype", r.trtype);
    insert(&mut address, "traddr", r.traddr);
    insert(&mut address, "adrfam", r.adrfam);
    insert(&mut address, "trsvcid", r.trsvcid);
    let mut m = Map::new();
    m.insert("address".into(), Value::Object(address));
    insert(&mut m, "tgt_name", r.tgt_name);
    insert(&mut m, "subnqn", r.subnqn.map(subsystem_nqn));
    insert(&mut m, "secure_channel", secure_channel);
    Some(m)
}

pub fn request(cmd: AdminCmd) -> Request {
    use AdminCmd::*;
    let level = |l: LogLevel| object(vec![("level", Value::from(l.name()))]);
    match cmd {
        NvmfNsAddHost(a) => ("nvmf_ns_add_host", ns_host(a)),
        NvmfNsRemoveHost(a) => ("nvmf_ns_remove_host", ns_host(a)),
        NvmfDiscoveryAddReferral {
            referral: r,
            secure_channel,
        } => ("nvmf_discovery_add_referral", referral(r, secure_channel)),
        NvmfDiscoveryRemoveReferral(r) => ("nvmf_discovery_remove_referral", referral(r, false)),
        NvmfDiscoveryGetReferrals { tgt_name } => (
            "nvmf_discovery_get_referrals",
            object(vec![("tgt_name", opt(tgt_name))]),
        ),
        BdevGetIostat { name, per_channel } => {
            let mut m = Map::new();
            insert(&mut m, "name", name);
            insert(&mut m, "per_channel", per_channel);
            ("bdev_get_iostat", Some(m))
        }
        ThreadGetStats => ("thread_get_stats", None),
        FrameworkGetReactors => ("framework_get_reactors", None),
        LogSetLevel { level: l } => ("log_set_level", level(l)),
        LogGetLevel => ("log_get_level", None),
        LogSetPrintLevel { level: l } => ("log_set_print_level", level(l)),
        LogGetPrintLevel => ("log_get_print_level", None),
        LogSetFlag { flag } => ("log_set_flag", object(vec![("flag", Value::String(flag))])),
        LogClearFlag { flag } => (
            "log_clear_flag",
            object(vec![("flag", Value::String(flag))]),
        ),
        LogGetFlags => ("log_get_flags", None),
        SpdkKillInstance { sig_name } => (
            "spdk_kill_instance",
            object(vec![("sig_name", Value::String(sig_name))]),
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: AdminCmd,
    }

    fn req(args: &[&str]) -> (String, Value) {
        let cli = Cli::try_parse_from(std::iter::once("nvmf-rpc").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let (method, params) = request(cli.cmd);
        (
            method.to_string(),
            params.map(Value::Object).unwrap_or(Value::Null),
        )
    }

    #[test]
    fn masking_and_referrals_send_rpc_pys_params() {
        assert_eq!(
            req(&["nvmf_ns_add_host", "nqn.x:a", "3", "nqn.h:1"]),
            (
                "nvmf_ns_add_host".into(),
                json!({"nqn": "nqn.x:a", "nsid": 3, "host": "nqn.h:1"})
            )
        );
        let (method, params) = req(&[
            "nvmf_discovery_add_referral",
            "-t",
            "rdma",
            "-a",
            "10.0.0.9",
            "-f",
            "ipv4",
            "-s",
            "4420",
            "-n",
            "discovery",
            "-k",
        ]);
        assert_eq!(method, "nvmf_discovery_add_referral");
        assert_eq!(
            params,
            json!({
                "address": {"trtype": "rdma", "traddr": "10.0.0.9", "adrfam": "ipv4", "trsvcid": "4420"},
                "subnqn": "nqn.2014-08.org.nvmexpress.discovery",
                "secure_channel": true
            })
        );
    }

    #[test]
    fn log_levels_are_spdks_names_and_others_are_refused() {
        assert_eq!(
            req(&["log_set_print_level", "NOTICE"]).1,
            json!({"level": "NOTICE"})
        );
        assert!(Cli::try_parse_from(["nvmf-rpc", "log_set_level", "LOUD"]).is_err());
        assert_eq!(
            req(&["spdk_kill_instance", "SIGTERM"]).1,
            json!({"sig_name": "SIGTERM"})
        );
        assert_eq!(req(&["thread_get_stats"]).1, Value::Null);
    }
}
