// Package verbs is b2bd's RDMA transport: one-sided RDMA WRITE chains over
// RC queue pairs, posted by the CPU, with a WRITE_WITH_IMM per QP marking
// the end of a batch and a SEND from the receiver acknowledging it.
//
// Per batch (Conn.Write):
//  1. the blocks are cut into byte-balanced ranges, one per QP used;
//  2. a small meta SEND (tag, QP count, blocks, bytes, rkey) goes first on
//     the batch's first QP, so the receiver can account the batch;
//  3. each QP gets chains of RDMA WRITEs (adjacent blocks merged, blocks
//     with contiguous destinations gathered into one multi-SGE WR, one
//     signaled WR every SignalEvery), posted round-robin over the QPs, one
//     ibv_post_send per chain, within the send-queue credits;
//  4. each QP's last WR is WRITE_WITH_IMM carrying the batch tag; RC
//     ordering makes it complete only after that QP's earlier writes;
//  5. once the receiver has the meta and one immediate per QP, it calls
//     Inbound.Landed and SENDs an immediate ack with the tag; Write returns
//     after that ack, never before.
//
// Any failed work completion or QP error breaks the Conn (Err turns
// non-nil) and fails the batch with errs.ErrAborted. A deadline or cancel
// stops only its batch (abandon): nothing more posted, the posted WRs
// waited for, the receiver told; the Conn breaks only if that wait runs
// out (CancelWait).
//
// Prepared batches (qpSet.Prepare, transport.Preparer): steps 1 and 3's
// planning run once; every WR and SGE of every QP's share is built in C
// memory (verbs.Plan, one cgo call). A prepared Write sends the meta as
// above and posts each share from its cursor in chains of up to the free
// credits (ending at ChainBytes), one cgo call per chain, which patches
// only the wr_id sequence numbers, the chain's last WR (signaled and the
// list cut there, both restored after the post) and the share's immediate.
// A source rekeyed since the plan was stamped is re-stamped (every SGE's
// lkey) once, before anything is posted. With PostThreads > 1 the shares
// are posted in parallel by a pool of OS-locked goroutines. Everything else
// (serialised per set, credits, stall guard, abandon on deadline,
// refusal as NotFound, the source MR held per batch) is Write's.
package verbs

import (
	"flag"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// Config tunes the transport. Zero values take the defaults below.
//
// Defaults were chosen by measurement on the Soft-RoCE testbed (two QEMU
// VMs, 1 vCPU each, rxe0 over virtio-net; see the package's report and
// deploy/rdma-testbed/test-rdma.sh) and checked against what large NICs
// need; the measurements are quoted next to each field.
type Config struct {
	Device   string // --rdma-device: "" = the device of NetDev, else the first with an ACTIVE port
	Port     int    // --rdma-port
	GIDIndex int    // --gid-index: -1 = auto (RoCE v2 GID of NetDev's IPv4 address)
	NetDev   string // --rdma-netdev: restricts GID choice (and picks the device when Device is "")

	// QPsPerPeer: RC QPs per connection; a batch's bytes are spread over
	// them. More QPs let a NIC work on several WR streams in parallel (CX-7:
	// 1 QP ~365 Gb/s, 2 ~392 Gb/s).
	QPsPerPeer int
	// SignalEvery: one signaled WR every K (each chain's last always is).
	SignalEvery int
	// MaxChain: WRs per ibv_post_send (doorbell batching).
	MaxChain int
	// ChainBytes: a chain also ends once it carries this many bytes, so big
	// blocks reach the wire without waiting for a long chain to be built and
	// all QPs start early (size-aware chain length).
	ChainBytes int
	// SQDepth: send-queue entries per QP (credits).
	SQDepth int
	// SRQDepth: receives posted on the shared receive queue.
	SRQDepth int
	// MaxSGE: SGEs per WR for gathering (capped by the device).
	MaxSGE int
	// MaxWRBytes: the most one WR carries; bigger blocks are cut.
	MaxWRBytes int
	// ReadDepth: a cap on the RDMA READs a QP keeps outstanding (its
	// max_rd_atomic); 0, the default, is no cap. max_rd_atomic is the least
	// of the device's max_qp_init_rd_atom, this cap and the peer's
	// max_dest_rd_atomic (sent at connect; 16 from a peer that predates it).
	// At 16 (the old default), 10,000 x 128 B READs reached 0.78-0.88x of a
	// tuned ib_read_bw on Soft-RoCE, whose limit is 128; at 128, 1.09x.
	// ReadWRBytes: the most one READ carries. Together they bound the READ response bytes in flight
	// per QP (ReadDepth x ReadWRBytes): unlike a WRITE's, a READ's
	// responses are not paced by the requester's window, and on Soft-RoCE
	// 128 outstanding 1 MiB READs (rxe's limit x MaxWRBytes) flooded the
	// wire until a READ ran out of retries.
	ReadDepth   int
	ReadWRBytes int
	// MinQPBytes: a batch uses one QP per this many bytes (at least one), up
	// to QPsPerPeer, so tiny batches do not pay for several immediates.
	MinQPBytes int
	// PostThreads: OS threads that post the QP shares of a prepared batch
	// in parallel (the writer's own included); 1 posts them one after the
	// other. See DefaultPostThreads.
	PostThreads int
	// InlineBytes: WRs up to this size go inline (host memory only; 0 off).
	InlineBytes int
	// PollSpin: how long the poller busy-polls after the last completion
	// before arming the CQ and sleeping. Ignored when GOMAXPROCS is 1.
	PollSpin time.Duration
	// AckTimeout: the QP's local ACK timeout exponent (4.096 µs * 2^n).
	AckTimeout int
	// RetryCount: transport retries (1..7) before a WR fails with
	// RETRY_EXC_ERR.
	RetryCount int
	// KeepAlive: a receiving QP set idle this long is probed; a dead sender's
	// set is then torn down.
	KeepAlive time.Duration
	// StallTimeout: a batch whose connection shows no progress this long (no
	// work completion, good or failed, and no acknowledgement) is cut off and
	// the connection dropped, so the caller can retry on a fresh one before
	// its deadline. The NIC's own retries fail a dead path far sooner (about
	// 0.5 s at the defaults); this guards against a path that neither
	// completes nor fails, as Soft-RoCE did once under CPU starvation after
	// link flaps (WRs in flight for 60 s, until the batch's deadline).
	StallTimeout time.Duration
	// CancelWait: a batch stopped by its caller's deadline or cancel posts
	// nothing more and waits for the WRs it already posted to complete
	// (then nothing of it can land any more, and the connection stays for
	// the batches behind it), at most its bytes at the port's nominal rate
	// plus this margin; the receiver's answer to the cancel gets this long
	// again. Past that the QPs go to ERROR and the connection is dropped,
	// as before, so an answer never waits long on a stuck or slow peer.
	CancelWait time.Duration
}

// Defaults. The data-path ones were chosen on the Soft-RoCE testbed with
// TestHWPair (two VMs, 1 vCPU each; 2000 x 128 B / 2000 x 4 KiB / 256 x
// 64 KiB / 8 x 2 MiB random blocks per batch, best of 4 timed batches, two
// interleaved rounds per configuration, every block verified). MB/s, the
// better of the two rounds, varying one knob from qps=4,signal=16,chain=64:
//
//	                 128 B   4 KiB   64 KiB   2 MiB
//	qps=1             1.26   11.80    30.09   22.90   (one round)
//	qps=2             2.06   26.68    43.69   42.05
//	qps=4             2.27   29.04    41.97   35.82
//	qps=8             1.98   28.00    34.40   25.40   (one round; once hit an rxe NAK)
//	signal=4          1.61   21.52    33.25   32.28
//	signal=64         1.97   25.49    32.68   28.24
//	chain=16          1.81   22.30    29.21   30.25
//	chain=128         1.89   26.01    38.86   38.35
//
// The emulated wire is noisy (±30% between rounds), so only the clear
// effects decide: one QP is half as fast as two or four for small blocks,
// signaling every 4 WRs and chains of 16 lose to 16 and 64, and nothing
// gains beyond those. 2 and 4 QPs tie here; 4 is the default because a real
// NIC's message rate grows with QPs working in parallel (UCCL uses 4), and
// a batch's bytes are split byte-balanced so big blocks gain as well.
//
// The send queue, chain and signalling defaults were then raised from 512,
// 64 and 16 to 2048, 256 and 256 (one signaled WR per chain) by the
// interleaved make test-rdma comparison with 10,000-block batches, where
// 2 KiB (8,192 WRITEs per batch) was the one size at which b2bd trailed a
// tuned ib_write_bw (median 0.91-0.97 in five runs). With a 2,048-WR SQ a
// QP's whole share of such a batch is posted at once; rxe then sends from
// its own context instead of inside ibv_post_send (post phase 300 -> 47 ms
// per batch, source daemon CPU halved), and a one-vCPU VM takes 32 instead
// of 512 completion wake-ups per batch: 1.01 and 1.15 in two short runs,
// then 1.10 (0.98-1.26) in a fresh-clone make test where every size was at
// or above 1.02 (deploy/rdma-testbed/README.md). A real NIC gains too:
// fewer CQEs, one doorbell per 256 WRs. A device whose max_qp_wr is smaller
// gets its largest (fitSendQueue).
const (
	DefaultPort        = 1
	DefaultQPsPerPeer  = 4
	DefaultSignalEvery = 256
	DefaultMaxChain    = 256
	DefaultChainBytes  = 1 << 20
	DefaultSQDepth     = 2048
	DefaultSRQDepth    = 1024
	DefaultMaxSGE      = 16
	DefaultMaxWRBytes  = 1 << 20
	DefaultReadDepth   = 0 // no cap: the device's and the peer's limits decide
	DefaultReadWRBytes = 64 << 10
	DefaultMinQPBytes  = 64 << 10
	DefaultInlineBytes = 0
	// DefaultPostThreads is 1, by measurement. Plan-only (no NIC), one
	// dry submit of 10,000 WRs (random 128 B blocks) over 4 QP shares on
	// the 2-core build host (BenchmarkPreparedPatch10k, load ~15): 1 thread
	// 17.8-20.5 µs with chains of up to 512 WRs (27-41 µs with chains of
	// 64), 2 threads 59-275 µs, 4 threads 82-171 µs: patching costs ~1.8
	// ns/WR, so the hand-off to another thread costs more than it saves.
	// The Soft-RoCE VMs have one vCPU each, so threads cannot gain there
	// either: TestHWPreparedPost, 10,000 x 128 B random, medians of 7,
	// prepared against ad hoc writes interleaved on the same pair: 292 /
	// 306 ms with 1 thread, 266 / 255 ms with 2, 185 / 166 ms with 4 (the
	// pairs differ run to run; the ratio does not improve with threads). On
	// a many-core host with a real NIC, where ibv_post_send writes each WQE
	// to device memory, measure with --rdma-post-threads = QPs per peer.
	DefaultPostThreads = 1
	DefaultPollSpin    = 20 * time.Microsecond
	DefaultAckTimeout  = 14 // ~67 ms per try: a dead peer is declared after ~0.5 s
	// DefaultRetryCount is 6, not the usual 7: Soft-RoCE (rxe) treats
	// retry_cnt 7 as "retry forever" (seen on the testbed: a Write to a
	// vanished peer never failed), while 6 is finite everywhere.
	DefaultRetryCount = 6
	DefaultKeepAlive  = 30 * time.Second
	// DefaultStallTimeout is ten times the NIC's retry budget at the
	// defaults (7 tries x 67 ms), rounded up.
	DefaultStallTimeout = 5 * time.Second
	// DefaultCancelWait: the cancel-under-load test's batches (64 x 4 KiB)
	// take about 6 ms at the Soft-RoCE VMs' 40 MB/s, but a VM may not be
	// scheduled for longer than rxe's 67 ms retry timer (see the testbed's
	// README): 250 ms keeps those stops clean, and bounds the answer on a
	// stuck peer well under the old fence's 1 s flush wait plus this.
	DefaultCancelWait = 250 * time.Millisecond

	// maxQPsPerConn bounds QPsPerPeer and a peer's ConnectVerbs request.
	maxQPsPerConn = 64
)

// DefaultConfig is Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		Port: DefaultPort, GIDIndex: -1,
		QPsPerPeer: DefaultQPsPerPeer, SignalEvery: DefaultSignalEvery, MaxChain: DefaultMaxChain,
		ChainBytes: DefaultChainBytes, SQDepth: DefaultSQDepth, SRQDepth: DefaultSRQDepth,
		MaxSGE: DefaultMaxSGE, MaxWRBytes: DefaultMaxWRBytes, MinQPBytes: DefaultMinQPBytes,
		ReadDepth: DefaultReadDepth, ReadWRBytes: DefaultReadWRBytes,
		InlineBytes: DefaultInlineBytes, PostThreads: DefaultPostThreads, PollSpin: DefaultPollSpin, AckTimeout: DefaultAckTimeout,
		RetryCount: DefaultRetryCount, KeepAlive: DefaultKeepAlive, StallTimeout: DefaultStallTimeout,
		CancelWait: DefaultCancelWait,
	}
}

// RegisterFlags adds the transport's flags to fs, with c's current values
// (set c to DefaultConfig() first) as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Device, "rdma-device", c.Device, "RDMA device (e.g. mlx5_0, rxe0); empty: the device of --rdma-netdev, else the first with an active port")
	fs.IntVar(&c.Port, "rdma-port", c.Port, "RDMA device port")
	fs.IntVar(&c.GIDIndex, "gid-index", c.GIDIndex, "GID index; -1: auto (RoCE v2 GID of the netdev's IPv4 address)")
	fs.StringVar(&c.NetDev, "rdma-netdev", c.NetDev, "netdev whose RoCE GID to use (empty: any)")
	fs.IntVar(&c.QPsPerPeer, "qps-per-peer", c.QPsPerPeer, "RC queue pairs per peer connection")
	fs.IntVar(&c.SignalEvery, "rdma-signal-every", c.SignalEvery, "one signaled work request every N")
	fs.IntVar(&c.MaxChain, "rdma-max-chain", c.MaxChain, "work requests per ibv_post_send chain")
	fs.IntVar(&c.ChainBytes, "rdma-chain-bytes", c.ChainBytes, "a chain ends once it carries this many bytes")
	fs.IntVar(&c.SQDepth, "rdma-sq-depth", c.SQDepth, "send queue depth per QP")
	fs.IntVar(&c.SRQDepth, "rdma-srq-depth", c.SRQDepth, "shared receive queue depth")
	fs.IntVar(&c.MaxSGE, "rdma-max-sge", c.MaxSGE, "SGEs per work request for gathering blocks (capped by the device)")
	fs.IntVar(&c.MaxWRBytes, "rdma-max-wr-bytes", c.MaxWRBytes, "largest single RDMA WRITE; bigger blocks are cut")
	fs.IntVar(&c.ReadDepth, "rdma-read-depth", c.ReadDepth, "cap on the RDMA READs a QP keeps outstanding (max_rd_atomic); 0: no cap, the device's max_qp_init_rd_atom and the peer's max_dest_rd_atomic decide")
	fs.IntVar(&c.ReadWRBytes, "rdma-read-wr-bytes", c.ReadWRBytes, "largest single RDMA READ; bigger ranges are cut")
	fs.IntVar(&c.MinQPBytes, "rdma-min-qp-bytes", c.MinQPBytes, "a batch uses one more QP per this many bytes")
	fs.IntVar(&c.InlineBytes, "rdma-inline", c.InlineBytes, "send WRs of at most this many bytes inline (host memory; 0: off)")
	fs.IntVar(&c.PostThreads, "rdma-post-threads", c.PostThreads, "threads posting the QP shares of a prepared transfer in parallel (1: one after the other)")
	fs.DurationVar(&c.PollSpin, "rdma-poll-spin", c.PollSpin, "busy-poll this long before sleeping on the completion channel")
	fs.IntVar(&c.AckTimeout, "rdma-ack-timeout", c.AckTimeout, "QP ACK timeout exponent (4.096us * 2^n)")
	fs.IntVar(&c.RetryCount, "rdma-retry-count", c.RetryCount, "QP transport retries (1-7; rxe treats 7 as infinite)")
	fs.DurationVar(&c.KeepAlive, "rdma-keepalive", c.KeepAlive, "probe receiving connections idle this long")
	fs.DurationVar(&c.CancelWait, "rdma-cancel-wait", c.CancelWait, "a cancelled or timed-out batch waits for its posted work requests at most its bytes at the link rate plus this long, then its connection is stopped")
	fs.DurationVar(&c.StallTimeout, "rdma-stall-timeout", c.StallTimeout, "cut off a batch whose connection shows no progress (no completion, no ack) this long, so it is retried on a fresh one")
}

// normalize fills zero fields with defaults and rejects nonsense.
func (c *Config) normalize() error {
	d := DefaultConfig()
	def := func(v *int, dv int) {
		if *v == 0 {
			*v = dv
		}
	}
	def(&c.Port, d.Port)
	def(&c.QPsPerPeer, d.QPsPerPeer)
	def(&c.SignalEvery, d.SignalEvery)
	def(&c.MaxChain, d.MaxChain)
	def(&c.ChainBytes, d.ChainBytes)
	def(&c.SQDepth, d.SQDepth)
	def(&c.SRQDepth, d.SRQDepth)
	def(&c.MaxSGE, d.MaxSGE)
	def(&c.MaxWRBytes, d.MaxWRBytes)
	def(&c.ReadWRBytes, d.ReadWRBytes)
	def(&c.MinQPBytes, d.MinQPBytes)
	def(&c.AckTimeout, d.AckTimeout)
	def(&c.PostThreads, d.PostThreads)
	def(&c.RetryCount, d.RetryCount)
	if c.PollSpin == 0 {
		c.PollSpin = d.PollSpin
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = d.KeepAlive
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = d.StallTimeout
	}
	if c.CancelWait == 0 {
		c.CancelWait = d.CancelWait
	}
	bad := func(f string, args ...any) error {
		return fmt.Errorf("verbs: config: "+f+": %w", append(args, errs.ErrInvalidArgument)...)
	}
	switch {
	case c.Port < 1 || c.Port > 255:
		return bad("--rdma-port %d", c.Port)
	case c.GIDIndex < -1:
		return bad("--gid-index %d", c.GIDIndex)
	case c.QPsPerPeer < 1 || c.QPsPerPeer > maxQPsPerConn:
		return bad("--qps-per-peer %d not in 1..%d", c.QPsPerPeer, maxQPsPerConn)
	case c.SQDepth < 8:
		return bad("--rdma-sq-depth %d < 8", c.SQDepth)
	case c.MaxChain < 1 || c.MaxChain > c.SQDepth:
		return bad("--rdma-max-chain %d not in 1..sq-depth (%d)", c.MaxChain, c.SQDepth)
	case c.SignalEvery < 1 || c.SignalEvery > c.SQDepth/2:
		return bad("--rdma-signal-every %d not in 1..sq-depth/2 (%d)", c.SignalEvery, c.SQDepth/2)
	case c.SRQDepth < 16:
		return bad("--rdma-srq-depth %d < 16", c.SRQDepth)
	case c.MaxSGE < 1:
		return bad("--rdma-max-sge %d", c.MaxSGE)
	case c.MaxWRBytes < 1 || c.MaxWRBytes > 1<<30:
		return bad("--rdma-max-wr-bytes %d", c.MaxWRBytes)
	case c.ReadDepth < 0 || c.ReadDepth > 255:
		return bad("--rdma-read-depth %d not in 0..255 (0: no cap)", c.ReadDepth)
	case c.ReadWRBytes < 1 || c.ReadWRBytes > 1<<30:
		return bad("--rdma-read-wr-bytes %d", c.ReadWRBytes)
	case c.ChainBytes < 1:
		return bad("--rdma-chain-bytes %d", c.ChainBytes)
	case c.MinQPBytes < 1:
		return bad("--rdma-min-qp-bytes %d", c.MinQPBytes)
	case c.InlineBytes < 0 || c.InlineBytes > 1024:
		return bad("--rdma-inline %d not in 0..1024", c.InlineBytes)
	case c.PostThreads < 1 || c.PostThreads > maxQPsPerConn:
		return bad("--rdma-post-threads %d not in 1..%d", c.PostThreads, maxQPsPerConn)
	case c.AckTimeout < 1 || c.AckTimeout > 31:
		return bad("--rdma-ack-timeout %d", c.AckTimeout)
	case c.RetryCount < 1 || c.RetryCount > 7:
		return bad("--rdma-retry-count %d", c.RetryCount)
	case c.PollSpin < 0 || c.KeepAlive < 0 || c.StallTimeout < 0 || c.CancelWait < 0:
		return bad("negative duration")
	}
	return nil
}
