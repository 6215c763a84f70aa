//! `save_config` and `load_config`, as rpc.py runs them, over a session that prints each
//! request and response with `-v`.

use nvmf_rpc::client::{Client, ClientError};
use serde_json::{json, Value};

pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) verbose: bool,
}

impl Session {
    pub(crate) fn call(
        &mut self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ClientError> {
        if self.verbose {
            eprintln!("request: {}", self.client.request(method, params.as_ref()));
        }
        let r = self.client.call(method, params);
        if self.verbose {
            match &r {
                Ok(v) => eprintln!("response: {v}"),
                Err(e) => eprintln!("response error: {e}"),
            }
        }
        r
    }
}

pub(crate) fn save_config(s: &mut Session) -> Result<Value, ClientError> {
    let mut subsystems = Vec::new();
    let list = s.call("framework_get_subsystems", None)?;
    for elem in list.as_array().cloned().unwrap_or_default() {
        let name = elem["subsystem"].clone();
        let config = s.call("framework_get_config", Some(json!({"name": name})))?;
        subsystems.push(json!({"subsystem": name, "config": config}));
    }
    Ok(json!({"subsystems": subsystems}))
}

/// rpc.py's algorithm: check every method is known, then repeatedly run the entries callable in
/// the current state, calling `framework_start_init` when it is callable, until nothing is
/// left or nothing can run. Entries left over are reported and make the exit status non-zero.
/// The calls one saved-config element makes: a `{"method", "params"}` object, or a batch (an
/// array of them).
pub(crate) fn config_calls(elem: &Value) -> Vec<(String, Option<Value>)> {
    let one = |e: &Value| {
        (
            e.get("method")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            e.get("params").cloned(),
        )
    };
    match elem {
        Value::Array(items) => items.iter().map(one).collect(),
        e => vec![one(e)],
    }
}

pub(crate) fn load_config(
    s: &mut Session,
    config: Value,
    include_aliases: bool,
) -> Result<bool, ClientError> {
    let mut subsystems: Vec<(String, Vec<Value>)> = config
        .get("subsystems")
        .and_then(Value::as_array)
        .ok_or_else(|| ClientError::Protocol("config has no \"subsystems\" array".into()))?
        .iter()
        .map(|sub| {
            let name = sub["subsystem"].as_str().unwrap_or("?").to_string();
            (name, sub["config"].as_array().cloned().unwrap_or_default())
        })
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let names = |v: Value| -> Vec<String> { serde_json::from_value(v).unwrap_or_default() };
    let known = names(s.call(
        "rpc_get_methods",
        Some(json!({"include_aliases": include_aliases})),
    )?);
    if subsystems.is_empty() {
        if known.iter().any(|m| m == "framework_start_init") {
            let current = names(s.call("rpc_get_methods", Some(json!({"current": true})))?);
            if current.iter().any(|m| m == "framework_start_init") {
                s.call("framework_start_init", None)?;
            }
        }
        return Ok(true);
    }
    for (name, config) in &subsystems {
        for (i, elem) in config.iter().enumerate() {
            for (method, _) in config_calls(elem) {
                if !known.contains(&method) {
                    return Err(ClientError::Protocol(format!(
                        "Unknown method was included in the config file: subsystem {name}, entry {i}: {method:?}"
                    )));
                }
            }
        }
    }
    while !subsystems.is_empty() {
        let current = names(s.call(
            "rpc_get_methods",
            Some(json!({"current": true, "include_aliases": include_aliases})),
        )?);
        let mut progressed = false;
        for (_, config) in subsystems.iter_mut() {
            let mut rest = Vec::new();
            for elem in config.drain(..) {
                let calls = config_calls(&elem);
                // A batch (SPDK 26's `save_config --with-batches`) runs only when all of its
                // methods may run now, then in order, as rpc.py does.
                if !calls.is_empty() && calls.iter().all(|(m, _)| current.contains(m)) {
                    for (method, params) in calls {
                        s.call(&method, params)?;
                    }
                    progressed = true;
                } else {
                    rest.push(elem);
                }
            }
            *config = rest;
        }
        subsystems.retain(|(_, c)| !c.is_empty());
        if current.iter().any(|m| m == "framework_start_init") {
            s.call("framework_start_init", None)?;
            progressed = true;
        }
        if !progressed {
            break;
        }
    }
    if !subsystems.is_empty() {
        eprintln!(
            "Some configs were skipped because the RPC state that can call them passed over:"
        );
        for (name, config) in &subsystems {
            for elem in config {
                for (method, _) in config_calls(elem) {
                    eprintln!("  {name}: {method}");
                }
            }
        }
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_elements_are_calls_or_batches_of_calls() {
        let one = json!({"method": "bdev_malloc_create", "params": {"name": "M0"}});
        assert_eq!(
            config_calls(&one),
            vec![(
                "bdev_malloc_create".to_string(),
                Some(json!({"name": "M0"}))
            )]
        );
        let batch = json!([
            {"method": "nvmf_create_subsystem", "params": {"nqn": "n"}},
            {"method": "framework_wait_init"}
        ]);
        let calls = config_calls(&batch);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].0, "nvmf_create_subsystem");
        assert_eq!(calls[1], ("framework_wait_init".to_string(), None));
    }
}
