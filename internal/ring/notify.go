package ring

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// The notify record (OpNotify) is NotifyRegion over the ring: a
// notification for one of the caller's own regions, which fires the
// transfers armed there on its keys. A client that armed a transfer on a
// local key sends it with one record, no gRPC call and no peer.
//
// Body (NotifyBodyLen bytes, always with flag arena): blob_off u64,
// blob_len u32, reserved u32 (0). Blob: region id length u16 (1 to
// MaxTrigRegion), the region id, then the notification (1 to MaxNote
// bytes): blob_len is 2 + both.
const (
	OpNotify Op = 6

	// NotifyBodyLen is a notify record's body.
	NotifyBodyLen = 16
)

// decodeNotifyBody reads a notify body (its length checked).
func decodeNotifyBody(rec []byte, r Request) (Request, error) {
	r, err := decodeBlobBody(rec, r)
	if err == nil && (r.BlobLen < 4 || r.BlobLen > 2+MaxTrigRegion+MaxNote) {
		err = fmt.Errorf("%w: ring notify blob_len %d: want 4 to %d", errs.ErrInvalidArgument, r.BlobLen, 2+MaxTrigRegion+MaxNote)
	}
	return r, err
}

// decodeBlobBody reads the body that notify and watch records share:
// blob_off u64, blob_len u32, a reserved u32 that must be 0.
func decodeBlobBody(rec []byte, r Request) (Request, error) {
	le := binary.LittleEndian
	b := rec[bodyOff:]
	r.BlobOff, r.BlobLen = le.Uint64(b), le.Uint32(b[8:])
	if v := le.Uint32(b[12:]); v != 0 {
		return r, fmt.Errorf("%w: ring %s reserved word is %d, want 0", errs.ErrInvalidArgument, r.Op, v)
	}
	return r, nil
}

// NotifyFromArena copies r's blob out of arena after checking that it lies
// inside, and returns its region id and notification.
func (r Request) NotifyFromArena(arena []byte) (region string, note []byte, err error) {
	size, n := uint64(len(arena)), uint64(r.BlobLen)
	if r.BlobOff > size || n > size-r.BlobOff {
		return "", nil, fmt.Errorf("%w: ring notify blob_off %d + blob_len %d ends past the arena of %d bytes", errs.ErrInvalidArgument, r.BlobOff, n, size)
	}
	blob := make([]byte, n)
	copy(blob, arena[r.BlobOff:])
	return DecodeNotify(blob)
}

// DecodeNotify reads a notify blob.
func DecodeNotify(blob []byte) (region string, note []byte, err error) {
	if len(blob) < 2 {
		return "", nil, fmt.Errorf("%w: ring notify blob is %d bytes: want at least 4", errs.ErrInvalidArgument, len(blob))
	}
	k := int(binary.LittleEndian.Uint16(blob))
	switch {
	case k == 0 || k > MaxTrigRegion:
		return "", nil, fmt.Errorf("%w: ring notify region id is %d bytes: want 1 to %d", errs.ErrInvalidArgument, k, MaxTrigRegion)
	case len(blob)-2 <= k:
		return "", nil, fmt.Errorf("%w: ring notify blob of %d bytes holds a %d-byte region id and no notification", errs.ErrInvalidArgument, len(blob), k)
	case len(blob)-2-k > MaxNote:
		return "", nil, fmt.Errorf("%w: ring notify notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(blob)-2-k, MaxNote)
	}
	return string(blob[2 : 2+k]), blob[2+k:], nil
}

// AppendNotify appends the blob of a notify record for region's note.
func AppendNotify(dst []byte, region string, note []byte) ([]byte, error) {
	if len(region) == 0 || len(region) > MaxTrigRegion {
		return dst, fmt.Errorf("%w: ring notify region id is %d bytes: want 1 to %d", errs.ErrInvalidArgument, len(region), MaxTrigRegion)
	}
	if len(note) == 0 || len(note) > MaxNote {
		return dst, fmt.Errorf("%w: ring notify notification is %d bytes: want 1 to %d", errs.ErrInvalidArgument, len(note), MaxNote)
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(region)))
	dst = append(dst, region...)
	return append(dst, note...), nil
}
