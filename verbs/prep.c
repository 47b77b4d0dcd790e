//go:build cgo && linux

/*
 * prep.c: prepared plans. b2bv_pplan_build plans a whole batch once, each
 * QP's share into its own array of WRs and a packed array of SGEs, in one
 * call; b2bv_pplan_post posts a sub-range of one share with one
 * ibv_post_send, patching only what changes per submit (wr_id sequence
 * numbers, the sub-range's last WR signaled and terminating the list, the
 * share's immediate) and restoring the list afterwards.
 */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

static inline int in_range(uint64_t off, uint64_t n, uint64_t limit)
{
	return n <= limit && off <= limit - n;
}

/* Upper bound of the WRs (and SGEs) of range [(i,off), (end_i,end_off)). */
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

int b2bv_pplan_build(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
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
	p->src_base = r->src_base;
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

void b2bv_pplan_free(struct b2bv_pplan *p) { free(p); }

void b2bv_pplan_restamp(struct b2bv_pplan *p, uint32_t lkey, uint64_t src_base)
{
	uint64_t delta = src_base - p->src_base;
	for (uint32_t q = 0; q < p->nshare; q++) {
		struct b2bv_pshare *sh = &p->share[q];
		for (uint32_t j = 0; j < sh->n_sge; j++) {
			sh->sge[j].addr += delta;
			sh->sge[j].lkey = lkey;
		}
	}
	p->src_base = src_base;
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
	if (b == n)
		last->imm_data = htonl(tag);
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
