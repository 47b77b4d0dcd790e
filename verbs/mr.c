//go:build cgo && linux

/* mr.c: protection domains and memory regions. */
#include "b2bv_int.h"

int b2bv_alloc_pd(struct ibv_context *c, struct ibv_pd **out)
{
	return B2BV_NEW(out, b2bv_lib.alloc_pd(c));
}

int b2bv_dealloc_pd(struct ibv_pd *pd) { return B2BV_CALL(NULL, b2bv_lib.dealloc_pd(pd)); }

int b2bv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access,
		struct ibv_mr **out)
{
	return B2BV_NEW(out, b2bv_lib.reg_mr(pd, (void *)addr, len, access));
}

int b2bv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len,
		       uint64_t iova, int fd, int access, struct ibv_mr **out)
{
	if (!b2bv_lib.reg_dmabuf_mr) {
		*out = NULL;
		return -ENOSYS;
	}
	return B2BV_NEW(out, b2bv_lib.reg_dmabuf_mr(pd, off, len, iova, fd, access));
}

int b2bv_dereg_mr(struct ibv_mr *mr) { return B2BV_CALL(NULL, b2bv_lib.dereg_mr(mr)); }
