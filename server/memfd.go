package server

import (
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/region/fdpass"
)

// Memory a client allocated itself reaches the daemon as a sealed memfd on
// the raw submit socket: a first frame tagged fdpass.Hello carries it
// (SCM_RIGHTS), the answer a token that RegisterRegion names
// (internal/region/fdpass). The frames of such a connection are read with
// recvmsg: a plain read would drop the descriptors.

// readFrame reads one frame into b, and the descriptor that came with it
// (-1: none). Descriptors past the first are closed.
func readFrame(c net.Conn, b []byte) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		_, err := io.ReadFull(c, b)
		return -1, err
	}
	fd := -1
	oob := make([]byte, unix.CmsgSpace(4*4))
	for n := 0; n < len(b); {
		m, oobn, _, _, err := uc.ReadMsgUnix(b[n:], oob)
		for _, got := range parseRights(oob[:oobn]) {
			if fd < 0 {
				fd = got
			} else {
				unix.Close(got)
			}
		}
		n += m
		if err != nil || m == 0 {
			if fd >= 0 {
				unix.Close(fd)
			}
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return -1, err
		}
	}
	return fd, nil
}

func parseRights(oob []byte) []int {
	var fds []int
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for i := range cms {
		if got, err := unix.ParseUnixRights(&cms[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// serveFDs takes the descriptors of c, the first (fd, with its frame req)
// read already, until c closes; those not registered by then are dropped.
func (s *Server) serveFDs(c net.Conn, who region.Caller, pid int32, req []byte, fd int) {
	dep := s.cfg.Registry.Depositor(who, pid)
	defer dep.Close()
	for {
		var a fdpass.Answer
		err := fdpass.CheckRequest(req)
		switch {
		case err != nil:
		case fd < 0:
			err = fmt.Errorf("%w: host_fd: the frame carried no descriptor (send it as SCM_RIGHTS with the frame)", errs.ErrInvalidArgument)
		default:
			a.Token, a.Size, err = dep.Put(fd)
			fd = -1
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			st := status.Convert(grpcstatus.ToStatus(err))
			a.Code, a.Msg = uint32(st.Code()), st.Message()
			s.cfg.Log.Debug("descriptor refused", "uid", who.UID, "pid", pid, "error", err)
		} else {
			s.cfg.Log.Debug("descriptor taken", "uid", who.UID, "pid", pid, "bytes", a.Size)
		}
		if _, werr := c.Write(a.Encode(nil)); werr != nil {
			return
		}
		if fd, err = readFrame(c, req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.cfg.Log.Debug("descriptor connection ended", "uid", who.UID, "pid", pid, "error", err)
			}
			return
		}
	}
}
