package transport

import (
	"errors"
	"reflect"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestRegionKeyRoundTrip(t *testing.T) {
	for _, k := range []RegionKey{
		{Key: RemoteKey{Key: 7}},
		{Key: RemoteKey{Key: 0x1234, Addr: 1 << 40}},
		{Key: RemoteKey{Key: 1, Addr: 2}, Devices: []RemoteKey{{Key: 1, Addr: 2}, {Key: 3, Addr: 4}}},
	} {
		got, err := UnmarshalRegionKey(MarshalRegionKey(k))
		if err != nil || !reflect.DeepEqual(got, k) {
			t.Errorf("round trip of %+v: got %+v, %v", k, got, err)
		}
	}
}

func TestRegionKeyRefused(t *testing.T) {
	many := RegionKey{}
	for i := 0; i <= MaxDevices; i++ {
		many.Devices = append(many.Devices, RemoteKey{Key: uint64(i)})
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": MarshalRegionKey(RegionKey{Key: RemoteKey{Key: 1 << 60}})[:4],
		"too many":  MarshalRegionKey(many),
	} {
		if _, err := UnmarshalRegionKey(b); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
}

func FuzzUnmarshalRegionKey(f *testing.F) {
	f.Add(MarshalRegionKey(RegionKey{Key: RemoteKey{Key: 9, Addr: 4096}}))
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := UnmarshalRegionKey(b)
		if err != nil {
			return
		}
		again, err := UnmarshalRegionKey(MarshalRegionKey(k))
		if err != nil || !reflect.DeepEqual(again, k) {
			t.Fatalf("re-encoding %+v gave %+v, %v", k, again, err)
		}
	})
}
