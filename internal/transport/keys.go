package transport

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/b2bd/b2bd/internal/errs"
)

// A region's key crosses the Peer service as opaque bytes per kind
// (ResolveRegionResponse.keys). Every kind's key is one (key, address)
// pair per device of the receiver, so they share this encoding, version 1,
// the wire form of
//
//	message RegionKey { repeated DeviceKey devices = 1; }
//	message DeviceKey { uint64 key = 1; uint64 addr = 2; }
//
// with Devices[0] (or Key alone) first. A kind needing another shape gets a
// message of its own in proto/b2b/transport/<kind>/.

// MaxDevices bounds the device keys taken from a peer.
const MaxDevices = 64

// MarshalRegionKey encodes k for ResolveRegionResponse.keys.
func MarshalRegionKey(k RegionKey) []byte {
	devs := k.Devices
	if len(devs) == 0 {
		devs = []RemoteKey{k.Key}
	}
	var b []byte
	for _, d := range devs {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.VarintType)
		m = protowire.AppendVarint(m, d.Key)
		m = protowire.AppendTag(m, 2, protowire.VarintType)
		m = protowire.AppendVarint(m, d.Addr)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b
}

// UnmarshalRegionKey decodes MarshalRegionKey's bytes; unknown fields are
// skipped (a later version may add some). Refused: malformed bytes, no
// device, more than MaxDevices.
func UnmarshalRegionKey(b []byte) (RegionKey, error) {
	var devs []RemoteKey
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return RegionKey{}, badKey(protowire.ParseError(n))
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return RegionKey{}, badKey(protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		m, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return RegionKey{}, badKey(protowire.ParseError(n))
		}
		b = b[n:]
		if len(devs) == MaxDevices {
			return RegionKey{}, badKey(fmt.Errorf("more than %d device keys", MaxDevices))
		}
		d, err := deviceKey(m)
		if err != nil {
			return RegionKey{}, err
		}
		devs = append(devs, d)
	}
	if len(devs) == 0 {
		return RegionKey{}, badKey(fmt.Errorf("no device key"))
	}
	k := RegionKey{Key: devs[0]}
	if len(devs) > 1 {
		k.Devices = devs
	}
	return k, nil
}

func deviceKey(m []byte) (RemoteKey, error) {
	var d RemoteKey
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return d, badKey(protowire.ParseError(n))
		}
		m = m[n:]
		if typ == protowire.VarintType && (num == 1 || num == 2) {
			v, n := protowire.ConsumeVarint(m)
			if n < 0 {
				return d, badKey(protowire.ParseError(n))
			}
			m = m[n:]
			if num == 1 {
				d.Key = v
			} else {
				d.Addr = v
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, m)
		if n < 0 {
			return d, badKey(protowire.ParseError(n))
		}
		m = m[n:]
	}
	return d, nil
}

func badKey(err error) error {
	return fmt.Errorf("%w: region key: %w", errs.ErrInvalidArgument, err)
}
