package peer

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// kindTransport is a fakeTransport of kind k.
type kindTransport struct {
	fakeTransport
	k transport.Kind
}

func (t *kindTransport) Kind() transport.Kind { return t.k }

// TestChooseByCapabilities: with no kind asked for, the highest-ranked kind
// both sides offer and whose Usable passes is chosen, and when none is the
// error says why each was passed over; a kind asked for by name must be run
// here, offered and usable.
func TestChooseByCapabilities(t *testing.T) {
	notHere := errors.New("peer is on another host")
	drivers := map[transport.Kind]transport.Driver{
		"near": {Kind: "near", Caps: transport.Caps{Rank: 30, SameHostOnly: true, Ops: transport.OpWrite | transport.OpRead}, Usable: func(_ transport.Transport, adv []byte) error {
			if string(adv) != "same-host" {
				return notHere
			}
			return nil
		}},
		"fast": {Kind: "fast", Caps: transport.Caps{Rank: 20, Ops: transport.OpWrite}}, // a kind that cannot pull
		"slow": {Kind: "slow", Caps: transport.Caps{Rank: 10, Ops: transport.OpWrite | transport.OpRead}},
	}
	lookup := func(k transport.Kind) (transport.Driver, bool) { d, ok := drivers[k]; return d, ok }
	cases := []struct {
		name    string
		offers  map[string][]byte
		want    transport.Kind
		pull    bool // a read: fast cannot
		chosen  transport.Kind
		errWant string
		errIs   error
	}{
		{"all offered, near usable", map[string][]byte{"near": []byte("same-host"), "fast": nil, "slow": nil}, "", false, "near", "", nil},
		{"near not usable: next rank", map[string][]byte{"near": []byte("elsewhere"), "fast": nil, "slow": nil}, "", false, "fast", "", nil},
		{"only the lowest offered", map[string][]byte{"slow": nil}, "", false, "slow", "", nil},
		{"nothing usable: every reason", map[string][]byte{"near": []byte("elsewhere"), "other": nil}, "", false,
			"", "near: peer is on another host; fast: failed precondition: peer p does not offer it; slow: failed precondition: peer p does not offer it", errs.ErrFailedPrecondition},
		{"asked: lower rank honoured", map[string][]byte{"near": []byte("same-host"), "slow": nil}, "slow", false, "slow", "", nil},
		{"asked: not offered", map[string][]byte{"near": []byte("same-host")}, "fast", false, "", "transport fast was requested but peer p cannot use it", errs.ErrFailedPrecondition},
		{"asked: not usable", map[string][]byte{"near": []byte("elsewhere")}, "near", false, "", "cannot use it: peer is on another host", notHere},
		{"asked: not run here", map[string][]byte{"verbs": nil}, "verbs", false, "", "transport verbs was requested but is not available on this daemon", errs.ErrFailedPrecondition},
		{"pull: a kind that cannot read is passed over", map[string][]byte{"near": []byte("elsewhere"), "fast": nil, "slow": nil}, "", true, "slow", "", nil},
		{"pull: none can read: the reason names the capability", map[string][]byte{"fast": nil}, "", true,
			"", "no transport in common with peer p for a read (pull) (it offers [fast]; near: failed precondition: peer p does not offer it; fast: failed precondition: transport fast cannot read (pull) (its capabilities: write (push))", errs.ErrFailedPrecondition},
		{"pull: asked for a kind that cannot read", map[string][]byte{"fast": nil, "slow": nil}, "fast", true,
			"", "transport fast was requested for peer p: failed precondition: transport fast cannot read (pull)", errs.ErrFailedPrecondition},
		{"asked: unknown", map[string][]byte{"slow": nil}, "udp", false, "", `transport "udp" is unknown`, errs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := New(&b2bv1.HandshakeRequest{}, []transport.Transport{&kindTransport{k: "slow"}, &kindTransport{k: "near"}, &kindTransport{k: "fast"}}, hclog.NewNullLogger(), false)
			defer m.Close()
			m.SetDrivers(lookup)
			st := &state{addr: "p", hs: &b2bv1.HandshakeResponse{Adverts: c.offers}}
			st.unusable = m.choice.usable(st)
			need := transport.Need{Op: transport.OpWrite}
			if c.pull {
				need.Op = transport.OpRead
			}
			got, _, err := m.choice.choose(st, c.want, need)
			if c.errWant == "" {
				if err != nil || got != c.chosen {
					t.Fatalf("choose = %q, %v; want %q", got, err, c.chosen)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.errWant) || !errors.Is(err, c.errIs) {
				t.Fatalf("choose = %q, %v; want an error saying %q (%v)", got, err, c.errWant, c.errIs)
			}
		})
	}
}

// TestChooseByMeasurement: with a calibration, auto gives a peer on this
// host the kind measured fastest for the batch's route and nearest block
// size, keeps the ranking's first within KeepMargin, asks for a recheck
// when the route is unknown, and leaves a peer on another host (or a
// route not measured) to the ranking.
func TestChooseByMeasurement(t *testing.T) {
	drivers := map[transport.Kind]transport.Driver{
		"near": {Kind: "near", Caps: transport.Caps{Rank: 30, SameHostOnly: true, Ops: transport.OpWrite}, Usable: func(_ transport.Transport, adv []byte) error {
			if string(adv) != "same-host" {
				return errors.New("peer is on another host")
			}
			return nil
		}},
		"slow": {Kind: "slow", Caps: transport.Caps{Rank: 10, Ops: transport.OpWrite}},
	}
	lookup := func(k transport.Kind) (transport.Driver, bool) { d, ok := drivers[k]; return d, ok }
	hh := transport.Route{From: memory.Host, To: memory.Host}
	gg := transport.Route{From: memory.CUDA, To: memory.CUDA} // across two GPUs
	ms := time.Millisecond
	cal := &transport.Calibration{State: "done", Rows: []transport.CalibrationRow{
		{Route: hh, BlockBytes: 128, Median: map[transport.Kind]time.Duration{"near": 7 * ms, "slow": 3 * ms}},
		{Route: hh, BlockBytes: 4096, Median: map[transport.Kind]time.Duration{"near": 102 * ms / 10, "slow": 10 * ms}}, // within 3%
		{Route: hh, BlockBytes: 65536, Median: map[transport.Kind]time.Duration{"near": 20 * ms, "slow": 60 * ms}},
		// near could not be measured (it refused the daemon's batch to
		// itself, as the same-host path does from one GPU to another): the
		// row goes by rank, not to the only kind measured.
		{Route: gg, BlockBytes: 128, Median: map[transport.Kind]time.Duration{"slow": 9 * ms}, Failed: map[transport.Kind]string{"near": "refused"}},
	}}
	cases := []struct {
		name      string
		adv       string
		need      transport.Need
		chosen    transport.Kind
		recheck   bool
		noMeasure bool
	}{
		{"128 B: the faster lower rank", "same-host", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 128}, "slow", false, false},
		{"200 B: nearest is 128 B", "same-host", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 200}, "slow", false, false},
		{"4 KiB: within the margin, rank kept", "same-host", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 4096}, "near", false, false},
		{"1 MiB: nearest is 64 KiB", "same-host", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 1 << 20}, "near", false, false},
		{"route unknown: rank, recheck", "same-host", transport.Need{Op: transport.OpWrite}, "near", true, false},
		{"route not measured: rank", "same-host", transport.Need{Op: transport.OpWrite, Route: transport.Route{From: memory.CUDA, To: memory.Host}, BlockBytes: 128}, "near", false, false},
		{"a kind not measured on the route: rank", "same-host", transport.Need{Op: transport.OpWrite, Route: gg, BlockBytes: 128}, "near", false, false},
		{"no calibration: rank", "same-host", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 128}, "near", false, true},
		{"peer on another host: rank, no recheck", "elsewhere", transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 128}, "slow", false, false},
		{"peer on another host, route unknown: no recheck", "elsewhere", transport.Need{Op: transport.OpWrite}, "slow", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := New(&b2bv1.HandshakeRequest{}, []transport.Transport{&kindTransport{k: "slow"}, &kindTransport{k: "near"}}, hclog.NewNullLogger(), false)
			defer m.Close()
			m.SetDrivers(lookup)
			if !c.noMeasure {
				m.SetCalibration(cal)
			}
			st := &state{addr: "p", hs: &b2bv1.HandshakeResponse{Adverts: map[string][]byte{"near": []byte(c.adv), "slow": nil}}}
			st.unusable = m.choice.usable(st)
			got, recheck, err := m.choice.choose(st, "", c.need)
			if err != nil || got != c.chosen || recheck != c.recheck {
				t.Fatalf("choose = %q, recheck %v, %v; want %q, recheck %v", got, recheck, err, c.chosen, c.recheck)
			}
		})
	}
}

// TestChooseAllocatesNothing: auto's measured choice runs for every
// batch.
func TestChooseAllocatesNothing(t *testing.T) {
	drivers := map[transport.Kind]transport.Driver{
		"near": {Kind: "near", Caps: transport.Caps{Rank: 30, SameHostOnly: true, Ops: transport.OpWrite}},
		"slow": {Kind: "slow", Caps: transport.Caps{Rank: 10, Ops: transport.OpWrite}},
	}
	m := New(&b2bv1.HandshakeRequest{}, []transport.Transport{&kindTransport{k: "slow"}, &kindTransport{k: "near"}}, hclog.NewNullLogger(), false)
	defer m.Close()
	m.SetDrivers(func(k transport.Kind) (transport.Driver, bool) { d, ok := drivers[k]; return d, ok })
	hh := transport.Route{From: memory.Host, To: memory.Host}
	m.SetCalibration(&transport.Calibration{Rows: []transport.CalibrationRow{{Route: hh, BlockBytes: 128, Median: map[transport.Kind]time.Duration{"near": 7, "slow": 3}}}})
	st := &state{addr: "p", hs: &b2bv1.HandshakeResponse{Adverts: map[string][]byte{"near": nil, "slow": nil}}}
	st.unusable = m.choice.usable(st)
	need := transport.Need{Op: transport.OpWrite, Route: hh, BlockBytes: 128}
	if n := testing.AllocsPerRun(100, func() {
		if k, _, _ := m.choice.choose(st, "", need); k != "slow" {
			t.Fatalf("chose %q", k)
		}
	}); n != 0 {
		t.Fatalf("choose allocates %v times per call", n)
	}
}
