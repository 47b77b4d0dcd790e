//go:build cgo && linux

/*
 * b2b.c: libibverbs loading, thin wrappers, the WR chain planner/poster and
 * the completion helpers of package verbs. See b2b.h.
 */
#define _GNU_SOURCE
#include "b2b.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* Loading. */

static struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_srq *(*create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
	int (*destroy_srq)(struct ibv_srq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
	void (*ack_async_event)(struct ibv_async_event *);
	const char *(*wc_status_str)(enum ibv_wc_status);
	const char *(*event_type_str)(enum ibv_event_type);
} B;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_err[512];
static int load_rc = -1;

#define SYM(field, name, required)                                             \
	do {                                                                   \
		*(void **)(&B.field) = dlsym(h, name);                         \
		if (!B.field && (required)) {                                  \
			snprintf(load_err, sizeof(load_err),                   \
				 "%s lacks symbol %s", lib, name);             \
			return;                                                \
		}                                                              \
	} while (0)

static void do_load(void)
{
	static const char *libs[] = {"libibverbs.so.1", "libibverbs.so"};
	const char *lib = NULL;
	void *h = NULL;
	for (size_t k = 0; k < sizeof(libs) / sizeof(libs[0]) && !h; k++) {
		lib = libs[k];
		h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	}
	if (!h) {
		const char *e = dlerror();
		snprintf(load_err, sizeof(load_err),
			 "dlopen libibverbs.so.1: %s (install rdma-core/libibverbs1)",
			 e ? e : "not found");
		return;
	}
	SYM(get_device_list, "ibv_get_device_list", 1);
	SYM(free_device_list, "ibv_free_device_list", 1);
	SYM(get_device_name, "ibv_get_device_name", 1);
	SYM(open_device, "ibv_open_device", 1);
	SYM(close_device, "ibv_close_device", 1);
	SYM(query_device, "ibv_query_device", 1);
	SYM(query_port, "ibv_query_port", 1);
	SYM(query_gid, "ibv_query_gid", 1);
	SYM(alloc_pd, "ibv_alloc_pd", 1);
	SYM(dealloc_pd, "ibv_dealloc_pd", 1);
	SYM(reg_mr, "ibv_reg_mr", 1);
	SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 0); /* rdma-core >= 34 */
	SYM(dereg_mr, "ibv_dereg_mr", 1);
	SYM(create_comp_channel, "ibv_create_comp_channel", 1);
	SYM(destroy_comp_channel, "ibv_destroy_comp_channel", 1);
	SYM(create_cq, "ibv_create_cq", 1);
	SYM(destroy_cq, "ibv_destroy_cq", 1);
	SYM(get_cq_event, "ibv_get_cq_event", 1);
	SYM(ack_cq_events, "ibv_ack_cq_events", 1);
	SYM(create_srq, "ibv_create_srq", 1);
	SYM(destroy_srq, "ibv_destroy_srq", 1);
	SYM(create_qp, "ibv_create_qp", 1);
	SYM(modify_qp, "ibv_modify_qp", 1);
	SYM(query_qp, "ibv_query_qp", 1);
	SYM(destroy_qp, "ibv_destroy_qp", 1);
	SYM(get_async_event, "ibv_get_async_event", 1);
	SYM(ack_async_event, "ibv_ack_async_event", 1);
	SYM(wc_status_str, "ibv_wc_status_str", 1);
	SYM(event_type_str, "ibv_event_type_str", 1);
	load_rc = 0;
}

int b2b_load(char *err, size_t errlen)
{
	pthread_once(&load_once, do_load);
	if (load_rc != 0 && err && errlen)
		snprintf(err, errlen, "%s", load_err);
	return load_rc;
}

int b2b_have_dmabuf(void) { return B.reg_dmabuf_mr != NULL; }

/* ---------------------------------------------------------------------- */
/* Thin wrappers: each returns what libibverbs returns, errno intact. */

struct ibv_device **b2b_get_device_list(int *n) { return B.get_device_list(n); }
void b2b_free_device_list(struct ibv_device **l) { B.free_device_list(l); }
const char *b2b_device_name(struct ibv_device *d) { return B.get_device_name(d); }
struct ibv_context *b2b_open_device(struct ibv_device *d) { return B.open_device(d); }
int b2b_close_device(struct ibv_context *c) { return B.close_device(c); }
int b2b_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	return B.query_device(c, a);
}

/* Mirrors verbs.h's ___ibv_query_port: prefer the extended op. */
int b2b_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
	if (!vctx) {
		memset(a, 0, sizeof(*a));
		return B.query_port(c, port, (struct _compat_ibv_port_attr *)a);
	}
	return vctx->query_port(c, port, a, sizeof(*a));
}

int b2b_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *gid16)
{
	union ibv_gid g;
	int rc = B.query_gid(c, port, index, &g);
	if (rc == 0)
		memcpy(gid16, g.raw, 16);
	return rc;
}

struct ibv_pd *b2b_alloc_pd(struct ibv_context *c) { return B.alloc_pd(c); }
int b2b_dealloc_pd(struct ibv_pd *pd) { return B.dealloc_pd(pd); }
struct ibv_mr *b2b_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access)
{
	return B.reg_mr(pd, (void *)addr, len, access);
}
struct ibv_mr *b2b_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len,
				 uint64_t iova, int fd, int access)
{
	if (!B.reg_dmabuf_mr) {
		errno = ENOSYS;
		return NULL;
	}
	return B.reg_dmabuf_mr(pd, off, len, iova, fd, access);
}
int b2b_dereg_mr(struct ibv_mr *mr) { return B.dereg_mr(mr); }

struct ibv_comp_channel *b2b_create_comp_channel(struct ibv_context *c)
{
	return B.create_comp_channel(c);
}
int b2b_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	return B.destroy_comp_channel(ch);
}
struct ibv_cq *b2b_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch)
{
	return B.create_cq(c, cqe, NULL, ch, 0);
}
int b2b_destroy_cq(struct ibv_cq *cq) { return B.destroy_cq(cq); }

struct ibv_srq *b2b_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge)
{
	struct ibv_srq_init_attr a;
	memset(&a, 0, sizeof(a));
	a.attr.max_wr = max_wr;
	a.attr.max_sge = max_sge;
	return B.create_srq(pd, &a);
}
int b2b_destroy_srq(struct ibv_srq *srq) { return B.destroy_srq(srq); }

struct ibv_qp *b2b_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq,
				struct ibv_cq *rcq, struct ibv_srq *srq,
				uint32_t max_send_wr, uint32_t max_send_sge,
				uint32_t max_inline, uint32_t *caps3)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0; /* selective signaling */
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_inline_data = max_inline;
	a.cap.max_recv_wr = srq ? 0 : 1;
	a.cap.max_recv_sge = srq ? 0 : 1;
	struct ibv_qp *qp = B.create_qp(pd, &a);
	if (qp && caps3) {
		/* The provider may round up: report what we really got. */
		caps3[0] = a.cap.max_send_wr;
		caps3[1] = a.cap.max_send_sge;
		caps3[2] = a.cap.max_inline_data;
	}
	return qp;
}
int b2b_destroy_qp(struct ibv_qp *qp) { return B.destroy_qp(qp); }
uint32_t b2b_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

int b2b_qp_to_init(struct ibv_qp *qp, uint8_t port, int access)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return B.modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS);
}

int b2b_qp_to_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dest_qpn,
		  uint32_t rq_psn, int mtu, int is_global, uint64_t dgid_hi,
		  uint64_t dgid_lo, uint8_t sgid_index, uint16_t dlid,
		  uint8_t min_rnr_timer)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn & 0xFFFFFF;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.port_num = port;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	if (is_global) {
		a.ah_attr.is_global = 1;
		for (int k = 0; k < 8; k++) {
			a.ah_attr.grh.dgid.raw[k] = (uint8_t)(dgid_hi >> (56 - 8 * k));
			a.ah_attr.grh.dgid.raw[8 + k] = (uint8_t)(dgid_lo >> (56 - 8 * k));
		}
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.traffic_class = 0;
		a.ah_attr.grh.flow_label = 0;
	}
	return B.modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int b2b_qp_to_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout,
		  uint8_t retry_cnt, uint8_t rnr_retry)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn & 0xFFFFFF;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = rnr_retry;
	a.max_rd_atomic = 1;
	return B.modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				   IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_MAX_QP_RD_ATOMIC);
}

int b2b_qp_to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	return B.modify_qp(qp, &a, IBV_QP_STATE);
}

int b2b_qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = B.query_qp(qp, &a, IBV_QP_STATE, &ia);
	if (rc)
		return -rc;
	return (int)a.qp_state;
}

const char *b2b_wc_status_str(int s) { return B.wc_status_str((enum ibv_wc_status)s); }
const char *b2b_event_type_str(int t) { return B.event_type_str((enum ibv_event_type)t); }

/* ---------------------------------------------------------------------- */
/* Chains. */

struct b2b_chain *b2b_chain_new(uint32_t cap_wr, uint32_t cap_sge)
{
	if (cap_wr == 0 || cap_sge == 0)
		return NULL;
	struct b2b_chain *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->wr = calloc(cap_wr, sizeof(*ch->wr));
	ch->sge = calloc((size_t)cap_wr * cap_sge, sizeof(*ch->sge));
	if (!ch->wr || !ch->sge) {
		free(ch->wr);
		free(ch->sge);
		free(ch);
		return NULL;
	}
	ch->cap_wr = cap_wr;
	ch->cap_sge = cap_sge;
	for (uint32_t j = 0; j < cap_wr; j++)
		ch->wr[j].sg_list = &ch->sge[(size_t)j * cap_sge];
	return ch;
}

void b2b_chain_free(struct b2b_chain *ch)
{
	if (!ch)
		return;
	free(ch->wr);
	free(ch->sge);
	free(ch);
}

/* off..off+n inside a region of limit bytes, without overflow. */
static inline int in_range(uint64_t off, uint64_t n, uint64_t limit)
{
	return n <= limit && off <= limit - n;
}

/*
 * b2b_plan builds one chain from the cursor (req.i, req.off) towards the end
 * (req.end_i, req.end_off) of a batch's block arrays:
 *  - a WR starts at the cursor; while the next block's destination follows
 *    the WR's on the remote side, the block joins the WR: merged into the
 *    last SGE when its source also follows (adjacent on both sides), or as
 *    a new SGE (gather) while the WR has fewer than max_sge;
 *  - a WR never carries more than max_wr_bytes; only a block bigger than
 *    that is cut, and blocks never straddle WRs otherwise;
 *  - the chain stops at max_wr WRs, or once it carries max_chain_bytes;
 *  - WR j is signaled when (j+1) % signal_every == 0, and the chain's last
 *    WR always is, so every posted WR's credit comes back;
 *  - when the chain reaches the end and B2B_PLAN_IMM_LAST is set, its last
 *    WR is RDMA_WRITE_WITH_IMM carrying req.imm.
 * Every block touched is bounds-checked against both regions first; nothing
 * is committed on error.
 */
int b2b_plan(struct b2b_chain *ch, const uint64_t *src, const uint64_t *dst,
	     const uint64_t *len, uint32_t n, int commit)
{
	struct b2b_plan *r = &ch->req;
	struct b2b_plan_res *res = &ch->res;
	memset(res, 0, sizeof(*res));

	uint32_t maxwr = r->max_wr < ch->cap_wr ? r->max_wr : ch->cap_wr;
	uint32_t maxsge = r->max_sge < ch->cap_sge ? r->max_sge : ch->cap_sge;
	uint64_t wrcap = r->max_wr_bytes;
	if (wrcap == 0 || wrcap > (1u << 31))
		wrcap = 1u << 31; /* sge.length is 32 bits */
	uint32_t k = r->signal_every ? r->signal_every : 1;
	if (maxwr == 0 || maxsge == 0)
		return B2B_EARG;
	if (r->end_i > n || (r->end_i == n && r->end_off != 0))
		return B2B_EARG;
	if (r->end_i < n && r->end_off > len[r->end_i])
		return B2B_EARG;

	uint32_t i = r->i;
	uint64_t off = r->off;
	uint32_t end_i = r->end_i;
	uint64_t end_off = r->end_off;
	if (i > end_i || (i < n && off > len[i]) || (i == n && off != 0))
		return B2B_EARG;

	/* limit(i): where block i stops inside this range. */
#define LIMIT(x) ((x) == end_i ? end_off : len[(x)])
#define AT_END(x, o) ((x) > end_i || ((x) == end_i && (o) >= end_off))

	uint32_t nwr = 0, nsge_total = 0, nsig = 0;
	uint64_t chain_bytes = 0;
	uint32_t seq = r->seq;

	while (nwr < maxwr) {
		if (nwr > 0 && r->max_chain_bytes && chain_bytes >= r->max_chain_bytes)
			break;
		/* Skip exhausted pieces and zero-length blocks. */
		while (!AT_END(i, off) && off >= LIMIT(i)) {
			i++;
			off = 0;
		}
		if (AT_END(i, off))
			break;
		if (!in_range(src[i], len[i], r->src_limit) ||
		    !in_range(dst[i], len[i], r->dst_limit)) {
			res->bad_block = i;
			return B2B_EBOUNDS;
		}

		struct ibv_send_wr *wr = &ch->wr[nwr];
		struct ibv_sge *sg = wr->sg_list;
		uint64_t take = LIMIT(i) - off;
		if (take > wrcap)
			take = wrcap;
		uint32_t first = i;
		uint64_t remote = dst[i] + off;
		uint64_t src_end = src[i] + off + take; /* offsets, for merging */
		uint64_t dst_end = remote + take;
		sg[0].addr = r->src_base + src[i] + off;
		sg[0].length = (uint32_t)take;
		sg[0].lkey = r->lkey;
		uint32_t nsge = 1;
		uint64_t wrbytes = take;
		off += take;

		/* Extend across following blocks only once block i is whole. */
		while (off >= LIMIT(i) && wrbytes < wrcap) {
			uint32_t j = i + 1;
			/* zero-length blocks carry nothing: step over them */
			while (!AT_END(j, 0) && LIMIT(j) == 0)
				j++;
			if (AT_END(j, 0))
				break;
			uint64_t p = LIMIT(j);
			if (dst[j] != dst_end || wrbytes + p > wrcap)
				break;
			if (!in_range(src[j], len[j], r->src_limit) ||
			    !in_range(dst[j], len[j], r->dst_limit)) {
				res->bad_block = j;
				return B2B_EBOUNDS;
			}
			if (src[j] == src_end) {
				sg[nsge - 1].length += (uint32_t)p; /* merge */
			} else if (nsge < maxsge) {
				sg[nsge].addr = r->src_base + src[j];
				sg[nsge].length = (uint32_t)p;
				sg[nsge].lkey = r->lkey;
				nsge++; /* gather */
			} else {
				break;
			}
			src_end = src[j] + p;
			dst_end += p;
			wrbytes += p;
			i = j;
			off = p;
		}

		wr->num_sge = (int)nsge;
		wr->opcode = IBV_WR_RDMA_WRITE;
		wr->send_flags = 0;
		if (r->inline_max && wrbytes <= r->inline_max)
			wr->send_flags |= IBV_SEND_INLINE;
		wr->wr.rdma.remote_addr = r->dst_base + remote;
		wr->wr.rdma.rkey = r->rkey;
		wr->imm_data = 0;
		seq++;
		wr->wr_id = B2B_WRID(seq, B2B_KIND_DATA, first);
		if ((nwr + 1) % k == 0) {
			wr->send_flags |= IBV_SEND_SIGNALED;
			nsig++;
		}
		wr->next = &ch->wr[nwr + 1];
		nwr++;
		nsge_total += nsge;
		chain_bytes += wrbytes;
	}

	/* Normalise the cursor so done is exact. */
	while (!AT_END(i, off) && off >= LIMIT(i)) {
		i++;
		off = 0;
	}
	res->done = AT_END(i, off) ? 1 : 0;
	if (res->done) {
		i = end_i;
		off = end_off;
	}
#undef LIMIT
#undef AT_END

	if (nwr > 0) {
		struct ibv_send_wr *last = &ch->wr[nwr - 1];
		last->next = NULL;
		if (!(last->send_flags & IBV_SEND_SIGNALED)) {
			last->send_flags |= IBV_SEND_SIGNALED;
			nsig++;
		}
		if (res->done && (r->flags & B2B_PLAN_IMM_LAST)) {
			last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			last->imm_data = htonl(r->imm);
		}
	}
	res->n_wr = nwr;
	res->n_sge = nsge_total;
	res->n_signaled = nsig;
	res->bytes = chain_bytes;
	res->next_i = i;
	res->next_off = off;
	if (commit) {
		r->i = i;
		r->off = off;
		r->seq = seq;
	}
	return B2B_OK;
}

int b2b_post_chain(struct ibv_qp *qp, struct b2b_chain *ch, const uint64_t *src,
		   const uint64_t *dst, const uint64_t *len, uint32_t n)
{
	int rc = b2b_plan(ch, src, dst, len, n, 0);
	if (rc != B2B_OK || ch->res.n_wr == 0) {
		if (rc == B2B_OK) {
			ch->req.i = ch->res.next_i;
			ch->req.off = ch->res.next_off;
		}
		return rc;
	}
	struct ibv_send_wr *bad = NULL;
	int e = ibv_post_send(qp, ch->wr, &bad);
	if (e) {
		uint32_t posted = 0;
		if (bad && bad >= ch->wr && bad < ch->wr + ch->res.n_wr)
			posted = (uint32_t)(bad - ch->wr);
		ch->res.posted = posted;
		ch->res.post_errno = e;
		ch->req.seq += posted; /* the device owns those; keep credits exact */
		return B2B_EPOST;
	}
	ch->res.posted = ch->res.n_wr;
	ch->req.i = ch->res.next_i;
	ch->req.off = ch->res.next_off;
	ch->req.seq += ch->res.n_wr;
	return B2B_OK;
}

/* One WR: SEND, SEND_WITH_IMM or a zero-length WRITE_WITH_IMM. */
int b2b_post_send1(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint32_t imm,
		   uint64_t addr, uint32_t len, uint32_t lkey, int flags)
{
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = (enum ibv_wr_opcode)opcode;
	wr.send_flags = (unsigned int)flags;
	wr.imm_data = htonl(imm);
	if (len) {
		wr.sg_list = &sge;
		wr.num_sge = 1;
	}
	return ibv_post_send(qp, &wr, &bad);
}

/* ---------------------------------------------------------------------- */
/* Receives. */

int b2b_srq_post(struct ibv_srq *srq, const uint32_t *idx, int n, uint64_t base,
		 uint32_t buf_len, uint32_t lkey)
{
	enum { BATCH = 64 };
	struct ibv_recv_wr wr[BATCH], *bad = NULL;
	struct ibv_sge sge[BATCH];
	for (int done = 0; done < n;) {
		int m = n - done < BATCH ? n - done : BATCH;
		for (int j = 0; j < m; j++) {
			uint32_t x = idx[done + j];
			sge[j].addr = base + (uint64_t)x * buf_len;
			sge[j].length = buf_len;
			sge[j].lkey = lkey;
			wr[j].wr_id = x;
			wr[j].sg_list = &sge[j];
			wr[j].num_sge = 1;
			wr[j].next = j + 1 < m ? &wr[j + 1] : NULL;
		}
		int e = ibv_post_srq_recv(srq, wr, &bad);
		if (e)
			return e;
		done += m;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Completions. */

struct b2b_wcbuf *b2b_wcbuf_new(int cap)
{
	struct b2b_wcbuf *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->raw = calloc((size_t)cap, sizeof(*b->raw));
	b->wc = calloc((size_t)cap, sizeof(*b->wc));
	if (!b->raw || !b->wc) {
		free(b->raw);
		free(b->wc);
		free(b);
		return NULL;
	}
	b->cap = cap;
	return b;
}

void b2b_wcbuf_free(struct b2b_wcbuf *b)
{
	if (!b)
		return;
	free(b->raw);
	free(b->wc);
	free(b);
}

/* Polls up to cap completions; returns their count or a negative errno. */
int b2b_poll(struct ibv_cq *cq, struct b2b_wcbuf *b)
{
	int n = ibv_poll_cq(cq, b->cap, b->raw);
	if (n < 0)
		return n;
	for (int j = 0; j < n; j++) {
		struct ibv_wc *w = &b->raw[j];
		struct b2b_wc *o = &b->wc[j];
		o->wr_id = w->wr_id;
		o->status = (uint32_t)w->status;
		o->opcode = (uint32_t)w->opcode;
		o->qp_num = w->qp_num;
		o->imm = (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : 0;
		o->byte_len = w->byte_len;
		o->vendor_err = w->vendor_err;
		o->flags = (uint32_t)w->wc_flags;
	}
	return n;
}

int b2b_arm(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

int b2b_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int b2b_comp_fd(struct ibv_comp_channel *ch) { return ch->fd; }
int b2b_async_fd(struct ibv_context *c) { return c->async_fd; }

/* Reads and acknowledges every pending CQ event (the fd is non-blocking). */
int b2b_drain_cq_events(struct ibv_comp_channel *ch)
{
	int n = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (B.get_cq_event(ch, &cq, &ctx) != 0)
			break;
		B.ack_cq_events(cq, 1);
		n++;
	}
	return n;
}

/* Reads, copies out and acknowledges pending async events. */
int b2b_drain_async(struct ibv_context *c, struct b2b_async *out, int cap)
{
	int n = 0;
	while (n < cap) {
		struct ibv_async_event ev;
		if (B.get_async_event(c, &ev) != 0)
			break;
		struct b2b_async *o = &out[n++];
		memset(o, 0, sizeof(*o));
		o->type = (uint32_t)ev.event_type;
		switch (ev.event_type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_PATH_MIG:
		case IBV_EVENT_PATH_MIG_ERR:
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			o->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
			break;
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_LID_CHANGE:
		case IBV_EVENT_PKEY_CHANGE:
		case IBV_EVENT_SM_CHANGE:
		case IBV_EVENT_CLIENT_REREGISTER:
		case IBV_EVENT_GID_CHANGE:
			o->port = (uint32_t)ev.element.port_num;
			break;
		default:
			break;
		}
		B.ack_async_event(&ev);
	}
	return n;
}

void *b2b_alloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, n ? n : 1) != 0)
		return NULL;
	memset(p, 0, n);
	return p;
}
void b2b_free(void *p) { free(p); }

/* Accessors for inspecting planned WRs from Go (unions are awkward in cgo). */
uint64_t b2b_wr_remote(const struct b2b_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.remote_addr; }
uint32_t b2b_wr_rkey(const struct b2b_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.rkey; }
uint32_t b2b_wr_imm(const struct b2b_chain *ch, uint32_t j) { return ntohl(ch->wr[j].imm_data); }

/* The Go side mirrors these enum values as constants. */
_Static_assert(IBV_WC_RECV == 128 && IBV_WC_RECV_RDMA_WITH_IMM == 129, "wc opcodes");
_Static_assert(IBV_WC_REM_ACCESS_ERR == 10 && IBV_WC_WR_FLUSH_ERR == 5 && IBV_WC_RETRY_EXC_ERR == 12, "wc status");
_Static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_RDMA_WRITE_WITH_IMM == 1 && IBV_WR_SEND == 2 && IBV_WR_SEND_WITH_IMM == 3, "wr opcodes");
_Static_assert(IBV_WC_WITH_IMM == 2, "wc flags");
_Static_assert(IBV_EVENT_QP_FATAL == 1 && IBV_EVENT_QP_LAST_WQE_REACHED == 16 && IBV_EVENT_DEVICE_FATAL == 8 && IBV_EVENT_PORT_ERR == 10, "events");
_Static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5, "mtu");
_Static_assert(IBV_LINK_LAYER_ETHERNET == 2 && IBV_LINK_LAYER_INFINIBAND == 1, "link layer");
