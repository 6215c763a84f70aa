//! `smart-log` and `get-log`: log pages, printed as `nvme smart-log` and `nvme get-log`
//! print them (or raw).

use std::io::Write;

use anyhow::bail;
use nvmf_common::spec::log_page::get_u128;
use nvmf_common::spec::{LogPageId, SmartHealthLog};
use zerocopy::FromBytes;

use crate::args::Cli;
use crate::{connect, disconnect, tid};

pub(crate) fn cmd_smart(cli: &Cli, r: &str, nsid: u32) -> anyhow::Result<()> {
    let mut ctrl = connect(r, cli, 0)?;
    let raw = ctrl.get_log_page(nsid, LogPageId::SMART_HEALTH, 512)?;
    disconnect(ctrl);
    let s = SmartHealthLog::read_from_bytes(&raw).expect("512 bytes");
    let k = s.composite_temperature();
    println!(
        "Smart Log for NVME device:{} namespace-id:{nsid:x}",
        tid(r, cli)?.subnqn
    );
    println!("critical_warning\t\t\t: {:#x}", s.critical_warning);
    println!(
        "temperature\t\t\t\t: {} °C ({k} Kelvin)",
        i32::from(k) - 273
    );
    println!("available_spare\t\t\t\t: {}%", s.available_spare);
    println!(
        "available_spare_threshold\t\t: {}%",
        s.available_spare_threshold
    );
    println!("percentage_used\t\t\t\t: {}%", s.percentage_used);
    println!(
        "endurance group critical warning summary: {:#x}",
        s.endurance_group_critical_warning
    );
    println!("data_units_read\t\t\t\t: {}", get_u128(&s.data_units_read));
    println!(
        "data_units_written\t\t\t: {}",
        get_u128(&s.data_units_written)
    );
    println!(
        "host_read_commands\t\t\t: {}",
        get_u128(&s.host_read_commands)
    );
    println!(
        "host_write_commands\t\t\t: {}",
        get_u128(&s.host_write_commands)
    );
    println!(
        "controller_busy_time\t\t\t: {}",
        get_u128(&s.controller_busy_time)
    );
    println!("power_cycles\t\t\t\t: {}", get_u128(&s.power_cycles));
    println!("power_on_hours\t\t\t\t: {}", get_u128(&s.power_on_hours));
    println!("unsafe_shutdowns\t\t\t: {}", get_u128(&s.unsafe_shutdowns));
    println!("media_errors\t\t\t\t: {}", get_u128(&s.media_errors));
    println!(
        "num_err_log_entries\t\t\t: {}",
        get_u128(&s.num_error_log_entries)
    );
    println!(
        "Warning Temperature Time\t\t: {}",
        s.warning_temp_time.get()
    );
    println!(
        "Critical Composite Temperature Time\t: {}",
        s.critical_temp_time.get()
    );
    Ok(())
}

pub(crate) fn cmd_get_log(
    cli: &Cli,
    r: &str,
    lid: u64,
    len: u64,
    nsid: u32,
    raw: bool,
) -> anyhow::Result<()> {
    let lid = u8::try_from(lid).map_err(|_| anyhow::anyhow!("-i {lid}: a log page ID is 0-255"))?;
    if len == 0 || len > 16 << 20 {
        bail!("-l {len}: give 1 to 16 MiB");
    }
    let mut ctrl = connect(r, cli, 0)?;
    let data = ctrl.get_log_page(nsid, LogPageId(lid), len as usize)?;
    disconnect(ctrl);
    if raw {
        std::io::stdout().write_all(&data)?;
        return Ok(());
    }
    println!(
        "Device:{} log-id:{lid} namespace-id:{nsid:#x}",
        tid(r, cli)?.subnqn
    );
    println!("       0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f");
    for (i, row) in data.chunks(16).enumerate() {
        let hex: String = row.iter().map(|b| format!(" {b:02x}")).collect();
        let txt: String = row
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        println!("{:04x}:{hex:<48} \"{txt}\"", i * 16);
    }
    Ok(())
}
