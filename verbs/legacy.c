//go:build cgo && linux

/*
 * legacy.c: TEMPORARY. The two planners before they were merged into plan.c,
 * kept only so that legacy_test.go can check that the merged planner builds
 * the same WRs. Deleted in the next commit.
 */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

int b2bv_plan_legacy(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
		     const uint64_t *len, uint32_t n, int commit);
int b2bv_pplan_build_legacy(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
			    const uint64_t *len, uint32_t n, const uint64_t *cuts, uint32_t nq,
			    struct b2bv_pplan **out, uint32_t *bad_block);

static inline int in_range(uint64_t off, uint64_t n, uint64_t limit)
{
	return n <= limit && off <= limit - n;
}
int b2bv_plan_legacy(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
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

static uint64_t share_bound(const uint64_t *len, uint32_t n, uint32_t i, uint64_t off,
			    uint32_t end_i, uint64_t end_off, uint64_t wrcap)
{
	uint64_t b = 0;
	for (; i <= end_i && i < n; i++) {
		uint64_t hi = i == end_i ? end_off : len[i];
		if (hi > off)
			b += (hi - off + wrcap - 1) / wrcap;
		off = 0;
	}
	return b;
}

int b2bv_pplan_build_legacy(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
		     const uint64_t *len, uint32_t n, const uint64_t *cuts, uint32_t nq,
		     struct b2bv_pplan **out, uint32_t *bad_block)
{
	*out = NULL;
	*bad_block = 0;
	uint64_t wrcap = r->max_wr_bytes;
	if (wrcap == 0 || wrcap > B2BV_MAX_WR_BYTES)
		wrcap = B2BV_MAX_WR_BYTES;
	uint32_t maxsge = r->max_sge;
	uint32_t k = r->signal_every ? r->signal_every : 1;
	if (maxsge == 0 || nq > B2BV_PPLAN_MAX_SHARES)
		return -EINVAL;
	/* cuts: nq+1 (i, off) pairs, non-decreasing, from (0,0) to (n,0). */
	for (uint32_t q = 0; q <= nq; q++) {
		uint64_t ci = cuts[2 * q], co = cuts[2 * q + 1];
		if (ci > n || (ci == n && co != 0) || (ci < n && co > len[ci]))
			return -EINVAL;
		if (q > 0 && (ci < cuts[2 * q - 2] || (ci == cuts[2 * q - 2] && co < cuts[2 * q - 1])))
			return -EINVAL;
	}
	if (nq > 0 && (cuts[0] != 0 || cuts[1] != 0 || cuts[2 * nq] != n))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (!in_range(src[i], len[i], r->src_limit) || !in_range(dst[i], len[i], r->dst_limit)) {
			*bad_block = i;
			return -ERANGE;
		}
	}
	if (n > B2BV_WRID_BLOCK_MASK)
		return -EINVAL;

	uint64_t bound[B2BV_PPLAN_MAX_SHARES];
	uint64_t total = 0;
	for (uint32_t q = 0; q < nq; q++) {
		bound[q] = share_bound(len, n, (uint32_t)cuts[2 * q], cuts[2 * q + 1],
				       (uint32_t)cuts[2 * q + 2], cuts[2 * q + 3], wrcap);
		total += bound[q];
	}
	if (total > (1u << 30))
		return -EINVAL;
	size_t hdr = sizeof(struct b2bv_pplan) + (size_t)nq * sizeof(struct b2bv_pshare);
	hdr = (hdr + 63) & ~(size_t)63;
	size_t sz = hdr + total * (sizeof(struct ibv_send_wr) + sizeof(struct ibv_sge) + sizeof(uint32_t));
	struct b2bv_pplan *p = calloc(1, sz);
	if (!p)
		return -ENOMEM;
	p->loc_base = r->src_base;
	p->lkey = r->lkey;
	p->nshare = nq;
	p->signal_every = k;
	p->shares = p->share;
	struct ibv_send_wr *wrs = (struct ibv_send_wr *)((char *)p + hdr);
	struct ibv_sge *sges = (struct ibv_sge *)(wrs + total);
	uint32_t *wbytes = (uint32_t *)(sges + total);

	for (uint32_t q = 0; q < nq; q++) {
		struct b2bv_pshare *sh = &p->share[q];
		sh->wr = wrs;
		sh->sge = sges;
		sh->wrbytes = wbytes;
		uint32_t i = (uint32_t)cuts[2 * q];
		uint64_t off = cuts[2 * q + 1];
		uint32_t end_i = (uint32_t)cuts[2 * q + 2];
		uint64_t end_off = cuts[2 * q + 3];
#define LIMIT(x) ((x) == end_i ? end_off : len[(x)])
#define AT_END(x, o) ((x) > end_i || ((x) == end_i && (o) >= end_off))
		uint32_t nwr = 0, nsg = 0;
		for (;;) {
			while (!AT_END(i, off) && off >= LIMIT(i)) {
				i++;
				off = 0;
			}
			if (AT_END(i, off))
				break;
			struct ibv_send_wr *wr = &wrs[nwr];
			struct ibv_sge *sg = &sges[nsg];
			uint64_t take = LIMIT(i) - off;
			if (take > wrcap)
				take = wrcap;
			uint32_t first = i;
			uint64_t remote = dst[i] + off;
			uint64_t src_end = src[i] + off + take;
			uint64_t dst_end = remote + take;
			sg[0].addr = r->src_base + src[i] + off;
			sg[0].length = (uint32_t)take;
			sg[0].lkey = r->lkey;
			uint32_t ns = 1;
			uint64_t wb = take;
			off += take;
			while (off >= LIMIT(i) && wb < wrcap) {
				uint32_t j = i + 1;
				while (!AT_END(j, 0) && LIMIT(j) == 0)
					j++;
				if (AT_END(j, 0))
					break;
				uint64_t pj = LIMIT(j);
				if (dst[j] != dst_end || wb + pj > wrcap)
					break;
				if (src[j] == src_end) {
					sg[ns - 1].length += (uint32_t)pj;
				} else if (ns < maxsge) {
					sg[ns].addr = r->src_base + src[j];
					sg[ns].length = (uint32_t)pj;
					sg[ns].lkey = r->lkey;
					ns++;
				} else {
					break;
				}
				src_end = src[j] + pj;
				dst_end += pj;
				wb += pj;
				i = j;
				off = pj;
			}
			wr->sg_list = sg;
			wr->num_sge = (int)ns;
			wr->opcode = IBV_WR_RDMA_WRITE;
			wr->send_flags = 0;
			if (r->inline_max && wb <= r->inline_max)
				wr->send_flags |= IBV_SEND_INLINE;
			if ((nwr + 1) % k == 0)
				wr->send_flags |= IBV_SEND_SIGNALED;
			wr->wr.rdma.remote_addr = r->dst_base + remote;
			wr->wr.rdma.rkey = r->rkey;
			wr->wr_id = B2BV_WRID(0, B2BV_KIND_DATA, first);
			wr->next = wr + 1;
			wbytes[nwr] = (uint32_t)wb;
			nwr++;
			nsg += ns;
			sh->bytes += wb;
		}
#undef LIMIT
#undef AT_END
		if (nwr > 0) {
			struct ibv_send_wr *last = &wrs[nwr - 1];
			last->next = NULL;
			last->send_flags |= IBV_SEND_SIGNALED;
			last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		}
		sh->n_wr = nwr;
		sh->n_sge = nsg;
		p->n_wr += nwr;
		p->n_sge += nsg;
		p->bytes += sh->bytes;
		/* Shares pack one after the other (bound >= used). */
		wrs += nwr;
		sges += nsg;
		wbytes += nwr;
	}
	*out = p;
	return 0;
}
