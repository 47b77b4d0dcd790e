//go:build cgo && linux

/*
 * plan.c: the WR planner, the one algorithm behind both ad hoc chains
 * (b2bv_plan, posted by chain.c) and prepared plans (b2bv_pplan_build,
 * posted by prep.c), for RDMA WRITE and RDMA READ alike.
 *
 * The planner works on the local and the remote side of a batch, not on
 * its source and destination: a WR covers one contiguous remote range and
 * its SGEs list the local pieces of that range. WRITE gathers those pieces
 * (local = source), READ scatters into them (local = destination); the
 * algorithm is the same, only the opcode and what READ forbids (inline
 * data, an immediate) differ. orient() makes the one translation.
 *
 * Nothing is allocated per WR or chain.
 */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* off..off+n inside a region of limit bytes, without overflow. */
static inline int in_range(uint64_t off, uint64_t n, uint64_t limit)
{
	return n <= limit && off <= limit - n;
}

/* A batch seen from the poster's side, for one opcode. */
struct sides {
	const uint64_t *loc, *rem, *len; /* block offsets: local, remote; lengths */
	uint64_t loc_base, rem_base;     /* addresses of offset 0 */
	uint64_t loc_limit, rem_limit;   /* region sizes */
	uint32_t lkey, rkey;
	uint32_t op;         /* IBV_WR_RDMA_WRITE or IBV_WR_RDMA_READ */
	uint32_t inline_max; /* 0 for READ: its local side is written, not read */
};

/* orient maps r's source/destination onto local/remote for r->op. */
static int orient(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
		  const uint64_t *len, struct sides *s)
{
	s->len = len;
	s->lkey = r->lkey;
	s->rkey = r->rkey;
	s->op = r->op;
	switch (r->op) {
	case IBV_WR_RDMA_WRITE:
		s->loc = src, s->rem = dst;
		s->loc_base = r->src_base, s->rem_base = r->dst_base;
		s->loc_limit = r->src_limit, s->rem_limit = r->dst_limit;
		s->inline_max = r->inline_max;
		return 0;
	case IBV_WR_RDMA_READ:
		if (r->flags & B2BV_PLAN_IMM_LAST)
			return -EINVAL; /* there is no READ with immediate */
		s->loc = dst, s->rem = src;
		s->loc_base = r->dst_base, s->rem_base = r->src_base;
		s->loc_limit = r->dst_limit, s->rem_limit = r->src_limit;
		s->inline_max = 0;
		return 0;
	}
	return -EINVAL;
}

/* The range [(i, off), (end_i, end_off)) of a batch; (i, off) is the cursor. */
struct span {
	uint64_t off, end_off;
	uint32_t i, end_i;
};

/* Where WRs go, their limits, and (out) what was planned. */
struct wrs {
	struct ibv_send_wr *wr; /* room for max_wr WRs */
	struct ibv_sge *sge;    /* packed: room for max_wr * max_sge SGEs */
	uint32_t *wrbytes;      /* each WR's payload bytes (NULL: not kept) */
	uint64_t wrcap;         /* bytes per WR */
	uint64_t max_bytes;     /* stop once this many are planned (0: no cap) */
	uint32_t max_wr, max_sge;
	uint32_t signal_every;
	uint32_t seq, seq_step; /* wr_id sequence numbers: seq += seq_step per WR */
	int check;              /* bounds-check each block touched (0: all checked before) */
	/*
	 * packed: each WR's SGEs follow the last WR's in sge, and the WR is
	 * pointed at them (a prepared plan's exact-size arrays); else each WR
	 * keeps the fixed slots its sg_list already points to (a chain's,
	 * assigned once: one store less per WR in the hot loop).
	 */
	int packed;
	/* blk_fixed: every WR's wr_id names block blk (a block request's
	 * group) instead of the WR's first block */
	int blk_fixed;
	uint32_t blk;
	/* out */
	uint32_t n_wr, n_sge, n_signaled, bad_block;
	uint64_t bytes;
};

/*
 * plan_span plans WRs from the cursor of c towards its end:
 *  - a WR starts at the cursor; while the next block's remote offset
 *    follows the WR's remote range, the block joins the WR: merged into the
 *    last SGE when its local offset also follows (adjacent on both sides),
 *    or as a new SGE (gather for WRITE, scatter for READ) while the WR has
 *    fewer than max_sge;
 *  - a WR never carries more than wrcap bytes; only a block bigger than
 *    that is cut, and blocks never straddle WRs otherwise;
 *  - planning stops at max_wr WRs, or once max_bytes are planned;
 *  - WR j is signaled when (j+1) % signal_every == 0, and the last WR
 *    always is, so every posted WR's credit comes back; the last WR ends
 *    the list.
 * With o->check, every block touched is bounds-checked against both
 * regions (-ERANGE, o->bad_block); a prepared plan checks them all first.
 * Returns 1 when the cursor reached the end (the cursor is then exactly
 * the end), 0 when WRs remain, or -ERANGE. Inlined into both entry
 * points, where check, packed, wrbytes and seq_step are constants: the
 * branches one entry does not need fold away, and the loop runs on locals.
 */
static inline __attribute__((always_inline)) int plan_span(const struct sides *s, struct span *c,
							   struct wrs *o)
{
	/*
	 * Everything the loop reads, in locals: the WRs and SGEs it stores are
	 * 64-bit fields too, and the block arrays are declared restrict, so the
	 * compiler need not reload any of it after each store.
	 */
	const uint64_t *restrict loc = s->loc, *restrict rem = s->rem, *restrict len = s->len;
	const uint64_t loc_base = s->loc_base, rem_base = s->rem_base;
	const uint64_t loc_limit = s->loc_limit, rem_limit = s->rem_limit;
	const uint32_t lkey = s->lkey, rkey = s->rkey, op = s->op, inline_max = s->inline_max;
	/* the wr_id kind names the opcode: an error completion's opcode is undefined */
	const uint32_t kind = op == IBV_WR_RDMA_READ ? B2BV_KIND_READ : B2BV_KIND_DATA;
	struct ibv_send_wr *restrict wrs = o->wr;
	struct ibv_sge *restrict sges = o->sge;
	uint32_t *restrict wrbytes = o->wrbytes;
	const uint64_t wrcap = o->wrcap, max_bytes = o->max_bytes;
	const uint32_t maxwr = o->max_wr, maxsge = o->max_sge, k = o->signal_every, seq_step = o->seq_step;
	uint32_t i = c->i, end_i = c->end_i;
	uint64_t off = c->off, end_off = c->end_off;
	const int check = o->check, packed = o->packed;
	uint32_t nwr = 0, nsge = 0, nsig = 0, seq = o->seq;
	uint32_t to_signal = k; /* WRs until the next signaled one: no division per WR */
	uint64_t bytes = 0;

	/* LIMIT(x): where block x stops inside this range. */
#define LIMIT(x) ((x) == end_i ? end_off : len[(x)])
#define AT_END(x, o_) ((x) > end_i || ((x) == end_i && (o_) >= end_off))

	while (nwr < maxwr) {
		if (nwr > 0 && max_bytes && bytes >= max_bytes)
			break;
		/* Skip exhausted pieces and zero-length blocks. */
		while (!AT_END(i, off) && off >= LIMIT(i)) {
			i++;
			off = 0;
		}
		if (AT_END(i, off))
			break;
		if (check && (!in_range(loc[i], len[i], loc_limit) || !in_range(rem[i], len[i], rem_limit))) {
			o->bad_block = i;
			return -ERANGE;
		}

		struct ibv_send_wr *wr = &wrs[nwr];
		struct ibv_sge *sg = packed ? &sges[nsge] : wr->sg_list;
		uint64_t take = LIMIT(i) - off;
		if (take > wrcap)
			take = wrcap;
		uint32_t first = i;
		uint64_t remote = rem[i] + off;
		uint64_t loc_end = loc[i] + off + take; /* offsets, for merging */
		uint64_t rem_end = remote + take;
		sg[0].addr = loc_base + loc[i] + off;
		sg[0].length = (uint32_t)take;
		sg[0].lkey = lkey;
		uint32_t ns = 1;
		uint64_t wb = take;
		off += take;

		/* Extend across following blocks only once block i is whole. */
		while (off >= LIMIT(i) && wb < wrcap) {
			uint32_t j = i + 1;
			/* zero-length blocks carry nothing: step over them */
			while (!AT_END(j, 0) && LIMIT(j) == 0)
				j++;
			if (AT_END(j, 0))
				break;
			uint64_t p = LIMIT(j);
			if (rem[j] != rem_end || wb + p > wrcap)
				break;
			if (check && (!in_range(loc[j], len[j], loc_limit) || !in_range(rem[j], len[j], rem_limit))) {
				o->bad_block = j;
				return -ERANGE;
			}
			if (loc[j] == loc_end) {
				sg[ns - 1].length += (uint32_t)p; /* merge */
			} else if (ns < maxsge) {
				sg[ns].addr = loc_base + loc[j];
				sg[ns].length = (uint32_t)p;
				sg[ns].lkey = lkey;
				ns++; /* gather (WRITE) or scatter (READ) */
			} else {
				break;
			}
			loc_end = loc[j] + p;
			rem_end += p;
			wb += p;
			i = j;
			off = p;
		}

		if (packed)
			wr->sg_list = sg;
		wr->num_sge = (int)ns;
		wr->opcode = op;
		wr->send_flags = 0;
		if (inline_max && wb <= inline_max)
			wr->send_flags |= IBV_SEND_INLINE;
		wr->wr.rdma.remote_addr = rem_base + remote;
		wr->wr.rdma.rkey = rkey;
		wr->imm_data = 0;
		seq += seq_step;
		wr->wr_id = B2BV_WRID(seq, kind, o->blk_fixed ? o->blk : first);
		if (--to_signal == 0) { /* (nwr + 1) % k == 0 */
			wr->send_flags |= IBV_SEND_SIGNALED;
			nsig++;
			to_signal = k;
		}
		wr->next = wr + 1;
		if (wrbytes) /* a constant once inlined: no test in the loop */
			wrbytes[nwr] = (uint32_t)wb;
		nwr++;
		nsge += ns;
		bytes += wb;
	}

	/* Normalise the cursor so done is exact. */
	while (!AT_END(i, off) && off >= LIMIT(i)) {
		i++;
		off = 0;
	}
	int done = AT_END(i, off);
	if (done) {
		i = end_i;
		off = end_off;
	}
#undef LIMIT
#undef AT_END

	if (nwr > 0) {
		struct ibv_send_wr *last = &wrs[nwr - 1];
		last->next = NULL;
		if (!(last->send_flags & IBV_SEND_SIGNALED)) {
			last->send_flags |= IBV_SEND_SIGNALED;
			nsig++;
		}
	}
	c->i = i;
	c->off = off;
	o->seq = seq;
	o->n_wr = nwr;
	o->n_sge = nsge;
	o->n_signaled = nsig;
	o->bytes = bytes;
	return done;
}

static inline uint64_t wr_cap(const struct b2bv_plan *r)
{
	uint64_t wrcap = r->max_wr_bytes;
	return wrcap == 0 || wrcap > B2BV_MAX_WR_BYTES ? B2BV_MAX_WR_BYTES : wrcap;
}

/*
 * b2bv_plan builds one chain from the cursor (req.i, req.off) towards the
 * end (req.end_i, req.end_off) of a batch's block arrays (see plan_span);
 * the chain stops at max_wr WRs, or once it carries max_chain_bytes. When
 * the chain reaches the end and B2BV_PLAN_IMM_LAST is set, its last WR is
 * RDMA_WRITE_WITH_IMM carrying req.imm. Nothing is committed on error.
 * Returns 0, -EINVAL (bad request) or -ERANGE (a block outside its region:
 * res.bad_block).
 */
int b2bv_plan(struct b2bv_chain *ch, const uint64_t *src, const uint64_t *dst,
	      const uint64_t *len, uint32_t n, int commit)
{
	struct b2bv_plan *r = &ch->req;
	struct b2bv_plan_res *res = &ch->res;
	memset(res, 0, sizeof(*res));

	uint32_t maxwr = r->max_wr < ch->cap_wr ? r->max_wr : ch->cap_wr;
	uint32_t maxsge = r->max_sge < ch->cap_sge ? r->max_sge : ch->cap_sge;
	if (maxwr == 0 || maxsge == 0)
		return -EINVAL;
	if (r->end_i > n || (r->end_i == n && r->end_off != 0))
		return -EINVAL;
	if (r->end_i < n && r->end_off > len[r->end_i])
		return -EINVAL;
	if (r->i > r->end_i || (r->i < n && r->off > len[r->i]) || (r->i == n && r->off != 0))
		return -EINVAL;
	struct sides s;
	if (orient(r, src, dst, len, &s) != 0)
		return -EINVAL;

	struct span c = {.i = r->i, .off = r->off, .end_i = r->end_i, .end_off = r->end_off};
	struct wrs o = {
		.wr = ch->wr,
		.sge = ch->sge,
		.wrbytes = NULL, /* posting a chain needs no per-WR bytes */
		.wrcap = wr_cap(r),
		.max_bytes = r->max_chain_bytes,
		.max_wr = maxwr,
		.max_sge = maxsge,
		.signal_every = r->signal_every ? r->signal_every : 1,
		.seq = r->seq,
		.seq_step = 1,
		.check = 1, /* lazily: a chain may cover a small part of a big batch */
	};
	int done = plan_span(&s, &c, &o);
	if (done < 0) {
		res->bad_block = o.bad_block;
		return done;
	}
	if (done && o.n_wr > 0 && (r->flags & B2BV_PLAN_IMM_LAST)) {
		struct ibv_send_wr *last = &ch->wr[o.n_wr - 1];
		last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		last->imm_data = htonl(r->imm);
	}
	res->done = (uint32_t)done;
	res->n_wr = o.n_wr;
	res->n_sge = o.n_sge;
	res->n_signaled = o.n_signaled;
	res->bytes = o.bytes;
	res->next_i = c.i;
	res->next_off = c.off;
	if (commit) {
		r->i = c.i;
		r->off = c.off;
		r->seq = o.seq;
	}
	return 0;
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

/*
 * b2bv_pplan_build plans a whole batch once, each of nq shares (cut at
 * cuts) into its own WR list, with plan_span: no WR or byte cap per share,
 * wr_id sequence numbers left 0 (b2bv_pplan_post stamps them). A WRITE
 * share's last WR is RDMA_WRITE_WITH_IMM (the immediate is set per post).
 * Every block is bounds-checked first. Returns 0, -EINVAL, -ERANGE
 * (*bad_block) or -ENOMEM.
 */
int b2bv_pplan_build(const struct b2bv_plan *r, const uint64_t *src, const uint64_t *dst,
		     const uint64_t *len, uint32_t n, const uint64_t *cuts, uint32_t nq,
		     struct b2bv_pplan **out, uint32_t *bad_block)
{
	*out = NULL;
	*bad_block = 0;
	uint64_t wrcap = wr_cap(r);
	uint32_t maxsge = r->max_sge;
	uint32_t k = r->signal_every ? r->signal_every : 1;
	struct sides s;
	if (maxsge == 0 || nq > B2BV_PPLAN_MAX_SHARES || orient(r, src, dst, len, &s) != 0)
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
	/* Every block, zero-length ones included, as a chain would not. */
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
	p->loc_base = s.loc_base;
	p->lkey = r->lkey;
	p->nshare = nq;
	p->signal_every = k;
	p->op = r->op;
	p->shares = p->share;
	struct ibv_send_wr *wrs = (struct ibv_send_wr *)((char *)p + hdr);
	struct ibv_sge *sges = (struct ibv_sge *)(wrs + total);
	uint32_t *wbytes = (uint32_t *)(sges + total);

	for (uint32_t q = 0; q < nq; q++) {
		struct b2bv_pshare *sh = &p->share[q];
		struct span c = {.i = (uint32_t)cuts[2 * q], .off = cuts[2 * q + 1],
				 .end_i = (uint32_t)cuts[2 * q + 2], .end_off = cuts[2 * q + 3]};
		struct wrs o = {
			.wr = wrs,
			.sge = sges,
			.wrbytes = wbytes,
			.wrcap = wrcap,
			.max_wr = UINT32_MAX, /* bound[q] is the real limit */
			.max_sge = maxsge,
			.signal_every = k,
			.packed = 1,
		};
		plan_span(&s, &c, &o); /* cannot fail: every block was checked above */
		if (o.n_wr > 0 && r->op == IBV_WR_RDMA_WRITE)
			wrs[o.n_wr - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		sh->wr = wrs;
		sh->sge = sges;
		sh->wrbytes = wbytes;
		sh->bytes = o.bytes;
		sh->n_wr = o.n_wr;
		sh->n_sge = o.n_sge;
		p->n_wr += o.n_wr;
		p->n_sge += o.n_sge;
		p->bytes += o.bytes;
		/* Shares pack one after the other (bound >= used). */
		wrs += o.n_wr;
		sges += o.n_sge;
		wbytes += o.n_wr;
	}
	*out = p;
	return 0;
}

/*
 * Block-id requests (b2bv.h: struct b2bv_btab, struct b2bv_bcur).
 */

/* Steps the range cursor past the end of its group's ids. */
static inline void bnorm(struct b2bv_bcur *c, uint32_t nids)
{
	if (c->e >= nids) {
		c->g++;
		c->e = 0;
	}
}

static inline int bdone(const struct b2bv_bcur *c)
{
	return c->g > c->end_g || (c->g == c->end_g && c->e >= c->end_e);
}

/*
 * bexpand writes at most max runs of the cursor's group from entry c->e on
 * (stopping at the range's end), advances the cursor, and returns the
 * count. Consecutive entries whose ids both go up by one merge in a
 * mergeable group, as layout.Pair.Expand's id runs do.
 */
static uint32_t bexpand(const struct b2bv_btab *t, const uint32_t *restrict sid,
			const uint32_t *restrict did, uint32_t nids, struct b2bv_bcur *c, uint32_t max,
			uint64_t *restrict src, uint64_t *restrict dst, uint64_t *restrict len,
			uint32_t *restrict first)
{
	bnorm(c, nids);
	if (bdone(c) || c->g >= t->ngroups)
		return 0;
	const struct b2bv_bgroup *gr = &t->g[c->g];
	const uint32_t stop = c->g == c->end_g ? c->end_e : nids;
	const uint64_t sb = gr->src_base, ss = gr->src_stride, db = gr->dst_base, ds = gr->dst_stride,
		       bl = gr->block_len;
	uint32_t e = c->e, k = 0;
	if (gr->mergeable) {
		while (k < max && e < stop) {
			uint32_t j = e + 1;
			while (j < stop && sid[j] == sid[j - 1] + 1 && did[j] == did[j - 1] + 1)
				j++;
			src[k] = sb + (uint64_t)sid[e] * ss;
			dst[k] = db + (uint64_t)did[e] * ds;
			len[k] = (uint64_t)(j - e) * bl;
			first[k] = e;
			k++;
			e = j;
		}
	} else {
		uint32_t n = stop - e < max ? stop - e : max;
		for (; k < n; k++, e++) {
			src[k] = sb + (uint64_t)sid[e] * ss;
			dst[k] = db + (uint64_t)did[e] * ds;
			len[k] = bl;
			first[k] = e;
		}
	}
	c->e = e;
	bnorm(c, nids);
	return k;
}

uint32_t b2bv_bexpand(const struct b2bv_btab *t, const uint32_t *sid, const uint32_t *did, uint32_t nids,
		      struct b2bv_bcur *c, uint32_t max, uint64_t *src, uint64_t *dst, uint64_t *len,
		      uint32_t *first, uint32_t *group)
{
	bnorm(c, nids);
	*group = c->g;
	return bexpand(t, sid, did, nids, c, max, src, dst, len, first);
}

/*
 * b2bv_bplan plans the next chain of c's range into ch: chunks of runs are
 * expanded into c and planned with plan_span (bases, limits and keys from
 * the chunk's group, every run bounds-checked), WR lists of successive
 * chunks linked into one chain. The chain stops at max_wr WRs or once it
 * carries max_chain_bytes. The range's last WR carries the immediate when
 * B2BV_PLAN_IMM_LAST is set. seq is committed by the caller.
 */
static int b2bv_bplan(struct b2bv_chain *ch, const struct b2bv_btab *t, struct b2bv_bcur *c,
		      const uint32_t *sid, const uint32_t *did, uint32_t nids, uint32_t *seq_out)
{
	struct b2bv_plan *r = &ch->req;
	struct b2bv_plan_res *res = &ch->res;
	memset(res, 0, sizeof(*res));
	uint32_t maxwr = r->max_wr < ch->cap_wr ? r->max_wr : ch->cap_wr;
	uint32_t maxsge = r->max_sge < ch->cap_sge ? r->max_sge : ch->cap_sge;
	if (maxwr == 0 || maxsge == 0 || c->cap == 0)
		return -EINVAL;
	if (r->op != IBV_WR_RDMA_WRITE && !(r->op == IBV_WR_RDMA_READ && !(r->flags & B2BV_PLAN_IMM_LAST)))
		return -EINVAL;
	const int read = r->op == IBV_WR_RDMA_READ;
	const uint64_t wrcap = wr_cap(r), max_bytes = r->max_chain_bytes;
	const uint32_t k = r->signal_every ? r->signal_every : 1;
	uint32_t nwr = 0, nsge = 0, nsig = 0, seq = r->seq;
	uint64_t bytes = 0;
	while (nwr < maxwr) {
		if (nwr > 0 && max_bytes && bytes >= max_bytes)
			break;
		if (c->i >= c->n) {
			c->n = c->i = 0;
			c->off = 0;
			bnorm(c, nids);
			if (bdone(c))
				break;
			c->cg = c->g;
			c->n = bexpand(t, sid, did, nids, c, c->cap, c->src, c->dst, c->len, c->first);
			if (c->n == 0)
				break;
		}
		const struct b2bv_bgroup *gr = &t->g[c->cg];
		if (gr->src_region >= t->nsrc || gr->dst_region >= t->ndst)
			return -EINVAL;
		const struct b2bv_bregion *sr = &t->src[gr->src_region], *dr = &t->dst[gr->dst_region];
		struct sides s = {.len = c->len, .op = r->op};
		if (read) {
			s.loc = c->dst, s.rem = c->src;
			s.loc_base = dr->addr, s.rem_base = sr->addr;
			s.loc_limit = dr->limit, s.rem_limit = sr->limit;
			s.lkey = dr->key, s.rkey = sr->key;
		} else {
			s.loc = c->src, s.rem = c->dst;
			s.loc_base = sr->addr, s.rem_base = dr->addr;
			s.loc_limit = sr->limit, s.rem_limit = dr->limit;
			s.lkey = sr->key, s.rkey = dr->key;
			s.inline_max = r->inline_max;
		}
		struct span sp = {.i = c->i, .off = c->off, .end_i = c->n, .end_off = 0};
		struct wrs o = {
			.wr = &ch->wr[nwr],
			.sge = ch->sge,
			.wrcap = wrcap,
			.max_bytes = max_bytes ? max_bytes - bytes : 0,
			.max_wr = maxwr - nwr,
			.max_sge = maxsge,
			.signal_every = k,
			.seq = seq,
			.seq_step = 1,
			.check = 1,
			.blk_fixed = 1,
			.blk = c->cg & B2BV_WRID_BLOCK_MASK,
		};
		int rc = plan_span(&s, &sp, &o);
		if (rc < 0) {
			c->bad_group = c->cg;
			c->bad_entry = c->first[o.bad_block];
			res->bad_block = o.bad_block;
			return rc;
		}
		if (nwr > 0 && o.n_wr > 0)
			ch->wr[nwr - 1].next = &ch->wr[nwr];
		nwr += o.n_wr;
		nsge += o.n_sge;
		nsig += o.n_signaled;
		bytes += o.bytes;
		seq = o.seq;
		c->i = sp.i;
		c->off = sp.off;
		if (rc == 1)
			c->i = c->n;
		else if (o.n_wr == 0)
			break;
	}
	int done = 0;
	if (c->i >= c->n) {
		bnorm(c, nids);
		done = bdone(c);
	}
	if (done && nwr > 0 && (r->flags & B2BV_PLAN_IMM_LAST)) {
		struct ibv_send_wr *last = &ch->wr[nwr - 1];
		last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		last->imm_data = htonl(r->imm);
	}
	res->done = (uint32_t)done;
	res->n_wr = nwr;
	res->n_sge = nsge;
	res->n_signaled = nsig;
	res->bytes = bytes;
	*seq_out = seq;
	return 0;
}

int b2bv_bpost_chain(struct ibv_qp *qp, struct b2bv_chain *ch, const struct b2bv_btab *t,
		     struct b2bv_bcur *c, const uint32_t *sid, const uint32_t *did, uint32_t nids)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint32_t seq = 0;
	int rc = b2bv_bplan(ch, t, c, sid, did, nids, &seq);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ch->res.plan_ns = b2bv_ns(&t0, &t1);
	if (rc != 0 || ch->res.n_wr == 0)
		return rc;
	/* qp NULL: plan only (tests and benchmarks) */
	if (qp && (rc = b2bv_chain_send(qp, ch, &t1)) != 0)
		return rc;
	ch->req.seq = seq;
	return 0;
}

int b2bv_btab_new(uint32_t ngroups, uint32_t nsrc, uint32_t ndst, struct b2bv_btab **out)
{
	*out = NULL;
	if (ngroups == 0 || nsrc == 0 || ndst == 0)
		return -EINVAL;
	struct b2bv_btab *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->g = calloc(ngroups, sizeof(*t->g));
	t->src = calloc(nsrc, sizeof(*t->src));
	t->dst = calloc(ndst, sizeof(*t->dst));
	if (!t->g || !t->src || !t->dst) {
		b2bv_btab_free(t);
		return -ENOMEM;
	}
	t->ngroups = ngroups, t->nsrc = nsrc, t->ndst = ndst;
	*out = t;
	return 0;
}

void b2bv_btab_free(struct b2bv_btab *t)
{
	if (!t)
		return;
	free(t->g);
	free(t->src);
	free(t->dst);
	free(t);
}

int b2bv_bcur_new(uint32_t cap, struct b2bv_bcur **out)
{
	*out = NULL;
	if (cap == 0)
		return -EINVAL;
	struct b2bv_bcur *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->src = calloc(cap, sizeof(uint64_t));
	c->dst = calloc(cap, sizeof(uint64_t));
	c->len = calloc(cap, sizeof(uint64_t));
	c->first = calloc(cap, sizeof(uint32_t));
	if (!c->src || !c->dst || !c->len || !c->first) {
		b2bv_bcur_free(c);
		return -ENOMEM;
	}
	c->cap = cap;
	*out = c;
	return 0;
}

void b2bv_bcur_free(struct b2bv_bcur *c)
{
	if (!c)
		return;
	free(c->src);
	free(c->dst);
	free(c->len);
	free(c->first);
	free(c);
}
