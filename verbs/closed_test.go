//go:build cgo && linux

package verbs

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// handles is one set of every handle type, in one state (nil or closed).
type handles struct {
	ctx  *Context
	pd   *PD
	mr   *MR
	ch   *CompChannel
	cq   *CQ
	wcb  *WCBuf
	srq  *SRQ
	qp   *QP
	cha  *Chain
	host *HostMem
}

// TestClosedHandles calls every method of every handle type on nil
// receivers, zero handles and handles closed for real (where no device is
// needed): Close is a no-op, every method that returns an error returns
// one wrapping ErrClosed (a FailedPrecondition for errs.Code), and the rest
// return zero values without touching C memory.
func TestClosedHandles(t *testing.T) {
	chain, err := NewChain(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.Close(); err != nil {
		t.Fatal(err)
	}
	host, err := AllocHost(64)
	if err != nil {
		t.Fatal(err)
	}
	host.Free()

	sets := map[string]handles{
		"nil": {},
		"zero": {ctx: &Context{}, pd: &PD{}, mr: &MR{}, ch: &CompChannel{}, cq: &CQ{}, wcb: &WCBuf{},
			srq: &SRQ{}, qp: &QP{}, cha: &Chain{}, host: &HostMem{}},
		"closed": {ctx: &Context{}, pd: &PD{}, mr: &MR{}, ch: &CompChannel{}, cq: &CQ{}, wcb: &WCBuf{},
			srq: &SRQ{}, qp: &QP{}, cha: chain, host: host},
	}
	for set, h := range sets {
		errCalls := map[string]func() error{
			"Context.Close":        h.ctx.Close,
			"Context.QueryPort":    func() error { _, err := h.ctx.QueryPort(1); return err },
			"Context.QueryGID":     func() error { _, err := h.ctx.QueryGID(1, 0); return err },
			"Context.AllocPD":      func() error { _, err := h.ctx.AllocPD(); return err },
			"Context.NewCompChan":  func() error { _, err := h.ctx.NewCompChannel(); return err },
			"Context.NewCQ":        func() error { _, err := h.ctx.NewCQ(16, h.ch); return err },
			"PD.Close":             h.pd.Close,
			"PD.RegMR":             func() error { _, err := h.pd.RegMR(4096, 4096, AccessDefault); return err },
			"PD.RegDmabufMR":       func() error { _, err := h.pd.RegDmabufMR(3, 0, 4096, 0, AccessDefault); return err },
			"PD.NewSRQ":            func() error { _, err := h.pd.NewSRQ(16, 1); return err },
			"PD.NewRCQP":           func() error { _, err := h.pd.NewRCQP(QPConfig{SendCQ: h.cq, RecvCQ: h.cq}); return err },
			"MR.Close":             h.mr.Close,
			"CompChannel.Close":    h.ch.Close,
			"CQ.Close":             h.cq.Close,
			"CQ.Arm":               h.cq.Arm,
			"CQ.Poll":              func() error { _, err := h.cq.Poll(h.wcb); return err },
			"WCBuf.Close":          h.wcb.Close,
			"SRQ.Close":            h.srq.Close,
			"SRQ.PostRecv":         func() error { return h.srq.PostRecv([]uint32{0}, 4096, 64, 1) },
			"QP.Close":             h.qp.Close,
			"QP.ToInit":            func() error { return h.qp.ToInit(1, AccessDefault) },
			"QP.ToRTR":             func() error { return h.qp.ToRTR(RTRAttr{Port: 1, MTU: MTU1024}) },
			"QP.ToRTS":             func() error { return h.qp.ToRTS(RTSAttr{}) },
			"QP.ToError":           h.qp.ToError,
			"QP.State":             func() error { _, err := h.qp.State(); return err },
			"QP.PostSend":          func() error { return h.qp.PostSend(1, WRSend, 0, 4096, 8, 1, true) },
			"QP.PostChain":         func() error { _, err := h.qp.PostChain(h.cha, []uint64{0}, []uint64{0}, []uint64{8}); return err },
			"QP.PostChain(nil ch)": func() error { _, err := (&QP{}).PostChain(nil, nil, nil, nil); return err },
			"Chain.Plan":           func() error { _, err := h.cha.Plan([]uint64{0}, []uint64{0}, []uint64{8}); return err },
			"Chain.Close":          h.cha.Close,
		}
		for name, call := range errCalls {
			t.Run(set+"/"+name, func(t *testing.T) {
				err := call()
				if isClose := len(name) > 6 && name[len(name)-6:] == ".Close"; isClose {
					if err != nil {
						t.Fatalf("Close on a %s handle = %v, want nil", set, err)
					}
					if err := call(); err != nil {
						t.Fatalf("second Close = %v, want nil", err)
					}
					return
				}
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("= %v, want an error wrapping ErrClosed", err)
				}
				if !errors.Is(err, errs.ErrFailedPrecondition) {
					t.Fatalf("= %v, want errs.ErrFailedPrecondition too", err)
				}
			})
		}
		zeroCalls := map[string]struct {
			got, want any
		}{
			"Context.Name":       {h.ctx.Name(), ""},
			"Context.Attr":       {h.ctx.Attr(), DeviceAttr{}},
			"Context.AsyncFD":    {h.ctx.AsyncFD(), -1},
			"Context.DrainAsync": {h.ctx.DrainAsync(make([]AsyncEvent, 4)), 0},
			"MR.Addr":            {h.mr.Addr(), uint64(0)},
			"MR.Len":             {h.mr.Len(), uint64(0)},
			"MR.LKey":            {h.mr.LKey(), uint32(0)},
			"MR.RKey":            {h.mr.RKey(), uint32(0)},
			"CompChannel.FD":     {h.ch.FD(), -1},
			"CompChannel.Drain":  {h.ch.DrainEvents(), 0},
			"CQ.Depth":           {h.cq.Depth(), 0},
			"WCBuf.At":           {h.wcb.At(0), WC{}},
			"QP.Num":             {h.qp.Num(), uint32(0)},
			"QP.Caps":            {h.qp.Caps(), QPCaps{}},
			"Chain.Cursor":       {h.cha.Cursor(), Pos{}},
			"Chain.Seq":          {h.cha.Seq(), uint32(0)},
			"Chain.WR":           {h.cha.WR(0).WRID, uint64(0)},
			"HostMem.Addr":       {h.host.Addr(), uintptr(0)},
			"HostMem.Bytes":      {h.host.Bytes() == nil, true},
		}
		for name, c := range zeroCalls {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("%s/%s = %v, want %v", set, name, c.got, c.want)
			}
		}
		// Setters on a closed chain do nothing (and must not crash).
		h.cha.Setup(&ChainParams{MaxWR: 4, MaxSGE: 2})
		h.cha.SetMaxWR(2)
		h.cha.Start(Pos{}, Pos{I: 1}, true, 7)
		h.cha.SetSeq(9)
		if w, s := h.cha.Cap(); w != 0 || s != 0 {
			t.Errorf("%s/Chain.Cap = %d, %d, want 0, 0", set, w, s)
		}
		h.host.Free()
	}
}

// TestErrsClasses: each class is the daemon's domain class, so errs.Class
// (and from it the gRPC code) sees verbs errors as they are meant.
func TestErrsClasses(t *testing.T) {
	for _, tc := range []struct {
		ours, class error
	}{
		{ErrClosed, errs.ErrFailedPrecondition},
		{ErrFailedPrecondition, errs.ErrFailedPrecondition},
		{ErrUnavailable, errs.ErrUnavailable},
		{ErrInvalidArgument, errs.ErrInvalidArgument},
		{ErrResourceExhausted, errs.ErrResourceExhausted},
		{ErrAborted, errs.ErrAborted},
	} {
		wrapped := fmt.Errorf("verbs: x: %w", tc.ours)
		if !errors.Is(wrapped, tc.class) || errs.Class(wrapped) != tc.class {
			t.Errorf("%v: class %v, want %v", tc.ours, errs.Class(wrapped), tc.class)
		}
	}
	if errors.Is(ErrFailedPrecondition, ErrClosed) {
		t.Error("every failed precondition reads as a closed handle")
	}
}
