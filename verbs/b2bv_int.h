/*
 * b2bv_int.h: shared by the C files of package verbs, not by Go: the table
 * of libibverbs entry points (filled from Go through internal/dl) and the
 * return-value normalisation.
 */
#ifndef B2BV_INT_H
#define B2BV_INT_H

#include "b2bv.h"

#include <errno.h>
#include <time.h>

/*
 * X(field, return type, parameters, required): each exported symbol is
 * "ibv_" #field. ibv_reg_dmabuf_mr is optional (rdma-core >= 34).
 */
#define B2BV_SYMS(X)                                                                       \
	X(get_device_list, struct ibv_device **, (int *), 1)                               \
	X(free_device_list, void, (struct ibv_device **), 1)                               \
	X(get_device_name, const char *, (struct ibv_device *), 1)                         \
	X(open_device, struct ibv_context *, (struct ibv_device *), 1)                     \
	X(close_device, int, (struct ibv_context *), 1)                                    \
	X(query_device, int, (struct ibv_context *, struct ibv_device_attr *), 1)          \
	X(query_port, int, (struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *), 1) \
	X(query_gid, int, (struct ibv_context *, uint8_t, int, union ibv_gid *), 1)        \
	X(alloc_pd, struct ibv_pd *, (struct ibv_context *), 1)                            \
	X(dealloc_pd, int, (struct ibv_pd *), 1)                                           \
	X(reg_mr, struct ibv_mr *, (struct ibv_pd *, void *, size_t, int), 1)              \
	X(reg_dmabuf_mr, struct ibv_mr *, (struct ibv_pd *, uint64_t, size_t, uint64_t, int, int), 0) \
	X(dereg_mr, int, (struct ibv_mr *), 1)                                             \
	X(create_comp_channel, struct ibv_comp_channel *, (struct ibv_context *), 1)       \
	X(destroy_comp_channel, int, (struct ibv_comp_channel *), 1)                       \
	X(create_cq, struct ibv_cq *, (struct ibv_context *, int, void *, struct ibv_comp_channel *, int), 1) \
	X(destroy_cq, int, (struct ibv_cq *), 1)                                           \
	X(get_cq_event, int, (struct ibv_comp_channel *, struct ibv_cq **, void **), 1)    \
	X(ack_cq_events, void, (struct ibv_cq *, unsigned int), 1)                         \
	X(create_srq, struct ibv_srq *, (struct ibv_pd *, struct ibv_srq_init_attr *), 1)  \
	X(destroy_srq, int, (struct ibv_srq *), 1)                                         \
	X(create_qp, struct ibv_qp *, (struct ibv_pd *, struct ibv_qp_init_attr *), 1)     \
	X(modify_qp, int, (struct ibv_qp *, struct ibv_qp_attr *, int), 1)                 \
	X(query_qp, int, (struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *), 1) \
	X(destroy_qp, int, (struct ibv_qp *), 1)                                           \
	X(get_async_event, int, (struct ibv_context *, struct ibv_async_event *), 1)       \
	X(ack_async_event, void, (struct ibv_async_event *), 1)                            \
	X(wc_status_str, const char *, (enum ibv_wc_status), 1)                            \
	X(event_type_str, const char *, (enum ibv_event_type), 1)

#define B2BV_FIELD(f, ret, args, req) ret(*f) args;
struct b2bv_lib {
	B2BV_SYMS(B2BV_FIELD)
};
#undef B2BV_FIELD

extern struct b2bv_lib b2bv_lib;

/*
 * b2bv_rc normalises what a libibverbs call or a provider op returned:
 * libibverbs returns a positive errno (0 on success); some entry points
 * (ibv_query_gid in older rdma-core) return -1 and set errno; providers'
 * ops (post_send, post_srq_recv, poll_cq, req_notify_cq) may return their
 * own negative values, which are not errnos. The caller clears errno before
 * the call. The result is 0 or -errno (-EIO when there is no errno); the
 * original value goes to *raw when raw is not NULL.
 */
static inline int b2bv_rc(int rc, int err, int *raw)
{
	if (raw)
		*raw = rc;
	if (rc == 0)
		return 0;
	if (rc > 0)
		return -rc;
	if (rc == -1 && err > 0)
		return -err;
	return -EIO;
}

/* A NULL from a constructor: -errno, or -EIO when errno was not set. */
static inline int b2bv_null_rc(int err) { return err > 0 ? -err : -EIO; }

/* Calls expr (an int-returning verb) with errno cleared; normalises it. */
#define B2BV_CALL(raw, expr)                                                   \
	({                                                                     \
		errno = 0;                                                     \
		int rc_ = (expr);                                              \
		b2bv_rc(rc_, errno, (raw));                                    \
	})

/* Calls expr (a constructor) and stores it in *out: 0 or -errno. */
#define B2BV_NEW(out, expr)                                                    \
	({                                                                     \
		errno = 0;                                                     \
		*(out) = (expr);                                               \
		*(out) ? 0 : b2bv_null_rc(errno);                              \
	})

/* Nanoseconds from a to b (CLOCK_MONOTONIC readings). */
static inline uint64_t b2bv_ns(const struct timespec *a, const struct timespec *b)
{
	return (uint64_t)((b->tv_sec - a->tv_sec) * 1000000000ll + (b->tv_nsec - a->tv_nsec));
}

/*
 * b2bv_chain_send posts the chain just planned in ch (res.n_wr > 0) with
 * one ibv_post_send; planned is when planning ended (res.post_ns counts
 * from it). On a refusal it records post_failed, bad_wr and post_raw and
 * adds the WRs the device accepted to req.seq (the device owns those:
 * credits stay exact); on success the caller commits the cursor and seq.
 */
int b2bv_chain_send(struct ibv_qp *qp, struct b2bv_chain *ch, const struct timespec *planned);

#endif
