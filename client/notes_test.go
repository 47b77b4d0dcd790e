package client

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestKeyNote: KeyNote builds what the daemon parses, and refuses what it
// would not take; AfterNote arms a start on it.
func TestKeyNote(t *testing.T) {
	b, err := KeyNote([][]byte{[]byte("step-7"), []byte("x")}, []byte(`{"t":"ready"}`))
	if err != nil {
		t.Fatal(err)
	}
	keys, payload, ok := notify.ParseKeys(b)
	if !ok || len(keys) != 2 || string(keys[0]) != "step-7" || string(payload) != `{"t":"ready"}` {
		t.Fatalf("parsed %q %q %v", keys, payload, ok)
	}
	many := make([][]byte, notify.MaxKeys+1)
	for i := range many {
		many[i] = []byte("k")
	}
	for _, keys := range [][][]byte{nil, {{}}, {bytes.Repeat([]byte("k"), 65)}, many} {
		b, err := KeyNote(keys, nil)
		if !errors.Is(err, errs.ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument || b != nil {
			t.Errorf("%d keys: %v (code %v), %d bytes; want InvalidArgument", len(keys), err, status.Code(err), len(b))
		}
	}
	r := &b2bv1.StartTransferRequest{}
	AfterNote("r-3", []byte("step-7"))(r)
	if r.GetAfter().GetNoteRegionId() != "r-3" || string(r.GetAfter().GetNoteKey()) != "step-7" || r.GetAfter().GetCounterRegionId() != "" {
		t.Fatalf("after %v", r.GetAfter())
	}
}
