package client

import (
	"bytes"
	"errors"
	"testing"

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
	for _, keys := range [][][]byte{nil, {{}}, {bytes.Repeat([]byte("k"), 65)}} {
		if _, err := KeyNote(keys, nil); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%d keys: %v, want InvalidArgument", len(keys), err)
		}
	}
	r := &b2bv1.StartTransferRequest{}
	AfterNote("r-3", []byte("step-7"))(r)
	if r.GetAfter().GetNoteRegionId() != "r-3" || string(r.GetAfter().GetNoteKey()) != "step-7" || r.GetAfter().GetCounterRegionId() != "" {
		t.Fatalf("after %v", r.GetAfter())
	}
}
