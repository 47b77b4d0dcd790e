// Package verbs is b2bd's cgo binding to libibverbs: device discovery, GID
// selection, protection domains, memory regions (host and dma-buf), CQs with
// a completion channel, SRQs, RC queue pairs, and the data path — a WR chain
// planner and poster written in C so that one cgo call builds and posts a
// whole chain (one ibv_post_send) and one cgo call polls a batch of
// completions.
//
// libibverbs is loaded at run time through internal/dl (dlopen), so binaries built with cgo
// start on hosts without rdma-core; without cgo (or off Linux) the package
// compiles to stubs. Either way an unusable verbs stack is reported as an
// error wrapping ErrUnavailable.
//
// Ownership: each handle type owns one C object. Close is safe to call
// twice (and on nil); every other method of a closed or nil handle returns
// an error wrapping ErrClosed, or a zero value where it returns no error.
// Parents refuse to close while children are open (QP → CQ/SRQ → MR → PD →
// Context), and constructors undo partial work on failure. Handles are not
// safe for concurrent Close; the data-path calls follow libibverbs' own
// thread-safety (post and poll may run on different threads).
//
// Layout: one Go file per handle kind (device.go: Context; mr.go: PD, MR;
// cq.go: CompChannel, CQ, WCBuf; srq.go; qp.go; chain.go; hostmem.go),
// each with a C twin (device.c, ...) and a _stub.go twin for builds
// without cgo; load.go/load.c hold loading and the one error helper
// (callErr), errors.go the sentinel errors.
package verbs

import (
	"fmt"
	"net"
)

// MTU is an IB path MTU enum value (ibv_mtu): 1 = 256 B .. 5 = 4096 B.
type MTU int

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, 0 when invalid.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << int(m)
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("mtu(%d)", int(m))
}

// MTUFromBytes maps 256..4096 to the enum; ok is false for other values.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// PortState is ibv_port_state.
type PortState int

const (
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

func (s PortState) String() string {
	switch s {
	case 0:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case 5:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// LinkLayer is the port's link layer.
type LinkLayer int

const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

// String matches sysfs and the proto's VerbsPort.link_layer.
func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand:
		return "InfiniBand"
	case LinkEthernet:
		return "Ethernet"
	}
	return "Unspecified"
}

// PortAttr is the part of ibv_port_attr b2bd uses.
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	GIDTableLen int
	MaxMsgSize  uint32
	LID         uint16
	LinkLayer   LinkLayer
	// ActiveSpeed and ActiveWidth are ibv_port_attr's encodings (speed per
	// lane, lanes); see LinkBitsPerSecond.
	ActiveSpeed uint8
	ActiveWidth uint8
}

// LinkBitsPerSecond is the port's nominal signalling rate from its active
// speed and width (IB encodings; Ethernet ports report the nearest IB
// pair), 0 when either is unknown. Soft-RoCE over a netdev without a
// reported speed says 1X SDR: 2.5 Gb/s.
func (a PortAttr) LinkBitsPerSecond() uint64 {
	var lane uint64 // Mb/s per lane
	switch a.ActiveSpeed {
	case 1: // SDR
		lane = 2500
	case 2: // DDR
		lane = 5000
	case 4, 8: // QDR, FDR10
		lane = 10000
	case 16: // FDR
		lane = 14000
	case 32: // EDR
		lane = 25000
	case 64: // HDR
		lane = 50000
	case 128: // NDR
		lane = 100000
	}
	var lanes uint64
	switch a.ActiveWidth {
	case 1:
		lanes = 1
	case 2:
		lanes = 4
	case 4:
		lanes = 8
	case 8:
		lanes = 12
	case 16:
		lanes = 2
	}
	return lane * lanes * 1_000_000
}

// DeviceAttr is the part of ibv_device_attr b2bd uses.
type DeviceAttr struct {
	FWVersion  string
	VendorID   uint32
	PartID     uint32
	MaxMRSize  uint64
	MaxQP      int
	MaxQPWR    int
	MaxSGE     int
	MaxCQ      int
	MaxCQE     int
	MaxMR      int
	MaxSRQ     int
	MaxSRQWR   int
	MaxSRQSGE  int
	PhysPorts  int
	MaxQPRdAtm int // max_qp_rd_atom: READs a QP answers at once as the responder
	// MaxQPInitRdAtm is max_qp_init_rd_atom: READs a QP keeps outstanding
	// as the initiator.
	MaxQPInitRdAtm int
	MaxSGERd       int // max_sge_rd: SGEs of one RDMA READ WR (0: not reported)
}

// Access flags for MRs and QPs (ibv_access_flags).
type Access int

const (
	AccessLocalWrite  Access = 1
	AccessRemoteWrite Access = 1 << 1
	AccessRemoteRead  Access = 1 << 2
	// AccessDefault is what b2bd registers every region with.
	AccessDefault = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
)

// GID is a 16-byte port GID.
type GID [16]byte

func (g GID) String() string { return net.IP(g[:]).String() }

// IsZero reports an empty GID table slot.
func (g GID) IsZero() bool { return g == GID{} }

// WCStatus is ibv_wc_status.
type WCStatus uint32

// A few statuses the transport treats specially.
const (
	WCSuccess      WCStatus = 0
	WCLocProtErr   WCStatus = 4
	WCFlushErr     WCStatus = 5
	WCRemAccessErr WCStatus = 10
	WCRetryExcErr  WCStatus = 12
	WCRNRRetryErr  WCStatus = 13
)

// WCOpcode is ibv_wc_opcode.
type WCOpcode uint32

const (
	WCSend           WCOpcode = 0
	WCRDMAWrite      WCOpcode = 1
	WCRDMARead       WCOpcode = 2
	WCRecv           WCOpcode = 128
	WCRecvRDMAWithIm WCOpcode = 129
)

// WC is a work completion, copied out of C by CQ.Poll.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	QPNum     uint32
	Imm       uint32 // host order; valid when HasImm
	ByteLen   uint32
	VendorErr uint32
	Flags     uint32
}

// WCWithImm is IBV_WC_WITH_IMM in WC.Flags.
const WCWithImm = 2

// HasImm reports IBV_WC_WITH_IMM.
func (w *WC) HasImm() bool { return w.Flags&WCWithImm != 0 }

// IsRecv reports a receive-side completion.
func (w *WC) IsRecv() bool { return w.Opcode&WCRecv != 0 }

// WR kinds carried in wr_id bits 28..31 (see b2bv.h).
const (
	KindData = 1
	KindMeta = 2
	KindAck  = 3
	KindBye  = 4
	KindPing = 5
	KindRead = 6 // an RDMA READ's data WR (KindData is a WRITE's)
)

// DataKind is the wr_id kind of op's data WRs: KindRead for WRRead, else
// KindData.
func DataKind(op WROpcode) int {
	if op == WRRead {
		return KindRead
	}
	return KindData
}

// WRID packs a send wr_id: the QP's WR sequence number after this WR, the
// kind, and the first batch block it carries (28 bits).
func WRID(seq uint32, kind int, block uint32) uint64 {
	return uint64(seq)<<wridSeqShift | uint64(kind&wridKindMask)<<wridKindShift | uint64(block&wridBlockMask)
}

// SplitWRID undoes WRID.
func SplitWRID(id uint64) (seq uint32, kind int, block uint32) {
	return uint32(id >> wridSeqShift), int(id>>wridKindShift) & wridKindMask, uint32(id) & wridBlockMask
}

// wr_id fields, as B2BV_WRID in b2bv.h.
const (
	wridSeqShift  = 32
	wridKindShift = 28
	wridKindMask  = 0xF
	wridBlockMask = 0x0FFFFFFF
)

// Opcodes for QP.PostSend (ibv_wr_opcode).
type WROpcode int

const (
	WRWrite        WROpcode = 0
	WRWriteWithImm WROpcode = 1
	WRSend         WROpcode = 2
	WRSendWithImm  WROpcode = 3
	WRRead         WROpcode = 4 // IBV_WR_RDMA_READ
)

// AsyncEvent is an acknowledged ibv_async_event.
type AsyncEvent struct {
	Type  int
	QPNum uint32
	Port  int
}

// Async event types b2bd reacts to (ibv_event_type).
const (
	EventQPFatal         = 1
	EventQPReqErr        = 2
	EventQPAccessErr     = 3
	EventDeviceFatal     = 8
	EventPortActive      = 9
	EventPortErr         = 10
	EventQPLastWQE       = 16
	EventSRQErr          = 14
	EventSRQLimitReached = 15
)

// Pos is a cursor inside a batch: block I at byte Off. The end of a range
// (I, Off) is exclusive; (N, 0) is the end of a batch of N blocks.
type Pos struct {
	I   uint32
	Off uint64
}

// ChainParams configures a Chain or a Plan for one region pair; set once
// per batch.
//
// Src and Dst name the direction bytes move in, as a batch's Src and Dst
// arrays do: with Op WRWrite (the zero value) the source is the local MR
// and the destination the remote one; with WRRead the source is remote and
// the destination local. LKey is always the local MR's, RKey the remote's.
// Either way a WR reads or writes one contiguous remote range, and its
// SGEs gather from (WRITE) or scatter into (READ) local pieces.
type ChainParams struct {
	Op                 WROpcode // WRWrite or WRRead
	SrcBase, DstBase   uint64   // addresses of offset 0 (WRITE: local MR, remote MR; READ: remote, local)
	SrcLimit, DstLimit uint64   // region sizes: no WR ever leaves them
	LKey, RKey         uint32
	MaxWR              int    // WRs per chain (≤ the chain's capacity)
	MaxSGE             int    // SGEs per WR (≤ capacity and the QP's max_send_sge)
	MaxWRBytes         uint64 // a WR carries at most this (0: 2 GiB)
	MaxChainBytes      uint64 // size-aware chain length: stop at this many bytes (0: none)
	SignalEvery        int    // one signaled WR every K, plus each chain's last
	InlineMax          int    // WRITEs up to this many bytes go inline (host memory only; never READs)
}

// ChainResult describes one planned or posted chain.
type ChainResult struct {
	WRs      int
	SGEs     int
	Signaled int
	Bytes    uint64
	Done     bool   // the range is fully planned/posted
	Seq      uint32 // the QP's WR sequence number after the chain
	// PostChain only: nanoseconds spent planning the chain and inside
	// ibv_post_send (measured in C).
	PlanNs, PostNs int64
}

// SGE is one scatter/gather element of a planned WR.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// WRInfo is a planned WR as the device would see it (for tests and tracing).
type WRInfo struct {
	WRID       uint64
	Opcode     WROpcode
	Signaled   bool
	Inline     bool
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32 // host order
	SGEs       []SGE
}

// QPState is ibv_qp_state, as QP.State returns it (an int, for the
// callers that compare it).
const (
	QPStateReset = 0
	QPStateInit  = 1
	QPStateRTR   = 2
	QPStateRTS   = 3 // IBV_QPS_RTS: the only state that sends
	QPStateSQD   = 4
	QPStateSQE   = 5
	QPStateErr   = 6
)

// QPConfig describes an RC QP.
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // receives come from the SRQ (nil: a one-entry RQ)
	MaxSendWR      int
	MaxSendSGE     int
	MaxInline      int
}

// QPCaps is what the provider granted.
type QPCaps struct {
	MaxSendWR, MaxSendSGE, MaxInline int
}

// RTRAttr is the remote side as INIT→RTR needs it.
type RTRAttr struct {
	Port        int
	RemoteQPN   uint32
	RemotePSN   uint32
	MTU         MTU
	Global      bool // RoCE: always (GRH with the remote GID)
	RemoteGID   GID
	GIDIndex    int // our source GID index
	RemoteLID   uint16
	MinRNRTimer int
	// MaxDestRdAtomic is max_dest_rd_atomic, the peer's READs this QP
	// answers at once (0: 1).
	MaxDestRdAtomic int
}

// RTSAttr is what RTR → RTS needs.
type RTSAttr struct {
	PSN        uint32
	Timeout    int // 4.096 µs * 2^Timeout per retry
	RetryCount int
	RNRRetry   int // 7 = infinite
	// MaxRdAtomic is max_rd_atomic, the READs this QP keeps outstanding
	// (0: 1).
	MaxRdAtomic int
}

// BlockGroup is one fused segment group of a layout pair, as the C
// expansion reads it (struct b2bv_bgroup): block b of the group is
// BlockLen bytes at SrcBase + b*SrcStride in source region SrcRegion and
// at DstBase + b*DstStride in destination region DstRegion. Mergeable
// (stride == block on both sides) lets consecutive ids merge.
type BlockGroup struct {
	SrcBase, DstBase     uint64
	SrcStride, DstStride uint64
	BlockLen             uint64
	SrcRegion, DstRegion uint32
	Mergeable            bool
}

// BlockRegion is a region of a block table: the address of its offset 0,
// its size, and its lkey (local side) or rkey (remote side).
type BlockRegion struct {
	Addr, Limit uint64
	Key         uint32
}

// BlockPos is a position in a block request's expansion: entry Entry of
// group Group (the end of a range is exclusive).
type BlockPos struct{ Group, Entry uint32 }
