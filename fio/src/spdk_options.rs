//! SPDK's fio plugin options (`app/fio/nvme/fio_plugin.c`), so its job files run unchanged.
//! `hostnqn` and `print_qid_mappings` apply here; the others configure what this engine
//! does not have (PCIe, DPDK memory, end-to-end protection, zoned namespaces, TCP digests,
//! SPDK tracing): set to anything but SPDK's default they get a one-line notice.

/// The values of SPDK's options as fio parsed them (the shim passes them all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpdkOptions {
    pub hostnqn: Option<String>,
    pub print_qid_mappings: bool,
    /// (option name, value, SPDK's default) of the integer options with no effect here.
    pub ints: Vec<(&'static str, i64, i64)>,
    /// (option name, value) of the string options with no effect here (set: a notice).
    pub strs: Vec<(&'static str, Option<String>)>,
}

/// SPDK's defaults of its integer options, in the order the shim passes them.
pub const INT_OPTIONS: [(&str, i64, &str); 19] = [
    ("enable_wrr", 0, "no PCIe weighted round robin here"),
    ("arbitration_burst", 0, "no PCIe weighted round robin here"),
    ("low_weight", 0, "no PCIe weighted round robin here"),
    ("medium_weight", 0, "no PCIe weighted round robin here"),
    ("high_weight", 0, "no PCIe weighted round robin here"),
    ("wrr_priority", 0, "no PCIe weighted round robin here"),
    ("enable_interrupts", 0, "completions are polled"),
    ("mem_size_mb", 0, "no DPDK memory here"),
    ("shm_id", -1, "no DPDK memory here"),
    ("enable_sgl", 0, "RDMA always sends keyed SGLs"),
    ("sge_size", 4096, "PCIe SGL only"),
    ("disable_pcie_sgl_merge", 0, "PCIe SGL only"),
    (
        "bit_bucket_data_len",
        0,
        "bit bucket SGLs are not supported",
    ),
    ("pi_act", 1, "end-to-end protection is not supported"),
    (
        "md_per_io_size",
        4096,
        "end-to-end protection is not supported",
    ),
    ("apptag", 0x1234, "end-to-end protection is not supported"),
    (
        "apptag_mask",
        0xffff,
        "end-to-end protection is not supported",
    ),
    ("enable_vmd", 0, "no PCIe VMD here"),
    ("spdk_tracing", 0, "no SPDK trace points here"),
];

/// Zoned-namespace options: refusing would be wrong for a conventional namespace, so they
/// are noticed like the others.
pub const ZONE_OPTIONS: [&str; 2] = ["initial_zone_reset", "zone_append"];

pub const STR_OPTIONS: [(&str, &str); 3] = [
    ("pi_chk", "end-to-end protection is not supported"),
    ("digest_enable", "TCP digests only; this engine is RDMA"),
    ("log_flags", "use NVMF_FIO_LOG"),
];

impl SpdkOptions {
    /// One line per option set to something that has no effect here.
    pub fn notices(&self) -> Vec<String> {
        let mut out = Vec::new();
        for &(name, value, default) in &self.ints {
            if value == default {
                continue;
            }
            let why = INT_OPTIONS
                .iter()
                .find(|o| o.0 == name)
                .map(|o| o.2)
                .or(ZONE_OPTIONS
                    .contains(&name)
                    .then_some("zoned namespaces are not supported"))
                .unwrap_or("no effect here");
            out.push(format!("{name}={value} ignored: {why}"));
        }
        for (name, value) in &self.strs {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                let why = STR_OPTIONS
                    .iter()
                    .find(|o| o.0 == *name)
                    .map_or("no effect here", |o| o.1);
                out.push(format!("{name}={v} ignored: {why}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> SpdkOptions {
        SpdkOptions {
            hostnqn: None,
            print_qid_mappings: false,
            ints: INT_OPTIONS
                .iter()
                .map(|o| (o.0, o.1, o.1))
                .chain(ZONE_OPTIONS.iter().map(|&z| (z, 0, 0)))
                .collect(),
            strs: STR_OPTIONS.iter().map(|o| (o.0, None)).collect(),
        }
    }

    #[test]
    fn spdk_defaults_say_nothing() {
        assert!(defaults().notices().is_empty());
    }

    #[test]
    fn options_with_no_effect_get_one_line_each() {
        let mut o = defaults();
        for (name, value, _) in o.ints.iter_mut() {
            if ["enable_sgl", "shm_id", "zone_append", "pi_act"].contains(name) {
                *value = 7;
            }
        }
        o.strs[1].1 = Some("BOTH".into());
        o.strs[0].1 = Some(String::new());
        let n = o.notices();
        assert_eq!(n.len(), 5, "{n:#?}");
        assert!(n.contains(&"enable_sgl=7 ignored: RDMA always sends keyed SGLs".to_string()));
        assert!(n
            .iter()
            .any(|l| l.starts_with("zone_append=7") && l.contains("zoned")));
        assert!(n.iter().any(|l| l.starts_with("digest_enable=BOTH")));
        assert!(n.iter().any(|l| l.starts_with("shm_id=7")));
        assert!(n.iter().any(|l| l.starts_with("pi_act=7")));
    }
}
