package ring

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// The watch record (OpWatch) is WatchNotifications over the ring: the
// notifications of one of the caller's exported regions come back as
// completion records under the watch's tag, so that a client reads them
// where it reads its transfers' ends, with no stream and no thread of its
// own. The body is a notify record's (blob_off u64, blob_len u32, reserved
// u32 0, always with flag arena); the blob is the region id alone (1 to
// MaxTrigRegion bytes).
//
// Under the tag come note records (code CodeNote): first an empty one (the
// watch is subscribed: every note from then on comes), then each note as a
// frame (AppendNoteFrame) cut in records of up to MsgMax bytes, each record
// carrying the frame's length in wire_ns, its offset in total_ns and the
// note's blocks and bytes; one note's records are contiguous. A note for
// which the completion ring has no room waits in the daemon, as a gRPC
// watcher's would (notify.QueueLen), and those past it are counted in the
// next frame's dropped. The watch ends with one ordinary completion: a
// refusal, or Canceled once an OpCancel named its tag.
const (
	OpWatch Op = 7

	// CodeNote marks a note record: no gRPC code is this large.
	CodeNote uint32 = 1 << 16
)

// decodeWatchBody reads a watch body (its length checked).
func decodeWatchBody(rec []byte, r Request) (Request, error) {
	r, err := decodeBlobBody(rec, r)
	if err == nil && (r.BlobLen == 0 || r.BlobLen > MaxTrigRegion) {
		err = fmt.Errorf("%w: ring watch region id is %d bytes: want 1 to %d", errs.ErrInvalidArgument, r.BlobLen, MaxTrigRegion)
	}
	return r, err
}

// WatchFromArena copies r's region id out of arena after checking that it
// lies inside.
func (r Request) WatchFromArena(arena []byte) (string, error) {
	size, n := uint64(len(arena)), uint64(r.BlobLen)
	if r.BlobOff > size || n > size-r.BlobOff {
		return "", fmt.Errorf("%w: ring watch blob_off %d + blob_len %d ends past the arena of %d bytes", errs.ErrInvalidArgument, r.BlobOff, n, size)
	}
	return string(arena[r.BlobOff : r.BlobOff+n]), nil
}

// NoteFrame is a watched note as its records carry it.
type NoteFrame struct {
	Sender, Region string
	Dropped        uint64 // notes missed before this one
	Note           []byte
}

// noteFrameHdr is a frame with empty names and no note.
const noteFrameHdr = 1 + 2 + 8

// AppendNoteFrame appends n's frame: sender length u8, the sender, region
// length u16, the region, dropped u64, the note. Names longer than their
// length fields are cut.
func AppendNoteFrame(dst []byte, n NoteFrame) []byte {
	s, r := n.Sender[:min(len(n.Sender), 255)], n.Region[:min(len(n.Region), 65535)]
	dst = append(dst, byte(len(s)))
	dst = append(dst, s...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(r)))
	dst = append(dst, r...)
	dst = binary.LittleEndian.AppendUint64(dst, n.Dropped)
	return append(dst, n.Note...)
}

// DecodeNoteFrame reads a frame (the client's side).
func DecodeNoteFrame(b []byte) (NoteFrame, error) {
	var n NoteFrame
	if len(b) < noteFrameHdr {
		return n, fmt.Errorf("%w: note frame of %d bytes, want at least %d", errs.ErrInvalidArgument, len(b), noteFrameHdr)
	}
	s := int(b[0])
	if len(b) < 1+s+2 {
		return n, fmt.Errorf("%w: note frame of %d bytes holds no %d-byte sender", errs.ErrInvalidArgument, len(b), s)
	}
	n.Sender = string(b[1 : 1+s])
	at := 1 + s
	r := int(binary.LittleEndian.Uint16(b[at:]))
	at += 2
	if len(b) < at+r+8 {
		return n, fmt.Errorf("%w: note frame of %d bytes holds no %d-byte region", errs.ErrInvalidArgument, len(b), r)
	}
	n.Region = string(b[at : at+r])
	at += r
	n.Dropped = binary.LittleEndian.Uint64(b[at:])
	n.Note = b[at+8:]
	return n, nil
}

// NoteRecords appends to dst the note records of frame under tag.
func NoteRecords(dst []Completion, tag uint64, frame []byte, blocks, bytes uint64) []Completion {
	for off := 0; off < len(frame); off += MsgMax {
		end := min(off+MsgMax, len(frame))
		dst = append(dst, Completion{Tag: tag, Code: CodeNote, Blocks: blocks, Bytes: bytes,
			Wire: int64(len(frame)), Total: int64(off), Msg: string(frame[off:end])})
	}
	return dst
}
