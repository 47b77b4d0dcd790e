// Package fdpass is how a client hands the daemon memory it allocated itself:
// a memfd sealed against shrinking, passed over the raw submit socket
// (SCM_RIGHTS, since gRPC cannot carry descriptors) in exchange for a token,
// which a RegisterRegion then names as its host_file path (TokenPath). The
// registration itself stays on gRPC, so exports, readers, leases and
// deregistration are those of every host region.
//
//	request  16 bytes: Hello u64, reserved u64 (0), one descriptor attached
//	answer   48 bytes, then msg_len bytes of message: Hello u64, code u32 (a
//	         gRPC code; 0 = taken), msg_len u32, token u64, file size u64,
//	         reserved u64 (0), Hello u64 again (a daemon that predates
//	         descriptors answers the frame as a submit, without it)
//
// A connection may hand over several descriptors, one a frame; a token not
// yet registered is dropped when its connection closes.
package fdpass

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
)

// Hello tags a frame handing over a descriptor: the first frame of the
// connection, and every frame after it.
const Hello uint64 = 0x64666d656d623262 // "b2bmemfd" read little-endian

// Frame sizes, the same as the raw submit socket's.
const (
	RequestLen = 16
	AnswerLen  = 48
	MaxMsg     = 4096
)

// TokenPrefix starts a host_file path that names a handed-over descriptor.
// A file of that name in the shm directory can still be imported by its
// absolute path.
const TokenPrefix = "memfd:"

// TokenPath is the host_file path naming token.
func TokenPath(token uint64) string {
	return TokenPrefix + fmt.Sprintf("%016x", token)
}

// ParseTokenPath returns the token of a host_file path; ok false when the
// path does not start with TokenPrefix (an ordinary file path), an error when
// it does but the rest is not 16 hex digits.
func ParseTokenPath(path string) (token uint64, ok bool, err error) {
	rest, ok := strings.CutPrefix(path, TokenPrefix)
	if !ok {
		return 0, false, nil
	}
	if len(rest) != 16 {
		return 0, true, fmt.Errorf("%w: host_file.path %q: a descriptor token is %s followed by 16 hex digits, not %d characters", errs.ErrInvalidArgument, path, TokenPrefix, len(rest))
	}
	t, perr := strconv.ParseUint(rest, 16, 64)
	if perr != nil || t == 0 {
		return 0, true, fmt.Errorf("%w: host_file.path %q: the token is not 16 hex digits of a nonzero value", errs.ErrInvalidArgument, path)
	}
	return t, true, nil
}

// Request is a handing-over frame.
func Request() [RequestLen]byte {
	var b [RequestLen]byte
	binary.LittleEndian.PutUint64(b[0:], Hello)
	return b
}

// CheckRequest checks a frame read on a connection that hands over
// descriptors.
func CheckRequest(b []byte) error {
	if len(b) != RequestLen {
		return fmt.Errorf("%w: descriptor frame is %d bytes, want %d", errs.ErrInvalidArgument, len(b), RequestLen)
	}
	le := binary.LittleEndian
	if tag := le.Uint64(b[0:]); tag != Hello {
		return fmt.Errorf("%w: descriptor frame tag %#x, want %#x", errs.ErrInvalidArgument, tag, Hello)
	}
	if r := le.Uint64(b[8:]); r != 0 {
		return fmt.Errorf("%w: descriptor frame reserved field is %#x, want 0", errs.ErrInvalidArgument, r)
	}
	return nil
}

// Answer is the daemon's answer to a frame: the token and size, or a code
// and message (code 0: taken).
type Answer struct {
	Code  uint32
	Msg   string
	Token uint64
	Size  uint64
}

// Encode appends a to dst (the message cut at MaxMsg).
func (a Answer) Encode(dst []byte) []byte {
	msg := a.Msg
	if len(msg) > MaxMsg {
		msg = msg[:MaxMsg]
	}
	var b [AnswerLen]byte
	le := binary.LittleEndian
	le.PutUint64(b[0:], Hello)
	le.PutUint32(b[8:], a.Code)
	le.PutUint32(b[12:], uint32(len(msg)))
	le.PutUint64(b[16:], a.Token)
	le.PutUint64(b[24:], a.Size)
	le.PutUint64(b[40:], Hello)
	return append(append(dst, b[:]...), msg...)
}

// DecodeAnswer decodes an answer's fixed part and returns the length of the
// message that follows it.
func DecodeAnswer(b []byte) (a Answer, msgLen int, err error) {
	if len(b) != AnswerLen {
		return a, 0, fmt.Errorf("%w: descriptor answer is %d bytes, want %d", errs.ErrInvalidArgument, len(b), AnswerLen)
	}
	le := binary.LittleEndian
	if tag := le.Uint64(b[0:]); tag != Hello {
		return a, 0, fmt.Errorf("%w: descriptor answer tag %#x, want %#x (a daemon without descriptor handover answers as the submit socket)", errs.ErrInvalidArgument, tag, Hello)
	}
	if le.Uint64(b[40:]) != Hello {
		return a, 0, fmt.Errorf("%w: the daemon does not take descriptors (it answered the frame as a submit: a b2bd older than memfd registration)", errs.ErrUnimplemented)
	}
	a.Code, a.Token, a.Size = le.Uint32(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:])
	n := le.Uint32(b[12:])
	if n > MaxMsg {
		return a, 0, fmt.Errorf("%w: descriptor answer message of %d bytes, limit %d", errs.ErrInvalidArgument, n, MaxMsg)
	}
	if a.Code == 0 && (n != 0 || a.Token == 0) {
		return a, 0, fmt.Errorf("%w: descriptor answer: code 0 with a %d-byte message and token %#x", errs.ErrInvalidArgument, n, a.Token)
	}
	return a, int(n), nil
}

// Allocator names what a client should allocate with, for refusals.
const Allocator = "b2b.alloc_host(size) in Python, client.AllocHost in Go, or memfd_create(MFD_ALLOW_SEALING) then fcntl(F_ADD_SEALS, F_SEAL_SHRINK)"

// RequiredSeals must all be set on a handed-over memfd: without
// F_SEAL_SHRINK its owner could truncate it under the daemon's mapping,
// whose next access would fault (SIGBUS).
const RequiredSeals = unix.F_SEAL_SHRINK

// Check returns the size of the file open at fd if the daemon may map it
// shared and writable for as long as it likes: a regular file, open
// read-write, sealed against shrinking, not sealed against writes, not empty.
func Check(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("%w: host_fd: fstat: %v", errs.ErrInvalidArgument, err)
	}
	seals, serr := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	fl, ferr := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	return CheckState(st.Mode, st.Size, fl, ferr, seals, serr)
}

// CheckState is Check on what fstat and fcntl(F_GETFL, F_GET_SEALS) said.
func CheckState(mode uint32, size int64, flags int, flagsErr error, seals int, sealsErr error) (uint64, error) {
	if mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("%w: host_fd: the descriptor is not a regular file (mode %#o): the daemon maps only sealed memfds; allocate with %s", errs.ErrInvalidArgument, mode, Allocator)
	}
	if flagsErr != nil {
		return 0, fmt.Errorf("%w: host_fd: fcntl(F_GETFL): %v", errs.ErrInvalidArgument, flagsErr)
	}
	if flags&unix.O_ACCMODE != unix.O_RDWR {
		return 0, fmt.Errorf("%w: host_fd: the descriptor is not open read-write (access mode %d, want O_RDWR %d): the daemon maps the region writable", errs.ErrInvalidArgument, flags&unix.O_ACCMODE, unix.O_RDWR)
	}
	if sealsErr != nil {
		return 0, fmt.Errorf("%w: host_fd: the file cannot be sealed (F_GET_SEALS: %v): it is not a memfd, and its owner could truncate it under the daemon's mapping; allocate with %s", errs.ErrInvalidArgument, sealsErr, Allocator)
	}
	if seals&RequiredSeals != RequiredSeals {
		return 0, fmt.Errorf("%w: host_fd: the memfd's seals %#x lack F_SEAL_SHRINK (%#x), so it could be truncated under the daemon's mapping: add it (fcntl(F_ADD_SEALS, F_SEAL_SHRINK)) or allocate with %s", errs.ErrInvalidArgument, seals, RequiredSeals, Allocator)
	}
	if w := seals & (unix.F_SEAL_WRITE | unix.F_SEAL_FUTURE_WRITE); w != 0 {
		return 0, fmt.Errorf("%w: host_fd: the memfd's seals %#x include write seals %#x: the daemon maps the region writable", errs.ErrInvalidArgument, seals, w)
	}
	if size <= 0 {
		return 0, fmt.Errorf("%w: host_fd: the memfd is empty (size %d): size it (ftruncate) before handing it over", errs.ErrInvalidArgument, size)
	}
	return uint64(size), nil
}
