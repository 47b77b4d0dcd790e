//go:build cgo && linux

/* qp.c: RC queue pairs, their state transitions and single sends. */
#include "b2bv_int.h"

#include <arpa/inet.h>
#include <string.h>

int b2bv_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		      struct ibv_srq *srq, uint32_t max_send_wr,
		      uint32_t max_send_sge, uint32_t max_inline,
		      uint32_t *caps3, struct ibv_qp **out)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0; /* selective signaling */
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_inline_data = max_inline;
	/* Without an SRQ the QP gets a one-entry RQ it never uses. */
	a.cap.max_recv_wr = srq ? 0 : 1;
	a.cap.max_recv_sge = srq ? 0 : 1;
	int rc = B2BV_NEW(out, b2bv_lib.create_qp(pd, &a));
	if (rc == 0 && caps3) {
		/* The provider may round up: report what we really got. */
		caps3[0] = a.cap.max_send_wr;
		caps3[1] = a.cap.max_send_sge;
		caps3[2] = a.cap.max_inline_data;
	}
	return rc;
}

int b2bv_destroy_qp(struct ibv_qp *qp) { return B2BV_CALL(NULL, b2bv_lib.destroy_qp(qp)); }
uint32_t b2bv_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

int b2bv_qp_to_init(struct ibv_qp *qp, uint8_t port, int access, int *raw)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = B2BV_PKEY_INDEX;
	a.port_num = port;
	a.qp_access_flags = access;
	return B2BV_CALL(raw, b2bv_lib.modify_qp(qp, &a,
					  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						  IBV_QP_ACCESS_FLAGS));
}

int b2bv_qp_to_rtr(struct ibv_qp *qp, uint8_t port, uint32_t dest_qpn,
		   uint32_t rq_psn, int mtu, int is_global, uint64_t dgid_hi,
		   uint64_t dgid_lo, uint8_t sgid_index, uint16_t dlid,
		   uint8_t min_rnr_timer, uint8_t max_dest_rd_atomic, int *raw)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn & B2BV_PSN_MASK;
	/* READs of the peer this QP answers at once (responder resources) */
	a.max_dest_rd_atomic = max_dest_rd_atomic ? max_dest_rd_atomic : B2BV_RD_ATOMIC_MIN;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.port_num = port;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	if (is_global) {
		a.ah_attr.is_global = 1;
		for (int k = 0; k < 8; k++) {
			a.ah_attr.grh.dgid.raw[k] = (uint8_t)(dgid_hi >> (56 - 8 * k));
			a.ah_attr.grh.dgid.raw[8 + k] = (uint8_t)(dgid_lo >> (56 - 8 * k));
		}
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.hop_limit = B2BV_HOP_LIMIT;
		a.ah_attr.grh.traffic_class = 0;
		a.ah_attr.grh.flow_label = 0;
	}
	return B2BV_CALL(raw, b2bv_lib.modify_qp(qp, &a,
					  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC |
						  IBV_QP_MIN_RNR_TIMER));
}

int b2bv_qp_to_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout,
		   uint8_t retry_cnt, uint8_t rnr_retry, uint8_t max_rd_atomic, int *raw)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn & B2BV_PSN_MASK;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = rnr_retry;
	/* READs this QP keeps outstanding at once (initiator depth) */
	a.max_rd_atomic = max_rd_atomic ? max_rd_atomic : B2BV_RD_ATOMIC_MIN;
	return B2BV_CALL(raw, b2bv_lib.modify_qp(qp, &a,
					  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
						  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						  IBV_QP_MAX_QP_RD_ATOMIC));
}

int b2bv_qp_to_err(struct ibv_qp *qp, int *raw)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	return B2BV_CALL(raw, b2bv_lib.modify_qp(qp, &a, IBV_QP_STATE));
}

int b2bv_qp_state(struct ibv_qp *qp, int *state)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	*state = 0;
	int rc = B2BV_CALL(NULL, b2bv_lib.query_qp(qp, &a, IBV_QP_STATE, &ia));
	if (rc == 0)
		*state = (int)a.qp_state;
	return rc;
}

/* One WR: SEND, SEND_WITH_IMM or a zero-length WRITE_WITH_IMM. */
int b2bv_post_send1(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint32_t imm,
		    uint64_t addr, uint32_t len, uint32_t lkey, int flags, int *raw)
{
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = (enum ibv_wr_opcode)opcode;
	wr.send_flags = (unsigned int)flags;
	wr.imm_data = htonl(imm);
	if (len) {
		wr.sg_list = &sge;
		wr.num_sge = 1;
	}
	return B2BV_CALL(raw, ibv_post_send(qp, &wr, &bad));
}
