//! What the doctor takes from a config in SPDK's saved-config format (`nvmf-tgt -c`): the RDMA
//! transport's options (`nvmf_create_transport`) and the RDMA listeners
//! (`nvmf_subsystem_add_listener`, `nvmf_discovery_add_listener`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::transport::options::{TransportKind, TransportOptions};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("nvmf_create_transport params: {0}")]
    Transport(String),
    #[error("listener traddr {0:?} is not an IP address")]
    Address(String),
}

/// The parts of a config the doctor checks.
#[derive(Debug, Clone, Default)]
pub struct ConfigPlan {
    /// The RDMA transport's options, if the config creates one.
    pub transport: Option<TransportOptions>,
    /// Addresses of RDMA listeners, in config order, without duplicates.
    pub listen: Vec<IpAddr>,
}

pub fn load(path: &Path) -> Result<ConfigPlan, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    from_value(&json)
}

pub fn from_value(json: &Value) -> Result<ConfigPlan, ConfigError> {
    let mut plan = ConfigPlan::default();
    let entries = json
        .get("subsystems")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("config").and_then(Value::as_array))
        .flatten();
    for entry in entries {
        let method = entry.get("method").and_then(Value::as_str).unwrap_or("");
        let params = entry.get("params").cloned().unwrap_or(Value::Null);
        match method {
            "nvmf_create_transport" => {
                let opts: TransportOptions = serde_json::from_value(params)
                    .map_err(|e| ConfigError::Transport(e.to_string()))?;
                if opts.kind().ok() == Some(TransportKind::Rdma) {
                    opts.validate().map_err(ConfigError::Transport)?;
                    plan.transport = Some(opts);
                }
            }
            "nvmf_subsystem_add_listener" | "nvmf_discovery_add_listener" => {
                let Some(la) = params.get("listen_address") else {
                    continue;
                };
                let trtype = la.get("trtype").and_then(Value::as_str).unwrap_or("");
                if TransportKind::parse(trtype) != Some(TransportKind::Rdma) {
                    continue;
                }
                let traddr = la.get("traddr").and_then(Value::as_str).unwrap_or("");
                let addr: IpAddr = traddr
                    .parse()
                    .map_err(|_| ConfigError::Address(traddr.to_string()))?;
                if !plan.listen.contains(&addr) {
                    plan.listen.push(addr);
                }
            }
            _ => {}
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn listener(traddr: &str, trtype: &str) -> Value {
        json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.x",
            "listen_address": {"trtype": trtype, "adrfam": "IPv4", "traddr": traddr, "trsvcid": "4420"}}})
    }

    #[test]
    fn reads_rdma_transport_options_and_listeners() {
        let cfg = json!({"subsystems": [
            {"subsystem": "bdev", "config": [{"method": "bdev_malloc_create", "params": {"name": "M", "num_blocks": 8, "block_size": 512}}]},
            {"subsystem": "nvmf", "config": [
                {"method": "nvmf_create_transport", "params": {"trtype": "RDMA", "max_srq_depth": 512}},
                listener("10.0.0.1", "RDMA"),
                listener("10.0.0.1", "rdma"),
                listener("192.168.5.5", "TCP"),
                {"method": "nvmf_discovery_add_listener", "params": {"listen_address": {"trtype": "RDMA", "traddr": "10.0.1.1", "trsvcid": "4420"}}}
            ]},
            {"subsystem": "scheduler", "config": null}
        ]});
        let plan = from_value(&cfg).unwrap();
        assert_eq!(plan.transport.unwrap().max_srq_depth, 512);
        let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.1.1".parse().unwrap()];
        assert_eq!(plan.listen, want);
    }

    #[test]
    fn bad_transport_params_and_addresses_are_errors() {
        let cfg = json!({"subsystems": [{"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "RDMA", "max_srq_deep": 5}}]}]});
        assert!(
            matches!(from_value(&cfg), Err(ConfigError::Transport(e)) if e.contains("max_srq_deep"))
        );
        let cfg = json!({"subsystems": [{"subsystem": "nvmf", "config": [listener("host.example", "RDMA")]}]});
        assert!(matches!(from_value(&cfg), Err(ConfigError::Address(_))));
        let err = load(Path::new("/nonexistent/config.json")).unwrap_err();
        assert!(err
            .to_string()
            .contains("cannot read /nonexistent/config.json"));
    }
}
