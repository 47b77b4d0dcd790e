package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/region/fdpass"
	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The raw submit socket (opt-in, --submit-socket) is SubmitStream without
// gRPC: a Unix socket whose caller the kernel names (SO_PEERCRED), carrying
// fixed little-endian frames. It only submits plans the same caller
// prepared over gRPC (on any of its connections); preparing and releasing
// stay on the API.
//
//	request  16 bytes: tag u64, handle u64
//	answer   RawAnswerLen bytes, then msg_len bytes of message:
//	         tag u64, code u32 (a gRPC code; 0 = landed), msg_len u32,
//	         blocks u64, bytes u64, wire_ns u64, total_ns u64 (the daemon's
//	         time from reading the request to the answer)
//
// Up to StreamInFlight submits of one connection run at once, answered in
// completion order. A first request tagged ring.Hello asks for a
// shared-memory ring instead (ring.go), one tagged fdpass.Hello hands over
// memfds (memfd.go).
const (
	RawRequestLen = 16
	RawAnswerLen  = 48
	rawMaxMsg     = 4096
)

// ServeSubmit serves the raw submit protocol on ln until ln is closed.
func (s *Server) ServeSubmit(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if !s.trackRaw(c, true) {
			c.Close()
			return nil
		}
		go s.serveRaw(c)
	}
}

// trackRaw adds (or removes) a raw connection; false once the server closed.
func (s *Server) trackRaw(c net.Conn, add bool) bool {
	s.rawMu.Lock()
	defer s.rawMu.Unlock()
	if !add {
		delete(s.raw, c)
		return true
	}
	if s.rawClosed {
		return false
	}
	if s.raw == nil {
		s.raw = map[net.Conn]struct{}{}
	}
	s.raw[c] = struct{}{}
	return true
}

func (s *Server) serveRaw(c net.Conn) {
	defer s.trackRaw(c, false)
	defer c.Close()
	_, ai, err := auth.PeerCred{}.ServerHandshake(c)
	l, ok := ai.(auth.Local)
	if err != nil || !ok {
		s.cfg.Log.Warn("raw submit socket: caller unknown; connection closed", "error", err)
		return
	}
	who := region.Caller{UID: l.UID, GID: l.GID, Known: true}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg    sync.WaitGroup
		wmu   sync.Mutex
		slots = make(chan struct{}, StreamInFlight)
	)
	defer wg.Wait()
	defer cancel() // a caller gone cancels its submits in flight
	br := bufio.NewReaderSize(c, 64*RawRequestLen)
	le := binary.LittleEndian
	var req [RawRequestLen]byte
	for first := true; ; first = false {
		if first { // with recvmsg: a descriptor may ride on it (memfd.go)
			fd, err := readFrame(c, req[:])
			if err != nil {
				return
			}
			if le.Uint64(req[0:]) == fdpass.Hello {
				s.serveFDs(c, who, l.PID, req[:], fd)
				return
			}
			if fd >= 0 {
				unix.Close(fd)
			}
		} else if _, err := io.ReadFull(br, req[:]); err != nil {
			return
		}
		if tag := le.Uint64(req[0:]); first && (tag == ring.Hello || tag == ring.HelloArena) { // ring.go
			s.serveRing(ctx, c, who, tag, le.Uint64(req[8:]))
			return
		}
		slots <- struct{}{}
		wg.Add(1)
		go func(tag, h uint64) {
			defer wg.Done()
			entry := time.Now()
			res, err := s.batches.Plans().SubmitByCaller(ctx, who, h)
			if obs := s.observeSubmit; obs != nil { // with metrics on: off the 0-alloc path otherwise
				var resp *b2bv1.BatchTransferResponse
				if err == nil {
					resp = transferResponse(res)
				}
				obs(resp, grpcstatus.ToStatus(err), time.Since(entry).Seconds())
			}
			var buf [RawAnswerLen + 256]byte
			out := buf[:RawAnswerLen]
			le.PutUint64(out[0:], tag)
			if err != nil {
				st := status.Convert(grpcstatus.ToStatus(err))
				msg := st.Message()
				if len(msg) > rawMaxMsg {
					msg = msg[:rawMaxMsg]
				}
				le.PutUint32(out[8:], uint32(st.Code()))
				le.PutUint32(out[12:], uint32(len(msg)))
				out = append(out, msg...)
			} else {
				le.PutUint64(out[16:], res.Blocks)
				le.PutUint64(out[24:], res.Bytes)
				le.PutUint64(out[32:], uint64(max(res.Phases.Wire, 0)))
				le.PutUint64(out[40:], uint64(max(res.Phases.Total, 0)))
			}
			<-slots
			wmu.Lock()
			_, werr := c.Write(out)
			wmu.Unlock()
			if werr != nil {
				cancel()
			}
		}(le.Uint64(req[0:]), le.Uint64(req[8:]))
	}
}

// closeRaw closes every raw submit connection and refuses new ones.
func (s *Server) closeRaw() {
	s.rawMu.Lock()
	s.rawClosed = true
	conns := s.raw
	s.raw = nil
	s.rawMu.Unlock()
	for c := range conns {
		c.Close()
	}
}
