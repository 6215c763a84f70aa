/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The C interface of the Rust static library (crate nvmf-fio, fio/src/ffi.rs) that the fio
 * shim (nvmf_fio.c) calls. No fio types appear here: the shim translates.
 *
 * Contract: a struct nvmf_fio_thread belongs to one fio thread and is used by one OS thread
 * at a time; strings are NUL-terminated; out pointers may be NULL; an I/O's buffer stays
 * valid and untouched until its event has been returned by nvmf_fio_event.
 * Functions returning int give 0 (or a count) on success and a negative errno on failure;
 * nvmf_fio_last_error() then has the message.
 */
#ifndef NVMF_FIO_H
#define NVMF_FIO_H

#include <stddef.h>
#include <stdint.h>

struct nvmf_fio_thread;

struct nvmf_fio_opts {
	uint32_t kato_s;            /* Keep Alive Timeout, seconds; 0: none */
	uint32_t io_timeout_s;      /* I/O command timeout, seconds */
	uint32_t reconnect_delay_s; /* seconds between reconnects; 0: no reconnect */
	uint32_t ctrl_loss_tmo_s;   /* give up reconnecting after this; 0: never */
	uint32_t in_capsule;        /* small writes in the command capsule */
	uint32_t copy;              /* always copy through bounce buffers */
	uint32_t idle_spin;         /* empty polls before getevents gives the CPU away; 0: never */
	uint32_t idle_sleep_us;     /* then sleep this long; 0: sched_yield */
	/* SPDK's fio plugin options, so its job files run unchanged (fio/src/spdk_options.rs) */
	const char *hostnqn;        /* NULL: the file name's hostnqn=, else the default */
	uint32_t print_qid_mappings;
	int32_t spdk_int[21];       /* no effect here; order of nvmf_spdk_int_names in the shim */
	const char *spdk_str[3];    /* pi_chk, digest_enable, log_flags; NULL: not set */
};

enum nvmf_fio_op {
	NVMF_FIO_OP_READ = 0,
	NVMF_FIO_OP_WRITE = 1,
	NVMF_FIO_OP_TRIM = 2,
	NVMF_FIO_OP_FLUSH = 3,
};

/* nvmf_fio_queue: retry after reaping completions. */
#define NVMF_FIO_BUSY 1

struct nvmf_fio_thread *nvmf_fio_thread_new(const struct nvmf_fio_opts *opts);
void nvmf_fio_thread_free(struct nvmf_fio_thread *t);

/* Connects (or reuses) the file's controller: namespace size in bytes, block size. */
int nvmf_fio_probe(struct nvmf_fio_thread *t, const char *filename, uint64_t *size,
		   uint32_t *block_size);
int nvmf_fio_init(struct nvmf_fio_thread *t, uint32_t iodepth, uint64_t max_bs);
int nvmf_fio_iomem_alloc(struct nvmf_fio_thread *t, size_t total, uint64_t max_bs,
			 uint32_t units, uint32_t mem_align, void **out);
void nvmf_fio_iomem_free(struct nvmf_fio_thread *t);
int nvmf_fio_open(struct nvmf_fio_thread *t, const char *filename, uint32_t *handle,
		  int *zero_copy);
int nvmf_fio_close(struct nvmf_fio_thread *t, uint32_t handle);
/* 0: queued; NVMF_FIO_BUSY: no room now; < 0: -errno, failed at once. */
int nvmf_fio_queue(struct nvmf_fio_thread *t, uint32_t handle, uint32_t op, uint64_t offset,
		   void *buf, uint64_t len, uint64_t tag);
/* At least min and at most max events; timeout_ns < 0 waits without limit. */
int nvmf_fio_getevents(struct nvmf_fio_thread *t, uint32_t min, uint32_t max,
		       int64_t timeout_ns);
int nvmf_fio_event(struct nvmf_fio_thread *t, uint32_t i, uint64_t *tag, int *err);
const char *nvmf_fio_last_error(void);

#endif
