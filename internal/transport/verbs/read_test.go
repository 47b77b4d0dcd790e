package verbs

import (
	"testing"

	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// Each access set's MR allows exactly what it grants: a write key cannot
// READ, a read key cannot WRITE.
func TestAccessFlags(t *testing.T) {
	for _, c := range []struct {
		a    transport.Access
		want ibv.Access
	}{
		{transport.AccessWrite, ibv.AccessLocalWrite | ibv.AccessRemoteWrite},
		{transport.AccessRead, ibv.AccessRemoteRead},
		{transport.AccessRead | transport.AccessWrite, ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead},
	} {
		if got := accessFlags(c.a); got != c.want {
			t.Errorf("accessFlags(%#x) = %#x, want %#x", c.a, got, c.want)
		}
	}
}

func TestReadLimits(t *testing.T) {
	for _, c := range []struct {
		name                  string
		attr                  ibv.DeviceAttr
		maxSGE, depth         int
		sgeRd, rdInit, rdDest int
	}{
		{"rxe", ibv.DeviceAttr{MaxQPRdAtm: 128, MaxQPInitRdAtm: 128, MaxSGERd: 32}, 16, 16, 16, 16, 128},
		{"rxe deep", ibv.DeviceAttr{MaxQPRdAtm: 128, MaxQPInitRdAtm: 128, MaxSGERd: 32}, 16, 255, 16, 128, 128},
		{"rxe no cap", ibv.DeviceAttr{MaxQPRdAtm: 128, MaxQPInitRdAtm: 128, MaxSGERd: 32}, 16, 0, 16, 128, 128},
		{"connectx no cap", ibv.DeviceAttr{MaxQPRdAtm: 16, MaxQPInitRdAtm: 16, MaxSGERd: 30}, 32, 0, 30, 16, 16},
		{"connectx", ibv.DeviceAttr{MaxQPRdAtm: 16, MaxQPInitRdAtm: 16, MaxSGERd: 30}, 32, 64, 30, 16, 16},
		{"unreported", ibv.DeviceAttr{}, 8, 16, 8, 1, 1},
		{"too deep", ibv.DeviceAttr{MaxQPRdAtm: 1 << 10, MaxQPInitRdAtm: 300}, 4, 255, 4, 255, 255},
	} {
		s, i, d := readLimits(c.attr, c.maxSGE, c.depth)
		if s != c.sgeRd || i != c.rdInit || d != c.rdDest {
			t.Errorf("%s: readLimits = %d, %d, %d; want %d, %d, %d", c.name, s, i, d, c.sgeRd, c.rdInit, c.rdDest)
		}
	}
}

// A QP keeps at most as many READs outstanding as the peer's responder
// answers at once (its max_dest_rd_atomic, sent at connect); a peer that
// predates the field sends 0, taken as 16 (what every b2bd before it
// used), never as "no limit".
func TestRdAtomicWithPeer(t *testing.T) {
	for _, c := range []struct {
		name            string
		local, peerDest int
		want            int
	}{
		{"rxe to rxe", 128, 128, 128},
		{"rxe to connectx", 128, 16, 16},
		{"connectx to rxe", 16, 128, 16},
		{"old peer", 128, 0, 16},
		{"old peer, shallow local", 8, 0, 8},
		{"capped locally", 32, 128, 32},
		{"peer says 1", 128, 1, 1},
	} {
		if got := rdAtomicWith(c.local, uint32(c.peerDest)); got != c.want {
			t.Errorf("%s: rdAtomicWith(%d, %d) = %d, want %d", c.name, c.local, c.peerDest, got, c.want)
		}
	}
}
