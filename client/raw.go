package client

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RawSubmitter submits prepared plans over the daemon's raw submit socket
// (opt-in, b2bd --submit-socket): fixed frames on a Unix socket, no gRPC.
// Plans are prepared and released through the Client as usual; the daemon
// accepts on this socket the plans of the same user. Safe for concurrent
// use; submits are serialised on the socket.
type RawSubmitter struct {
	mu  sync.Mutex
	c   net.Conn
	tag uint64
	req [16]byte
	ans [48]byte
}

// RawResult is a landed submit as the raw socket reports it.
type RawResult struct {
	Blocks, Bytes uint64
	Wire          time.Duration // wait for the bytes to land and the ack
	Total         time.Duration // the daemon's whole time
	// Transport is the kind that carried it, by name (empty where the
	// daemon does not say: the raw submit socket, older daemons).
	Transport string
	// Posted and Landed are the daemon's wall-clock times of the first
	// write and of the last landing; zero where the daemon did not say.
	Posted, Landed time.Time
	// Segments and WorkRequests are the response's (0 where the daemon
	// did not say: the raw submit socket, older daemons).
	Segments, WorkRequests uint64
}

// unixTime is t (Unix ns) as a time, zero for 0.
func unixTime(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// DialSubmit connects to a daemon's raw submit socket.
func DialSubmit(path string) (*RawSubmitter, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("b2b client: dial submit socket %s: %w", path, err)
	}
	return &RawSubmitter{c: c}, nil
}

// Close closes the socket; safe to call twice.
func (r *RawSubmitter) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return nil
	}
	err := r.c.Close()
	r.c = nil
	return err
}

// Submit runs p and returns once every byte landed, like Plan.Submit; a
// refusal is a gRPC status error with the code SubmitTransfer would give.
// A submit runs under the daemon's --default-timeout.
func (r *RawSubmitter) Submit(p *Plan) (RawResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return RawResult{}, fmt.Errorf("b2b client: submit socket is closed")
	}
	r.tag++
	le := binary.LittleEndian
	le.PutUint64(r.req[0:], r.tag)
	le.PutUint64(r.req[8:], p.Handle)
	if _, err := r.c.Write(r.req[:]); err != nil {
		return RawResult{}, fmt.Errorf("b2b client: submit: %w", err)
	}
	if _, err := io.ReadFull(r.c, r.ans[:]); err != nil {
		return RawResult{}, fmt.Errorf("b2b client: submit answer: %w", err)
	}
	if tag := le.Uint64(r.ans[0:]); tag != r.tag {
		return RawResult{}, fmt.Errorf("b2b client: submit answer for tag %d, want %d", tag, r.tag)
	}
	if code, n := le.Uint32(r.ans[8:]), le.Uint32(r.ans[12:]); code != 0 || n != 0 {
		msg := make([]byte, n)
		if _, err := io.ReadFull(r.c, msg); err != nil {
			return RawResult{}, fmt.Errorf("b2b client: submit answer: %w", err)
		}
		return RawResult{}, status.Error(codes.Code(code), string(msg))
	}
	return RawResult{Blocks: le.Uint64(r.ans[16:]), Bytes: le.Uint64(r.ans[24:]),
		Wire: time.Duration(le.Uint64(r.ans[32:])), Total: time.Duration(le.Uint64(r.ans[40:]))}, nil
}
