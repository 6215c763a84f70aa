//! Helpers shared by the end-to-end tests: a target with one poll group and the loopback
//! transport, and a host that drives it the way Linux's nvme-fabrics host does.
#![forbid(unsafe_code)]

pub mod chaos;
pub mod hostile;
pub mod sim;
pub mod watched_bdev;

use std::sync::Arc;

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{
    ConnectCommand, ConnectData, PropertyGetCommand, PropertySetCommand, CNTLID_DYNAMIC,
};
use nvmf_common::spec::features::{
    parse_async_event_dw0, AsyncEventType, AsyncNotice, FeatureId, NumberOfQueues,
    AEC_NAMESPACE_ATTRIBUTE,
};
use nvmf_common::spec::identify::{Cns, IdentifyController};
use nvmf_common::spec::log_page::LogPageId;
use nvmf_common::spec::registers::{Cc, Csts, Property};
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::{Completion, Status};
use nvmf_target::bdev::{BdevRef, MallocBdev, NullBdev};
use nvmf_target::core::subsystem::ListenAddress;
use nvmf_target::core::{PollGroup, TargetInfo};
use nvmf_target::target::{NamespaceOptions, SubsystemOptions, Target};
pub use nvmf_target::transport::loopback::{
    Capsule, LoopbackHostQueue, LoopbackPools, LoopbackTransport, Response, LOOPBACK_LIMITS,
};
use nvmf_target::transport::TransportLimits;
use zerocopy::{FromBytes, IntoBytes};

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const HOSTID: [u8; 16] = [0x11; 16];
/// The admin queue Linux opens: 32 entries (SQSIZE 31).
pub const LINUX_ADMIN_SQSIZE: u16 = 31;
/// KATO the Linux host sends by default (NVME_DEFAULT_KATO = 5 s).
pub const LINUX_KATO_MS: u32 = 5000;
/// How many reactor turns a test waits for a response before calling it a hang.
const MAX_POLLS: usize = 100_000;

/// A target serving the loopback transport from one poll group, driven by the test thread.
pub struct LoopbackLab {
    pub target: Target,
    pub pg: PollGroup,
    pub transport: LoopbackTransport,
}

impl Default for LoopbackLab {
    fn default() -> Self {
        Self::new(LOOPBACK_LIMITS)
    }
}

impl LoopbackLab {
    pub fn new(limits: TransportLimits) -> Self {
        Self::with_transport(LoopbackTransport::new(limits))
    }

    /// A lab whose loopback transport is set up by the test (buffer pool sizes).
    pub fn with_transport(transport: LoopbackTransport) -> Self {
        let info = Arc::new(TargetInfo::default());
        let mut target = Target::new(Arc::clone(&info));
        let pg = PollGroup::new(0, info);
        target.add_poll_group(pg.handle());
        target
            .add_transport(Arc::new(transport.clone()))
            .expect("first transport");
        let mut lab = Self {
            target,
            pg,
            transport,
        };
        lab.pg.poll();
        lab
    }

    /// A RAM bdev registered with the target.
    pub fn malloc(&mut self, name: &str, num_blocks: u64, block_size: u32) -> BdevRef {
        let bdev: BdevRef = Arc::new(MallocBdev::new(name, num_blocks, block_size, None).unwrap());
        self.target.bdevs.register(Arc::clone(&bdev)).unwrap();
        bdev
    }

    /// A null bdev (reads return zeroes, writes are dropped) registered with the target.
    pub fn null(&mut self, name: &str, num_blocks: u64, block_size: u32) -> BdevRef {
        let bdev: BdevRef = Arc::new(NullBdev::new(name, num_blocks, block_size, None).unwrap());
        self.target.bdevs.register(Arc::clone(&bdev)).unwrap();
        bdev
    }

    /// An NVM subsystem open to any host, with a loopback listener and the given bdevs as
    /// namespaces 1..
    pub fn subsystem(&mut self, nqn: &str, bdevs: &[&str]) {
        let opts = SubsystemOptions {
            allow_any_host: true,
            serial_number: "SN0001".into(),
            model_number: "rust nvmf loopback".into(),
            ..Default::default()
        };
        self.target.create_subsystem(nqn, opts).unwrap();
        for name in bdevs {
            let opts = NamespaceOptions {
                bdev_name: name.to_string(),
                ..Default::default()
            };
            self.target.add_namespace(nqn, opts).unwrap();
        }
        self.target.add_listener(nqn, loopback_address()).unwrap();
        self.pg.poll();
    }

    pub fn open_queue(&mut self) -> LoopbackHostQueue {
        let q = self.transport.connect();
        self.pg.poll();
        q
    }

    /// A queue that comes through the listener at `addr`.
    pub fn open_queue_via(&mut self, addr: ListenAddress) -> LoopbackHostQueue {
        let q = self.transport.connect_via(addr);
        self.pg.poll();
        q
    }

    fn open_queue_on(&mut self, listener: Option<&ListenAddress>) -> LoopbackHostQueue {
        match listener {
            Some(addr) => self.open_queue_via(addr.clone()),
            None => self.open_queue(),
        }
    }

    /// Sends one capsule and polls the target until its response arrives.
    pub fn run(&mut self, q: &LoopbackHostQueue, capsule: Capsule) -> Response {
        q.submit(capsule);
        self.wait(q)
    }

    pub fn wait(&mut self, q: &LoopbackHostQueue) -> Response {
        for _ in 0..MAX_POLLS {
            if let Some(r) = q.poll() {
                return r;
            }
            self.pg.poll();
        }
        // Work off the reactor (a PTPL file's write and fsync on a busy machine) can take
        // longer than the polls: wait in real time too, then give up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.pg.poll();
            if let Some(r) = q.poll() {
                return r;
            }
        }
        panic!("no response after {MAX_POLLS} polls and 10 s: the target hung");
    }

    /// Polls a few turns and reports whether a response showed up (for AERs).
    pub fn try_wait(&mut self, q: &LoopbackHostQueue, polls: usize) -> Option<Response> {
        for _ in 0..polls {
            if let Some(r) = q.poll() {
                return Some(r);
            }
            self.pg.poll();
        }
        None
    }
}

pub fn loopback_address() -> ListenAddress {
    ListenAddress {
        trtype: "LOOPBACK".into(),
        adrfam: "INTRA_HOST".into(),
        traddr: "local".into(),
        trsvcid: "0".into(),
    }
}

/// A command with no data, carrying the zero-length keyed SGL Linux sends.
pub fn no_data(mut cmd: Command) -> Capsule {
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = SglDescriptor::keyed(0, 0, 0, false);
    Capsule {
        cmd,
        host_buffer: Vec::new(),
    }
}

/// A command whose data lives in host memory of `len` bytes (keyed SGL).
pub fn with_buffer(mut cmd: Command, host_buffer: Vec<u8>) -> Capsule {
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = SglDescriptor::keyed(0x1000, host_buffer.len() as u32, 0x1234, false);
    Capsule { cmd, host_buffer }
}

/// A read-like command: the target fills `len` bytes of host memory.
pub fn reading(cmd: Command, len: usize) -> Capsule {
    with_buffer(cmd, vec![0; len])
}

/// A write with in-capsule data (SGL data block, offset subtype).
pub fn in_capsule(mut cmd: Command, data: Vec<u8>) -> Capsule {
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = SglDescriptor::in_capsule(0, data.len() as u32);
    Capsule {
        cmd,
        host_buffer: data,
    }
}

pub fn connect_capsule(
    cid: u16,
    qid: u16,
    sqsize: u16,
    kato: u32,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Capsule {
    connect_capsule_as(cid, qid, sqsize, kato, cntlid, subnqn, hostnqn, HOSTID)
}

/// [`connect_capsule`] with another Host Identifier (reservations tell hosts apart by it).
#[allow(clippy::too_many_arguments)]
pub fn connect_capsule_as(
    cid: u16,
    qid: u16,
    sqsize: u16,
    kato: u32,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
    hostid: [u8; 16],
) -> Capsule {
    let cmd = ConnectCommand::new(cid, qid, sqsize, kato).to_command();
    let data = ConnectData::new(hostid, cntlid, subnqn, hostnqn);
    with_buffer(cmd, data.as_bytes().to_vec())
}

/// A controller the test host brought up.
pub struct HostController {
    pub admin: LoopbackHostQueue,
    pub io: Vec<LoopbackHostQueue>,
    pub cntlid: u16,
    pub subnqn: String,
    pub identify: Box<IdentifyController>,
    next_cid: u16,
}

impl HostController {
    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    pub fn admin(&mut self, lab: &mut LoopbackLab, capsule: Capsule) -> Response {
        lab.run(&self.admin, capsule)
    }

    pub fn io(&mut self, lab: &mut LoopbackLab, queue: usize, capsule: Capsule) -> Response {
        lab.run(&self.io[queue], capsule)
    }
}

pub fn expect_ok(r: &Response) -> &Completion {
    assert_eq!(
        r.cqe.status(),
        Status::SUCCESS,
        "command failed: {:?}",
        r.cqe
    );
    &r.cqe
}

/// Brings a controller up in exactly the order the Linux host does (drivers/nvme/host:
/// nvmf_connect_admin_queue, nvme_enable_ctrl, nvme_init_ctrl_finish, nvme_set_queue_count,
/// nvmf_connect_io_queue per queue, nvme_enable_aen).
pub fn linux_bring_up(lab: &mut LoopbackLab, subnqn: &str, io_queues: u16) -> HostController {
    bring_up(lab, subnqn, io_queues, None, HOSTNQN, HOSTID)
}

/// [`linux_bring_up`] by the host `hostnqn` (per-host behaviour: namespace masking).
pub fn linux_bring_up_as(
    lab: &mut LoopbackLab,
    subnqn: &str,
    io_queues: u16,
    hostnqn: &str,
) -> HostController {
    bring_up(lab, subnqn, io_queues, None, hostnqn, HOSTID)
}

/// [`linux_bring_up`] by the host `hostnqn` with Host Identifier `hostid` (reservations).
pub fn linux_bring_up_with_hostid(
    lab: &mut LoopbackLab,
    subnqn: &str,
    io_queues: u16,
    hostnqn: &str,
    hostid: [u8; 16],
) -> HostController {
    bring_up(lab, subnqn, io_queues, None, hostnqn, hostid)
}

/// [`linux_bring_up`] with every queue coming through the listener at `addr`.
pub fn linux_bring_up_via(
    lab: &mut LoopbackLab,
    subnqn: &str,
    io_queues: u16,
    addr: &ListenAddress,
) -> HostController {
    bring_up(lab, subnqn, io_queues, Some(addr), HOSTNQN, HOSTID)
}

fn bring_up(
    lab: &mut LoopbackLab,
    subnqn: &str,
    io_queues: u16,
    listener: Option<&ListenAddress>,
    hostnqn: &str,
    hostid: [u8; 16],
) -> HostController {
    let admin = lab.open_queue_on(listener);
    let r = lab.run(
        &admin,
        connect_capsule_as(
            1,
            0,
            LINUX_ADMIN_SQSIZE,
            LINUX_KATO_MS,
            CNTLID_DYNAMIC,
            subnqn,
            hostnqn,
            hostid,
        ),
    );
    let cntlid = expect_ok(&r).dw0.get() as u16;

    let r = lab.run(
        &admin,
        no_data(PropertyGetCommand::new(2, Property::CAP.0, true).to_command()),
    );
    let cap = nvmf_common::spec::registers::Cap(expect_ok(&r).result64());
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    let r = lab.run(
        &admin,
        no_data(PropertySetCommand::new(3, Property::CC.0, u64::from(cc.0), false).to_command()),
    );
    expect_ok(&r);
    let mut ready = false;
    for cid in 4..20 {
        let r = lab.run(
            &admin,
            no_data(PropertyGetCommand::new(cid, Property::CSTS.0, false).to_command()),
        );
        if Csts(expect_ok(&r).dw0.get()).rdy() {
            ready = true;
            break;
        }
    }
    assert!(ready, "CSTS.RDY never set");
    let r = lab.run(
        &admin,
        no_data(PropertyGetCommand::new(20, Property::VS.0, false).to_command()),
    );
    assert!(expect_ok(&r).dw0.get() >= 0x0001_0300, "VS below 1.3");

    let r = lab.run(
        &admin,
        reading(Command::identify(21, Cns::CONTROLLER, 0, 0), 4096),
    );
    expect_ok(&r);
    let identify = Box::new(IdentifyController::read_from_bytes(&r.host_buffer[..4096]).unwrap());
    assert_eq!(
        identify.cntlid.get(),
        cntlid,
        "Identify cntlid must equal Connect's"
    );

    let mut ctrl = HostController {
        admin,
        io: Vec::new(),
        cntlid,
        subnqn: subnqn.to_string(),
        identify,
        next_cid: 100,
    };
    if io_queues > 0 {
        let want = NumberOfQueues {
            nsq: u32::from(io_queues),
            ncq: u32::from(io_queues),
        };
        let cid = ctrl.cid();
        let r = ctrl.admin(
            lab,
            no_data(Command::set_features(
                cid,
                FeatureId::NUMBER_OF_QUEUES,
                want.to_dword(),
                false,
            )),
        );
        let granted = NumberOfQueues::from_dword(expect_ok(&r).dw0.get());
        assert!(granted.nsq >= u32::from(io_queues));
        let sqsize = cap.mqes().min(127);
        for qid in 1..=io_queues {
            let q = lab.open_queue_on(listener);
            let r = lab.run(
                &q,
                connect_capsule_as(1, qid, sqsize, 0, cntlid, subnqn, hostnqn, hostid),
            );
            expect_ok(&r);
            ctrl.io.push(q);
        }
    }
    ctrl
}

/// Asks for Namespace Attribute Changed notices (Set Features, Asynchronous Event
/// Configuration).
pub fn enable_namespace_notices(lab: &mut LoopbackLab, ctrl: &mut HostController) {
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(
        lab,
        no_data(Command::set_features(
            cid,
            FeatureId::ASYNC_EVENT_CONFIGURATION,
            AEC_NAMESPACE_ATTRIBUTE,
            false,
        )),
    ));
}

/// Leaves an Asynchronous Event Request outstanding; returns its CID.
pub fn submit_aer(ctrl: &mut HostController) -> u16 {
    let cid = ctrl.cid();
    ctrl.admin
        .submit(no_data(Command::async_event_request(cid)));
    cid
}

/// The outstanding AER `aer` completes with a Namespace Attribute Changed notice, and the
/// Changed Namespace List then holds exactly `nsids`.
pub fn expect_namespace_notice(
    lab: &mut LoopbackLab,
    ctrl: &mut HostController,
    aer: u16,
    nsids: &[u32],
) {
    let r = lab
        .try_wait(&ctrl.admin, 200)
        .expect("a Namespace Attribute Changed notice");
    assert_eq!(r.cqe.cid.get(), aer);
    assert_eq!(
        parse_async_event_dw0(expect_ok(&r).dw0.get()),
        (
            AsyncEventType::NOTICE,
            AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0,
            LogPageId::CHANGED_NAMESPACE_LIST
        )
    );
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::CHANGED_NAMESPACE_LIST, 4096, 0),
            4096,
        ),
    );
    expect_ok(&r);
    let mut want = vec![0u8; 4096];
    for (slot, nsid) in want.chunks_exact_mut(4).zip(nsids) {
        slot.copy_from_slice(&nsid.to_le_bytes());
    }
    assert_eq!(r.host_buffer, want, "changed namespace list");
}
