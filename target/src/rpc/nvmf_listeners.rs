//! Listeners: a subsystem's transport addresses (`nvmf_subsystem_add_listener`,
//! `nvmf_subsystem_remove_listener`, `nvmf_subsystem_get_listeners`), and the address
//! spelling shared with ANA states and discovery referrals.

use nvmf_common::spec::log_page::AnaState;
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{refuse_if, true_};
use super::nvmf_subsystems::NqnParams;
use super::{check_tgt_name, einval, parse, Control};
use crate::core::subsystem::ListenAddress;
use crate::transport::options::TransportKind;

pub(crate) fn address_json(a: &ListenAddress) -> Value {
    json!({"trtype": a.trtype, "adrfam": a.adrfam, "traddr": a.traddr, "trsvcid": a.trsvcid})
}

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
