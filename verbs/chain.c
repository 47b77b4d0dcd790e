//go:build cgo && linux

/*
 * chain.c: the WR chain planner and poster. One call plans a chain of
 * RDMA WRITEs from a batch's block arrays and posts it with one
 * ibv_post_send (doorbell batching); nothing is allocated per WR or chain.
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

/* off..off+n inside a region of limit bytes, without overflow. */
static inline int in_range(uint64_t off, uint64_t n, uint64_t limit)
{
	return n <= limit && off <= limit - n;
}

/*
 * b2bv_plan builds one chain from the cursor (req.i, req.off) towards the end
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
 *  - when the chain reaches the end and B2BV_PLAN_IMM_LAST is set, its last
 *    WR is RDMA_WRITE_WITH_IMM carrying req.imm.
 * Every block touched is bounds-checked against both regions first; nothing
 * is committed on error. Returns 0, -EINVAL (bad request) or -ERANGE (a
 * block outside its region: res.bad_block).
 */
int b2bv_plan(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
	     const uint64_t *len, uint32_t n, int commit)
{
	struct b2bv_plan *r = &ch->req;
	struct b2bv_plan_res *res = &ch->res;
	memset(res, 0, sizeof(*res));

	uint32_t maxwr = r->max_wr < ch->cap_wr ? r->max_wr : ch->cap_wr;
	uint32_t maxsge = r->max_sge < ch->cap_sge ? r->max_sge : ch->cap_sge;
	uint64_t wrcap = r->max_wr_bytes;
	if (wrcap == 0 || wrcap > B2BV_MAX_WR_BYTES)
		wrcap = B2BV_MAX_WR_BYTES;
	uint32_t k = r->signal_every ? r->signal_every : 1;
	if (maxwr == 0 || maxsge == 0)
		return -EINVAL;
	if (r->end_i > n || (r->end_i == n && r->end_off != 0))
		return -EINVAL;
	if (r->end_i < n && r->end_off > len[r->end_i])
		return -EINVAL;

	uint32_t i = r->i;
	uint64_t off = r->off;
	uint32_t end_i = r->end_i;
	uint64_t end_off = r->end_off;
	if (i > end_i || (i < n && off > len[i]) || (i == n && off != 0))
		return -EINVAL;

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
			return -ERANGE;
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
				return -ERANGE;
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
		wr->wr_id = B2BV_WRID(seq, B2BV_KIND_DATA, first);
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
		if (res->done && (r->flags & B2BV_PLAN_IMM_LAST)) {
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
	return 0;
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
