//go:build cgo && linux

/*
 * chain.c: ad hoc chains. A chain is preallocated room for WRs and SGEs;
 * b2bv_post_chain plans the next chain from a batch's block arrays (with
 * the planner of plan.c) and posts it with one ibv_post_send (doorbell
 * batching); nothing is allocated per WR or chain.
 */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int b2bv_chain_new(uint32_t cap_wr, uint32_t cap_sge, struct b2bv_chain **out)
{
	*out = NULL;
	if (cap_wr == 0 || cap_sge == 0)
		return -EINVAL;
	struct b2bv_chain *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->wr = calloc(cap_wr, sizeof(*ch->wr));
	ch->sge = calloc((size_t)cap_wr * cap_sge, sizeof(*ch->sge));
	if (!ch->wr || !ch->sge) {
		free(ch->wr);
		free(ch->sge);
		free(ch);
		return -ENOMEM;
	}
	ch->cap_wr = cap_wr;
	ch->cap_sge = cap_sge;
	/* Fixed SGE slots, cap_sge per WR: the planner fills, never re-points, them. */
	for (uint32_t j = 0; j < cap_wr; j++)
		ch->wr[j].sg_list = &ch->sge[(size_t)j * cap_sge];
	*out = ch;
	return 0;
}

void b2bv_chain_free(struct b2bv_chain *ch)
{
	if (!ch)
		return;
	free(ch->wr);
	free(ch->sge);
	free(ch);
}

int b2bv_post_chain(struct ibv_qp *qp, struct b2bv_chain *ch, const uint64_t *src,
		    const uint64_t *dst, const uint64_t *len, uint32_t n)
{
	struct timespec t0, t1, t2;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = b2bv_plan(ch, src, dst, len, n, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ch->res.plan_ns = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000ll + (t1.tv_nsec - t0.tv_nsec));
	if (rc != 0 || ch->res.n_wr == 0) {
		if (rc == 0) {
			ch->req.i = ch->res.next_i;
			ch->req.off = ch->res.next_off;
		}
		return rc;
	}
	struct ibv_send_wr *bad = NULL;
	int raw = 0;
	rc = B2BV_CALL(&raw, ibv_post_send(qp, ch->wr, &bad));
	clock_gettime(CLOCK_MONOTONIC, &t2);
	ch->res.post_ns = (uint64_t)((t2.tv_sec - t1.tv_sec) * 1000000000ll + (t2.tv_nsec - t1.tv_nsec));
	if (rc) {
		uint32_t posted = 0;
		if (bad && bad >= ch->wr && bad < ch->wr + ch->res.n_wr)
			posted = (uint32_t)(bad - ch->wr);
		ch->res.post_failed = 1;
		ch->res.bad_wr = posted;
		ch->res.post_raw = raw;
		ch->req.seq += posted; /* the device owns those; keep credits exact */
		return rc;
	}
	ch->req.i = ch->res.next_i;
	ch->req.off = ch->res.next_off;
	ch->req.seq += ch->res.n_wr;
	return 0;
}

/* Accessors for inspecting planned WRs from Go (unions are awkward in cgo). */
uint64_t b2bv_wr_remote(const struct b2bv_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.remote_addr; }
uint32_t b2bv_wr_rkey(const struct b2bv_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.rkey; }
uint32_t b2bv_wr_imm(const struct b2bv_chain *ch, uint32_t j) { return ntohl(ch->wr[j].imm_data); }
