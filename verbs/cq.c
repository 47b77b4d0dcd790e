//go:build cgo && linux

/* cq.c: completion channels, CQs and polling. */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <stdlib.h>

int b2bv_create_comp_channel(struct ibv_context *c, struct ibv_comp_channel **out)
{
	return B2BV_NEW(out, b2bv_lib.create_comp_channel(c));
}

int b2bv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	return B2BV_CALL(NULL, b2bv_lib.destroy_comp_channel(ch));
}

int b2bv_comp_fd(struct ibv_comp_channel *ch) { return ch->fd; }

/* Reads and acknowledges every pending CQ event (the fd is non-blocking). */
int b2bv_drain_cq_events(struct ibv_comp_channel *ch, int *n)
{
	int k = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (b2bv_lib.get_cq_event(ch, &cq, &ctx) != 0)
			break;
		b2bv_lib.ack_cq_events(cq, 1);
		k++;
	}
	*n = k;
	return 0;
}

int b2bv_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch,
		   struct ibv_cq **out)
{
	return B2BV_NEW(out, b2bv_lib.create_cq(c, cqe, NULL, ch, 0));
}

int b2bv_destroy_cq(struct ibv_cq *cq) { return B2BV_CALL(NULL, b2bv_lib.destroy_cq(cq)); }

int b2bv_wcbuf_new(int cap, struct b2bv_wcbuf **out)
{
	*out = NULL;
	if (cap <= 0)
		return -EINVAL;
	struct b2bv_wcbuf *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->raw = calloc((size_t)cap, sizeof(*b->raw));
	b->wc = calloc((size_t)cap, sizeof(*b->wc));
	if (!b->raw || !b->wc) {
		free(b->raw);
		free(b->wc);
		free(b);
		return -ENOMEM;
	}
	b->cap = cap;
	*out = b;
	return 0;
}

void b2bv_wcbuf_free(struct b2bv_wcbuf *b)
{
	if (!b)
		return;
	free(b->raw);
	free(b->wc);
	free(b);
}

/* Polls up to cap completions into b (count in b->n); 0 or -errno. */
int b2bv_poll(struct ibv_cq *cq, struct b2bv_wcbuf *b)
{
	b->n = 0;
	b->rc_raw = 0;
	int n = ibv_poll_cq(cq, b->cap, b->raw);
	if (n < 0)
		return b2bv_rc(n, 0, &b->rc_raw); /* a provider value, not an errno */
	for (int j = 0; j < n; j++) {
		struct ibv_wc *w = &b->raw[j];
		struct b2bv_wc *o = &b->wc[j];
		o->wr_id = w->wr_id;
		o->status = (uint32_t)w->status;
		o->opcode = (uint32_t)w->opcode;
		o->qp_num = w->qp_num;
		o->imm = (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : 0;
		o->byte_len = w->byte_len;
		o->vendor_err = w->vendor_err;
		o->flags = (uint32_t)w->wc_flags;
	}
	b->n = n;
	return 0;
}

int b2bv_arm(struct ibv_cq *cq, int *raw) { return B2BV_CALL(raw, ibv_req_notify_cq(cq, 0)); }
