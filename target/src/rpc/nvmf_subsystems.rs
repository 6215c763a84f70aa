//! Subsystems: creating, deleting and listing them (`nvmf_get_subsystems` shows listeners,
//! hosts and namespaces too), and the controllers and queue pairs connected to one.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{hex_upper, refuse_if, subsystems_in_order, true_};
use super::nvmf_listeners::address_json;
use super::{check_tgt_name, parse, Control};
use crate::bdev::util;
use crate::core::subsystem::SubsystemKind;
use crate::target::{SubsystemOptions, SubsystemState};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubsystemParams {
    pub nqn: String,
    #[serde(default)]
    pub serial_number: Option<String>,
    #[serde(default)]
    pub model_number: Option<String>,
    /// Extended discovery log page entry label.
    #[serde(default)]
    pub admin_label: Option<String>,
    #[serde(default)]
    pub tgt_name: Option<String>,
    #[serde(default)]
    pub max_namespaces: u32,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub ana_reporting: bool,
    #[serde(default)]
    pub min_cntlid: Option<u16>,
    #[serde(default)]
    pub max_cntlid: Option<u16>,
    /// SPDK before 26.09 (25.x `rpc.py` always sends 0, 26.01 saves it): `dmrsl` in KiB. Like
    /// `dmrsl`, only 0 (no limit) is accepted.
    #[serde(default)]
    pub max_discard_size_kib: u64,
    /// SPDK before 26.09, as `max_discard_size_kib`: `wzsl` in KiB. Like `wzsl`, only 0.
    #[serde(default)]
    pub max_write_zeroes_size_kib: u64,
    /// No limit is reported (Identify CNS 06h is not served) nor enforced, so only 0.
    #[serde(default)]
    pub dmrsl: u32,
    #[serde(default)]
    pub wzsl: u8,
    #[serde(default)]
    pub passthrough: bool,
    #[serde(default)]
    pub enable_nssr: bool,
}

pub fn nvmf_create_subsystem(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: CreateSubsystemParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    refuse_if(
        p.passthrough,
        "passthrough",
        "NVMe passthrough is not supported",
    )?;
    refuse_if(
        p.enable_nssr,
        "enable_nssr",
        "NVM subsystem reset is not supported",
    )?;
    refuse_if(
        p.admin_label.is_some(),
        "admin_label",
        "the extended discovery log page (which carries admin labels) is not supported",
    )?;
    for (field, value, limit) in [
        (
            "max_discard_size_kib",
            p.max_discard_size_kib,
            "dataset management range size",
        ),
        ("dmrsl", u64::from(p.dmrsl), "dataset management range size"),
        (
            "max_write_zeroes_size_kib",
            p.max_write_zeroes_size_kib,
            "write zeroes size",
        ),
        ("wzsl", u64::from(p.wzsl), "write zeroes size"),
    ] {
        refuse_if(
            value != 0,
            field,
            &format!("{value}: a {limit} limit is not supported (0, no limit, is)"),
        )?;
    }
    let existing = c.target.subsystems().count() as u32;
    if existing >= c.max_subsystems && c.target.subsystem(&p.nqn).is_err() {
        return Err(RpcError::errno(
            libc::ENOSPC,
            format!(
                "Unable to create subsystem {}: max_subsystems ({}) reached",
                p.nqn, c.max_subsystems
            ),
        ));
    }
    let defaults = SubsystemOptions::default();
    let opts = SubsystemOptions {
        serial_number: p.serial_number.unwrap_or(defaults.serial_number),
        model_number: p.model_number.unwrap_or(defaults.model_number),
        allow_any_host: p.allow_any_host,
        max_namespaces: p.max_namespaces,
        min_cntlid: p.min_cntlid.unwrap_or(defaults.min_cntlid),
        max_cntlid: p.max_cntlid.unwrap_or(defaults.max_cntlid),
        ana_reporting: p.ana_reporting,
    };
    c.target.create_subsystem(&p.nqn, opts)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NqnParams {
    pub nqn: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_delete_subsystem(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: NqnParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.delete_subsystem(&p.nqn)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetSubsystemsParams {
    #[serde(default)]
    pub nqn: Option<String>,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

fn dump_subsystem(s: &SubsystemState) -> Value {
    let nvme = s.kind == SubsystemKind::Nvm;
    let mut v = json!({
        "nqn": s.nqn,
        "subtype": if nvme { "NVMe" } else { "Discovery" },
        "listen_addresses": s.listeners.iter().map(address_json).collect::<Vec<_>>(),
        "allow_any_host": s.allow_any_host,
        "hosts": s.hosts.iter().map(|h| json!({"nqn": h})).collect::<Vec<_>>(),
    });
    if nvme {
        v["serial_number"] = json!(s.serial_number);
        v["model_number"] = json!(s.model_number);
        // SPDK always lists it (0: no limit of our own beyond the NSID space).
        v["max_namespaces"] = json!(s.max_namespaces);
        v["min_cntlid"] = json!(s.min_cntlid);
        v["max_cntlid"] = json!(s.max_cntlid);
        v["namespaces"] = Value::Array(
            s.namespaces
                .values()
                .map(|ns| {
                    let mut n = json!({
                        "nsid": ns.nsid,
                        "bdev_name": ns.bdev.name(),
                        "name": ns.bdev.name(),
                        "no_auto_visible": !ns.auto_visible,
                    });
                    if ns.nguid != [0; 16] {
                        n["nguid"] = json!(hex_upper(&ns.nguid));
                    }
                    if ns.eui64 != [0; 8] {
                        n["eui64"] = json!(hex_upper(&ns.eui64));
                    }
                    if ns.uuid != [0; 16] {
                        n["uuid"] = json!(util::format_uuid(&ns.uuid));
                    }
                    if s.ana_reporting {
                        n["anagrpid"] = json!(s.anagrpid(ns.nsid));
                    }
                    n
                })
                .collect(),
        );
    }
    v
}

pub fn nvmf_get_subsystems(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: GetSubsystemsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    match p.nqn {
        Some(nqn) => {
            let s = c.target.subsystem(&nqn).map_err(|_| {
                RpcError::errno(libc::ENODEV, format!("No such device: subsystem {nqn}"))
            })?;
            Ok(json!([dump_subsystem(s)]))
        }
        None => Ok(Value::Array(
            subsystems_in_order(c)
                .into_iter()
                .map(dump_subsystem)
                .collect(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Controllers, qpairs (statistics are in stats.rs)

fn group_name(index: usize) -> String {
    format!("nvmf_tgt_poll_group_{index:03}")
}

pub fn nvmf_subsystem_get_controllers(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: NqnParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let s = c.target.subsystem(&p.nqn)?;
    Ok(Value::Array(
        s.shared
            .controllers()
            .iter()
            .map(|ctrl| {
                json!({
                    "cntlid": ctrl.cntlid,
                    "cntrltype": if ctrl.kind == SubsystemKind::Nvm { "io" } else { "discovery" },
                    "hostnqn": ctrl.hostnqn,
                    "hostid": util::format_uuid(&ctrl.hostid),
                    // SPDK counts every connected queue here, the admin queue included.
                    "num_io_qpairs": ctrl.connected_qids().len(),
                })
            })
            .collect(),
    ))
}

/// Per controller, its connected queues. The reactor serving an I/O queue is not tracked by
/// the control plane, so only the admin queue names its thread. Every queue names the
/// listener its controller's admin queue came through, as SPDK lists `listen_address` for
/// each qpair (hosts connect a controller's queues through one address).
pub fn nvmf_subsystem_get_qpairs(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: NqnParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let s = c.target.subsystem(&p.nqn)?;
    let mut out = Vec::new();
    for ctrl in s.shared.controllers() {
        let state = if ctrl.is_failed() { "error" } else { "enabled" };
        for qid in ctrl.connected_qids() {
            let mut q = json!({
                "cntlid": ctrl.cntlid,
                "qid": qid,
                "state": state,
                "hostnqn": ctrl.hostnqn,
            });
            if qid == 0 {
                q["thread"] = json!(group_name(ctrl.admin_group));
            }
            if let Some(l) = &ctrl.listener {
                q["listen_address"] = address_json(l);
            }
            out.push(q);
        }
    }
    Ok(Value::Array(out))
}
