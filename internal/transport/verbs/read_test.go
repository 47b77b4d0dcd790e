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
