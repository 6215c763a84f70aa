//! The command line: rpc.py's global options and one subcommand per method, with rpc.py's
//! flags.

use clap::{Args, Parser, Subcommand};

use crate::admin;
use nvmf_rpc::DEFAULT_SOCKET_PATH;

const EXAMPLES: &str = "\
Examples:
  nvmf-rpc bdev_malloc_create -b Malloc0 64 4096        # 64 MiB RAM disk, 4 KiB blocks
  nvmf-rpc nvmf_create_transport -t RDMA
  nvmf-rpc nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SPDK00000000000001
  nvmf-rpc nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0
  nvmf-rpc nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t rdma -f ipv4 -a 10.0.0.1 -s 4420
  nvmf-rpc save_config > config.json                    # nvmf-tgt -c config.json restores it
  nvmf-rpc -s /run/nvmf/tgt.sock nvmf_get_subsystems    # another target's socket

SPDK's own rpc.py (`pip install spdk`, then `spdk-rpc`) drives nvmf-tgt the same way.
Exit status: 0 success, 1 an error (the request and the target's answer on stderr, then a hint).";

#[derive(Parser)]
#[command(
    name = "nvmf-rpc",
    about = "JSON-RPC client for the NVMe-oF target (SPDK rpc.py compatible)",
    after_help = EXAMPLES
)]
pub(crate) struct Cli {
    /// RPC domain socket path or IP address.
    #[arg(short = 's', long = "server", default_value = DEFAULT_SOCKET_PATH)]
    pub(crate) server: String,
    /// RPC port number (when the server is an IP address).
    #[arg(short = 'p', long = "port")]
    pub(crate) port: Option<u16>,
    /// Timeout in seconds to wait for a response.
    #[arg(short = 't', long = "timeout", default_value_t = 60.0)]
    pub(crate) timeout: f64,
    /// Print requests and responses on stderr.
    #[arg(short = 'v', long = "verbose")]
    pub(crate) verbose: bool,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    #[command(name = "rpc_get_methods")]
    RpcGetMethods {
        #[arg(short = 'c', long = "current")]
        current: bool,
        #[arg(short = 'i', long = "include-aliases")]
        include_aliases: bool,
    },
    #[command(name = "spdk_get_version")]
    SpdkGetVersion,
    #[command(name = "framework_start_init")]
    FrameworkStartInit,
    #[command(name = "framework_wait_init")]
    FrameworkWaitInit,
    #[command(name = "framework_get_subsystems")]
    FrameworkGetSubsystems,
    #[command(name = "framework_get_config")]
    FrameworkGetConfig { name: String },
    /// Write the live configuration as {"subsystems": [...]} (stdout unless -o).
    #[command(name = "save_config")]
    SaveConfig {
        /// Indent level; below 0 means compact.
        #[arg(
            short = 'i',
            long = "indent",
            default_value_t = 2,
            allow_negative_numbers = true
        )]
        indent: i32,
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
    },
    /// Replay a saved configuration (from -j FILE or stdin).
    #[command(name = "load_config")]
    LoadConfig {
        #[arg(short = 'j', long = "json-conf")]
        json_conf: Option<String>,
        #[arg(short = 'i', long = "include-aliases")]
        include_aliases: bool,
    },
    #[command(name = "save_subsystem_config")]
    SaveSubsystemConfig {
        #[arg(short = 'n', long = "name", required = true)]
        name: String,
        #[arg(
            short = 'i',
            long = "indent",
            default_value_t = 2,
            allow_negative_numbers = true
        )]
        indent: i32,
    },
    #[command(name = "bdev_get_bdevs")]
    BdevGetBdevs {
        #[arg(short = 'b', long = "name")]
        name: Option<String>,
        #[arg(short = 't', long = "timeout")]
        timeout: Option<u64>,
    },
    #[command(name = "bdev_malloc_create")]
    BdevMallocCreate(MallocCreate),
    #[command(name = "bdev_malloc_delete")]
    BdevMallocDelete { name: String },
    #[command(name = "bdev_null_create")]
    BdevNullCreate(NullCreate),
    #[command(name = "bdev_null_delete")]
    BdevNullDelete { name: String },
    #[command(name = "bdev_aio_create")]
    BdevAioCreate {
        filename: String,
        name: String,
        block_size: Option<u32>,
        #[arg(short = 'r', long = "readonly")]
        readonly: bool,
        #[arg(long = "fallocate")]
        fallocate: bool,
        #[arg(short = 'u', long = "uuid")]
        uuid: Option<String>,
    },
    #[command(name = "bdev_aio_delete")]
    BdevAioDelete { name: String },
    #[command(name = "bdev_uring_create")]
    BdevUringCreate {
        filename: String,
        name: String,
        block_size: Option<u32>,
        #[arg(short = 'u', long = "uuid")]
        uuid: Option<String>,
    },
    #[command(name = "bdev_uring_delete")]
    BdevUringDelete { name: String },
    /// Grows a null bdev (or shrinks one no namespace uses); NEW_SIZE in MiB.
    #[command(name = "bdev_null_resize")]
    BdevNullResize { name: String, new_size: u64 },
    /// Takes the new size of an AIO bdev's file or device.
    #[command(name = "bdev_aio_rescan")]
    BdevAioRescan { name: String },
    /// Takes the new size of an io_uring bdev's file or device.
    #[command(name = "bdev_uring_rescan")]
    BdevUringRescan { name: String },
    /// Splits BASE_BDEV into SPLIT_COUNT parts named <base>p0, <base>p1, ...
    #[command(name = "bdev_split_create")]
    BdevSplitCreate {
        base_bdev: String,
        split_count: u32,
        /// Size of each part in MiB (default: the base divided evenly).
        #[arg(short = 's', long = "split-size-mb")]
        split_size_mb: Option<u64>,
    },
    /// Deletes every part of BASE_BDEV.
    #[command(name = "bdev_split_delete")]
    BdevSplitDelete { base_bdev: String },
    #[command(name = "bdev_delay_create")]
    BdevDelayCreate {
        #[arg(short = 'b', long = "base-bdev-name", required = true)]
        base_bdev_name: String,
        #[arg(short = 'd', long = "name", required = true)]
        name: String,
        #[arg(short = 'r', long = "avg-read-latency", required = true)]
        avg_read_latency: u64,
        #[arg(short = 't', long = "nine-nine-read-latency", required = true)]
        p99_read_latency: u64,
        #[arg(short = 'w', long = "avg-write-latency", required = true)]
        avg_write_latency: u64,
        #[arg(short = 'n', long = "nine-nine-write-latency", required = true)]
        p99_write_latency: u64,
        #[arg(short = 'u', long = "uuid")]
        uuid: Option<String>,
    },
    #[command(name = "bdev_delay_delete")]
    BdevDelayDelete { name: String },
    #[command(name = "bdev_delay_update_latency")]
    BdevDelayUpdateLatency {
        delay_bdev_name: String,
        latency_type: String,
        latency_us: u64,
    },
    #[command(name = "bdev_error_create")]
    BdevErrorCreate {
        base_name: String,
        #[arg(short = 'u', long = "uuid")]
        uuid: Option<String>,
    },
    #[command(name = "bdev_error_delete")]
    BdevErrorDelete { name: String },
    #[command(name = "bdev_error_inject_error")]
    BdevErrorInjectError {
        name: String,
        io_type: String,
        error_type: String,
        #[arg(short = 'n', long = "num")]
        num: Option<u32>,
        #[arg(short = 'q', long = "queue-depth")]
        queue_depth: Option<u64>,
        #[arg(short = 'o', long = "corrupt-offset")]
        corrupt_offset: Option<u64>,
        #[arg(short = 'v', long = "corrupt-value")]
        corrupt_value: Option<u8>,
        #[arg(long = "nvme-sct")]
        nvme_sct: Option<u32>,
        #[arg(long = "nvme-sc")]
        nvme_sc: Option<u32>,
    },
    #[command(name = "bdev_error_resume_pending")]
    BdevErrorResumePending { name: String },
    #[command(name = "nvmf_set_max_subsystems")]
    NvmfSetMaxSubsystems {
        #[arg(short = 'x', long = "max-subsystems", required = true)]
        max_subsystems: u32,
    },
    #[command(name = "nvmf_set_config")]
    NvmfSetConfig {
        #[arg(short = 'm', long = "poll-groups-mask")]
        poll_groups_mask: Option<String>,
        #[arg(short = 'd', long = "discovery-filter")]
        discovery_filter: Option<String>,
        /// Our extension: queue pairs one host NQN may have connected.
        #[arg(long = "max-qpairs-per-host")]
        max_qpairs_per_host: Option<u32>,
        /// Our extension: queue pairs connected to the whole target.
        #[arg(long = "max-qpairs")]
        max_qpairs: Option<u32>,
        /// Our extension: a connection with no successful Connect this long is closed (ms).
        #[arg(long = "connect-timeout-ms")]
        connect_timeout_ms: Option<u64>,
        /// Our extension: a queue whose host takes no response or data transfer this long is
        /// closed and its buffers freed (ms).
        #[arg(long = "transfer-timeout-ms")]
        transfer_timeout_ms: Option<u64>,
    },
    #[command(name = "nvmf_create_transport")]
    NvmfCreateTransport(CreateTransport),
    #[command(name = "nvmf_get_transports")]
    NvmfGetTransports {
        #[arg(long = "trtype")]
        trtype: Option<String>,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_get_subsystems")]
    NvmfGetSubsystems {
        nqn: Option<String>,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_create_subsystem")]
    NvmfCreateSubsystem(CreateSubsystem),
    #[command(name = "nvmf_delete_subsystem")]
    NvmfDeleteSubsystem {
        subsystem_nqn: String,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_subsystem_add_listener")]
    NvmfSubsystemAddListener(AddListener),
    #[command(name = "nvmf_subsystem_remove_listener")]
    NvmfSubsystemRemoveListener(Listener),
    #[command(name = "nvmf_subsystem_get_listeners")]
    NvmfSubsystemGetListeners(NqnArgs),
    /// Set the ANA state of one group (-g) or of all groups through a listener.
    #[command(name = "nvmf_subsystem_listener_set_ana_state")]
    NvmfSubsystemListenerSetAnaState(SetAnaState),
    /// Move a namespace to another ANA group.
    #[command(name = "nvmf_subsystem_set_ns_ana_group")]
    NvmfSubsystemSetNsAnaGroup {
        nqn: String,
        nsid: u32,
        anagrpid: u32,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_subsystem_add_ns")]
    NvmfSubsystemAddNs(AddNs),
    #[command(name = "nvmf_subsystem_remove_ns")]
    NvmfSubsystemRemoveNs {
        nqn: String,
        nsid: u32,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_subsystem_add_host")]
    NvmfSubsystemAddHost {
        nqn: String,
        host: String,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
        #[arg(long = "psk")]
        psk: Option<String>,
        #[arg(long = "dhchap-key")]
        dhchap_key: Option<String>,
        #[arg(long = "dhchap-ctrlr-key")]
        dhchap_ctrlr_key: Option<String>,
    },
    #[command(name = "nvmf_subsystem_remove_host")]
    NvmfSubsystemRemoveHost {
        nqn: String,
        host: String,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_subsystem_allow_any_host")]
    NvmfSubsystemAllowAnyHost {
        nqn: String,
        #[arg(short = 'e', long = "enable")]
        enable: bool,
        #[arg(short = 'd', long = "disable")]
        disable: bool,
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(name = "nvmf_subsystem_get_controllers")]
    NvmfSubsystemGetControllers(NqnArgs),
    #[command(name = "nvmf_subsystem_get_qpairs")]
    NvmfSubsystemGetQpairs(NqnArgs),
    #[command(name = "nvmf_get_stats")]
    NvmfGetStats {
        #[arg(short = 't', long = "tgt-name")]
        tgt_name: Option<String>,
    },
    #[command(flatten)]
    Admin(admin::AdminCmd),
}

#[derive(Args)]
pub(crate) struct MallocCreate {
    /// Size in MiB.
    pub(crate) total_size: f64,
    pub(crate) block_size: u32,
    #[arg(short = 'b', long = "name")]
    pub(crate) name: Option<String>,
    #[arg(short = 'u', long = "uuid")]
    pub(crate) uuid: Option<String>,
    #[arg(short = 'p', long = "physical-block-size")]
    pub(crate) physical_block_size: Option<u32>,
    #[arg(short = 'o', long = "optimal-io-boundary")]
    pub(crate) optimal_io_boundary: Option<u32>,
    #[arg(short = 'm', long = "md-size")]
    pub(crate) md_size: Option<u32>,
    #[arg(short = 'i', long = "md-interleave")]
    pub(crate) md_interleave: bool,
    #[arg(short = 't', long = "dif-type")]
    pub(crate) dif_type: Option<i32>,
    #[arg(short = 'd', long = "dif-is-head-of-md")]
    pub(crate) dif_is_head_of_md: bool,
    #[arg(short = 'f', long = "dif-pi-format")]
    pub(crate) dif_pi_format: Option<u32>,
    #[arg(short = 'n', long = "numa-id")]
    pub(crate) numa_id: Option<i32>,
}

#[derive(Args)]
pub(crate) struct NullCreate {
    pub(crate) name: String,
    /// Size in MiB.
    pub(crate) total_size: f64,
    pub(crate) block_size: u32,
    #[arg(short = 'u', long = "uuid")]
    pub(crate) uuid: Option<String>,
    #[arg(short = 'p', long = "physical-block-size")]
    pub(crate) physical_block_size: Option<u32>,
    #[arg(short = 'm', long = "md-size")]
    pub(crate) md_size: Option<u32>,
    #[arg(short = 't', long = "dif-type")]
    pub(crate) dif_type: Option<i32>,
    #[arg(short = 'd', long = "dif-is-head-of-md")]
    pub(crate) dif_is_head_of_md: bool,
    #[arg(long = "dif-pi-format")]
    pub(crate) dif_pi_format: Option<u32>,
}

#[derive(Args)]
pub(crate) struct CreateTransport {
    #[arg(short = 't', long = "trtype", required = true)]
    pub(crate) trtype: String,
    #[arg(short = 'g', long = "tgt-name")]
    pub(crate) tgt_name: Option<String>,
    #[arg(short = 'q', long = "max-queue-depth")]
    pub(crate) max_queue_depth: Option<u32>,
    #[arg(short = 'm', long = "max-io-qpairs-per-ctrlr")]
    pub(crate) max_io_qpairs_per_ctrlr: Option<u32>,
    #[arg(short = 'c', long = "in-capsule-data-size")]
    pub(crate) in_capsule_data_size: Option<u32>,
    #[arg(short = 'i', long = "max-io-size")]
    pub(crate) max_io_size: Option<u32>,
    #[arg(short = 'u', long = "io-unit-size")]
    pub(crate) io_unit_size: Option<u32>,
    #[arg(short = 'a', long = "max-aq-depth")]
    pub(crate) max_aq_depth: Option<u32>,
    #[arg(short = 'n', long = "num-shared-buffers")]
    pub(crate) num_shared_buffers: Option<u32>,
    #[arg(short = 'b', long = "buf-cache-size")]
    pub(crate) buf_cache_size: Option<u32>,
    #[arg(short = 'z', long = "zcopy")]
    pub(crate) zcopy: bool,
    #[arg(short = 'd', long = "num-cqe")]
    pub(crate) num_cqe: Option<i32>,
    #[arg(short = 's', long = "max-srq-depth")]
    pub(crate) max_srq_depth: Option<u32>,
    #[arg(short = 'r', long = "no-srq")]
    pub(crate) no_srq: bool,
    /// Disable the C2H success optimization (TCP).
    #[arg(short = 'o', long = "c2h-success")]
    pub(crate) disable_c2h_success: bool,
    #[arg(short = 'f', long = "dif-insert-or-strip")]
    pub(crate) dif_insert_or_strip: bool,
    #[arg(short = 'y', long = "sock-priority")]
    pub(crate) sock_priority: Option<u32>,
    #[arg(short = 'l', long = "acceptor-backlog")]
    pub(crate) acceptor_backlog: Option<i32>,
    #[arg(short = 'x', long = "abort-timeout-sec")]
    pub(crate) abort_timeout_sec: Option<u32>,
    #[arg(short = 'w', long = "no-wr-batching")]
    pub(crate) no_wr_batching: bool,
    #[arg(short = 'e', long = "control-msg-num")]
    pub(crate) control_msg_num: Option<u32>,
    #[arg(long = "acceptor-poll-rate")]
    pub(crate) acceptor_poll_rate: Option<u32>,
    #[arg(long = "ack-timeout")]
    pub(crate) ack_timeout: Option<u32>,
    #[arg(long = "data-wr-pool-size")]
    pub(crate) data_wr_pool_size: Option<u32>,
    #[arg(long = "disable-command-passthru")]
    pub(crate) disable_command_passthru: bool,
    #[arg(long = "kas")]
    pub(crate) kas: Option<u16>,
    #[arg(long = "min-kato")]
    pub(crate) min_kato: Option<u32>,
}

#[derive(Args)]
pub(crate) struct CreateSubsystem {
    pub(crate) nqn: String,
    #[arg(short = 't', long = "tgt-name")]
    pub(crate) tgt_name: Option<String>,
    #[arg(short = 's', long = "serial-number")]
    pub(crate) serial_number: Option<String>,
    #[arg(short = 'd', long = "model-number")]
    pub(crate) model_number: Option<String>,
    #[arg(short = 'a', long = "allow-any-host")]
    pub(crate) allow_any_host: bool,
    #[arg(short = 'm', long = "max-namespaces")]
    pub(crate) max_namespaces: Option<u32>,
    #[arg(short = 'r', long = "ana-reporting")]
    pub(crate) ana_reporting: bool,
    #[arg(short = 'i', long = "min_cntlid")]
    pub(crate) min_cntlid: Option<u16>,
    #[arg(short = 'I', long = "max_cntlid")]
    pub(crate) max_cntlid: Option<u16>,
    #[arg(long = "max-discard-size")]
    pub(crate) max_discard_size: Option<u64>,
    #[arg(long = "max-write-zeroes-size")]
    pub(crate) max_write_zeroes_size: Option<u64>,
    #[arg(short = 'p', long = "passthrough")]
    pub(crate) passthrough: bool,
    #[arg(short = 'n', long = "enable_nssr")]
    pub(crate) enable_nssr: bool,
}

#[derive(Args)]
pub(crate) struct Listener {
    pub(crate) nqn: String,
    #[arg(short = 't', long = "trtype", required = true)]
    pub(crate) trtype: String,
    #[arg(short = 'a', long = "traddr", required = true)]
    pub(crate) traddr: String,
    #[arg(short = 'p', long = "tgt-name")]
    pub(crate) tgt_name: Option<String>,
    #[arg(short = 'f', long = "adrfam")]
    pub(crate) adrfam: Option<String>,
    #[arg(short = 's', long = "trsvcid")]
    pub(crate) trsvcid: Option<String>,
}

#[derive(Args)]
pub(crate) struct AddListener {
    #[command(flatten)]
    pub(crate) listener: Listener,
    #[arg(short = 'k', long = "secure-channel")]
    pub(crate) secure_channel: bool,
    #[arg(short = 'n', long = "ana-state")]
    pub(crate) ana_state: Option<String>,
    #[arg(short = 'S', long = "sock-impl")]
    pub(crate) sock_impl: Option<String>,
}

#[derive(Args)]
pub(crate) struct SetAnaState {
    #[command(flatten)]
    pub(crate) listener: Listener,
    /// optimized, non_optimized, inaccessible (SPDK's choices), persistent_loss, change.
    #[arg(short = 'n', long = "ana-state", required = true)]
    pub(crate) ana_state: String,
    #[arg(short = 'g', long = "anagrpid")]
    pub(crate) anagrpid: Option<u32>,
}

#[derive(Args)]
pub(crate) struct NqnArgs {
    pub(crate) nqn: String,
    #[arg(short = 't', long = "tgt-name")]
    pub(crate) tgt_name: Option<String>,
}

#[derive(Args)]
pub(crate) struct AddNs {
    pub(crate) nqn: String,
    pub(crate) bdev_name: String,
    #[arg(short = 't', long = "tgt-name")]
    pub(crate) tgt_name: Option<String>,
    #[arg(short = 'p', long = "ptpl-file")]
    pub(crate) ptpl_file: Option<String>,
    #[arg(short = 'n', long = "nsid")]
    pub(crate) nsid: Option<u32>,
    #[arg(short = 'g', long = "nguid")]
    pub(crate) nguid: Option<String>,
    #[arg(short = 'e', long = "eui64")]
    pub(crate) eui64: Option<String>,
    #[arg(short = 'u', long = "uuid")]
    pub(crate) uuid: Option<String>,
    #[arg(short = 'a', long = "anagrpid")]
    pub(crate) anagrpid: Option<u32>,
    #[arg(short = 'i', long = "no-auto-visible")]
    pub(crate) no_auto_visible: bool,
    #[arg(short = 'N', long = "hide-metadata")]
    pub(crate) hide_metadata: bool,
}
