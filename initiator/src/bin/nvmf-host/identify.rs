//! `identify ctrl` / `identify ns`: Identify Controller and Namespace, printed as
//! `nvme id-ctrl` / `nvme id-ns` print them.

use nvmf_common::spec::identify::{ascii_str, nul_str};
use nvmf_common::spec::log_page::get_u128;
use nvmf_common::spec::{IdentifyController, IdentifyNamespace};

use crate::args::{Cli, What};
use crate::{connect, disconnect};

fn print_id_ctrl(id: &IdentifyController) {
    macro_rules! f {
        ($name:literal, $v:expr) => {
            println!("{:<10}: {}", $name, $v)
        };
    }
    println!("NVME Identify Controller:");
    f!("vid", format!("{:#x}", id.vid.get()));
    f!("ssvid", format!("{:#x}", id.ssvid.get()));
    f!("sn", format!("{:<20}", ascii_str(&id.sn)));
    f!("mn", format!("{:<40}", ascii_str(&id.mn)));
    f!("fr", format!("{:<8}", ascii_str(&id.fr)));
    f!("rab", id.rab);
    f!(
        "ieee",
        format!("{:02x}{:02x}{:02x}", id.ieee[2], id.ieee[1], id.ieee[0])
    );
    f!("cmic", id.cmic);
    f!("mdts", id.mdts);
    f!("cntlid", format!("{:#x}", id.cntlid.get()));
    f!("ver", format!("{:#x}", id.ver.get()));
    f!("rtd3r", id.rtd3r.get());
    f!("rtd3e", id.rtd3e.get());
    f!("oaes", format!("{:#x}", id.oaes.get()));
    f!("ctratt", format!("{:#x}", id.ctratt.get()));
    f!("cntrltype", id.cntrltype);
    f!("oacs", format!("{:#x}", id.oacs.get()));
    f!("acl", id.acl);
    f!("aerl", id.aerl);
    f!("frmw", format!("{:#x}", id.frmw));
    f!("lpa", format!("{:#x}", id.lpa));
    f!("elpe", id.elpe);
    f!("npss", id.npss);
    f!("kas", id.kas.get());
    f!("sqes", format!("{:#x}", id.sqes));
    f!("cqes", format!("{:#x}", id.cqes));
    f!("maxcmd", id.maxcmd.get());
    f!("nn", id.nn.get());
    f!("oncs", format!("{:#x}", id.oncs.get()));
    f!("fuses", format!("{:#x}", id.fuses.get()));
    f!("fna", format!("{:#x}", id.fna));
    f!("vwc", format!("{:#x}", id.vwc));
    f!("awun", id.awun.get());
    f!("awupf", id.awupf.get());
    f!("sgls", format!("{:#x}", id.sgls.get()));
    f!("mnan", id.mnan.get());
    f!("subnqn", nul_str(&id.subnqn));
    f!("ioccsz", id.ioccsz.get());
    f!("iorcsz", id.iorcsz.get());
    f!("icdoff", id.icdoff.get());
    f!("fcatt", format!("{:#x}", id.fcatt));
    f!("msdbd", id.msdbd);
    f!("ofcs", id.ofcs.get());
}

fn print_id_ns(nsid: u32, ns: &IdentifyNamespace) {
    macro_rules! f {
        ($name:literal, $v:expr) => {
            println!("{:<8}: {}", $name, $v)
        };
    }
    println!("NVME Identify Namespace {nsid}:");
    f!("nsze", format!("{:#x}", ns.nsze.get()));
    f!("ncap", format!("{:#x}", ns.ncap.get()));
    f!("nuse", format!("{:#x}", ns.nuse.get()));
    f!("nsfeat", format!("{:#x}", ns.nsfeat));
    f!("nlbaf", ns.nlbaf);
    f!("flbas", format!("{:#x}", ns.flbas));
    f!("mc", format!("{:#x}", ns.mc));
    f!("dpc", format!("{:#x}", ns.dpc));
    f!("dps", format!("{:#x}", ns.dps));
    f!("nmic", ns.nmic);
    f!("rescap", ns.rescap);
    f!("fpi", ns.fpi);
    f!("dlfeat", ns.dlfeat);
    f!("nawun", ns.nawun.get());
    f!("nawupf", ns.nawupf.get());
    f!("nacwu", ns.nacwu.get());
    f!("noiob", ns.noiob.get());
    f!("nvmcap", get_u128(&ns.nvmcap));
    f!("anagrpid", ns.anagrpid.get());
    f!("nsattr", ns.nsattr);
    f!("nvmsetid", ns.nvmsetid.get());
    f!("endgid", ns.endgid.get());
    f!(
        "nguid",
        ns.nguid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    f!(
        "eui64",
        ns.eui64
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let cur = (ns.flbas & 0xF) | ((ns.flbas >> 1) & 0x30);
    for (i, l) in ns.lbaf.iter().enumerate().take(usize::from(ns.nlbaf) + 1) {
        println!(
            "lbaf {i:>2} : ms:{:<3} lbads:{:<2} rp:{:#x} {}",
            l.ms.get(),
            l.lbads,
            l.rp & 3,
            if i == usize::from(cur) {
                "(in use)"
            } else {
                ""
            }
        );
    }
}

pub(crate) fn cmd_identify(cli: &Cli, r: &str, what: What, nsid: u32) -> anyhow::Result<()> {
    let mut ctrl = connect(r, cli, 0)?;
    match what {
        What::Ctrl => print_id_ctrl(ctrl.identify()),
        What::Ns => {
            let ns = ctrl.identify_namespace(nsid)?;
            print_id_ns(nsid, &ns);
        }
    }
    disconnect(ctrl);
    Ok(())
}
