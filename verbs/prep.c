//go:build cgo && linux

/*
 * prep.c: prepared plans. b2bv_pplan_build (plan.c) plans a whole batch
 * once, each QP's share into its own array of WRs and a packed array of
 * SGEs, in one call; b2bv_pplan_post posts a sub-range of one share with
 * one ibv_post_send, patching only what changes per submit (wr_id sequence
 * numbers, the sub-range's last WR signaled and terminating the list, a
 * WRITE share's immediate) and restoring the list afterwards.
 */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

void b2bv_pplan_free(struct b2bv_pplan *p) { free(p); }

void b2bv_pplan_restamp(struct b2bv_pplan *p, uint32_t lkey, uint64_t loc_base)
{
	uint64_t delta = loc_base - p->loc_base;
	for (uint32_t q = 0; q < p->nshare; q++) {
		struct b2bv_pshare *sh = &p->share[q];
		for (uint32_t j = 0; j < sh->n_sge; j++) {
			sh->sge[j].addr += delta;
			sh->sge[j].lkey = lkey;
		}
	}
	p->loc_base = loc_base;
	p->lkey = lkey;
}

int b2bv_pplan_post(struct ibv_qp *qp, struct b2bv_pplan *p, uint32_t q, uint32_t max_wr,
		    uint64_t max_bytes, uint32_t tag)
{
	if (q >= p->nshare)
		return -EINVAL;
	struct b2bv_pshare *sh = &p->share[q];
	sh->posted = 0;
	sh->post_failed = 0;
	sh->post_raw = 0;
	uint32_t a = sh->next, n = sh->n_wr;
	if (a >= n || max_wr == 0)
		return 0;
	uint32_t b = a;
	uint64_t bytes = 0;
	uint64_t seq = sh->seq;
	struct ibv_send_wr *w = sh->wr;
	while (b < n && b - a < max_wr && (b == a || max_bytes == 0 || bytes < max_bytes)) {
		seq++;
		w[b].wr_id = (w[b].wr_id & 0xFFFFFFFFull) | ((uint64_t)(uint32_t)seq << B2BV_WRID_SEQ_SHIFT);
		bytes += sh->wrbytes[b];
		b++;
	}
	struct ibv_send_wr *last = &w[b - 1];
	struct ibv_send_wr *next = last->next;
	unsigned int flags = last->send_flags;
	last->next = NULL;
	last->send_flags |= IBV_SEND_SIGNALED;
	if (b == n && p->op == IBV_WR_RDMA_WRITE)
		last->imm_data = htonl(tag); /* a READ carries no immediate */
	int rc = 0;
	uint32_t posted = b - a;
	if (qp) {
		struct ibv_send_wr *bad = NULL;
		int raw = 0;
		rc = B2BV_CALL(&raw, ibv_post_send(qp, &w[a], &bad));
		if (rc) {
			posted = 0;
			if (bad && bad >= &w[a] && bad < &w[b])
				posted = (uint32_t)(bad - &w[a]);
			sh->post_failed = 1;
			sh->post_raw = raw;
		}
	}
	last->next = next;
	last->send_flags = flags;
	sh->posted = posted;
	sh->next = a + posted;
	sh->seq += posted;
	sh->bytes_posted = bytes;
	return rc;
}

uint64_t b2bv_pwr_remote(const struct b2bv_pplan *p, uint32_t q, uint32_t j) { return p->share[q].wr[j].wr.rdma.remote_addr; }
uint32_t b2bv_pwr_rkey(const struct b2bv_pplan *p, uint32_t q, uint32_t j) { return p->share[q].wr[j].wr.rdma.rkey; }
uint32_t b2bv_pwr_imm(const struct b2bv_pplan *p, uint32_t q, uint32_t j) { return ntohl(p->share[q].wr[j].imm_data); }
