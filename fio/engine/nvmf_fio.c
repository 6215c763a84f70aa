// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * fio ioengine "nvmf": NVMe over Fabrics (RDMA) through the project's userspace initiator.
 *
 * License: this file includes fio's headers, which are GPLv2, so it is GPL-2.0-or-later.
 * It is kept apart from the rest of the project on purpose: it only translates between
 * fio's struct ioengine_ops and the small C interface in nvmf_fio.h, implemented by the Rust
 * crate nvmf-fio (fio/src, the project's own license, Apache-2.0). The shared object that
 * fio/build-engine.sh links from both is a plugin for fio and is distributed under GPLv2
 * terms together with fio.
 *
 * Built against the headers of the fio that runs it (Debian's 3.33, see build-engine.sh):
 * the layouts of struct thread_data, fio_file and io_u must match.
 *
 * Usage:
 *   fio --ioengine=external:/path/libnvmf_fio_engine.so --thread=1 \
 *       --filename='trtype=RDMA adrfam=IPv4 traddr=10.0.0.1 trsvcid=4420 subnqn=NQN ns=1' ...
 * (fio splits file names at ':': write '\:' inside an NQN.)
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "fio.h"
#include "optgroup.h"

#include "nvmf_fio.h"

struct nvmf_fio_options {
	void *pad; /* fio owns the first member of an engine's option struct */
	unsigned int kato;
	unsigned int io_timeout;
	unsigned int reconnect_delay;
	unsigned int ctrl_loss_tmo;
	unsigned int in_capsule;
	unsigned int copy;
	unsigned int idle_spin;
	unsigned int idle_sleep_us;
	char *hostnqn;
	int print_qid_mappings;
	int spdk_int[21];
	char *spdk_str[3];
};

static struct fio_option options[] = {
	{
		.name = "nvmf_kato",
		.lname = "NVMe-oF Keep Alive Timeout",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, kato),
		.def = "5",
		.help = "Keep Alive Timeout in seconds (0: no keep-alive)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_io_timeout",
		.lname = "NVMe-oF I/O timeout",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, io_timeout),
		.def = "30",
		.minval = 1,
		.help = "Seconds before an I/O command times out (the association is then reset)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_reconnect_delay",
		.lname = "NVMe-oF reconnect delay",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, reconnect_delay),
		.def = "0",
		.help = "Seconds between reconnect attempts after a connection loss (0: no reconnect)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_ctrl_loss_tmo",
		.lname = "NVMe-oF controller loss timeout",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, ctrl_loss_tmo),
		.def = "600",
		.help = "Stop reconnecting this many seconds after the loss (0: never)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_in_capsule",
		.lname = "NVMe-oF in-capsule data",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, in_capsule),
		.def = "1",
		.help = "Send small writes inside the command capsule when the controller allows it",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_copy",
		.lname = "NVMe-oF copy through bounce buffers",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, copy),
		.def = "0",
		.help = "Copy data through registered bounce buffers even when fio's buffers can be used directly",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_idle_spin",
		.lname = "NVMe-oF empty polls before idling",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, idle_spin),
		.def = "0",
		.help = "Empty polls in a row before getevents gives the CPU away (0: pure polling; "
			"default from $NVMF_FIO_IDLE_SPIN)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "nvmf_idle_sleep_us",
		.lname = "NVMe-oF idle sleep",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, idle_sleep_us),
		.def = "0",
		.help = "Microseconds to sleep once idle (0: yield; default from $NVMF_FIO_IDLE_SLEEP_US)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "hostnqn",
		.lname = "Host NQN (SPDK plugin option)",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, hostnqn),
		.help = "Host NQN where the file name has no hostnqn=",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "print_qid_mappings",
		.lname = "Print the qpair of each file (SPDK plugin option)",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, print_qid_mappings),
		.def = "0",
		.help = "Print which I/O queue each file uses",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "enable_wrr",
		.lname = "SPDK plugin option enable_wrr",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[0]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "arbitration_burst",
		.lname = "SPDK plugin option arbitration_burst",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[1]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "low_weight",
		.lname = "SPDK plugin option low_weight",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[2]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "medium_weight",
		.lname = "SPDK plugin option medium_weight",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[3]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "high_weight",
		.lname = "SPDK plugin option high_weight",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[4]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "wrr_priority",
		.lname = "SPDK plugin option wrr_priority",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[5]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "enable_interrupts",
		.lname = "SPDK plugin option enable_interrupts",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[6]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "mem_size_mb",
		.lname = "SPDK plugin option mem_size_mb",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[7]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "shm_id",
		.lname = "SPDK plugin option shm_id",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[8]),
		.def = "-1",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "enable_sgl",
		.lname = "SPDK plugin option enable_sgl",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[9]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "sge_size",
		.lname = "SPDK plugin option sge_size",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[10]),
		.def = "4096",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "disable_pcie_sgl_merge",
		.lname = "SPDK plugin option disable_pcie_sgl_merge",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[11]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "bit_bucket_data_len",
		.lname = "SPDK plugin option bit_bucket_data_len",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[12]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "pi_act",
		.lname = "SPDK plugin option pi_act",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[13]),
		.def = "1",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "md_per_io_size",
		.lname = "SPDK plugin option md_per_io_size",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[14]),
		.def = "4096",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "apptag",
		.lname = "SPDK plugin option apptag",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[15]),
		.def = "0x1234",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "apptag_mask",
		.lname = "SPDK plugin option apptag_mask",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[16]),
		.def = "0xffff",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "enable_vmd",
		.lname = "SPDK plugin option enable_vmd",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[17]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "spdk_tracing",
		.lname = "SPDK plugin option spdk_tracing",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[18]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "initial_zone_reset",
		.lname = "SPDK plugin option initial_zone_reset",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[19]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "zone_append",
		.lname = "SPDK plugin option zone_append",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, spdk_int[20]),
		.def = "0",
		.help = "Accepted for SPDK job files; no effect here (a notice if not the default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "pi_chk",
		.lname = "SPDK plugin option pi_chk",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, spdk_str[0]),
		.help = "Accepted for SPDK job files; no effect here (a notice if set)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "digest_enable",
		.lname = "SPDK plugin option digest_enable",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, spdk_str[1]),
		.help = "Accepted for SPDK job files; no effect here (a notice if set)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "log_flags",
		.lname = "SPDK plugin option log_flags",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, spdk_str[2]),
		.help = "Accepted for SPDK job files; no effect here (a notice if set)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/*
 * An option left at 0 takes its value from the environment: job files shared with other
 * engines (fio/jobs) cannot name this engine's options.
 */
static unsigned int nvmf_opt_or_env(unsigned int value, const char *env)
{
	const char *s = getenv(env);

	if (value || !s || !*s)
		return value;
	return (unsigned int)strtoul(s, NULL, 10);
}

static void nvmf_log_failure(const char *what, const char *name)
{
	log_err("nvmf: %s%s%s: %s\n", what, name ? " " : "", name ? name : "",
		nvmf_fio_last_error());
}

/* The engine state of td, made on first use (setup in the main thread, or init). */
static struct nvmf_fio_thread *nvmf_thread(struct thread_data *td)
{
	struct nvmf_fio_options *o = td->eo;
	struct nvmf_fio_opts opts;
	int i;

	if (td->io_ops_data)
		return td->io_ops_data;
	opts.kato_s = o->kato;
	opts.io_timeout_s = o->io_timeout;
	opts.reconnect_delay_s = o->reconnect_delay;
	opts.ctrl_loss_tmo_s = o->ctrl_loss_tmo;
	opts.in_capsule = o->in_capsule;
	opts.copy = o->copy;
	opts.idle_spin = nvmf_opt_or_env(o->idle_spin, "NVMF_FIO_IDLE_SPIN");
	opts.idle_sleep_us = nvmf_opt_or_env(o->idle_sleep_us, "NVMF_FIO_IDLE_SLEEP_US");
	opts.hostnqn = o->hostnqn;
	opts.print_qid_mappings = o->print_qid_mappings;
	for (i = 0; i < 21; i++)
		opts.spdk_int[i] = o->spdk_int[i];
	for (i = 0; i < 3; i++)
		opts.spdk_str[i] = o->spdk_str[i];
	td->io_ops_data = nvmf_fio_thread_new(&opts);
	if (!td->io_ops_data)
		nvmf_log_failure("engine state", NULL);
	return td->io_ops_data;
}

/*
 * Runs in fio's main thread before the job starts: connects the controllers and sizes the
 * files from Identify Namespace.
 */
static int nvmf_setup(struct thread_data *td)
{
	struct nvmf_fio_thread *t;
	struct fio_file *f;
	unsigned int i;

	if (!td->o.use_thread) {
		log_err("nvmf: this engine needs fio's thread model: add --thread=1 (thread=1 in a job file)\n");
		return 1;
	}
	t = nvmf_thread(td);
	if (!t)
		return 1;
	for_each_file(td, f, i) {
		uint64_t size = 0;
		uint32_t bs = 0;
		int rc = nvmf_fio_probe(t, f->file_name, &size, &bs);

		if (rc < 0) {
			nvmf_log_failure("setup", f->file_name);
			td_verror(td, -rc, "nvmf_setup");
			return 1;
		}
		f->real_file_size = size;
		f->filetype = FIO_TYPE_BLOCK;
		fio_file_set_size_known(f);
	}
	return 0;
}

static int nvmf_init(struct thread_data *td)
{
	struct nvmf_fio_thread *t = nvmf_thread(td);
	int rc;

	if (!t)
		return 1;
	rc = nvmf_fio_init(t, td->o.iodepth, td_max_bs(td));
	if (rc < 0) {
		nvmf_log_failure("init", NULL);
		td_verror(td, -rc, "nvmf_init");
		return 1;
	}
	return 0;
}

/* fio's I/O buffers come from the engine, so commands can use them without a copy. */
static int nvmf_iomem_alloc(struct thread_data *td, size_t total)
{
	struct nvmf_fio_thread *t = nvmf_thread(td);
	void *mem = NULL;
	int rc;

	if (!t)
		return 1;
	rc = nvmf_fio_iomem_alloc(t, total, td_max_bs(td), td->o.iodepth, td->o.mem_align, &mem);
	if (rc < 0) {
		nvmf_log_failure("I/O memory", NULL);
		return 1;
	}
	td->orig_buffer = mem;
	return 0;
}

static void nvmf_iomem_free(struct thread_data *td)
{
	if (td->io_ops_data)
		nvmf_fio_iomem_free(td->io_ops_data);
}

static int nvmf_open_file(struct thread_data *td, struct fio_file *f)
{
	struct nvmf_fio_thread *t = nvmf_thread(td);
	uint32_t handle = 0;
	int zero_copy = 0;
	int rc;

	if (!t)
		return 1;
	rc = nvmf_fio_open(t, f->file_name, &handle, &zero_copy);
	if (rc < 0) {
		nvmf_log_failure("open", f->file_name);
		td_verror(td, -rc, "nvmf_open_file");
		return 1;
	}
	dprint(FD_FILE, "nvmf: %s: handle %u, %s\n", f->file_name, handle,
	       zero_copy ? "zero copy" : "copying through bounce buffers");
	/* +1: NULL means "not open". */
	FILE_SET_ENG_DATA(f, (void *)(uintptr_t)(handle + 1));
	return 0;
}

static int nvmf_close_file(struct thread_data *td, struct fio_file *f)
{
	uintptr_t h = (uintptr_t)FILE_ENG_DATA(f);

	if (h && td->io_ops_data)
		nvmf_fio_close(td->io_ops_data, (uint32_t)(h - 1));
	FILE_SET_ENG_DATA(f, NULL);
	return 0;
}

/* There is no page cache between fio and the target. */
static int nvmf_invalidate(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static enum fio_q_status nvmf_queue(struct thread_data *td, struct io_u *io_u)
{
	uintptr_t h = (uintptr_t)FILE_ENG_DATA(io_u->file);
	uint32_t op;
	int rc;

	fio_ro_check(td, io_u);

	switch (io_u->ddir) {
	case DDIR_READ:
		op = NVMF_FIO_OP_READ;
		break;
	case DDIR_WRITE:
		op = NVMF_FIO_OP_WRITE;
		break;
	case DDIR_TRIM:
		op = NVMF_FIO_OP_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		op = NVMF_FIO_OP_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	if (!h) {
		io_u->error = EBADF;
		return FIO_Q_COMPLETED;
	}
	/* Submitted at once (no commit step): the engine has nothing to batch. */
	rc = nvmf_fio_queue(td->io_ops_data, (uint32_t)(h - 1), op, io_u->offset, io_u->xfer_buf,
			    io_u->xfer_buflen, (uint64_t)(uintptr_t)io_u);
	if (rc == 0)
		return FIO_Q_QUEUED;
	if (rc == NVMF_FIO_BUSY)
		return FIO_Q_BUSY;
	nvmf_log_failure("queue", io_u->file->file_name);
	io_u->error = -rc;
	return FIO_Q_COMPLETED;
}

static int nvmf_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	int64_t timeout_ns = -1;
	int rc;

	if (t)
		timeout_ns = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
	rc = nvmf_fio_getevents(td->io_ops_data, min, max, timeout_ns);
	if (rc < 0)
		nvmf_log_failure("getevents", NULL);
	return rc;
}

static struct io_u *nvmf_event(struct thread_data *td, int event)
{
	uint64_t tag = 0;
	int err = 0;
	struct io_u *io_u;

	if (nvmf_fio_event(td->io_ops_data, (uint32_t)event, &tag, &err) < 0) {
		/* Cannot happen for 0 <= event < what getevents returned. */
		nvmf_log_failure("event", NULL);
		return NULL;
	}
	io_u = (struct io_u *)(uintptr_t)tag;
	io_u->error = err;
	if (!err)
		io_u->resid = 0;
	return io_u;
}

static void nvmf_cleanup(struct thread_data *td)
{
	if (td->io_ops_data) {
		nvmf_fio_thread_free(td->io_ops_data);
		td->io_ops_data = NULL;
	}
}

/* Exported under this name: fio looks up "ioengine" in an external engine. */
struct ioengine_ops ioengine = {
	.name = "nvmf",
	.version = FIO_IOOPS_VERSION,
	/* As SPDK's fio plugin: raw block I/O, no file extension, no disk util stats, and
	 * aligned buffers (so io_u buffers sit at fixed offsets of the engine's memory). */
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN,
	.setup = nvmf_setup,
	.init = nvmf_init,
	.queue = nvmf_queue,
	.getevents = nvmf_getevents,
	.event = nvmf_event,
	.cleanup = nvmf_cleanup,
	.open_file = nvmf_open_file,
	.close_file = nvmf_close_file,
	.invalidate = nvmf_invalidate,
	.iomem_alloc = nvmf_iomem_alloc,
	.iomem_free = nvmf_iomem_free,
	.option_struct_size = sizeof(struct nvmf_fio_options),
	.options = options,
};

/* Also available as ioengine=nvmf when preloaded (LD_PRELOAD=...so fio --ioengine=nvmf). */
static void fio_init nvmf_fio_register(void)
{
	register_ioengine(&ioengine);
}

static void fio_exit nvmf_fio_unregister(void)
{
	unregister_ioengine(&ioengine);
}
