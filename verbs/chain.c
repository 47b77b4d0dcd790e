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

/*
 * b2bv_post_chain plans the next chain from the cursor and posts it; with
 * qp NULL it only plans (tests, benchmarks). Either way the cursor and
 * the sequence number advance past what was planned; see b2bv_chain_send
 * for a refused post.
 */
int b2bv_post_chain(struct ibv_qp *qp, struct b2bv_chain *ch, const uint64_t *src,
		    const uint64_t *dst, const uint64_t *len, uint32_t n)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = b2bv_plan(ch, src, dst, len, n, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ch->res.plan_ns = b2bv_ns(&t0, &t1);
	if (rc != 0)
		return rc;
	if (qp && ch->res.n_wr > 0 && (rc = b2bv_chain_send(qp, ch, &t1)) != 0)
		return rc;
	ch->req.i = ch->res.next_i;
	ch->req.off = ch->res.next_off;
	ch->req.seq += ch->res.n_wr;
	return 0;
}

int b2bv_chain_send(struct ibv_qp *qp, struct b2bv_chain *ch, const struct timespec *planned)
{
	struct ibv_send_wr *bad = NULL;
	int raw = 0;
	int rc = B2BV_CALL(&raw, ibv_post_send(qp, ch->wr, &bad));
	struct timespec t2;
	clock_gettime(CLOCK_MONOTONIC, &t2);
	ch->res.post_ns = b2bv_ns(planned, &t2);
	if (rc) {
		uint32_t posted = 0;
		if (bad && bad >= ch->wr && bad < ch->wr + ch->res.n_wr)
			posted = (uint32_t)(bad - ch->wr);
		ch->res.post_failed = 1;
		ch->res.bad_wr = posted;
		ch->res.post_raw = raw;
		ch->req.seq += posted;
	}
	return rc;
}

/* Accessors for inspecting planned WRs from Go (unions are awkward in cgo). */
uint64_t b2bv_wr_remote(const struct b2bv_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.remote_addr; }
uint32_t b2bv_wr_rkey(const struct b2bv_chain *ch, uint32_t j) { return ch->wr[j].wr.rdma.rkey; }
uint32_t b2bv_wr_imm(const struct b2bv_chain *ch, uint32_t j) { return ntohl(ch->wr[j].imm_data); }
