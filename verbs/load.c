//go:build cgo && linux

/*
 * load.c: the table of libibverbs entry points. Go opens the library and
 * resolves each symbol through internal/dl (Load in load.go), then hands the
 * pointers over here one by one; b2bv_sym_name tells Go what to look up.
 */
#include "b2bv_int.h"

#include <string.h>

struct b2bv_lib b2bv_lib;

#define B2BV_NAME(f, ret, args, req) {"ibv_" #f, req},
static const struct {
	const char *name;
	int required;
} b2bv_syms[] = {B2BV_SYMS(B2BV_NAME)};
#undef B2BV_NAME

enum { B2BV_NSYMS = sizeof(b2bv_syms) / sizeof(b2bv_syms[0]) };
_Static_assert(sizeof(struct b2bv_lib) == B2BV_NSYMS * sizeof(void *),
	       "the table is one function pointer per symbol");

int b2bv_nsyms(void) { return B2BV_NSYMS; }

const char *b2bv_sym_name(int k, int *required)
{
	if (k < 0 || k >= B2BV_NSYMS)
		return NULL;
	if (required)
		*required = b2bv_syms[k].required;
	return b2bv_syms[k].name;
}

int b2bv_set_sym(int k, void *p)
{
	if (k < 0 || k >= B2BV_NSYMS)
		return -EINVAL;
	memcpy((char *)&b2bv_lib + (size_t)k * sizeof(void *), &p, sizeof(p));
	return 0;
}

int b2bv_have_dmabuf(void) { return b2bv_lib.reg_dmabuf_mr != NULL; }

const char *b2bv_wc_status_str(int s) { return b2bv_lib.wc_status_str((enum ibv_wc_status)s); }
const char *b2bv_event_type_str(int t) { return b2bv_lib.event_type_str((enum ibv_event_type)t); }

/* The Go side mirrors these enum values as constants (types.go). */
_Static_assert(IBV_WC_RECV == 128 && IBV_WC_RECV_RDMA_WITH_IMM == 129, "wc opcodes");
_Static_assert(IBV_WC_REM_ACCESS_ERR == 10 && IBV_WC_WR_FLUSH_ERR == 5 && IBV_WC_RETRY_EXC_ERR == 12, "wc status");
_Static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_RDMA_WRITE_WITH_IMM == 1 && IBV_WR_SEND == 2 && IBV_WR_SEND_WITH_IMM == 3, "wr opcodes");
_Static_assert(IBV_WC_WITH_IMM == 2, "wc flags");
_Static_assert(IBV_EVENT_QP_FATAL == 1 && IBV_EVENT_QP_LAST_WQE_REACHED == 16 && IBV_EVENT_DEVICE_FATAL == 8 && IBV_EVENT_PORT_ERR == 10, "events");
_Static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5, "mtu");
_Static_assert(IBV_LINK_LAYER_ETHERNET == 2 && IBV_LINK_LAYER_INFINIBAND == 1, "link layer");
_Static_assert(IBV_QPS_RESET == 0 && IBV_QPS_INIT == 1 && IBV_QPS_RTR == 2 && IBV_QPS_RTS == 3 && IBV_QPS_SQD == 4 && IBV_QPS_SQE == 5 && IBV_QPS_ERR == 6, "qp states");
_Static_assert(IBV_PORT_DOWN == 1 && IBV_PORT_ACTIVE == 4, "port states");
_Static_assert(IBV_ACCESS_LOCAL_WRITE == 1 && IBV_ACCESS_REMOTE_WRITE == 2 && IBV_ACCESS_REMOTE_READ == 4, "access flags");
