//! Transports: `nvmf_create_transport` (through the [`Control`]'s transport factory) and
//! `nvmf_get_transports`.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::true_;
use super::{check_tgt_name, einval, parse, Control};
use crate::transport::options::TransportOptions;
use crate::transport::TransportError;

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
