//go:build cgo && linux

package verbs

// Device tests: they run only when B2B_RDMA_DEV names an RDMA device (the
// Soft-RoCE testbed VMs set B2B_RDMA_DEV=rxe0).

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

func hwDev(t testing.TB) string {
	d := os.Getenv("B2B_RDMA_DEV")
	if d == "" {
		t.Skip("B2B_RDMA_DEV not set: no RDMA device (run inside the rdma testbed)")
	}
	return d
}

// rig is one device context with two RC QPs connected to each other.
type rig struct {
	ctx      *Context
	pd       *PD
	cq       *CQ
	a, b     *QP
	src, dst *HostMem
	smr, dmr *MR
	port     PortAttr
	gid      GIDChoice
	wcs      *WCBuf
}

func newRig(t testing.TB, size, sqDepth, maxSGE int) *rig {
	t.Helper()
	dev := hwDev(t)
	r := &rig{}
	var err error
	must := func(e error) {
		t.Helper()
		if e != nil {
			t.Fatal(e)
		}
	}
	r.ctx, err = Open(dev)
	must(err)
	t.Cleanup(func() { must(r.close()) })
	r.port, err = r.ctx.QueryPort(1)
	must(err)
	tab, err := ReadGIDTable(SysfsRoot, dev, 1)
	must(err)
	r.gid, err = SelectGID(tab, r.port.LinkLayer, "", -1, NetDevAddrs)
	must(err)
	r.pd, err = r.ctx.AllocPD()
	must(err)
	r.cq, err = r.ctx.NewCQ(2*sqDepth+16, nil)
	must(err)
	r.src, err = AllocHost(size)
	must(err)
	r.dst, err = AllocHost(size)
	must(err)
	r.smr, err = r.pd.RegMR(r.src.Addr(), uint64(size), AccessDefault)
	must(err)
	r.dmr, err = r.pd.RegMR(r.dst.Addr(), uint64(size), AccessDefault)
	must(err)
	r.wcs, err = NewWCBuf(64)
	must(err)
	cfg := QPConfig{SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: sqDepth, MaxSendSGE: maxSGE}
	r.a, err = r.pd.NewRCQP(cfg)
	must(err)
	r.b, err = r.pd.NewRCQP(cfg)
	must(err)
	for _, pair := range [][2]*QP{{r.a, r.b}, {r.b, r.a}} {
		must(pair[0].ToInit(1, AccessDefault))
		must(pair[0].ToRTR(RTRAttr{Port: 1, RemoteQPN: pair[1].Num(), RemotePSN: 100, MTU: r.port.ActiveMTU,
			Global: r.port.LinkLayer == LinkEthernet, RemoteGID: r.gid.GID, GIDIndex: r.gid.Index, RemoteLID: r.port.LID, MinRNRTimer: 12}))
		must(pair[0].ToRTS(RTSAttr{PSN: 100, Timeout: 14, RetryCount: 6, RNRRetry: 7}))
	}
	return r
}

// close releases in child-first order, checking each step.
func (r *rig) close() error {
	var errList []error
	for _, c := range []interface{ Close() error }{r.a, r.b, r.smr, r.dmr, r.cq, r.wcs, r.pd, r.ctx} {
		errList = append(errList, c.Close())
	}
	r.src.Free()
	r.dst.Free()
	return errors.Join(errList...)
}

func TestHWDeviceAndGID(t *testing.T) {
	dev := hwDev(t)
	names, err := ListDevices()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range names {
		found = found || n == dev
	}
	if !found {
		t.Fatalf("%s not in %v (sysfs: %v)", dev, names, SysfsDevices())
	}
	r := newRig(t, 4096, 16, 1)
	if r.port.State != PortActive || r.port.ActiveMTU.Bytes() == 0 {
		t.Fatalf("port %+v", r.port)
	}
	g, err := r.ctx.QueryGID(1, r.gid.Index)
	if err != nil || g != r.gid.GID {
		t.Fatalf("verbs GID %s (%v) vs sysfs %s", g, err, r.gid.GID)
	}
	t.Logf("%s: %+v, GID %+v, attr %+v", dev, r.port, r.gid, r.ctx.Attr())
}

func TestHWHandleErrors(t *testing.T) {
	r := newRig(t, 4096, 16, 1)
	if _, err := r.pd.RegMR(0, 10, AccessDefault); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("reg_mr(NULL): %v", err)
	}
	// Parents refuse to go while children live.
	if err := r.pd.Close(); !errors.Is(err, errs.ErrFailedPrecondition) {
		t.Fatalf("PD close with children: %v", err)
	}
	if err := r.cq.Close(); !errors.Is(err, errs.ErrFailedPrecondition) {
		t.Fatalf("CQ close with QPs: %v", err)
	}
	// RTR errors name GID index, MTU and PSN.
	q, err := r.pd.NewRCQP(QPConfig{SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: 8, MaxSendSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.ToInit(1, AccessDefault); err != nil {
		t.Fatal(err)
	}
	err = q.ToRTR(RTRAttr{Port: 1, RemoteQPN: r.a.Num(), RemotePSN: 7, MTU: r.port.ActiveMTU, Global: true,
		RemoteGID: r.gid.GID, GIDIndex: 250})
	if err == nil {
		t.Fatal("RTR with GID index 250 succeeded")
	}
	for _, want := range []string{"GID index 250", "path MTU", "PSN 7"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("RTR error %q lacks %q", err, want)
		}
	}
	// An oversized QP request fails with its parameters named.
	if _, err := r.pd.NewRCQP(QPConfig{SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: 1 << 30, MaxSendSGE: 1}); err == nil ||
		!strings.Contains(err.Error(), "max_send_wr=1073741824") {
		t.Fatalf("huge QP: %v", err)
	}
	if _, err := r.pd.RegDmabufMR(-1, 0, 4096, 0, AccessDefault); err == nil {
		t.Fatal("dma-buf MR with fd -1 succeeded")
	}
	t.Logf("RTR error: %v", err)

	// A post the device refuses (the QP is not in RTS) is Aborted and names
	// the call; a provider's own negative value shows as "provider returned".
	if err := q.PostSend(WRID(1, KindPing, 0), WRSend, 0, 0, 0, 0, true); !errors.Is(err, errs.ErrAborted) ||
		!strings.Contains(err.Error(), "ibv_post_send on QP") {
		t.Fatalf("post on a QP in INIT: %v", err)
	} else {
		t.Logf("post on a QP in INIT: %v", err)
	}
	if st, err := q.State(); err != nil || st != QPStateInit {
		t.Fatalf("State = %d, %v; want INIT", st, err)
	}

	// Every method of a handle closed for real reports ErrClosed; Close
	// twice is a no-op.
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	cq2, err := r.ctx.NewCQ(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := r.pd.NewSRQ(16, 1)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := r.pd.RegMR(r.src.Addr(), 4096, AccessDefault)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := NewChain(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, c := range []interface{ Close() error }{q, cq2, srq, mr} {
		if err := c.Close(); err != nil {
			t.Fatalf("%T.Close: %v", c, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second %T.Close: %v", c, err)
		}
	}
	_, stErr := q.State()
	_, pollErr := cq2.Poll(r.wcs)
	_, chainErr := q.PostChain(ch, []uint64{0}, []uint64{0}, []uint64{8})
	for name, err := range map[string]error{
		"QP.ToInit": q.ToInit(1, AccessDefault), "QP.ToError": q.ToError(), "QP.State": stErr,
		"QP.PostSend": q.PostSend(1, WRSend, 0, 0, 0, 0, true), "QP.PostChain": chainErr,
		"CQ.Arm": cq2.Arm(), "CQ.Poll": pollErr, "SRQ.PostRecv": srq.PostRecv([]uint32{0}, uint64(r.src.Addr()), 64, 0),
	} {
		if !errors.Is(err, ErrClosed) || !errors.Is(err, errs.ErrFailedPrecondition) {
			t.Errorf("%s after Close: %v; want ErrClosed", name, err)
		}
	}
}

// drain polls until the QP's posted WRs are all complete; it returns the
// completions seen.
func (r *rig) drain(t testing.TB, posted uint32, done *uint32) {
	for *done != posted {
		n, err := r.cq.Poll(r.wcs)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < n; k++ {
			w := r.wcs.At(k)
			if w.Status != WCSuccess {
				t.Fatalf("WC %s on %#x", StatusString(w.Status), w.WRID)
			}
			seq, _, _ := SplitWRID(w.WRID)
			*done = seq
		}
	}
}

func TestHWPostChainLoopback(t *testing.T) {
	const size = 1 << 20
	r := newRig(t, size, 256, 4)
	src, dst, lens, _ := randomBatch(2000, 128, 3)
	for i := range src { // the batch generator's layout is 2x the data
		src[i] %= size - 128
		dst[i] = uint64(i) * 256
	}
	data := r.src.Bytes()
	for k := range data {
		data[k] = byte(k * 7)
	}
	ch, err := NewChain(64, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.Setup(&ChainParams{SrcBase: r.smr.Addr(), DstBase: r.dmr.Addr(), SrcLimit: size, DstLimit: size,
		LKey: r.smr.LKey(), RKey: r.dmr.RKey(), MaxWR: 64, MaxSGE: 4, MaxWRBytes: 1 << 20, SignalEvery: 16})
	ch.Start(Pos{}, Pos{I: uint32(len(src))}, false, 0)
	var posted, done uint32
	for {
		res, err := r.a.PostChain(ch, src, dst, lens)
		if err != nil {
			t.Fatal(err)
		}
		posted = res.Seq
		r.drain(t, posted, &done)
		if res.Done {
			break
		}
	}
	out := r.dst.Bytes()
	for i := range src {
		if string(out[dst[i]:dst[i]+lens[i]]) != string(data[src[i]:src[i]+lens[i]]) {
			t.Fatalf("block %d differs", i)
		}
	}
}

// BenchmarkHWPostChain: plan + one ibv_post_send per chain on a real device
// (polling keeps credits flowing): ns per WR and allocations per chain.
func BenchmarkHWPostChain(b *testing.B) {
	for _, chainLen := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("chain=%d", chainLen), func(b *testing.B) {
			const size = 4 << 20
			r := newRig(b, size, 512, 4)
			src, dst, lens, _ := randomBatch(10000, 128, 4)
			for i := range src {
				src[i] %= size - 128
				dst[i] %= size - 128
			}
			ch, err := NewChain(chainLen, 4)
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			ch.Setup(&ChainParams{SrcBase: r.smr.Addr(), DstBase: r.dmr.Addr(), SrcLimit: size, DstLimit: size,
				LKey: r.smr.LKey(), RKey: r.dmr.RKey(), MaxWR: chainLen, MaxSGE: 4, MaxWRBytes: 1 << 20, SignalEvery: 16})
			end := Pos{I: uint32(len(src))}
			ch.Start(Pos{}, end, false, 0)
			var posted, done uint32
			wrs := 0
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for k := 0; k < b.N; k++ {
				if posted-done+uint32(chainLen) > 512 {
					r.drain(b, posted, &done)
				}
				res, err := r.a.PostChain(ch, src, dst, lens)
				if err != nil {
					b.Fatal(err)
				}
				posted = res.Seq
				wrs += res.WRs
				if res.Done {
					ch.Start(Pos{}, end, false, 0)
				}
			}
			r.drain(b, posted, &done)
			b.StopTimer()
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(wrs), "ns/WR")
		})
	}
}
