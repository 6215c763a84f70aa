//! NVMe-oF methods (`lib/nvmf/nvmf_rpc.c`) and the nvmf part of `framework_get_config`
//! (`spdk_nvmf_tgt_write_config_json`).
//!
//! Parameters SPDK has for features this target lacks (TLS secure channels, DH-HMAC-CHAP
//! keys, NVMe passthrough, NSSR, DMRSL/WZSL limits,
//! `admin_label` of the extended discovery log page, bdev metadata) are accepted only at their
//! "off" value; anything else is `-EINVAL` naming the parameter.
//!
//! Parameters that configure machinery absent here are accepted with any value and logged at
//! debug: a listener's `sock_impl` (SPDK's socket layer: no listener here uses it) and
//! `numa_id` (used only by SPDK's vfio-user transport). Every parameter of SPDK's schema
//! (`tests/data/spdk-schema.yaml`) for these methods decodes; `rpc::schema_tests` walks it.

use nvmf_common::spec::log_page::AnaState;
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_tgt_name, einval, parse, Control};
use crate::bdev::util;
use crate::core::subsystem::{ListenAddress, SubsystemKind};
use crate::target::{NamespaceOptions, SubsystemOptions, SubsystemState};
use crate::transport::options::{TransportKind, TransportOptions};
use crate::transport::TransportError;

fn true_() -> Value {
    Value::Bool(true)
}

/// Subsystems in creation order (SPDK lists them by subsystem id).
fn subsystems_in_order(c: &Control) -> Vec<&SubsystemState> {
    let mut subs: Vec<&SubsystemState> = c.target.subsystems().collect();
    subs.sort_by_key(|s| s.id);
    subs
}

fn refuse_if(set: bool, field: &str, why: &str) -> Result<(), RpcError> {
    if set {
        Err(einval(format!("{field}: {why}")))
    } else {
        Ok(())
    }
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

fn parse_hex<const N: usize>(field: &str, s: &str) -> Result<[u8; N], RpcError> {
    let bad = || {
        einval(format!(
            "{field}: {s:?} is not {} hexadecimal digits",
            N * 2
        ))
    };
    if s.len() != N * 2 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Transports

pub fn nvmf_create_transport(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let opts: TransportOptions = parse(params)?;
    check_tgt_name(opts.tgt_name.as_deref())?;
    opts.validate().map_err(einval)?;
    let kind = opts.kind().map_err(einval)?;
    if c.target.transport(kind.name()).is_some() {
        return Err(RpcError::errno(
            libc::EEXIST,
            format!("Transport type '{}' already exists", kind.name()),
        ));
    }
    let transport = (c.transport_factory)(&opts).map_err(|e| {
        // A failed RDMA call is the fabric's set-up, which the doctor checks.
        let hint = match e {
            TransportError::Rdma { .. } => "; run `nvmf-doctor` to diagnose",
            _ => "",
        };
        RpcError::internal(format!(
            "Transport type '{}' create failed: {e}{hint}",
            kind.name()
        ))
    })?;
    c.target.add_transport(transport)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetTransportsParams {
    #[serde(default)]
    pub trtype: Option<String>,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_get_transports(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: GetTransportsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    match p.trtype {
        Some(t) => {
            let transport = c.target.transport(&t).ok_or_else(|| {
                RpcError::errno(libc::ENODEV, format!("No such device: transport {t}"))
            })?;
            Ok(json!([transport.options()]))
        }
        None => Ok(Value::Array(
            c.target.transports().iter().map(|t| t.options()).collect(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Subsystems

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

pub(crate) fn address_json(a: &ListenAddress) -> Value {
    json!({"trtype": a.trtype, "adrfam": a.adrfam, "traddr": a.traddr, "trsvcid": a.trsvcid})
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
// Listeners

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenAddressParams {
    pub trtype: String,
    #[serde(default)]
    pub adrfam: Option<String>,
    pub traddr: String,
    #[serde(default)]
    pub trsvcid: Option<String>,
}

impl ListenAddressParams {
    /// SPDK's spelling: trtype upper case, adrfam IPv4 by default for RDMA and TCP, service id
    /// required for them.
    pub fn to_address(&self) -> Result<ListenAddress, RpcError> {
        let kind = TransportKind::parse(&self.trtype).ok_or_else(|| {
            einval(format!(
                "listen_address.trtype: invalid transport type {}",
                self.trtype
            ))
        })?;
        let adrfam = match self
            .adrfam
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => match kind {
                TransportKind::Loopback => "INTRA_HOST",
                _ => "IPv4",
            },
            Some("ipv4") => "IPv4",
            Some("ipv6") => "IPv6",
            Some("ib") => "IB",
            Some("fc") => "FC",
            Some("intra_host") => "INTRA_HOST",
            Some(other) => {
                return Err(einval(format!(
                    "listen_address.adrfam: invalid address family {other}"
                )))
            }
        };
        if self.traddr.len() > 256 {
            return Err(einval("listen_address.traddr: longer than 256 characters"));
        }
        let trsvcid = self.trsvcid.clone().unwrap_or_default();
        if trsvcid.len() > 32 {
            return Err(einval("listen_address.trsvcid: longer than 32 characters"));
        }
        if trsvcid.is_empty() && matches!(kind, TransportKind::Rdma | TransportKind::Tcp) {
            return Err(einval(format!(
                "listen_address.trsvcid: a service id is required for {}",
                kind.name()
            )));
        }
        Ok(ListenAddress {
            trtype: kind.name().to_string(),
            adrfam: adrfam.to_string(),
            traddr: self.traddr.clone(),
            trsvcid,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddListenerParams {
    pub nqn: String,
    pub listen_address: ListenAddressParams,
    #[serde(default)]
    pub tgt_name: Option<String>,
    #[serde(default)]
    pub secure_channel: bool,
    #[serde(default)]
    pub ana_state: Option<String>,
    #[serde(default)]
    pub sock_impl: Option<String>,
    /// NUMA node whose namespaces the listener may serve (SPDK: vfio-user only).
    #[serde(default)]
    pub numa_id: Option<i32>,
}

pub fn nvmf_subsystem_add_listener(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: AddListenerParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    refuse_if(
        p.secure_channel,
        "secure_channel",
        "TLS secure channels are not supported",
    )?;
    let ana_state = p
        .ana_state
        .as_deref()
        .map(|s| super::nvmf_ana::parse_state("ana_state", s))
        .transpose()?
        .unwrap_or(AnaState::OPTIMIZED);
    super::framework::debug_ignored(
        "nvmf_subsystem_add_listener",
        [
            ("sock_impl", p.sock_impl.is_some()),
            ("numa_id", p.numa_id.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name)),
    );
    let addr = p.listen_address.to_address()?;
    c.target.add_listener_with_ana(&p.nqn, addr, ana_state)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveListenerParams {
    pub nqn: String,
    pub listen_address: ListenAddressParams,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_remove_listener(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: RemoveListenerParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let addr = p.listen_address.to_address()?;
    c.target.remove_listener(&p.nqn, &addr)?;
    Ok(true_())
}

pub fn nvmf_subsystem_get_listeners(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: NqnParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let s = c.target.subsystem(&p.nqn)?;
    Ok(Value::Array(
        s.listeners
            .iter()
            .map(|a| {
                let mut l = json!({"address": address_json(a)});
                if s.ana_reporting {
                    l["ana_states"] = super::nvmf_ana::listener_states_json(s, a);
                }
                l
            })
            .collect(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Namespaces

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceParams {
    pub bdev_name: String,
    #[serde(default)]
    pub nsid: u32,
    #[serde(default)]
    pub nguid: Option<String>,
    #[serde(default)]
    pub eui64: Option<String>,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub ptpl_file: Option<String>,
    #[serde(default)]
    pub anagrpid: u32,
    #[serde(default)]
    pub no_auto_visible: bool,
    #[serde(default)]
    pub hide_metadata: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddNsParams {
    pub nqn: String,
    pub namespace: NamespaceParams,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

/// Answers the NSID, as SPDK does.
pub fn nvmf_subsystem_add_ns(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: AddNsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let ns = p.namespace;
    refuse_if(
        ns.ptpl_file.as_deref() == Some(""),
        "namespace.ptpl_file",
        "an empty path",
    )?;
    refuse_if(
        ns.hide_metadata,
        "namespace.hide_metadata",
        "bdev metadata is not supported",
    )?;
    let nguid = ns
        .nguid
        .as_deref()
        .map(|s| parse_hex::<16>("namespace.nguid", s))
        .transpose()?;
    let eui64 = ns
        .eui64
        .as_deref()
        .map(|s| parse_hex::<8>("namespace.eui64", s))
        .transpose()?;
    let uuid = ns
        .uuid
        .as_deref()
        .map(|s| {
            util::parse_uuid(s)
                .ok_or_else(|| einval(format!("namespace.uuid: {s:?} is not a UUID")))
        })
        .transpose()?;
    let nsid = c.target.add_namespace(
        &p.nqn,
        NamespaceOptions {
            bdev_name: ns.bdev_name,
            nsid: Some(ns.nsid),
            nguid,
            uuid,
            eui64,
            no_auto_visible: ns.no_auto_visible,
            anagrpid: Some(ns.anagrpid),
            ptpl_file: ns.ptpl_file.map(std::path::PathBuf::from),
        },
    )?;
    Ok(json!(nsid))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveNsParams {
    pub nqn: String,
    pub nsid: u32,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_remove_ns(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: RemoveNsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.remove_namespace(&p.nqn, p.nsid)?;
    Ok(true_())
}

// ---------------------------------------------------------------------------------------------
// Hosts

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddHostParams {
    pub nqn: String,
    pub host: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
    #[serde(default)]
    pub psk: Option<String>,
    #[serde(default)]
    pub dhchap_key: Option<String>,
    #[serde(default)]
    pub dhchap_ctrlr_key: Option<String>,
}

pub fn nvmf_subsystem_add_host(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: AddHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    refuse_if(
        p.psk.is_some(),
        "psk",
        "TLS pre-shared keys are not supported",
    )?;
    refuse_if(
        p.dhchap_key.is_some(),
        "dhchap_key",
        "DH-HMAC-CHAP authentication is not supported",
    )?;
    refuse_if(
        p.dhchap_ctrlr_key.is_some(),
        "dhchap_ctrlr_key",
        "DH-HMAC-CHAP authentication is not supported",
    )?;
    c.target.add_host(&p.nqn, &p.host)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveHostParams {
    pub nqn: String,
    pub host: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
    /// How long SPDK waits for the host's queues to disconnect; here they are failed at once.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Removes the host and disconnects its controllers, as SPDK does.
pub fn nvmf_subsystem_remove_host(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: RemoveHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let _ = p.timeout_ms;
    c.target.remove_host(&p.nqn, &p.host)?;
    let sub = c.target.subsystem(&p.nqn)?;
    for ctrl in sub.shared.controllers() {
        if ctrl.hostnqn == p.host {
            ctrl.fail();
        }
    }
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowAnyHostParams {
    pub nqn: String,
    pub allow_any_host: bool,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_allow_any_host(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: AllowAnyHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.allow_any_host(&p.nqn, p.allow_any_host)?;
    Ok(true_())
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

// ---------------------------------------------------------------------------------------------
// Saved config

fn entry(method: &str, params: Value) -> Value {
    json!({"method": method, "params": params})
}

fn listener_entry(nqn: &str, a: &ListenAddress) -> Value {
    entry(
        "nvmf_subsystem_add_listener",
        json!({"nqn": nqn, "listen_address": address_json(a), "secure_channel": false}),
    )
}

/// What SPDK's `spdk_nvmf_tgt_write_config_json` writes, in its order: limits, transports,
/// then per subsystem its creation, listeners, hosts and namespaces. Unlike SPDK, listeners of
/// the discovery subsystem are written too (right after the transports), so they come back.
pub fn config(c: &Control) -> Vec<Value> {
    let mut out = vec![entry(
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": c.max_subsystems}),
    )];
    let limits = &c.target.info.qpair_limits;
    let per_host = limits
        .max_per_host
        .load(std::sync::atomic::Ordering::Relaxed);
    let total = limits.max_total.load(std::sync::atomic::Ordering::Relaxed);
    let connect_ms = limits
        .connect_timeout_ms
        .load(std::sync::atomic::Ordering::Relaxed);
    let transfer_ms = limits
        .transfer_timeout_ms
        .load(std::sync::atomic::Ordering::Relaxed);
    if (per_host, total)
        != (
            crate::core::limits::DEFAULT_MAX_QPAIRS_PER_HOST,
            crate::core::limits::DEFAULT_MAX_QPAIRS,
        )
        || connect_ms != 0
        || transfer_ms != 0
    {
        // Only when changed: SPDK's own configs never carry these extensions.
        let mut params = json!({"max_qpairs_per_host": per_host, "max_qpairs": total});
        if connect_ms != 0 {
            params["connect_timeout_ms"] = connect_ms.into();
        }
        if transfer_ms != 0 {
            params["transfer_timeout_ms"] = transfer_ms.into();
        }
        out.push(entry("nvmf_set_config", params));
    }
    for t in c.target.transports() {
        out.push(entry("nvmf_create_transport", t.options()));
    }
    out.extend(super::nvmf_referrals::config(c));
    let subs = subsystems_in_order(c);
    for s in subs.iter().filter(|s| s.kind == SubsystemKind::Discovery) {
        for a in &s.listeners {
            out.push(listener_entry(DISCOVERY_NQN, a));
        }
    }
    for s in subs.iter().filter(|s| s.kind == SubsystemKind::Nvm) {
        let mut create = json!({
            "nqn": s.nqn,
            "allow_any_host": s.allow_any_host,
            "serial_number": s.serial_number,
            "model_number": s.model_number,
            "min_cntlid": s.min_cntlid,
            "max_cntlid": s.max_cntlid,
            "ana_reporting": s.ana_reporting,
        });
        if s.max_namespaces != 0 {
            create["max_namespaces"] = json!(s.max_namespaces);
        }
        out.push(entry("nvmf_create_subsystem", create));
        for a in &s.listeners {
            let mut l = listener_entry(&s.nqn, a);
            if let Some(state) = super::nvmf_ana::listener_default_state(s, a) {
                l["params"]["ana_state"] = json!(state);
            }
            out.push(l);
        }
        for h in &s.hosts {
            out.push(entry(
                "nvmf_subsystem_add_host",
                json!({"nqn": s.nqn, "host": h}),
            ));
        }
        for ns in s.namespaces.values() {
            let mut n = json!({
                "nsid": ns.nsid,
                "bdev_name": ns.bdev.name(),
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
            if let Some(path) = ns.resv.ptpl_file() {
                n["ptpl_file"] = json!(path.to_string_lossy());
            }
            out.push(entry(
                "nvmf_subsystem_add_ns",
                json!({"nqn": s.nqn, "namespace": n}),
            ));
        }
        // Namespace masking, after the namespaces it applies to (SPDK's order).
        for (nsid, hosts) in &s.ns_hosts {
            for host in hosts {
                out.push(entry(
                    "nvmf_ns_add_host",
                    json!({"nqn": s.nqn, "nsid": nsid, "host": host}),
                ));
            }
        }
        // Per-group ANA states, once the groups they name exist.
        out.extend(super::nvmf_ana::listener_state_entries(s));
    }
    out
}
