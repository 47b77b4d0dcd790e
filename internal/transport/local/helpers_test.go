package local

import (
	"net"
	"unsafe"

	"github.com/b2bd/b2bd/internal/memory"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

type netDialer struct{}

func (netDialer) dial(path string) (net.Conn, error) { return net.Dial("unix", path) }

func memory4(m memory.Memory, off uint64) memory.Memory {
	m.Addr += uintptr(off)
	m.Len -= off
	m.Host = m.Host[off:]
	return m
}

func endpoint(boot, sock, tok string, dig []byte) Endpoint {
	return Endpoint{BootID: boot, Socket: sock, TokenPath: tok, TokenDigest: dig}
}
