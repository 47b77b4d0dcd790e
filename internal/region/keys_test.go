package region

import (
	"testing"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// keyedReg is a registration with a read key apart and, optionally, an MR
// on each of several devices.
type keyedReg struct {
	transport.SingleKey
	write, read uint64
	rails       []transport.RailRegistration
}

func (r *keyedReg) Memory() memory.Memory    { return memory.Memory{} }
func (r *keyedReg) Key() transport.RemoteKey { return transport.RemoteKey{Key: r.write} }
func (r *keyedReg) Close() error             { return nil }
func (r *keyedReg) KeyFor(a transport.Access) (transport.RemoteKey, error) {
	if a == transport.AccessRead && r.read != 0 {
		return transport.RemoteKey{Key: r.read}, nil
	}
	return r.SingleKey.KeyFor(a)
}
func (r *keyedReg) Rails() []transport.RailRegistration { return r.rails }

// TestKeysFor: a peer gets the key of the access it was granted, never the
// other's, and per-device keys only for writes over several devices.
func TestKeysFor(t *testing.T) {
	rails := []transport.RailRegistration{{Rail: 0, Key: transport.RemoteKey{Key: 70}}, {Rail: 1, Key: transport.RemoteKey{Key: 71}}}
	r := &Region{regs: map[transport.Kind]transport.Registration{
		"tcp":   &keyedReg{write: 1, read: 2},
		"one":   &keyedReg{write: 3},
		"verbs": &keyedReg{write: 70, rails: rails},
		"solo":  &keyedReg{write: 80, rails: rails[:1]},
	}}
	for _, tc := range []struct {
		a    transport.Access
		kind transport.Kind
		key  uint64
		devs []uint64
	}{
		{transport.AccessWrite, "tcp", 1, nil},
		{transport.AccessRead, "tcp", 2, nil},
		{transport.AccessRead, "one", 3, nil}, // one key for both accesses
		{transport.AccessWrite, "verbs", 70, []uint64{70, 71}},
		{transport.AccessRead, "verbs", 70, nil}, // per-device keys are write keys
		{transport.AccessWrite, "solo", 80, nil}, // one device: no list
	} {
		got, ok := r.KeysFor(tc.a)[tc.kind]
		if !ok {
			t.Fatalf("%s %s: no key", tc.kind, tc.a)
		}
		if got.Key.Key != tc.key || len(got.Devices) != len(tc.devs) {
			t.Fatalf("%s %s: key %d with %d devices, want %d with %d", tc.kind, tc.a, got.Key.Key, len(got.Devices), tc.key, len(tc.devs))
		}
		for i, d := range tc.devs {
			if got.Devices[i].Key != d {
				t.Fatalf("%s %s: device %d key %d, want %d", tc.kind, tc.a, i, got.Devices[i].Key, d)
			}
		}
	}
}
