package local

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/gpudirect"
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
	c    *net.UnixConn
	peer string
	// pins are the releases of the keys the batch in progress holds (one
	// for a begin, one per key for a set); empty between batches.
	pins   []func()
	blocks uint64
	buf    [replySize]byte
	req    [requestSize]byte
	// A set's scratch, reused: its entries as read, its reply (header and
	// body) and the descriptors the reply carries.
	setIn  []byte
	setOut []byte
	fds    []int
}

// releaseAll lets go of every pin the connection holds.
func (sc *serverConn) releaseAll() {
	for i, release := range sc.pins {
		release()
		sc.pins[i] = nil
	}
	sc.pins = sc.pins[:0]
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
		sc.releaseAll()
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
			// Refused with a reply the sender can read (an unknown op from
			// a newer sender: its message says which), then dropped: what
			// follows the request cannot be told apart from the next one.
			t.log.Warn("samehost: bad request; dropping the connection", "peer", sc.peer, "error", err)
			_ = t.reply(sc, reply{status: statusInvalid}, err.Error(), -1, nil)
			return
		}
		t.served[req.op].Add(1)
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

// pinnedKey is what a begin tells of one key it pinned.
type pinnedKey struct {
	kind         uint32
	size, offset uint64
	// fd: a host map's descriptor, a duplicate of the region file's that
	// the caller closes once the reply is out (so that the region's Close
	// cannot close it under the reply); -1 when none.
	fd        int
	bus       string
	hasHandle bool // a CUDA map: handle is the region's IPC handle (a copy)
	handle    [gpudirect.IPCHandleSize]byte
}

// handleBytes is the handle to send, nil when none.
func (pk *pinnedKey) handleBytes() []byte {
	if !pk.hasHandle {
		return nil
	}
	return pk.handle[:]
}

// pinKey pins key (a read key when read) and, with mapIt, gathers what the
// sender needs to map it. On error nothing is held.
func (t *Transport) pinKey(key uint64, read, mapIt bool, pk *pinnedKey) (func(), error) {
	var (
		mem     memory.Memory
		release func()
		err     error
	)
	if read {
		mem, release, err = t.in.PinRead(transport.Local, key)
	} else {
		mem, release, err = t.in.Pin(transport.Local, key)
	}
	if err != nil {
		return nil, err
	}
	reg := t.lookup(key)
	if reg == nil {
		release()
		return nil, fmt.Errorf("%w: no live local registration has key %#x", errs.ErrNotFound, key)
	}
	pk.size, pk.offset, pk.fd, pk.bus, pk.hasHandle = mem.Len, 0, -1, "", false
	pk.kind = kindHost
	if mem.Kind != memory.Host {
		pk.kind = kindCUDA
	}
	if !mapIt {
		return release, nil
	}
	if err := pk.share(reg); err != nil {
		release() // not under reg.mu: letting go may take the registry's locks
		return nil, err
	}
	return release, nil
}

// share gathers what the sender needs to map reg: a duplicate of its
// file's descriptor (made under reg.mu, so that the region's Close cannot
// close the file under it), or its IPC handle and bus id.
func (pk *pinnedKey) share(reg *registration) error {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	shareErr := reg.shareErr
	if pk.kind == kindHost && shareErr == nil && reg.file == nil {
		shareErr = fmt.Errorf("%w: the region's file is closed", errs.ErrNotFound)
	}
	if shareErr != nil {
		return fmt.Errorf("destination cannot be shared on this host: %w", shareErr)
	}
	if pk.kind == kindHost {
		fd, err := unix.FcntlInt(reg.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: samehost: duplicate the region's descriptor: %v", errs.ErrResourceExhausted, err)
		}
		pk.offset, pk.fd = reg.fileOff, fd
		return nil
	}
	pk.offset, pk.bus = reg.handleOff, reg.busID
	pk.handle, pk.hasHandle = reg.handle, true
	return nil
}

func (t *Transport) serveRequest(sc *serverConn, req request) error {
	switch req.op {
	case opBegin:
		sc.releaseAll()
		var pk pinnedKey
		release, err := t.pinKey(req.key, req.flags&flagRead != 0, req.flags&flagMap != 0, &pk)
		if err != nil {
			return t.reply(sc, reply{status: statusOf(err)}, err.Error(), -1, nil)
		}
		sc.pins = append(sc.pins, release)
		err = t.reply(sc, reply{status: statusOK, kind: pk.kind, size: pk.size, offset: pk.offset}, pk.bus, pk.fd, pk.handleBytes())
		if pk.fd >= 0 {
			_ = unix.Close(pk.fd)
		}
		return err
	case opBeginSet:
		sc.releaseAll()
		return t.serveSet(sc, req)
	case opEnd:
		if len(sc.pins) == 0 {
			return t.reply(sc, reply{status: statusInvalid}, "end without begin", -1, nil)
		}
		// The sender's copies are complete (host: its stores are in the
		// shared pages; GPU: its stream was synchronised) before it asks.
		// A set's end counts the whole set once.
		sc.releaseAll()
		if req.flags&flagRead == 0 {
			t.in.Landed(transport.Local, req.a, req.b)
		}
		return t.reply(sc, reply{status: statusOK}, "", -1, nil)
	default: // opAbort
		sc.releaseAll()
		return t.reply(sc, reply{status: statusOK}, "", -1, nil)
	}
}

// serveSet pins every key of a set's begin and answers them in one reply;
// a refused key lets go of the ones pinned before it, and the refusal
// names its index.
func (t *Transport) serveSet(sc *serverConn, req request) error {
	n := int(req.a)
	if cap(sc.setIn) < n*setEntrySize {
		sc.setIn = make([]byte, maxSetKeys*setEntrySize)
	}
	in := sc.setIn[:n*setEntrySize]
	if _, err := io.ReadFull(sc.c, in); err != nil {
		return fmt.Errorf("read a set's entries: %w", err)
	}
	if sc.setOut == nil {
		sc.setOut = make([]byte, 0, replySize+maxSetBody)
	}
	out := sc.setOut[:replySize]
	sc.fds = sc.fds[:0]
	defer func() {
		for _, fd := range sc.fds {
			_ = unix.Close(fd)
		}
		sc.fds = sc.fds[:0]
	}()
	read := req.flags&flagRead != 0
	var pk pinnedKey
	for i := 0; i < n; i++ {
		e, err := parseSetEntry(in[i*setEntrySize:(i+1)*setEntrySize], i)
		var release func()
		if err == nil {
			release, err = t.pinKey(e.key, read, e.flags&flagMap != 0, &pk)
		}
		if err != nil {
			sc.releaseAll()
			return t.reply(sc, reply{status: statusOf(err), size: uint64(i)}, err.Error(), -1, nil)
		}
		sc.pins = append(sc.pins, release)
		a := setAnswer{kind: pk.kind, size: pk.size, offset: pk.offset, busLen: uint32(len(pk.bus))}
		if pk.fd >= 0 {
			a.flags |= setFD
			sc.fds = append(sc.fds, pk.fd)
		}
		if pk.hasHandle {
			a.flags |= setHandle
		}
		if len(pk.bus) > maxBusID {
			sc.releaseAll()
			err := fmt.Errorf("%w: the region's GPU bus id %q is over %d bytes", errs.ErrFailedPrecondition, pk.bus, maxBusID)
			return t.reply(sc, reply{status: statusInternal, size: uint64(i)}, err.Error(), -1, nil)
		}
		var ab [setReplyEntry]byte
		a.put(ab[:])
		out = append(append(append(out, ab[:]...), pk.bus...), pk.handleBytes()...)
	}
	r := reply{status: statusOK, size: uint64(n), offset: uint64(len(out) - replySize), fds: uint32(len(sc.fds))}
	r.put(out[:replySize])
	sc.setOut = out[:0]
	var oob []byte
	if len(sc.fds) > 0 {
		oob = unix.UnixRights(sc.fds...)
	}
	_, _, err := sc.c.WriteMsgUnix(out, oob, nil)
	return err
}
