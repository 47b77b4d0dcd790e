package peer

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
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
			got, err := m.choice.choose(st, c.want, need)
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
