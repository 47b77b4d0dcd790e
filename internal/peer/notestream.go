package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// A peer's notes (a landed batch's notification, a note alone, a key note
// that fires the peer's armed transfers) go on one NotifyStream per peer:
// on a loaded 2-core host a unary Notify took 0.16-0.5 ms at the median
// and up to 3 ms at p90, most of a pull's handover beyond the wire. Each
// note is still answered (delivered, or the peer's refusal), in order.

// noteStream is one open NotifyStream and the notes awaiting their answer.
type noteStream struct {
	client b2bv1.PeerClient // the channel it runs on: a new one opens a new stream
	cancel context.CancelFunc

	// sending holds the one Send at a time (seq order is send order): a
	// channel, so that a note waiting for it gives up at its deadline.
	sending chan struct{}
	stream  b2bv1.Peer_NotifyStreamClient
	seq     uint64
	inSend  atomic.Uint64 // the seq whose Send is under way; 0: none

	mu      sync.Mutex
	waiting map[uint64]chan *b2bv1.NotifyResponse
	broken  error // set once: every later note is refused with it
	// received is closed when receive returned: the stream's end, with
	// the peer's status, is in broken.
	received chan struct{}
}

// stuckSend is how long past its note's deadline a Send may still be
// under way before the stream is taken as stuck (its peer reads nothing).
const stuckSend = 50 * time.Millisecond

// errNoNoteStream: the peer has no NotifyStream (an older b2bd); Notify
// is called instead.
var errNoNoteStream = errors.New("peer has no NotifyStream")

// openNoteStream opens a stream on client; it runs until the channel
// closes, the peer ends it, or close.
func openNoteStream(client b2bv1.PeerClient) (*noteStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := client.NotifyStream(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	ns := newNoteStream(client, s, cancel)
	go ns.receive()
	return ns, nil
}

func newNoteStream(client b2bv1.PeerClient, s b2bv1.Peer_NotifyStreamClient, cancel context.CancelFunc) *noteStream {
	return &noteStream{client: client, cancel: cancel, stream: s, sending: make(chan struct{}, 1),
		waiting: map[uint64]chan *b2bv1.NotifyResponse{}, received: make(chan struct{})}
}

// receive hands each answer to its note, and on the stream's end fails
// the notes still waiting.
func (ns *noteStream) receive() {
	defer close(ns.received)
	for {
		resp, err := ns.stream.Recv()
		if err != nil {
			ns.fail(err)
			return
		}
		ns.mu.Lock()
		ch := ns.waiting[resp.GetSeq()]
		delete(ns.waiting, resp.GetSeq())
		ns.mu.Unlock()
		if ch != nil {
			ch <- resp // buffered: never blocks
		}
	}
}

// fail marks the stream broken with err and wakes every waiting note.
func (ns *noteStream) fail(err error) {
	if errors.Is(err, io.EOF) {
		err = status.Error(codes.Unavailable, "the peer closed its note stream")
	}
	ns.mu.Lock()
	if ns.broken == nil {
		ns.broken = err
	}
	waiting := ns.waiting
	ns.waiting = map[uint64]chan *b2bv1.NotifyResponse{}
	ns.mu.Unlock()
	for _, ch := range waiting {
		close(ch)
	}
	ns.cancel()
}

// err is why the stream cannot take notes, nil while it can.
func (ns *noteStream) err() error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.broken
}

// notify sends req and waits for its answer under ctx. sent says whether
// the note left: a note refused before it was sent may go another way.
// answered says whether the peer answered it: a note sent and not
// answered may still be delivered.
func (ns *noteStream) notify(ctx context.Context, req *b2bv1.NotifyRequest) (resp *b2bv1.NotifyResponse, sent, answered bool, err error) {
	ch := make(chan *b2bv1.NotifyResponse, 1)
	select {
	case ns.sending <- struct{}{}:
	case <-ctx.Done():
		return nil, false, false, ctx.Err()
	}
	ns.seq++
	seq := ns.seq
	ns.mu.Lock()
	if err := ns.broken; err != nil {
		ns.mu.Unlock()
		<-ns.sending
		return nil, false, false, err
	}
	ns.waiting[seq] = ch
	ns.mu.Unlock()
	req.Seq = seq
	// A peer that stopped reading (frozen) fills the stream's flow-control
	// window, and Send then waits whatever the note's deadline: a Send
	// still under way stuckSend past it takes the stream down, Send
	// returns, and the next note opens another. (A cancel during an
	// ordinary Send must not: the stream carries other notes.)
	ns.inSend.Store(seq)
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(stuckSend, func() {
			if ns.inSend.Load() == seq {
				ns.close()
			}
		})
	})
	err = ns.stream.Send(req)
	ns.inSend.Store(0)
	stop()
	<-ns.sending
	if err != nil {
		// The stream ended (its peer, its channel, or the deadline above):
		// no later note may take it.
		ns.mu.Lock()
		delete(ns.waiting, seq)
		ns.mu.Unlock()
		if errors.Is(err, io.EOF) {
			// The peer ended it, and its status comes with Recv: wait
			// for it. Unimplemented (an older b2bd) sends the note by
			// the call; taken as a closed stream, the note was lost
			// unconfirmed when the loaded reader came second.
			select {
			case <-ns.received:
				if b := ns.err(); b != nil {
					err = b
				}
			case <-ctx.Done():
			}
		}
		ns.fail(err)
		if ctx.Err() != nil {
			return nil, false, false, ctx.Err()
		}
		return nil, false, false, err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, true, false, ns.err()
		}
		if c := codes.Code(resp.GetCode()); c != codes.OK {
			return nil, true, true, status.Error(c, resp.GetMessage())
		}
		return resp, true, true, nil
	case <-ctx.Done():
		ns.mu.Lock()
		delete(ns.waiting, seq)
		ns.mu.Unlock()
		return nil, true, false, ctx.Err()
	}
}

// close ends the stream; notes waiting fail.
func (ns *noteStream) close() {
	ns.fail(status.Error(codes.Unavailable, "note stream closed"))
}

// noteStreamFor returns st's open note stream on client, opening one when
// there is none or it broke; errNoNoteStream when the peer has none.
func (st *state) noteStreamFor(client b2bv1.PeerClient) (*noteStream, error) {
	st.notesMu.Lock()
	defer st.notesMu.Unlock()
	if st.noNoteStream == client {
		return nil, errNoNoteStream
	}
	if ns := st.notes; ns != nil && ns.client == client && ns.err() == nil {
		return ns, nil
	}
	if st.notes != nil {
		st.notes.close()
		st.notes = nil
	}
	ns, err := openNoteStream(client)
	if err != nil {
		return nil, fmt.Errorf("%w: open a note stream: %w", errs.ErrUnavailable, err)
	}
	st.notes = ns
	return ns, nil
}

// noNoteStreamOn remembers that the peer behind client answered
// NotifyStream with Unimplemented.
func (st *state) noNoteStreamOn(client b2bv1.PeerClient) {
	st.notesMu.Lock()
	defer st.notesMu.Unlock()
	st.noNoteStream = client
	if st.notes != nil && st.notes.client == client {
		st.notes.close()
		st.notes = nil
	}
}

// closeNotes ends st's note stream (the peer's channel is going).
func (st *state) closeNotes() {
	st.notesMu.Lock()
	defer st.notesMu.Unlock()
	if st.notes != nil {
		st.notes.close()
		st.notes = nil
	}
}
