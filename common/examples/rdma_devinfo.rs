//! Lists RDMA devices with the limits the target and initiator size their queues by, like a
//! short `ibv_devinfo`. Usage: `cargo run -p nvmf-common --example rdma_devinfo [DEVICE]`.

use nvmf_common::rdma::device::format_guid;
use nvmf_common::rdma::{Context, Device, DeviceCapFlags};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let only = std::env::args().nth(1);
    let devices = Device::list()?;
    if devices.is_empty() {
        println!("no RDMA devices");
        return Ok(());
    }
    for info in devices {
        if only.as_ref().is_some_and(|n| *n != info.name) {
            continue;
        }
        println!(
            "{}: node GUID {}, transport {:?}",
            info.name,
            format_guid(info.node_guid),
            info.transport
        );
        let ctx = Context::open(&info.name)?;
        let a = ctx.query_device()?;
        println!(
            "  fw {} vendor {:#x}:{:#x}, max_qp {} max_qp_wr {} max_sge {} max_cqe {} \
             max_srq_wr {} max_mr_size {:#x}",
            a.fw_ver,
            a.vendor_id,
            a.vendor_part_id,
            a.max_qp,
            a.max_qp_wr,
            a.max_sge,
            a.max_cqe,
            a.max_srq_wr,
            a.max_mr_size
        );
        println!(
            "  rd_atom {}/{} (responder/initiator), caps {:?}, send with invalidate: {}",
            a.max_qp_rd_atom,
            a.max_qp_init_rd_atom,
            a.device_cap_flags,
            a.device_cap_flags
                .contains(DeviceCapFlags::MEM_MGT_EXTENSIONS)
        );
        for port in 1..=a.phys_port_cnt {
            let p = ctx.query_port(port)?;
            let gid = ctx.query_gid(port, 0)?;
            println!(
                "  port {port}: {:?}, active MTU {:?}, link layer {:?}, GID[0] {gid}",
                p.state,
                p.active_mtu.bytes(),
                p.link_layer
            );
        }
    }
    Ok(())
}
