/*
 * b2b.h: the C half of package verbs.
 *
 * libibverbs is loaded with dlopen (b2b_load) rather than linked, so a b2bd
 * binary built with cgo still starts on a host without rdma-core and reports
 * verbs as unavailable instead of failing in the dynamic loader. Every
 * exported ibv_* symbol is therefore called through the table in b2b.c; the
 * data-path verbs (post_send, post_srq_recv, poll_cq, req_notify_cq) are
 * header inlines that jump through the provider's ops table and need no
 * symbol at all.
 */
#ifndef B2B_VERBS_H
#define B2B_VERBS_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* Return codes of the planner and posting functions (negative, never errno). */
enum {
	B2B_OK = 0,
	B2B_EARG = -1,    /* bad request: caps, cursor or end position */
	B2B_EBOUNDS = -2, /* a block lies outside its region (res.bad_block) */
	B2B_EPOST = -3,   /* ibv_post_send failed (res.post_errno, res.posted) */
};

/* WR kinds, in bits 28..31 of wr_id. */
enum {
	B2B_KIND_DATA = 1,
	B2B_KIND_META = 2,
	B2B_KIND_ACK = 3,
	B2B_KIND_BYE = 4,
	B2B_KIND_PING = 5,
};

/*
 * wr_id layout: the QP's running WR sequence number after this WR (high 32
 * bits), so one signaled completion returns every credit up to it without a
 * side table; the kind; and the first batch block the WR carries, so an
 * error completion names a block.
 */
#define B2B_WRID(seq, kind, blk)                                               \
	(((uint64_t)(uint32_t)(seq) << 32) |                                   \
	 ((uint64_t)((kind)&0xFu) << 28) | ((uint64_t)(blk)&0x0FFFFFFFu))

/* Planner flags. */
enum {
	B2B_PLAN_IMM_LAST = 1, /* the range's last WR is RDMA_WRITE_WITH_IMM */
};

/*
 * One chain request. Go fills it in C memory (no Go pointers, no escape) and
 * the planner advances the cursor (i, off) and seq when the chain is
 * committed (posted, or planned in plan-only mode).
 */
struct b2b_plan {
	uint64_t src_base;  /* local address of src offset 0 (MR address or iova) */
	uint64_t dst_base;  /* remote address of dst offset 0 */
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
};

struct b2b_plan_res {
	uint64_t bytes;      /* payload bytes in the chain */
	uint64_t next_off;   /* cursor after the chain */
	uint32_t next_i;
	uint32_t n_wr;
	uint32_t n_sge;
	uint32_t n_signaled;
	uint32_t done;       /* the cursor reached the end of the range */
	uint32_t bad_block;  /* B2B_EBOUNDS: the offending block */
	uint32_t posted;     /* B2B_EPOST: WRs the device accepted before the bad one */
	int32_t post_errno;  /* B2B_EPOST: ibv_post_send's return value */
};

/* A preallocated chain: WRs, SGEs (max_sge per WR) and the request/result. */
struct b2b_chain {
	struct b2b_plan req;
	struct b2b_plan_res res;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	uint32_t cap_wr;
	uint32_t cap_sge;
};

/* A compact work completion, copied out of struct ibv_wc. */
struct b2b_wc {
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

/* A reusable poll buffer (ibv_wc scratch plus compact output). */
struct b2b_wcbuf {
	struct ibv_wc *raw;
	struct b2b_wc *wc;
	int cap;
};

/* An async event, copied out and already acknowledged. */
struct b2b_async {
	uint32_t type;
	uint32_t qp_num; /* QP events */
	uint32_t port;   /* port events */
	uint32_t pad;
};

int b2b_load(char *err, size_t errlen);
int b2b_have_dmabuf(void);

struct ibv_device **b2b_get_device_list(int *n);
void b2b_free_device_list(struct ibv_device **l);
const char *b2b_device_name(struct ibv_device *d);
struct ibv_context *b2b_open_device(struct ibv_device *d);
int b2b_close_device(struct ibv_context *c);
int b2b_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int b2b_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
int b2b_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *gid16);

struct ibv_pd *b2b_alloc_pd(struct ibv_context *c);
int b2b_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *b2b_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access);
struct ibv_mr *b2b_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len,
				 uint64_t iova, int fd, int access);
int b2b_dereg_mr(struct ibv_mr *mr);

struct ibv_comp_channel *b2b_create_comp_channel(struct ibv_context *c);
int b2b_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *b2b_create_cq(struct ibv_context *c, int cqe,
			     struct ibv_comp_channel *ch);
int b2b_destroy_cq(struct ibv_cq *cq);

struct ibv_srq *b2b_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge);
int b2b_destroy_srq(struct ibv_srq *srq);

struct ibv_qp *b2b_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq,
				struct ibv_cq *rcq, struct ibv_srq *srq,
				uint32_t max_send_wr, uint32_t max_send_sge,
				uint32_t max_inline, uint32_t *caps3);
int b2b_destroy_qp(struct ibv_qp *qp);
uint32_t b2b_qp_num(struct ibv_qp *qp);
int b2b_qp_to_init(struct ibv_qp *qp, uint8_t port, int access);
int b2b_qp_to_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dest_qpn,
		  uint32_t rq_psn, int mtu, int is_global, uint64_t dgid_hi,
		  uint64_t dgid_lo, uint8_t sgid_index, uint16_t dlid,
		  uint8_t min_rnr_timer);
int b2b_qp_to_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout,
		  uint8_t retry_cnt, uint8_t rnr_retry);
int b2b_qp_to_err(struct ibv_qp *qp);
int b2b_qp_state(struct ibv_qp *qp);

const char *b2b_wc_status_str(int status);
const char *b2b_event_type_str(int type);

/* Chains: planning and posting. */
struct b2b_chain *b2b_chain_new(uint32_t cap_wr, uint32_t cap_sge);
void b2b_chain_free(struct b2b_chain *ch);
int b2b_plan(struct b2b_chain *ch, const uint64_t *src, const uint64_t *dst,
	     const uint64_t *len, uint32_t n, int commit);
int b2b_post_chain(struct ibv_qp *qp, struct b2b_chain *ch, const uint64_t *src,
		   const uint64_t *dst, const uint64_t *len, uint32_t n);
int b2b_post_send1(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint32_t imm,
		   uint64_t addr, uint32_t len, uint32_t lkey, int flags);

/* Receives: post idx[0..n) buffers of buf_len bytes at base+idx*buf_len. */
int b2b_srq_post(struct ibv_srq *srq, const uint32_t *idx, int n, uint64_t base,
		 uint32_t buf_len, uint32_t lkey);

/* Completions. */
struct b2b_wcbuf *b2b_wcbuf_new(int cap);
void b2b_wcbuf_free(struct b2b_wcbuf *b);
int b2b_poll(struct ibv_cq *cq, struct b2b_wcbuf *b);
int b2b_arm(struct ibv_cq *cq);
int b2b_set_nonblock(int fd);
int b2b_comp_fd(struct ibv_comp_channel *ch);
int b2b_async_fd(struct ibv_context *c);
int b2b_drain_cq_events(struct ibv_comp_channel *ch);
int b2b_drain_async(struct ibv_context *c, struct b2b_async *out, int cap);

/* Planned-WR accessors (tests, tracing). */
uint64_t b2b_wr_remote(const struct b2b_chain *ch, uint32_t j);
uint32_t b2b_wr_rkey(const struct b2b_chain *ch, uint32_t j);
uint32_t b2b_wr_imm(const struct b2b_chain *ch, uint32_t j);

/* Helpers for Go tests and callers that need C (non-Go-heap) memory. */
void *b2b_alloc(size_t n);
void b2b_free(void *p);

#endif
