/*
 * b2bv.h: the C half of package verbs (prefix b2bv_; internal/dl's C helpers
 * use b2bdl_, gpudirect's use b2b_cuda).
 *
 * One convention at the cgo boundary: every fallible function returns 0 or
 * a negative errno. Values come back through out-parameters (a created
 * handle, a count, the failing WR). Where libibverbs or a provider returns a
 * value of its own (a provider's negative code, which is no errno: mlx5
 * answers a full send queue with -ENOMEM or -2 depending on the path), the
 * value is normalised to -EIO and kept verbatim in a `raw` out-parameter
 * so the Go message can show it. Infallible accessors (qp_num, fds, planned
 * WR fields) return their value. The Go side turns results into errors in
 * one place (callErr in load.go).
 *
 * libibverbs is dlopened through internal/dl (as gpudirect loads libcuda),
 * and the symbols Go resolves are handed to this table (b2bv_set_sym), so a
 * b2bd binary built with cgo still starts on a host without rdma-core. The
 * data-path verbs (ibv_post_send, ibv_post_srq_recv, ibv_poll_cq,
 * ibv_req_notify_cq, and ibv_query_port's extended op) are static inlines in
 * <infiniband/verbs.h> that jump through the provider's ops table in struct
 * ibv_context: they are not exported symbols, there is nothing to dlsym, and
 * they cost no indirection beyond the provider's own.
 *
 * Files: load.c (symbol table), device.c (device list, context, ports,
 * async events), mr.c (PD, MR), cq.c (completion channel, CQ, poll
 * buffers), srq.c, qp.c (QP, state transitions, single sends), plan.c (the
 * one WR planner, for ad hoc chains and prepared plans, RDMA WRITE and
 * READ), chain.c (chains: storage and posting), prep.c (prepared plans:
 * storage and posting), hostmem.c.
 */
#ifndef B2BV_H
#define B2BV_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* WR kinds, in bits 28..31 of wr_id. */
enum {
	B2BV_KIND_DATA = 1,
	B2BV_KIND_META = 2,
	B2BV_KIND_ACK = 3,
	B2BV_KIND_BYE = 4,
	B2BV_KIND_PING = 5,
	B2BV_KIND_READ = 6, /* an RDMA READ's data WR (B2BV_KIND_DATA is a WRITE's) */
};

/* wr_id fields (mirrored by WRID/SplitWRID in types.go). */
#define B2BV_WRID_SEQ_SHIFT 32
#define B2BV_WRID_KIND_SHIFT 28
#define B2BV_WRID_KIND_MASK 0xFu
#define B2BV_WRID_BLOCK_MASK 0x0FFFFFFFu

/*
 * wr_id layout: the QP's running WR sequence number after this WR (high 32
 * bits), so one signaled completion returns every credit up to it without a
 * side table; the kind; and the first batch block the WR carries, so an
 * error completion names a block.
 */
#define B2BV_WRID(seq, kind, blk)                                              \
	(((uint64_t)(uint32_t)(seq) << B2BV_WRID_SEQ_SHIFT) |                  \
	 ((uint64_t)((kind)&B2BV_WRID_KIND_MASK) << B2BV_WRID_KIND_SHIFT) |    \
	 ((uint64_t)(blk)&B2BV_WRID_BLOCK_MASK))

/* sge.length is 32 bits: no WR carries more than this. */
#define B2BV_MAX_WR_BYTES (1u << 31)

/* Planner flags. */
enum {
	B2BV_PLAN_IMM_LAST = 1, /* the range's last WR is RDMA_WRITE_WITH_IMM (WRITE only) */
};

/*
 * One chain request. Go fills it in C memory (no Go pointers, no escape) and
 * the planner advances the cursor (i, off) and seq when the chain is
 * committed (posted, or planned in plan-only mode).
 *
 * src and dst name the direction the bytes move in, whatever the opcode:
 * with IBV_WR_RDMA_WRITE the source is local (SGEs, lkey) and the
 * destination remote (remote_addr, rkey); with IBV_WR_RDMA_READ the source
 * is remote and the destination local. lkey is always the local MR's, rkey
 * the remote's. A WR's remote range is always contiguous; its SGEs gather
 * local pieces (WRITE) or scatter into them (READ).
 */
struct b2bv_plan {
	uint64_t src_base;  /* address of src offset 0 (local MR address or iova for WRITE, remote for READ) */
	uint64_t dst_base;  /* address of dst offset 0 (remote for WRITE, local for READ) */
	uint64_t src_limit; /* bytes of the source region */
	uint64_t dst_limit; /* bytes of the destination region */
	uint64_t max_wr_bytes;    /* one WR carries at most this many bytes */
	uint64_t max_chain_bytes; /* stop the chain once it carries this many (0: no cap) */
	uint64_t off;     /* cursor: offset inside block i */
	uint64_t end_off; /* end: the range stops at (end_i, end_off), exclusive */
	uint32_t i;       /* cursor: block index */
	uint32_t end_i;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t max_wr;  /* WRs per chain (<= chain capacity) */
	uint32_t max_sge; /* SGEs per WR (<= chain capacity) */
	uint32_t signal_every; /* one signaled WR every this many (plus the last) */
	uint32_t inline_max;   /* WRs of at most this many bytes go inline (0: never) */
	uint32_t imm;          /* immediate for the last WR (host order) */
	uint32_t flags;
	uint32_t seq; /* the QP's WR sequence number before this chain */
	uint32_t op;  /* IBV_WR_RDMA_WRITE (0) or IBV_WR_RDMA_READ; READ never goes inline */
};

/*
 * The planner's and poster's out-parameters. b2bv_plan and b2bv_post_chain
 * return 0 or -errno: -EINVAL for a bad request (caps, cursor or end),
 * -ERANGE for a block outside its region (bad_block), and ibv_post_send's
 * error when the device refused a WR (post_failed = 1, bad_wr = the index
 * of the refused WR = how many the device accepted, post_raw = what
 * ibv_post_send returned).
 */
struct b2bv_plan_res {
	uint64_t bytes;      /* payload bytes in the chain */
	uint64_t next_off;   /* cursor after the chain */
	uint32_t next_i;
	uint32_t n_wr;
	uint32_t n_sge;
	uint32_t n_signaled;
	uint32_t done;       /* the cursor reached the end of the range */
	uint32_t bad_block;  /* -ERANGE: the offending block */
	uint32_t post_failed; /* ibv_post_send refused WR bad_wr */
	uint32_t bad_wr;     /* post_failed: WRs the device accepted before it */
	int32_t post_raw;    /* post_failed: ibv_post_send's own return value */
	uint32_t pad;
	uint64_t plan_ns;    /* b2bv_post_chain: time spent planning */
	uint64_t post_ns;    /* b2bv_post_chain: time spent in ibv_post_send */
};

/* A preallocated chain: WRs, their SGEs (cap_sge fixed slots per WR) and
 * the request/result. */
struct b2bv_chain {
	struct b2bv_plan req;
	struct b2bv_plan_res res;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	uint32_t cap_wr;
	uint32_t cap_sge;
};

/*
 * A prepared plan (plan.c builds it, prep.c posts it): a batch planned
 * once, each QP's share into its own WR array (chained, the last WR
 * signaled, one WR signaled every signal_every; a WRITE plan's last WR is
 * WRITE_WITH_IMM) with packed SGEs. A share is posted in sub-ranges from
 * its cursor (next, seq); Go sets the cursor per submit.
 */
enum { B2BV_PPLAN_MAX_SHARES = 256 };

struct b2bv_pshare {
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	uint32_t *wrbytes; /* payload bytes of each WR */
	uint64_t bytes;    /* payload bytes of the share */
	uint64_t bytes_posted; /* the last post's payload bytes */
	uint32_t n_wr;
	uint32_t n_sge;
	/* cursor: the next WR to post and the QP's sequence number before it */
	uint32_t next;
	uint32_t seq;
	/* the last post: WRs the device accepted; post_failed/post_raw as in b2bv_plan_res */
	uint32_t posted;
	uint32_t post_failed;
	int32_t post_raw;
	uint32_t pad;
};

struct b2bv_pplan {
	uint64_t loc_base; /* the local base the SGEs are stamped with (src for WRITE, dst for READ) */
	uint64_t n_wr, n_sge, bytes;
	uint32_t lkey;     /* the lkey the SGEs are stamped with */
	uint32_t nshare;
	uint32_t signal_every;
	uint32_t op;       /* IBV_WR_RDMA_WRITE or IBV_WR_RDMA_READ */
	struct b2bv_pshare *shares; /* = share, for Go (cgo cannot index a flexible array) */
	struct b2bv_pshare share[];
};

/* A compact work completion, copied out of struct ibv_wc. */
struct b2bv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t qp_num;
	uint32_t imm; /* host order; valid when flags has IBV_WC_WITH_IMM */
	uint32_t byte_len;
	uint32_t vendor_err;
	uint32_t flags;
	uint32_t pad;
};

/*
 * A reusable poll buffer (ibv_wc scratch plus compact output). The count
 * and the provider's raw result live here, not in Go out-parameters, so a
 * poll passes no Go pointer and allocates nothing.
 */
struct b2bv_wcbuf {
	struct ibv_wc *raw;
	struct b2bv_wc *wc;
	int cap;
	int n;      /* completions stored by the last poll */
	int rc_raw; /* the last poll's ibv_poll_cq result when it failed */
};

/* An async event, copied out and already acknowledged. */
struct b2bv_async {
	uint32_t type;
	uint32_t qp_num; /* QP events */
	uint32_t port;   /* port events */
	uint32_t pad;
};

/* RC QP attributes fixed by b2bd (see qp.c). */
enum {
	B2BV_PKEY_INDEX = 0,
	B2BV_HOP_LIMIT = 64,    /* RoCE v2 GRH hop limit */
	B2BV_RD_ATOMIC_MIN = 1, /* what max_rd_atomic 0 (not given) stands for */
	B2BV_PSN_MASK = 0xFFFFFF, /* PSNs are 24 bits */
};

/* Receives posted per ibv_post_srq_recv call (stack arrays in srq.c). */
enum { B2BV_SRQ_POST_BATCH = 64 };

/* Loading (load.c). */
int b2bv_nsyms(void);
const char *b2bv_sym_name(int k, int *required);
int b2bv_set_sym(int k, void *p);
int b2bv_have_dmabuf(void);
const char *b2bv_wc_status_str(int status);
const char *b2bv_event_type_str(int type);

/* Devices and contexts (device.c). */
int b2bv_get_device_list(struct ibv_device ***out, int *n);
void b2bv_free_device_list(struct ibv_device **l);
const char *b2bv_device_name(struct ibv_device *d);
int b2bv_open_device(struct ibv_device *d, struct ibv_context **out);
int b2bv_close_device(struct ibv_context *c);
int b2bv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int b2bv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
int b2bv_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *gid16);
int b2bv_async_fd(struct ibv_context *c);
int b2bv_drain_async(struct ibv_context *c, struct b2bv_async *out, int cap, int *n);
int b2bv_set_nonblock(int fd);

/* Protection domains and memory regions (mr.c). */
int b2bv_alloc_pd(struct ibv_context *c, struct ibv_pd **out);
int b2bv_dealloc_pd(struct ibv_pd *pd);
int b2bv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access,
		struct ibv_mr **out);
int b2bv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len,
		       uint64_t iova, int fd, int access, struct ibv_mr **out);
int b2bv_dereg_mr(struct ibv_mr *mr);

/* Completion channels, CQs, polling (cq.c). */
int b2bv_create_comp_channel(struct ibv_context *c, struct ibv_comp_channel **out);
int b2bv_destroy_comp_channel(struct ibv_comp_channel *ch);
int b2bv_comp_fd(struct ibv_comp_channel *ch);
int b2bv_drain_cq_events(struct ibv_comp_channel *ch, int *n);
int b2bv_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch,
		   struct ibv_cq **out);
int b2bv_destroy_cq(struct ibv_cq *cq);
int b2bv_wcbuf_new(int cap, struct b2bv_wcbuf **out);
void b2bv_wcbuf_free(struct b2bv_wcbuf *b);
int b2bv_poll(struct ibv_cq *cq, struct b2bv_wcbuf *b);
int b2bv_arm(struct ibv_cq *cq, int *raw);

/* Shared receive queues (srq.c). */
int b2bv_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge,
		    struct ibv_srq **out);
int b2bv_destroy_srq(struct ibv_srq *srq);
/* Posts idx[0..n) buffers of buf_len bytes at base+idx*buf_len. */
int b2bv_srq_post(struct ibv_srq *srq, const uint32_t *idx, int n, uint64_t base,
		  uint32_t buf_len, uint32_t lkey, int *raw);

/* Queue pairs (qp.c). */
int b2bv_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		      struct ibv_srq *srq, uint32_t max_send_wr,
		      uint32_t max_send_sge, uint32_t max_inline,
		      uint32_t *caps3, struct ibv_qp **out);
int b2bv_destroy_qp(struct ibv_qp *qp);
uint32_t b2bv_qp_num(struct ibv_qp *qp);
int b2bv_qp_to_init(struct ibv_qp *qp, uint8_t port, int access, int *raw);
int b2bv_qp_to_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dest_qpn,
		   uint32_t rq_psn, int mtu, int is_global, uint64_t dgid_hi,
		   uint64_t dgid_lo, uint8_t sgid_index, uint16_t dlid,
		   uint8_t min_rnr_timer, uint8_t max_dest_rd_atomic, int *raw);
int b2bv_qp_to_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout,
		   uint8_t retry_cnt, uint8_t rnr_retry, uint8_t max_rd_atomic, int *raw);
int b2bv_qp_to_err(struct ibv_qp *qp, int *raw);
int b2bv_qp_state(struct ibv_qp *qp, int *state);
int b2bv_post_send1(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint32_t imm,
		    uint64_t addr, uint32_t len, uint32_t lkey, int flags, int *raw);

/* Chains (chain.c) and the planner (plan.c). */
int b2bv_chain_new(uint32_t cap_wr, uint32_t cap_sge, struct b2bv_chain **out);
void b2bv_chain_free(struct b2bv_chain *ch);
int b2bv_plan(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
	      const uint64_t *len, uint32_t n, int commit);
int b2bv_post_chain(struct ibv_qp *qp, struct b2bv_chain *ch, const uint64_t *src,
		    const uint64_t *dst, const uint64_t *len, uint32_t n);
/* Planned-WR accessors (tests, tracing). */
uint64_t b2bv_wr_remote(const struct b2bv_chain *ch, uint32_t j);
uint32_t b2bv_wr_rkey(const struct b2bv_chain *ch, uint32_t j);
uint32_t b2bv_wr_imm(const struct b2bv_chain *ch, uint32_t j);

/* Prepared plans (built in plan.c, posted in prep.c). cuts holds nq+1
 * (block, offset) pairs. */
int b2bv_pplan_build(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
		     const uint64_t *len, uint32_t n, const uint64_t *cuts, uint32_t nq,
		     struct b2bv_pplan **out, uint32_t *bad_block);
void b2bv_pplan_free(struct b2bv_pplan *p);
void b2bv_pplan_restamp(struct b2bv_pplan *p, uint32_t lkey, uint64_t loc_base);
/* Posts share q from its cursor: at most max_wr WRs, stopping once max_bytes
 * (0: no cap) are reached; qp NULL patches without posting (benchmarks). */
int b2bv_pplan_post(struct ibv_qp *qp, struct b2bv_pplan *p, uint32_t q, uint32_t max_wr,
		    uint64_t max_bytes, uint32_t tag);
uint64_t b2bv_pwr_remote(const struct b2bv_pplan *p, uint32_t q, uint32_t j);
uint32_t b2bv_pwr_rkey(const struct b2bv_pplan *p, uint32_t q, uint32_t j);
uint32_t b2bv_pwr_imm(const struct b2bv_pplan *p, uint32_t q, uint32_t j);

/*
 * Block-id requests (docs/kv.md): a layout pair's fused segment groups and
 * its regions, copied into C memory once per pair (b2bv_btab), and a
 * per-QP cursor (b2bv_bcur) that expands packed ids into runs chunk by
 * chunk and plans them with plan_span. Runs match layout.Pair.Expand:
 * group-major, request order within a group, and in a group whose stride
 * equals its block on both sides consecutive ids merge into one run.
 *
 * src/dst name the direction the bytes move (as struct b2bv_plan): for a
 * WRITE the src regions are local (addr = MR address, key = lkey) and the
 * dst regions remote (addr = remote address, key = rkey); for a READ the
 * other way round.
 */
struct b2bv_bgroup {
	uint64_t src_base, dst_base;     /* offset of block 0 in its region */
	uint64_t src_stride, dst_stride; /* bytes between blocks b and b+1 */
	uint64_t block_len;              /* the group's fused block */
	uint32_t src_region, dst_region; /* indices into src / dst regions */
	uint32_t mergeable;              /* stride == block_len on both sides */
	uint32_t pad;
};

struct b2bv_bregion {
	uint64_t addr;  /* address of offset 0 */
	uint64_t limit; /* region bytes: no WR leaves them */
	uint32_t key;   /* lkey (local side) or rkey (remote side) */
	uint32_t pad;
};

struct b2bv_btab {
	struct b2bv_bgroup *g;
	struct b2bv_bregion *src, *dst;
	uint32_t ngroups, nsrc, ndst, pad;
};

/*
 * A QP's share of a request: the range [(g, e), (end_g, end_e)) in (group,
 * id entry) and the chunk of expanded runs not yet fully planned (runs
 * 0..n of group cg, span cursor (i, off) inside them).
 */
struct b2bv_bcur {
	uint64_t *src, *dst, *len; /* chunk: region offsets and lengths */
	uint32_t *first;           /* chunk: each run's first entry */
	uint64_t off;
	uint32_t g, e, end_g, end_e;
	uint32_t n, i, cg, cap;
	uint32_t bad_group, bad_entry; /* -ERANGE: the run outside its region */
};

int b2bv_btab_new(uint32_t ngroups, uint32_t nsrc, uint32_t ndst, struct b2bv_btab **out);
void b2bv_btab_free(struct b2bv_btab *t);
int b2bv_bcur_new(uint32_t cap, struct b2bv_bcur **out);
void b2bv_bcur_free(struct b2bv_bcur *c);
/* Expands at most max runs of one group from c's range cursor into out
 * arrays (the test hook; posting expands into c's chunk). Returns the count. */
uint32_t b2bv_bexpand(const struct b2bv_btab *t, const uint32_t *sid, const uint32_t *did, uint32_t nids,
		      struct b2bv_bcur *c, uint32_t max, uint64_t *src, uint64_t *dst, uint64_t *len,
		      uint32_t *first, uint32_t *group);
/* Plans the next chain of c's range into ch (ch->req gives op, caps,
 * signalling, seq, imm and B2BV_PLAN_IMM_LAST; bases, limits and keys come
 * from t per group), and posts it with one ibv_post_send unless qp is NULL.
 * Results and errors as b2bv_post_chain; -ERANGE names c->bad_group/bad_entry. */
int b2bv_bpost_chain(struct ibv_qp *qp, struct b2bv_chain *ch, const struct b2bv_btab *t,
		     struct b2bv_bcur *c, const uint32_t *sid, const uint32_t *did, uint32_t nids);

/* C (non-Go-heap) memory for control buffers and tests (hostmem.c). */
int b2bv_alloc(size_t n, void **out);
void b2bv_free(void *p);

#endif
