package rails

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
)

// TestConformance runs the transport contract's suite over two rails of
// fake devices (fake_test.go: a connection writes straight into the memory
// the receiving rail pins, as a NIC would), striping every batch.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Factory{
		Kind: transport.Verbs,
		// Found by the suite: each rail reports its share to
		// Inbound.Landed, so a batch refused on one rail is counted as
		// landed for the share another rail placed.
		Gaps: map[string]string{transporttest.GapLandedOnRefusal: "rails: each rail's share is counted as landed, whatever the batch's outcome"},
		New: func(t testing.TB, send, recv transport.Inbound) *transporttest.Pair {
			f := &fabric{}
			cfg := Config{Retry: 20 * time.Millisecond, Monitor: time.Hour, StripeMin: 1}
			ca, cb := cfg, cfg
			ca.Devices, cb.Devices = []string{"a0", "a1"}, []string{"b0", "b1"}
			a, err := New(ca, send, nil, checked(f.open(ips)))
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(cb, recv, nil, checked(f.open(ips)))
			if err != nil {
				a.Close()
				t.Fatal(err)
			}
			for i, n := range []string{"10.77.0.0/24", "10.78.0.0/24"} {
				_, ipn, _ := net.ParseCIDR(n)
				a.rails[i].nets = []*net.IPNet{ipn}
				b.rails[i].nets = []*net.IPNet{ipn}
			}
			return &transporttest.Pair{Sender: a, Receiver: b,
				Connect: func(ctx context.Context) (transport.Conn, error) {
					return a.Connect(ctx, transport.Peer{Address: "b", Signal: b.HandleSignal, Advert: b.Advertise().Data})
				},
				// The fake places bytes without waiting on the receiver's
				// Pin, as a NIC does: stall the fake devices instead.
				Stall: func() func() {
					for _, d := range []string{"a0", "a1"} {
						f.rails[d].fault.Store(int32(stall))
					}
					return func() {
						for _, d := range []string{"a0", "a1"} {
							f.rails[d].fault.Store(int32(ok))
						}
					}
				},
				Remote: func(reg transport.Registration, size uint64) transport.RemoteRegion {
					mrLen.Store(reg.Key().Key, reg.Memory().Len)
					for _, k := range railKeys(reg) {
						mrLen.Store(k.Key, reg.Memory().Len)
					}
					return transport.RemoteRegion{Name: "conformance", Size: size, Key: reg.Key(), Devices: railKeys(reg)}
				}}
		},
	})
}

// checked gives the fake rails what a device has and the fake lacks: a
// work request outside its source MR fails before it is posted, as the
// verbs conn checks. (The receiving side's range check is the fake's Pin
// of the destination, unchanged.)
func checked(open Open) Open {
	return func(dev string, in transport.Inbound) (Rail, error) {
		r, err := open(dev, in)
		if err != nil {
			return nil, err
		}
		return checkedRail{r}, nil
	}
}

type checkedRail struct{ Rail }

func (r checkedRail) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	c, err := r.Rail.Connect(ctx, p)
	if err != nil {
		return nil, err
	}
	return checkedConn{c}, nil
}

// mrLen is each destination's real length by its rail-0 key.
var mrLen sync.Map

type checkedConn struct{ transport.Conn }

// Post checks a write's bounds, as a NIC would, before the fake rail's.
func (c checkedConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.write}
	return h.Post(ctx, r)
}

func (c checkedConn) write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	n := src.Memory().Len
	for i := range b.Src {
		if b.Src[i] > n || b.Len[i] > n-b.Src[i] {
			return transport.Stats{}, fmt.Errorf("fake rail: block %d [%d,+%d) outside the %d-byte source: %w", i, b.Src[i], b.Len[i], n, errs.ErrInvalidArgument)
		}
	}
	m := dst.Size
	if v, ok := mrLen.Load(dst.Key.Key); ok {
		m = min(m, v.(uint64)) // the NIC checks the MR's bounds, not the resolved size
	}
	for i := range b.Dst {
		if b.Dst[i] > m || b.Len[i] > m-b.Dst[i] {
			return transport.Stats{}, fmt.Errorf("fake rail: block %d [%d,+%d) outside the %d-byte destination: %w", i, b.Dst[i], b.Len[i], m, errs.ErrInvalidArgument)
		}
	}
	return transport.Write(ctx, c.Conn, src, dst, b)
}
