package batch

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
)

// TestStartTriggered: Start checks a trigger's counter before anything
// else, lets go of it when refused, and posts only once the counter
// reached its value.
func TestStartTriggered(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req := rig(t, fp)
	for _, tc := range []struct {
		after Trigger
		msg   string
	}{
		{Trigger{Region: req.Src, Offset: 4}, "after.counter_offset 4 is not a multiple of 8"},
		{Trigger{Region: req.Src, Offset: regionSize}, "past the end of region"},
		{Trigger{}, "after.counter_region_id is empty"},
	} {
		_, err := s.Start(StartRequest{Caller: req.Caller, After: &tc.after, Batch: &req})
		if errs.Class(err) != errs.ErrInvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Fatalf("after %+v: %v; want %q", tc.after, err, tc.msg)
		}
	}
	if _, err := s.Start(StartRequest{Caller: req.Caller}); errs.Class(err) != errs.ErrInvalidArgument || !strings.Contains(err.Error(), "transfer is not set") {
		t.Fatalf("no transfer: %v", err)
	}

	src, release, err := s.cfg.Registry.Acquire(req.Src, "src", req.Caller)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	word := (*uint64)(unsafe.Pointer(&src.Mem.Host[regionSize-8]))
	id, err := s.Start(StartRequest{Caller: req.Caller, After: &Trigger{Region: req.Src, Offset: regionSize - 8, Value: 1}, Batch: &req})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := s.Transfers().Wait(ctxT(t), 0, id, 20*time.Millisecond); err != nil || o.State != Running {
		t.Fatalf("before the counter: %+v, %v; want running", o, err)
	}
	atomic.StoreUint64(word, 1)
	o, err := s.Transfers().Wait(context.Background(), 0, id, 0)
	if err != nil || o.State != Done || o.Result.Phases.Armed <= 0 || o.Result.Phases.TriggerSeen.IsZero() || fp.conns[0].writes != 1 {
		t.Fatalf("after the counter: %+v, %v, %d writes", o, err, fp.conns[0].writes)
	}
}

// TestNoteTriggerDeadlineNamesTheKey: an armed transfer whose key note
// never came fails DeadlineExceeded naming the key and the region it
// waited on (a counter's wait names its counter); nothing was posted.
func TestNoteTriggerDeadlineNamesTheKey(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req := rig(t, fp)
	s.triggers.notes = &notify.Hub{}
	for _, tc := range []struct {
		name  string
		after Trigger
		want  []string
	}{
		{"note", Trigger{NoteRegion: req.Src, NoteKey: []byte("step-7")}, []string{`after.note_key "step-7"`, "after.note_region_id " + req.Src, "deadline"}},
		{"counter", Trigger{Region: req.Src, Offset: regionSize - 8, Value: 1}, []string{"counter " + req.Src, "short of 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := s.Start(StartRequest{Caller: req.Caller, After: &tc.after, Batch: &req, Timeout: 30 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			o, err := s.Transfers().Wait(ctxT(t), 0, id, 0)
			if err != nil || o.State != Failed || errs.Class(o.Err) != context.DeadlineExceeded {
				t.Fatalf("%+v, %v; want failed, DeadlineExceeded", o, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(o.Err.Error(), w) {
					t.Fatalf("%q does not name %q", o.Err, w)
				}
			}
			if fp.conns[0].writes != 0 {
				t.Fatalf("%d writes: a transfer whose trigger never came posted", fp.conns[0].writes)
			}
		})
	}
}
