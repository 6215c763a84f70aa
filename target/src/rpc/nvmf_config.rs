//! The nvmf part of `framework_get_config` (`spdk_nvmf_tgt_write_config_json`): the methods
//! that rebuild the target's NVMe-oF state when replayed.

use nvmf_common::spec::nqn::DISCOVERY_NQN;
use serde_json::{json, Value};

use super::nvmf::{hex_upper, subsystems_in_order};
use super::nvmf_listeners::address_json;
use super::Control;
use crate::bdev::util;
use crate::core::subsystem::{ListenAddress, SubsystemKind};

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
