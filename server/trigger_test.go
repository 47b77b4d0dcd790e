package server_test

import (
	"bytes"
	"context"
	"os"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// mapRegion maps a host region's shm file as the application does.
func mapRegion(t *testing.T, r *b2bv1.Region) []byte {
	t.Helper()
	f, err := os.OpenFile(r.GetShmPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), int64(r.GetShmOffset()), int(r.GetSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// triggerRig: a source region with a pattern on a, a destination "tdst"
// on b, and a one-page counter region on a, all mapped here.
type triggerRig struct {
	*asyncRig
	src, dst, counter []byte
	srcID, counterID  string
}

func newTriggerRig(t *testing.T) *triggerRig {
	t.Helper()
	r := &triggerRig{asyncRig: newAsyncRig(t, 0)}
	ctx := context.Background()
	reg := func(api b2bv1.B2BClient, size uint64, export string) *b2bv1.Region {
		resp, err := api.RegisterRegion(ctx, hostAlloc(size, export))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRegion()
	}
	s, d, c := reg(r.a.api, 1<<16, ""), reg(r.b.api, 1<<16, "tdst"), reg(r.a.api, 4096, "")
	r.src, r.dst, r.counter = mapRegion(t, s), mapRegion(t, d), mapRegion(t, c)
	r.srcID, r.counterID = s.GetId(), c.GetId()
	for i := range r.src {
		r.src[i] = byte(i*7 + 1)
	}
	return r
}

func (r *triggerRig) set(v uint64) { atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.counter[0])), v) }

// start starts a one-block batch into tdst at block (4 KiB each), after
// the counter at offset 0 reaches value.
func (r *triggerRig) start(t *testing.T, block, value, timeoutMs uint64) uint64 {
	t.Helper()
	resp, err := r.a.api.StartTransfer(context.Background(), r.request(block, r.counterID, 0, value, timeoutMs))
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetTransferId()
}

func (r *triggerRig) request(block uint64, counter string, offset, value, timeoutMs uint64) *b2bv1.StartTransferRequest {
	return &b2bv1.StartTransferRequest{
		Transfer: &b2bv1.StartTransferRequest_Batch{Batch: &b2bv1.BatchTransferRequest{
			SrcRegionId: r.srcID, Peer: "b:7470", DstRegion: "tdst",
			Descriptors: &b2bv1.Descriptors{SrcOffsets: desc.Pack([]uint64{block * 4096}), DstOffsets: desc.Pack([]uint64{block * 4096}), BlockLength: 4096},
		}},
		TimeoutMs: timeoutMs,
		After:     &b2bv1.TransferTrigger{CounterRegionId: counter, CounterOffset: offset, Value: value},
	}
}

func (r *triggerRig) landed(block uint64) bool {
	return bytes.Equal(r.dst[block*4096:(block+1)*4096], r.src[block*4096:(block+1)*4096])
}

func (r *triggerRig) untouched(block uint64) bool {
	return bytes.Count(r.dst[block*4096:(block+1)*4096], []byte{0}) == 4096
}

func (r *triggerRig) wait(t *testing.T, id, timeoutMs uint64) *b2bv1.TransferOutcome {
	t.Helper()
	o, err := r.a.api.WaitTransfer(context.Background(), &b2bv1.WaitTransferRequest{TransferId: id, TimeoutMs: timeoutMs})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestTriggeredTransfers(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, r *triggerRig)
	}{
		{"a counter written late: nothing posted before its value", func(t *testing.T, r *triggerRig) {
			r.set(1)
			id := r.start(t, 1, 2, 60_000)
			if o := r.wait(t, id, 30); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING {
				t.Fatalf("with the counter at 1 of 2: %v; want RUNNING", o)
			}
			if !r.untouched(1) {
				t.Fatal("block 1 landed before the counter reached its value")
			}
			r.set(2)
			o := r.wait(t, id, 0)
			if o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || !r.landed(1) {
				t.Fatalf("after the counter reached 2: %v, landed %v", o, r.landed(1))
			}
			ph := o.GetResult().GetPhases()
			if ph.GetTriggerSeenUnixNs() == 0 || ph.GetPostedUnixNs() < ph.GetTriggerSeenUnixNs() || ph.GetLandedUnixNs() < ph.GetPostedUnixNs() || ph.GetArmedNs() == 0 {
				t.Fatalf("phases %v: want seen <= posted <= landed, armed > 0", ph)
			}
		}},
		{"the deadline passes while armed: DeadlineExceeded, nothing posted", func(t *testing.T, r *triggerRig) {
			id := r.start(t, 2, 5, 20)
			o := r.wait(t, id, 0)
			if o.GetState() != b2bv1.TransferState_TRANSFER_STATE_FAILED || codes.Code(o.GetCode()) != codes.DeadlineExceeded {
				t.Fatalf("%v; want FAILED with DeadlineExceeded", o)
			}
			r.set(5)
			// A later transfer on the counter is the sync point: the
			// failed one is gone, so it cannot post after this one.
			if o := r.wait(t, r.start(t, 3, 5, 60_000), 0); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE {
				t.Fatalf("the later transfer: %v", o)
			}
			if !r.untouched(2) {
				t.Fatal("the expired transfer posted")
			}
		}},
		{"cancel withdraws an armed trigger", func(t *testing.T, r *triggerRig) {
			id := r.start(t, 4, 3, 60_000)
			o, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id})
			if err != nil || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_CANCELLED {
				t.Fatalf("cancel: %v, %v; want CANCELLED", o, err)
			}
			r.set(3)
			if o := r.wait(t, r.start(t, 5, 3, 60_000), 0); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || !r.landed(5) {
				t.Fatalf("the later transfer: %v", o)
			}
			if !r.untouched(4) {
				t.Fatal("the cancelled transfer posted")
			}
		}},
		{"the counter's region is held while armed", func(t *testing.T, r *triggerRig) {
			id := r.start(t, 6, 9, 60_000)
			_, err := r.a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.counterID})
			wantStatus(t, err, codes.FailedPrecondition, "a trigger on counter "+r.counterID+"+0")
			if _, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.counterID}); err != nil {
				t.Fatalf("deregister after the cancel: %v", err)
			}
		}},
		{"bad counters are refused with the field", func(t *testing.T, r *triggerRig) {
			for _, tc := range []struct {
				region string
				offset uint64
				code   codes.Code
				msg    string
			}{
				{r.counterID, 4, codes.InvalidArgument, "after.counter_offset 4 is not a multiple of 8"},
				{r.counterID, 4096, codes.InvalidArgument, "after.counter_offset 4096 + 8 is past the end"},
				{r.counterID, 1 << 63, codes.InvalidArgument, "is past the end"},
				{"", 0, codes.InvalidArgument, "after.counter_region_id is empty"},
				{"r999", 0, codes.NotFound, `after.counter_region_id "r999"`},
			} {
				_, err := r.a.api.StartTransfer(ctx, r.request(7, tc.region, tc.offset, 1, 1000))
				wantStatus(t, err, tc.code, tc.msg)
			}
			// Refusals let go of the counter: it deregisters.
			if _, err := r.a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.counterID}); err != nil {
				t.Fatalf("deregister after refusals: %v", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newTriggerRig(t)) })
	}
}

// TestNoteTriggeredTransfers: a transfer armed on a key note (after
// note_region_id / note_key) posts nothing until a peer's batch with a key
// note naming its key lands on the note region; the region is held while
// it waits; bad triggers are refused with the field named.
func TestNoteTriggeredTransfers(t *testing.T) {
	ctx := context.Background()
	r := newTriggerRig(t)
	mbox, err := r.a.api.RegisterRegion(ctx, hostAlloc(4096, "mbox"))
	if err != nil {
		t.Fatal(err)
	}
	mboxID := mbox.GetRegion().GetId()
	noteSrc, err := r.b.api.RegisterRegion(ctx, hostAlloc(4096, ""))
	if err != nil {
		t.Fatal(err)
	}
	armed := func(block uint64, region string, key []byte) *b2bv1.StartTransferRequest {
		req := r.request(block, "", 0, 0, 60_000)
		req.After = &b2bv1.TransferTrigger{NoteRegionId: region, NoteKey: key}
		return req
	}
	send := func(keys ...string) {
		t.Helper()
		var ks [][]byte
		for _, k := range keys {
			ks = append(ks, []byte(k))
		}
		note, err := notify.AppendKeys(nil, ks, []byte(`{"t":"ready"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.b.api.BatchTransfer(ctx, &b2bv1.BatchTransferRequest{SrcRegionId: noteSrc.GetRegion().GetId(), Peer: "a:7470", DstRegion: "mbox",
			Descriptors: &b2bv1.Descriptors{SrcOffsets: desc.Pack([]uint64{0}), DstOffsets: desc.Pack([]uint64{0}), BlockLength: 8}, Notification: note})
		if err != nil {
			t.Fatal(err)
		}
	}
	resp, err := r.a.api.StartTransfer(ctx, armed(1, mboxID, []byte("k1")))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetTransferId()
	if o := r.wait(t, id, 30); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING || !r.untouched(1) {
		t.Fatalf("before its note: %v, untouched %v; want RUNNING, nothing landed", o, r.untouched(1))
	}
	_, err = r.a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: mboxID})
	wantStatus(t, err, codes.FailedPrecondition, "a trigger on key notes to "+mboxID)
	send("k0", "k2") // other keys
	if o := r.wait(t, id, 30); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING || !r.untouched(1) {
		t.Fatalf("after other keys: %v; want RUNNING", o)
	}
	send("k2", "k1")
	o := r.wait(t, id, 0)
	if o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || !r.landed(1) {
		t.Fatalf("after its key: %v, landed %v", o, r.landed(1))
	}
	if ph := o.GetResult().GetPhases(); ph.GetTriggerSeenUnixNs() == 0 || ph.GetPostedUnixNs() < ph.GetTriggerSeenUnixNs() {
		t.Fatalf("phases %v: want seen <= posted", ph)
	}
	// A key that landed before the arm: at once.
	resp, err = r.a.api.StartTransfer(ctx, armed(2, mboxID, []byte("k0")))
	if err != nil {
		t.Fatal(err)
	}
	if o := r.wait(t, resp.GetTransferId(), 0); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || !r.landed(2) {
		t.Fatalf("a key seen before: %v", o)
	}
	for _, tc := range []struct {
		req  *b2bv1.StartTransferRequest
		code codes.Code
		msg  string
	}{
		{armed(3, mboxID, bytes.Repeat([]byte("k"), 65)), codes.InvalidArgument, "after.note_key is 65 bytes: want 1 to 64"},
		{armed(3, mboxID, nil), codes.InvalidArgument, "after.note_key is 0 bytes"},
		{armed(3, "", []byte("k")), codes.InvalidArgument, "after.note_region_id is empty"},
		{armed(3, "r999", []byte("k")), codes.NotFound, `after.note_region_id "r999"`},
		{func() *b2bv1.StartTransferRequest {
			q := armed(3, mboxID, []byte("k"))
			q.After.CounterRegionId = r.counterID
			return q
		}(), codes.InvalidArgument, "give one"},
	} {
		_, err := r.a.api.StartTransfer(ctx, tc.req)
		wantStatus(t, err, tc.code, tc.msg)
	}
	if !r.untouched(3) {
		t.Fatal("a refused transfer posted")
	}
	// Nothing armed holds the region now.
	if _, err := r.a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: mboxID}); err != nil {
		t.Fatalf("deregister after the transfers: %v", err)
	}
}
