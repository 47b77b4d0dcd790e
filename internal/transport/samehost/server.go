package samehost

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// sameInode checks that f is the inode mapping mp names.
func sameInode(f *os.File, mp mapping) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("samehost: fstat %s: %w", f.Name(), err)
	}
	if st.Ino != mp.inode || unix.Major(uint64(st.Dev)) != mp.major || unix.Minor(uint64(st.Dev)) != mp.minor {
		return fmt.Errorf("%w: samehost: %s is no longer the file mapped at %#x (replaced by its client?)", errs.ErrFailedPrecondition, f.Name(), mp.start)
	}
	return nil
}

// serverConn is one sender's connection.
type serverConn struct {
	c       *net.UnixConn
	peer    string
	release func() // the pin of the batch in progress, nil between batches
	blocks  uint64
	buf     [replySize]byte
	req     [requestSize]byte
}

func (t *Transport) serve() {
	defer t.wg.Done()
	for {
		c, err := t.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				t.log.Warn("samehost accept", "error", err)
			}
			return
		}
		sc := &serverConn{c: c}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		t.conns[sc] = struct{}{}
		t.mu.Unlock()
		t.nconns.Add(1)
		t.wg.Add(1)
		go t.handle(sc)
	}
}

// peerAllowed admits local processes of this daemon's user and root.
func peerAllowed(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: samehost: uid %d (pid %d) is neither root nor this daemon's uid %d", errs.ErrPermissionDenied, cred.Uid, cred.Pid, os.Geteuid())
	}
	return nil
}

func (t *Transport) handle(sc *serverConn) {
	defer func() {
		if sc.release != nil {
			sc.release()
			sc.release = nil
		}
		_ = sc.c.Close()
		t.mu.Lock()
		delete(t.conns, sc)
		t.mu.Unlock()
		t.nconns.Add(-1)
		t.wg.Done()
	}()
	if err := t.welcome(sc); err != nil {
		t.log.Warn("samehost: connection refused", "error", err)
		return
	}
	for {
		if _, err := io.ReadFull(sc.c, sc.req[:]); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.log.Debug("samehost: connection ended", "peer", sc.peer, "error", err)
			}
			return
		}
		req, err := parseRequest(sc.req[:])
		if err != nil {
			t.log.Warn("samehost: bad request; dropping the connection", "peer", sc.peer, "error", err)
			return
		}
		if err := t.serveRequest(sc, req); err != nil {
			t.log.Debug("samehost: reply failed", "peer", sc.peer, "error", err)
			return
		}
	}
}

func (t *Transport) welcome(sc *serverConn) error {
	var h hello
	var fixed [helloFixed]byte
	if _, err := io.ReadFull(sc.c, fixed[:]); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	n, err := parseHelloFixed(fixed[:], &h)
	if err != nil {
		return err
	}
	node := make([]byte, n)
	if _, err := io.ReadFull(sc.c, node); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	sc.peer = string(node)
	if err := peerAllowed(sc.c); err != nil {
		_ = t.reply(sc, reply{status: statusDenied}, err.Error(), -1, nil)
		return err
	}
	if subtle.ConstantTimeCompare(h.token[:], t.token) != 1 {
		err := fmt.Errorf("%w: samehost: %q presented a wrong token", errs.ErrPermissionDenied, sc.peer)
		_ = t.reply(sc, reply{status: statusDenied}, "wrong token", -1, nil)
		return err
	}
	return t.reply(sc, reply{status: statusOK}, t.cfg.Node, -1, nil)
}

// reply writes a reply with msg, an optional descriptor and handle bytes.
func (t *Transport) reply(sc *serverConn, r reply, msg string, fd int, extra []byte) error {
	if len(msg) > maxMsg {
		msg = msg[:maxMsg]
	}
	r.msgLen = uint32(len(msg))
	var oob []byte
	if fd >= 0 {
		r.fds = 1
		oob = unix.UnixRights(fd)
	}
	r.put(sc.buf[:])
	if len(msg) == 0 && len(extra) == 0 {
		_, _, err := sc.c.WriteMsgUnix(sc.buf[:], oob, nil)
		return err
	}
	b := make([]byte, 0, replySize+len(msg)+len(extra))
	b = append(append(append(b, sc.buf[:]...), msg...), extra...)
	_, _, err := sc.c.WriteMsgUnix(b, oob, nil)
	return err
}

func (t *Transport) serveRequest(sc *serverConn, req request) error {
	switch req.op {
	case opBegin:
		if sc.release != nil {
			sc.release()
			sc.release = nil
		}
		var (
			mem     memory.Memory
			release func()
			err     error
		)
		if req.flags&flagRead != 0 {
			rp, ok := t.in.(transport.ReadPinner)
			if !ok {
				err = fmt.Errorf("%w: samehost: this daemon serves no reads", errs.ErrUnimplemented)
			} else {
				mem, release, err = rp.PinRead(transport.Local, req.key)
			}
		} else {
			mem, release, err = t.in.Pin(transport.Local, req.key)
		}
		if err != nil {
			return t.reply(sc, reply{status: statusOf(err)}, err.Error(), -1, nil)
		}
		reg := t.lookup(req.key)
		if reg == nil {
			release()
			err := fmt.Errorf("%w: no live local registration has key %#x", errs.ErrNotFound, req.key)
			return t.reply(sc, reply{status: statusNotFound}, err.Error(), -1, nil)
		}
		r := reply{status: statusOK, size: mem.Len}
		fd := -1
		var extra []byte
		msg := ""
		reg.mu.Lock()
		shareErr := reg.shareErr
		switch mem.Kind {
		case memory.Host:
			r.kind = kindHost
			if req.flags&flagMap != 0 && shareErr == nil && reg.file != nil {
				r.offset = reg.fileOff
				fd = int(reg.file.Fd())
			}
		default:
			r.kind = kindCUDA
			if req.flags&flagMap != 0 && shareErr == nil {
				r.offset = reg.handleOff
				extra = reg.handle[:]
				msg = reg.busID
			}
		}
		if req.flags&flagMap != 0 && shareErr == nil && reg.file == nil && mem.Kind == memory.Host {
			shareErr = fmt.Errorf("%w: the region's file is closed", errs.ErrNotFound)
		}
		if req.flags&flagMap != 0 && shareErr != nil {
			reg.mu.Unlock()
			release()
			return t.reply(sc, reply{status: statusOf(shareErr)}, "destination cannot be shared on this host: "+shareErr.Error(), -1, nil)
		}
		// The descriptor is sent while reg.mu is held, so Close cannot
		// close it under us.
		err = t.reply(sc, r, msg, fd, extra)
		reg.mu.Unlock()
		sc.release = release
		return err
	case opEnd:
		if sc.release == nil {
			return t.reply(sc, reply{status: statusInvalid}, "end without begin", -1, nil)
		}
		// The sender's copies are complete (host: its stores are in the
		// shared pages; GPU: its stream was synchronised) before it asks.
		sc.release()
		sc.release = nil
		if req.flags&flagRead == 0 {
			t.in.Landed(transport.Local, req.a, req.b)
		}
		return t.reply(sc, reply{status: statusOK}, "", -1, nil)
	default: // opAbort
		if sc.release != nil {
			sc.release()
			sc.release = nil
		}
		return t.reply(sc, reply{status: statusOK}, "", -1, nil)
	}
}
