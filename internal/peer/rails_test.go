package peer

import (
	"reflect"
	"testing"

	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Keys cross the Peer service as opaque bytes per kind and are decoded once
// here: a kind over several devices keeps every device's key, a key that
// does not decode is left out.
func TestResolvedKeys(t *testing.T) {
	one := transport.RegionKey{Key: transport.RemoteKey{Key: 7, Addr: 70}}
	two := transport.RegionKey{Key: transport.RemoteKey{Key: 7, Addr: 70}, Devices: []transport.RemoteKey{{Key: 7, Addr: 70}, {Key: 8, Addr: 80}}}
	r := resolvedFromProto(&b2bv1.ResolveRegionResponse{Name: "x", Keys: map[string][]byte{
		"a": transport.MarshalRegionKey(one), "b": transport.MarshalRegionKey(two), "bad": {0xff}, "": transport.MarshalRegionKey(one),
	}})
	want := map[transport.Kind]transport.RegionKey{"a": one, "b": two}
	if !reflect.DeepEqual(r.Keys, want) {
		t.Fatalf("keys %+v, want %+v", r.Keys, want)
	}
}
