//! `nvmf-rpc`: the command-line client, a drop-in for SPDK's `scripts/rpc.py` on the methods
//! this target implements: the same global options (`-s`, `-p`, `-t`, `-v`), subcommands named
//! after the methods with rpc.py's flags, rpc.py's output (results as indented JSON, strings
//! bare, nothing for `true`) and error report (`request:` / `Got JSON-RPC error response` /
//! `response:`, exit status 1). `save_config` and `load_config` work as rpc.py's do.

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nvmf_rpc::client::{Client, ClientError, Endpoint};
use nvmf_rpc::DEFAULT_SOCKET_PATH;
use serde_json::{json, Map, Value};

/// Builds a params object from (name, value) pairs, leaving out `None`s as rpc.py's client
/// leaves out unset arguments.
macro_rules! params {
    ($($key:literal => $value:expr),* $(,)?) => {{
        let mut m = Map::new();
        $( insert(&mut m, $key, $value); )*
        m
    }};
}

fn insert<T: Into<Opt>>(m: &mut Map<String, Value>, key: &str, value: T) {
    if let Opt(Some(v)) = value.into() {
        m.insert(key.to_string(), v);
    }
}

/// A value that may be absent; flags (`bool`) are sent only when set.
struct Opt(Option<Value>);

impl From<bool> for Opt {
    fn from(b: bool) -> Self {
        Opt(b.then_some(Value::Bool(true)))
    }
}
impl<T: serde::Serialize> From<Option<T>> for Opt {
    fn from(v: Option<T>) -> Self {
        Opt(v.map(|v| serde_json::to_value(v).expect("serializable")))
    }
}
impl From<String> for Opt {
    fn from(s: String) -> Self {
        Opt(Some(Value::String(s)))
    }
}
impl From<u32> for Opt {
    fn from(v: u32) -> Self {
        Opt(Some(json!(v)))
    }
}
impl From<u64> for Opt {
    fn from(v: u64) -> Self {
        Opt(Some(json!(v)))
    }
}

mod admin;
mod cli;
mod config;

use cli::{Cli, Cmd, Listener};
use config::{load_config, save_config, Session};

/// `discovery` is rpc.py's shortcut for the discovery NQN.
fn subsystem_nqn(nqn: String) -> String {
    if nqn == "discovery" {
        "nqn.2014-08.org.nvmexpress.discovery".to_string()
    } else {
        nqn
    }
}

fn mib_to_blocks(total_size: f64, block_size: u32) -> Result<u64, String> {
    if total_size.is_nan() || total_size <= 0.0 || block_size == 0 {
        return Err("total_size must be > 0 MiB and block_size > 0".into());
    }
    Ok((total_size * 1024.0 * 1024.0) as u64 / u64::from(block_size))
}

fn listen_address(l: &Listener) -> Value {
    let mut a = params! {"trtype" => l.trtype.clone(), "traddr" => l.traddr.clone()};
    insert(&mut a, "adrfam", l.adrfam.clone());
    insert(&mut a, "trsvcid", l.trsvcid.clone());
    Value::Object(a)
}

/// The method and params a subcommand stands for.
/// A method name and its params object.
type Request = (&'static str, Option<Map<String, Value>>);

fn request(cmd: Cmd) -> Result<Request, String> {
    use Cmd::*;
    let some = |m: Map<String, Value>| Some(m);
    Ok(match cmd {
        RpcGetMethods {
            current,
            include_aliases,
        } => (
            "rpc_get_methods",
            some(params! {"current" => current, "include_aliases" => include_aliases}),
        ),
        SpdkGetVersion => ("spdk_get_version", None),
        FrameworkStartInit => ("framework_start_init", None),
        FrameworkWaitInit => ("framework_wait_init", None),
        FrameworkGetSubsystems => ("framework_get_subsystems", None),
        FrameworkGetConfig { name } => ("framework_get_config", some(params! {"name" => name})),
        SaveConfig { .. } | LoadConfig { .. } | SaveSubsystemConfig { .. } => {
            unreachable!("handled by run")
        }
        BdevGetBdevs { name, timeout } => (
            "bdev_get_bdevs",
            some(params! {"name" => name, "timeout" => timeout}),
        ),
        BdevMallocCreate(a) => {
            let num_blocks = mib_to_blocks(a.total_size, a.block_size)?;
            (
                "bdev_malloc_create",
                some(params! {
                    "num_blocks" => num_blocks, "block_size" => a.block_size, "name" => a.name, "uuid" => a.uuid,
                    "physical_block_size" => a.physical_block_size, "optimal_io_boundary" => a.optimal_io_boundary,
                    "md_size" => a.md_size, "md_interleave" => a.md_interleave, "dif_type" => a.dif_type,
                    "dif_is_head_of_md" => a.dif_is_head_of_md, "dif_pi_format" => a.dif_pi_format, "numa_id" => a.numa_id,
                }),
            )
        }
        BdevMallocDelete { name } => ("bdev_malloc_delete", some(params! {"name" => name})),
        BdevNullCreate(a) => {
            let num_blocks = mib_to_blocks(a.total_size, a.block_size)?;
            (
                "bdev_null_create",
                some(params! {
                    "name" => a.name, "num_blocks" => num_blocks, "block_size" => a.block_size, "uuid" => a.uuid,
                    "physical_block_size" => a.physical_block_size, "md_size" => a.md_size, "dif_type" => a.dif_type,
                    "dif_is_head_of_md" => a.dif_is_head_of_md, "dif_pi_format" => a.dif_pi_format,
                }),
            )
        }
        BdevNullDelete { name } => ("bdev_null_delete", some(params! {"name" => name})),
        BdevAioCreate {
            filename,
            name,
            block_size,
            readonly,
            fallocate,
            uuid,
        } => (
            "bdev_aio_create",
            some(
                params! {"filename" => filename, "name" => name, "block_size" => block_size,
                "readonly" => readonly, "fallocate" => fallocate, "uuid" => uuid},
            ),
        ),
        BdevAioDelete { name } => ("bdev_aio_delete", some(params! {"name" => name})),
        BdevUringCreate {
            filename,
            name,
            block_size,
            uuid,
        } => (
            "bdev_uring_create",
            some(
                params! {"filename" => filename, "name" => name, "block_size" => block_size, "uuid" => uuid},
            ),
        ),
        BdevUringDelete { name } => ("bdev_uring_delete", some(params! {"name" => name})),
        BdevNullResize { name, new_size } => (
            "bdev_null_resize",
            some(params! {"name" => name, "new_size" => new_size}),
        ),
        BdevAioRescan { name } => ("bdev_aio_rescan", some(params! {"name" => name})),
        BdevUringRescan { name } => ("bdev_uring_rescan", some(params! {"name" => name})),
        BdevSplitCreate {
            base_bdev,
            split_count,
            split_size_mb,
        } => (
            "bdev_split_create",
            some(
                params! {"base_bdev" => base_bdev, "split_count" => split_count, "split_size_mb" => split_size_mb},
            ),
        ),
        BdevSplitDelete { base_bdev } => (
            "bdev_split_delete",
            some(params! {"base_bdev" => base_bdev}),
        ),
        BdevDelayCreate {
            base_bdev_name,
            name,
            avg_read_latency,
            p99_read_latency,
            avg_write_latency,
            p99_write_latency,
            uuid,
        } => (
            "bdev_delay_create",
            some(params! {
                "base_bdev_name" => base_bdev_name, "name" => name, "avg_read_latency" => avg_read_latency,
                "p99_read_latency" => p99_read_latency, "avg_write_latency" => avg_write_latency,
                "p99_write_latency" => p99_write_latency, "uuid" => uuid,
            }),
        ),
        BdevDelayDelete { name } => ("bdev_delay_delete", some(params! {"name" => name})),
        BdevDelayUpdateLatency {
            delay_bdev_name,
            latency_type,
            latency_us,
        } => (
            "bdev_delay_update_latency",
            some(
                params! {"delay_bdev_name" => delay_bdev_name, "latency_type" => latency_type, "latency_us" => latency_us},
            ),
        ),
        BdevErrorCreate { base_name, uuid } => (
            "bdev_error_create",
            some(params! {"base_name" => base_name, "uuid" => uuid}),
        ),
        BdevErrorDelete { name } => ("bdev_error_delete", some(params! {"name" => name})),
        BdevErrorInjectError {
            name,
            io_type,
            error_type,
            num,
            queue_depth,
            corrupt_offset,
            corrupt_value,
            nvme_sct,
            nvme_sc,
        } => (
            "bdev_error_inject_error",
            some(params! {
                "name" => name, "io_type" => io_type, "error_type" => error_type, "num" => num,
                "queue_depth" => queue_depth, "corrupt_offset" => corrupt_offset, "corrupt_value" => corrupt_value,
                "nvme_sct" => nvme_sct, "nvme_sc" => nvme_sc,
            }),
        ),
        BdevErrorResumePending { name } => {
            ("bdev_error_resume_pending", some(params! {"name" => name}))
        }
        NvmfSetMaxSubsystems { max_subsystems } => (
            "nvmf_set_max_subsystems",
            some(params! {"max_subsystems" => max_subsystems}),
        ),
        NvmfSetConfig {
            poll_groups_mask,
            discovery_filter,
            max_qpairs_per_host,
            max_qpairs,
            connect_timeout_ms,
            transfer_timeout_ms,
        } => (
            "nvmf_set_config",
            some(params! {
                "poll_groups_mask" => poll_groups_mask, "discovery_filter" => discovery_filter,
                "max_qpairs_per_host" => max_qpairs_per_host, "max_qpairs" => max_qpairs,
                "connect_timeout_ms" => connect_timeout_ms, "transfer_timeout_ms" => transfer_timeout_ms,
            }),
        ),
        NvmfCreateTransport(a) => {
            let mut p = params! {
                "trtype" => a.trtype, "tgt_name" => a.tgt_name, "max_queue_depth" => a.max_queue_depth,
                "max_io_qpairs_per_ctrlr" => a.max_io_qpairs_per_ctrlr, "in_capsule_data_size" => a.in_capsule_data_size,
                "max_io_size" => a.max_io_size, "io_unit_size" => a.io_unit_size, "max_aq_depth" => a.max_aq_depth,
                "num_shared_buffers" => a.num_shared_buffers, "buf_cache_size" => a.buf_cache_size, "zcopy" => a.zcopy,
                "num_cqe" => a.num_cqe, "max_srq_depth" => a.max_srq_depth,
                "dif_insert_or_strip" => a.dif_insert_or_strip, "sock_priority" => a.sock_priority,
                "acceptor_backlog" => a.acceptor_backlog, "abort_timeout_sec" => a.abort_timeout_sec,
                "no_wr_batching" => a.no_wr_batching, "control_msg_num" => a.control_msg_num,
                "acceptor_poll_rate" => a.acceptor_poll_rate, "ack_timeout" => a.ack_timeout,
                "data_wr_pool_size" => a.data_wr_pool_size, "disable_command_passthru" => a.disable_command_passthru,
                "kas" => a.kas, "min_kato" => a.min_kato,
            };
            // rpc.py always sends these two.
            p.insert("no_srq".into(), Value::Bool(a.no_srq));
            p.insert("c2h_success".into(), Value::Bool(!a.disable_c2h_success));
            ("nvmf_create_transport", some(p))
        }
        NvmfGetTransports { trtype, tgt_name } => (
            "nvmf_get_transports",
            some(params! {"trtype" => trtype, "tgt_name" => tgt_name}),
        ),
        NvmfGetSubsystems { nqn, tgt_name } => (
            "nvmf_get_subsystems",
            some(params! {"nqn" => nqn, "tgt_name" => tgt_name}),
        ),
        NvmfCreateSubsystem(a) => {
            let mut p = params! {
                "nqn" => a.nqn, "tgt_name" => a.tgt_name, "serial_number" => a.serial_number,
                "model_number" => a.model_number, "max_namespaces" => a.max_namespaces,
                "min_cntlid" => a.min_cntlid, "max_cntlid" => a.max_cntlid,
                "max_discard_size_kib" => a.max_discard_size, "max_write_zeroes_size_kib" => a.max_write_zeroes_size,
                "passthrough" => a.passthrough, "enable_nssr" => a.enable_nssr,
            };
            p.insert("allow_any_host".into(), Value::Bool(a.allow_any_host));
            p.insert("ana_reporting".into(), Value::Bool(a.ana_reporting));
            ("nvmf_create_subsystem", some(p))
        }
        NvmfDeleteSubsystem {
            subsystem_nqn,
            tgt_name,
        } => (
            "nvmf_delete_subsystem",
            some(params! {"nqn" => subsystem_nqn, "tgt_name" => tgt_name}),
        ),
        NvmfSubsystemAddListener(a) => {
            let mut p = params! {"nqn" => subsystem_nqn(a.listener.nqn.clone()), "tgt_name" => a.listener.tgt_name.clone(),
            "secure_channel" => a.secure_channel, "ana_state" => a.ana_state, "sock_impl" => a.sock_impl};
            p.insert("listen_address".into(), listen_address(&a.listener));
            ("nvmf_subsystem_add_listener", some(p))
        }
        NvmfSubsystemRemoveListener(l) => {
            let mut p =
                params! {"nqn" => subsystem_nqn(l.nqn.clone()), "tgt_name" => l.tgt_name.clone()};
            p.insert("listen_address".into(), listen_address(&l));
            ("nvmf_subsystem_remove_listener", some(p))
        }
        NvmfSubsystemListenerSetAnaState(a) => {
            let mut p = params! {"nqn" => a.listener.nqn.clone(), "tgt_name" => a.listener.tgt_name.clone(),
            "ana_state" => Some(a.ana_state), "anagrpid" => a.anagrpid};
            p.insert("listen_address".into(), listen_address(&a.listener));
            ("nvmf_subsystem_listener_set_ana_state", some(p))
        }
        NvmfSubsystemSetNsAnaGroup {
            nqn,
            nsid,
            anagrpid,
            tgt_name,
        } => (
            "nvmf_subsystem_set_ns_ana_group",
            some(
                params! {"nqn" => nqn, "nsid" => nsid, "anagrpid" => anagrpid, "tgt_name" => tgt_name},
            ),
        ),
        NvmfSubsystemGetListeners(a) => (
            "nvmf_subsystem_get_listeners",
            some(params! {"nqn" => a.nqn, "tgt_name" => a.tgt_name}),
        ),
        NvmfSubsystemAddNs(a) => {
            let ns = params! {
                "bdev_name" => a.bdev_name, "ptpl_file" => a.ptpl_file, "nsid" => a.nsid, "nguid" => a.nguid,
                "eui64" => a.eui64, "uuid" => a.uuid, "anagrpid" => a.anagrpid,
                "no_auto_visible" => a.no_auto_visible, "hide_metadata" => a.hide_metadata,
            };
            let mut p = params! {"nqn" => a.nqn, "tgt_name" => a.tgt_name};
            p.insert("namespace".into(), Value::Object(ns));
            ("nvmf_subsystem_add_ns", some(p))
        }
        NvmfSubsystemRemoveNs {
            nqn,
            nsid,
            tgt_name,
        } => (
            "nvmf_subsystem_remove_ns",
            some(params! {"nqn" => nqn, "nsid" => nsid, "tgt_name" => tgt_name}),
        ),
        NvmfSubsystemAddHost {
            nqn,
            host,
            tgt_name,
            psk,
            dhchap_key,
            dhchap_ctrlr_key,
        } => (
            "nvmf_subsystem_add_host",
            some(
                params! {"nqn" => nqn, "host" => host, "tgt_name" => tgt_name, "psk" => psk,
                "dhchap_key" => dhchap_key, "dhchap_ctrlr_key" => dhchap_ctrlr_key},
            ),
        ),
        NvmfSubsystemRemoveHost {
            nqn,
            host,
            tgt_name,
        } => (
            "nvmf_subsystem_remove_host",
            some(params! {"nqn" => nqn, "host" => host, "tgt_name" => tgt_name}),
        ),
        NvmfSubsystemAllowAnyHost {
            nqn,
            enable,
            disable,
            tgt_name,
        } => {
            if enable && disable {
                return Err("-e and -d are mutually exclusive".into());
            }
            let mut p = params! {"nqn" => nqn, "tgt_name" => tgt_name};
            p.insert("allow_any_host".into(), Value::Bool(!disable));
            ("nvmf_subsystem_allow_any_host", some(p))
        }
        NvmfSubsystemGetControllers(a) => (
            "nvmf_subsystem_get_controllers",
            some(params! {"nqn" => a.nqn, "tgt_name" => a.tgt_name}),
        ),
        NvmfSubsystemGetQpairs(a) => (
            "nvmf_subsystem_get_qpairs",
            some(params! {"nqn" => a.nqn, "tgt_name" => a.tgt_name}),
        ),
        NvmfGetStats { tgt_name } => ("nvmf_get_stats", some(params! {"tgt_name" => tgt_name})),
        Admin(cmd) => admin::request(cmd),
    })
}

/// rpc.py's output: nothing for `true`, strings bare, everything else indented JSON.
fn print_result(v: &Value) {
    match v {
        Value::Bool(true) => {}
        Value::String(s) => println!("{s}"),
        other => println!("{}", pretty(other, 2)),
    }
}

fn pretty(v: &Value, indent: i32) -> String {
    if indent < 0 {
        return v.to_string();
    }
    let spaces = " ".repeat(indent as usize);
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(v, &mut ser).expect("JSON serializes");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// What rpc.py prints when the server answers with an error.
fn report(err: &ClientError) {
    match err {
        ClientError::Rpc { request, error } => {
            let mut shown = request
                .get("params")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            shown.insert("method".into(), request["method"].clone());
            shown.insert("req_id".into(), request["id"].clone());
            eprintln!("request:");
            eprintln!("{}", pretty(&Value::Object(shown), 2));
            eprintln!("Got JSON-RPC error response");
            eprintln!("response:");
            eprintln!(
                "{}",
                pretty(&json!({"code": error.code, "message": error.message}), 2)
            );
        }
        ClientError::Connect { .. } => eprintln!("{err}"),
        other => eprintln!("{other}"),
    }
    if let Some(hint) = hint(err) {
        eprintln!("hint: {hint}");
    }
}

/// What to change, for the failures people meet first: the wrong socket, its permissions, a
/// method this target does not serve, a mistyped parameter, a call before or after init.
fn hint(err: &ClientError) -> Option<String> {
    match err {
        ClientError::Connect { endpoint, source } => Some(match source.kind() {
            std::io::ErrorKind::NotFound => format!(
                "no socket at {endpoint}: start nvmf-tgt (it listens on {DEFAULT_SOCKET_PATH} \
                 unless started with -r PATH), or point nvmf-rpc at its socket with -s PATH"
            ),
            std::io::ErrorKind::PermissionDenied => format!(
                "{endpoint} is mode 0600, owned by the user that started nvmf-tgt: run nvmf-rpc \
                 as that user, or start nvmf-tgt with --rpc-socket-group GROUP and join GROUP"
            ),
            std::io::ErrorKind::ConnectionRefused => format!(
                "nothing serves {endpoint} (a stale socket or a stopped target): start nvmf-tgt, \
                 or check -s/-p"
            ),
            _ => "check that nvmf-tgt is running and that -s/-p name its RPC endpoint".into(),
        }),
        ClientError::Timeout => Some(
            "the target did not answer in time: raise -t SECONDS, or check nvmf-tgt's log".into(),
        ),
        ClientError::Rpc { request, error } => {
            let method = request["method"].as_str().unwrap_or("");
            match error.code {
                nvmf_rpc::RpcError::METHOD_NOT_FOUND => Some(
                    "this target does not serve that method: `nvmf-rpc rpc_get_methods` lists \
                     the ones it does"
                        .into(),
                ),
                nvmf_rpc::RpcError::INVALID_PARAMS => Some(format!(
                    "fix the parameter the message names (`nvmf-rpc {method} --help` lists them)"
                )),
                -1 if error.message.contains("framework_start_init") => Some(
                    "the target's init state does not allow this now: see the message; \
                     `nvmf-rpc rpc_get_methods --current` lists what is callable"
                        .into(),
                ),
                _ => None,
            }
        }
        _ => None,
    }
}

fn run(cli: Cli) -> Result<ExitCode, ClientError> {
    let endpoint = Endpoint::parse(&cli.server, cli.port);
    let timeout = (cli.timeout > 0.0).then(|| Duration::from_secs_f64(cli.timeout));
    let client = Client::connect(&endpoint, timeout)?;
    let mut s = Session {
        client,
        verbose: cli.verbose,
    };
    match cli.cmd {
        Cmd::SaveConfig { indent, output } => {
            let config = save_config(&mut s)?;
            let text = pretty(&config, indent) + "\n";
            match output {
                Some(path) => std::fs::write(&path, text)?,
                None => print!("{text}"),
            }
        }
        Cmd::SaveSubsystemConfig { name, indent } => {
            let config = s.call("framework_get_config", Some(json!({"name": name})))?;
            println!(
                "{}",
                pretty(&json!({"subsystem": name, "config": config}), indent)
            );
        }
        Cmd::LoadConfig {
            json_conf,
            include_aliases,
        } => {
            let text = match json_conf {
                Some(path) => std::fs::read_to_string(&path)?,
                None => {
                    let mut t = String::new();
                    std::io::stdin().read_to_string(&mut t)?;
                    t
                }
            };
            let config: Value = serde_json::from_str(&text)
                .map_err(|e| ClientError::Protocol(format!("config is not JSON: {e}")))?;
            if !load_config(&mut s, config, include_aliases)? {
                return Ok(ExitCode::FAILURE);
            }
        }
        cmd => {
            let (method, params) = request(cmd).map_err(ClientError::Protocol)?;
            let result = s.call(method, params.map(Value::Object))?;
            print_result(&result);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_rpc::RpcError;

    fn connect_error(kind: std::io::ErrorKind) -> ClientError {
        ClientError::Connect {
            endpoint: "/tmp/x.sock".into(),
            source: std::io::Error::from(kind),
        }
    }

    #[test]
    fn connect_failures_say_what_to_change() {
        let missing = hint(&connect_error(std::io::ErrorKind::NotFound)).unwrap();
        assert!(
            missing.contains("-s PATH") && missing.contains("start nvmf-tgt"),
            "{missing}"
        );
        let denied = hint(&connect_error(std::io::ErrorKind::PermissionDenied)).unwrap();
        assert!(denied.contains("--rpc-socket-group"), "{denied}");
        let refused = hint(&connect_error(std::io::ErrorKind::ConnectionRefused)).unwrap();
        assert!(refused.contains("stale socket"), "{refused}");
    }

    #[test]
    fn rpc_errors_point_to_the_fix() {
        let rpc = |code, message: &str| ClientError::Rpc {
            request: json!({"method": "nvmf_create_subsystem", "id": 1}),
            error: RpcError::new(code, message),
        };
        let unknown = hint(&rpc(RpcError::METHOD_NOT_FOUND, "Method not found")).unwrap();
        assert!(unknown.contains("rpc_get_methods"), "{unknown}");
        let params = hint(&rpc(RpcError::INVALID_PARAMS, "Invalid parameters: nqn")).unwrap();
        assert!(
            params.contains("nvmf-rpc nvmf_create_subsystem --help"),
            "{params}"
        );
        // A domain error's message already says what is wrong: no generic hint under it.
        assert!(hint(&rpc(-17, "Subsystem already exists")).is_none());
    }
}
