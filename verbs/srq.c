//go:build cgo && linux

/* srq.c: shared receive queues. */
#include "b2bv_int.h"

#include <string.h>

int b2bv_create_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge,
		    struct ibv_srq **out)
{
	struct ibv_srq_init_attr a;
	memset(&a, 0, sizeof(a));
	a.attr.max_wr = max_wr;
	a.attr.max_sge = max_sge;
	return B2BV_NEW(out, b2bv_lib.create_srq(pd, &a));
}

int b2bv_destroy_srq(struct ibv_srq *srq) { return B2BV_CALL(NULL, b2bv_lib.destroy_srq(srq)); }

int b2bv_srq_post(struct ibv_srq *srq, const uint32_t *idx, int n, uint64_t base,
		  uint32_t buf_len, uint32_t lkey, int *raw)
{
	struct ibv_recv_wr wr[B2BV_SRQ_POST_BATCH], *bad = NULL;
	struct ibv_sge sge[B2BV_SRQ_POST_BATCH];
	if (raw)
		*raw = 0;
	for (int done = 0; done < n;) {
		int m = n - done < B2BV_SRQ_POST_BATCH ? n - done : B2BV_SRQ_POST_BATCH;
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
		int e = B2BV_CALL(raw, ibv_post_srq_recv(srq, wr, &bad));
		if (e)
			return e;
		done += m;
	}
	return 0;
}
