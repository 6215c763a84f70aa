//! Discovery referrals (`nvmf_discovery_add_referral`, `nvmf_discovery_remove_referral`,
//! `nvmf_discovery_get_referrals`; SPDK's `nvmf_rpc.c` and `spdk_nvmf_tgt_add_referral`).
//!
//! A referral names another discovery service (subsystem NQN left out: the discovery NQN)
//! or an NVM subsystem at an address; every discovery controller lists it, to every host on
//! every port, as a log page entry of subtype 1 (referral) or 2 (NVM subsystem).
//!
//! As in SPDK: adding a referral that exists (same address and subsystem NQN) succeeds and
//! changes nothing; removing an unknown one is `-32603` "Unable to remove a referral."; a
//! missing service id for RDMA or TCP is `-32603` "Service ID is required."; an invalid
//! subsystem NQN is `-32603` "Internal error" (SPDK's answer; the message here names it).

use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{address_json, ListenAddressParams};
use super::{check_tgt_name, parse, Control};
use crate::core::subsystem::{ListenAddress, Referral};
use crate::target::TargetError;
use crate::transport::options::TransportKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddReferralParams {
    #[serde(default)]
    pub tgt_name: Option<String>,
    pub address: ListenAddressParams,
    #[serde(default)]
    pub secure_channel: bool,
    #[serde(default)]
    pub subnqn: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveReferralParams {
    #[serde(default)]
    pub tgt_name: Option<String>,
    pub address: ListenAddressParams,
    #[serde(default)]
    pub subnqn: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetReferralsParams {
    #[serde(default)]
    pub tgt_name: Option<String>,
}

/// The referral's address in SPDK's spelling; RDMA and TCP need a service id.
fn referral_address(p: &ListenAddressParams) -> Result<ListenAddress, RpcError> {
    let needs_port = matches!(
        TransportKind::parse(&p.trtype),
        Some(TransportKind::Rdma | TransportKind::Tcp)
    );
    if needs_port && p.trsvcid.as_deref().unwrap_or("").is_empty() {
        return Err(RpcError::internal("Service ID is required."));
    }
    p.to_address()
}

/// SPDK fills in the discovery NQN when none is given (`spdk_nvmf_tgt_add_referral`).
fn subnqn_or_discovery(subnqn: Option<String>) -> String {
    subnqn
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DISCOVERY_NQN.to_string())
}

pub fn nvmf_discovery_add_referral(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: AddReferralParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let referral = Referral {
        address: referral_address(&p.address)?,
        subnqn: subnqn_or_discovery(p.subnqn),
        secure_channel: p.secure_channel,
    };
    c.target.add_referral(referral).map_err(|e| match e {
        TargetError::InvalidNqn { .. } => RpcError::internal(format!("Internal error: {e}")),
        e => e.into(),
    })?;
    Ok(Value::Bool(true))
}

pub fn nvmf_discovery_remove_referral(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: RemoveReferralParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let address = p.address.to_address()?;
    let subnqn = subnqn_or_discovery(p.subnqn);
    c.target
        .remove_referral(&address, &subnqn)
        .map_err(|_| RpcError::internal("Unable to remove a referral."))?;
    Ok(Value::Bool(true))
}

fn referral_json(r: &Referral) -> Value {
    json!({
        "address": address_json(&r.address),
        "secure_channel": r.secure_channel,
        "subnqn": r.subnqn,
    })
}

/// Newest first, as SPDK lists them (it inserts each at the head of its list).
pub fn nvmf_discovery_get_referrals(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: GetReferralsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    Ok(Value::Array(
        c.target
            .referrals()
            .iter()
            .rev()
            .map(referral_json)
            .collect(),
    ))
}

/// `nvmf_discovery_add_referral` entries for the saved config, oldest first so a replay
/// rebuilds the same order (SPDK writes its list head first, which reverses it on reload).
pub fn config(c: &Control) -> Vec<Value> {
    c.target
        .referrals()
        .iter()
        .map(|r| {
            json!({
                "method": "nvmf_discovery_add_referral",
                "params": {
                    "address": address_json(&r.address),
                    "secure_channel": r.secure_channel,
                    "subnqn": r.subnqn,
                },
            })
        })
        .collect()
}
