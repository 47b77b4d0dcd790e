//go:build cgo && linux

/* device.c: device list, contexts, ports, GIDs, async events. */
#define _GNU_SOURCE
#include "b2bv_int.h"

#include <fcntl.h>
#include <string.h>

int b2bv_get_device_list(struct ibv_device ***out, int *n)
{
	*n = 0;
	return B2BV_NEW(out, b2bv_lib.get_device_list(n));
}

void b2bv_free_device_list(struct ibv_device **l) { b2bv_lib.free_device_list(l); }
const char *b2bv_device_name(struct ibv_device *d) { return b2bv_lib.get_device_name(d); }

int b2bv_open_device(struct ibv_device *d, struct ibv_context **out)
{
	return B2BV_NEW(out, b2bv_lib.open_device(d));
}

int b2bv_close_device(struct ibv_context *c) { return B2BV_CALL(NULL, b2bv_lib.close_device(c)); }

int b2bv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	return B2BV_CALL(NULL, b2bv_lib.query_device(c, a));
}

/* Mirrors verbs.h's ___ibv_query_port: prefer the extended op. */
int b2bv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
	if (!vctx) {
		memset(a, 0, sizeof(*a));
		return B2BV_CALL(NULL, b2bv_lib.query_port(c, port, (struct _compat_ibv_port_attr *)a));
	}
	return B2BV_CALL(NULL, vctx->query_port(c, port, a, sizeof(*a)));
}

int b2bv_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *gid16)
{
	union ibv_gid g;
	int rc = B2BV_CALL(NULL, b2bv_lib.query_gid(c, port, index, &g));
	if (rc == 0)
		memcpy(gid16, g.raw, 16);
	return rc;
}

int b2bv_async_fd(struct ibv_context *c) { return c->async_fd; }

int b2bv_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/*
 * Reads, copies out and acknowledges pending async events (the fd is
 * non-blocking: ibv_get_async_event failing means none is left).
 */
int b2bv_drain_async(struct ibv_context *c, struct b2bv_async *out, int cap, int *n)
{
	int k = 0;
	while (k < cap) {
		struct ibv_async_event ev;
		if (b2bv_lib.get_async_event(c, &ev) != 0)
			break;
		struct b2bv_async *o = &out[k++];
		memset(o, 0, sizeof(*o));
		o->type = (uint32_t)ev.event_type;
		switch (ev.event_type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_PATH_MIG:
		case IBV_EVENT_PATH_MIG_ERR:
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			o->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
			break;
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_LID_CHANGE:
		case IBV_EVENT_PKEY_CHANGE:
		case IBV_EVENT_SM_CHANGE:
		case IBV_EVENT_CLIENT_REREGISTER:
		case IBV_EVENT_GID_CHANGE:
			o->port = (uint32_t)ev.element.port_num;
			break;
		default:
			break;
		}
		b2bv_lib.ack_async_event(&ev);
	}
	*n = k;
	return 0;
}
