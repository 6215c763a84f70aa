//! `discover`: the discovery log, printed as `nvme discover` prints it.

use anyhow::Context;
use nvmf_initiator::discover;

use crate::args::Cli;
use crate::{opts, tid};

fn trtype_str(v: u8) -> String {
    match v {
        1 => "rdma".into(),
        2 => "fc".into(),
        3 => "tcp".into(),
        254 => "loop".into(),
        v => format!("unknown ({v})"),
    }
}

fn adrfam_str(v: u8) -> String {
    match v {
        1 => "ipv4".into(),
        2 => "ipv6".into(),
        3 => "infiniband".into(),
        4 => "fibre-channel".into(),
        254 => "intra-host".into(),
        v => format!("unknown ({v})"),
    }
}

fn subtype_str(v: u8) -> String {
    match v {
        1 => "discovery subsystem referral".into(),
        2 => "nvme subsystem".into(),
        3 => "current discovery subsystem".into(),
        v => format!("unknown ({v})"),
    }
}

fn treq_str(v: u8) -> String {
    let sec = match v & 3 {
        0 => "not specified",
        1 => "required",
        2 => "not required",
        _ => "reserved",
    };
    if v & 4 != 0 {
        format!("{sec}, sq flow control disable supported")
    } else {
        sec.to_string()
    }
}

pub(crate) fn cmd_discover(cli: &Cli, r: &str) -> anyhow::Result<()> {
    let t = tid(r, cli)?;
    let log = discover(&t, &opts(cli, 0))
        .with_context(|| format!("discovery at {}:{}", t.traddr, t.trsvcid))?;
    println!(
        "\nDiscovery Log Number of Records {}, Generation counter {}",
        log.entries.len(),
        log.genctr
    );
    for (i, e) in log.entries.iter().enumerate() {
        println!("=====Discovery Log Entry {i}======");
        println!("trtype:  {}", trtype_str(e.trtype));
        println!("adrfam:  {}", adrfam_str(e.adrfam));
        println!("subtype: {}", subtype_str(e.subtype));
        println!("treq:    {}", treq_str(e.treq));
        println!("portid:  {}", e.portid);
        println!("trsvcid: {}", e.trsvcid);
        println!("subnqn:  {}", e.subnqn);
        println!("traddr:  {}", e.traddr);
        println!(
            "eflags:  {}",
            if e.eflags == 0 {
                "none".to_string()
            } else {
                format!("{:#x}", e.eflags)
            }
        );
        if e.trtype == 1 {
            let prtype = match e.rdma_prtype {
                1 => "not specified",
                2 => "infiniband",
                3 => "roce",
                4 => "roce-v2",
                5 => "iwarp",
                _ => "unrecognized",
            };
            let qptype = match e.rdma_qptype {
                1 => "connected",
                2 => "datagram",
                _ => "unrecognized",
            };
            let cms = if e.rdma_cms == 1 {
                "rdma-cm"
            } else {
                "unrecognized"
            };
            println!("rdma_prtype: {prtype}");
            println!("rdma_qptype: {qptype}");
            println!("rdma_cms:    {cms}");
            println!("rdma_pkey: {:#06x}", e.rdma_pkey);
        }
    }
    Ok(())
}
