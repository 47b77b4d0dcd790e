package local

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/b2bd/b2bd/internal/errs"
)

// A host region is a mapping of a file in the shm dir. The receiving daemon
// finds that file through /proc/self/maps (the registry hands the transports
// memory, not files), opens it, and checks that the inode it opened is the
// one mapped, so a client that replaced the file at its path is not handed on.

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uintptr
	offset     uint64
	major      uint32
	minor      uint32
	inode      uint64
	path       string
}

// maxMapsLine bounds a line of /proc/self/maps (a path is at most PATH_MAX).
const maxMapsLine = 4096 + 128

// parseMapsLine parses "start-end perms offset major:minor inode   path".
func parseMapsLine(line []byte) (mapping, error) {
	var m mapping
	if len(line) > maxMapsLine {
		return m, fmt.Errorf("%w: maps line is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(line), maxMapsLine)
	}
	field := func(name string) ([]byte, error) {
		line = bytes.TrimLeft(line, " ")
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			i = len(line)
		}
		f := line[:i]
		line = line[i:]
		if len(f) == 0 {
			return nil, fmt.Errorf("%w: maps line: %s is missing", errs.ErrInvalidArgument, name)
		}
		return f, nil
	}
	hex := func(name string, b []byte, bits int) (uint64, error) {
		v, err := strconv.ParseUint(string(b), 16, bits)
		if err != nil {
			return 0, fmt.Errorf("%w: maps line: %s %q: %v", errs.ErrInvalidArgument, name, b, err)
		}
		return v, nil
	}
	r, err := field("address range")
	if err != nil {
		return m, err
	}
	lo, hi, ok := bytes.Cut(r, []byte{'-'})
	if !ok {
		return m, fmt.Errorf("%w: maps line: address range %q has no dash", errs.ErrInvalidArgument, r)
	}
	s, err := hex("start", lo, 64)
	if err != nil {
		return m, err
	}
	e, err := hex("end", hi, 64)
	if err != nil {
		return m, err
	}
	if e <= s {
		return m, fmt.Errorf("%w: maps line: range %q ends before it starts", errs.ErrInvalidArgument, r)
	}
	m.start, m.end = uintptr(s), uintptr(e)
	if _, err := field("perms"); err != nil {
		return m, err
	}
	o, err := field("offset")
	if err != nil {
		return m, err
	}
	if m.offset, err = hex("offset", o, 64); err != nil {
		return m, err
	}
	d, err := field("device")
	if err != nil {
		return m, err
	}
	maj, min, ok := bytes.Cut(d, []byte{':'})
	if !ok {
		return m, fmt.Errorf("%w: maps line: device %q has no colon", errs.ErrInvalidArgument, d)
	}
	v, err := hex("major", maj, 32)
	if err != nil {
		return m, err
	}
	m.major = uint32(v)
	if v, err = hex("minor", min, 32); err != nil {
		return m, err
	}
	m.minor = uint32(v)
	in, err := field("inode")
	if err != nil {
		return m, err
	}
	if m.inode, err = strconv.ParseUint(string(in), 10, 64); err != nil {
		return m, fmt.Errorf("%w: maps line: inode %q: %v", errs.ErrInvalidArgument, in, err)
	}
	m.path = string(bytes.TrimLeft(line, " "))
	return m, nil
}

// mapsPath is read by findMapping (a test may point it elsewhere).
var mapsPath = "/proc/self/maps"

// findMapping returns the mapping holding [addr, addr+n).
func findMapping(addr uintptr, n uint64) (mapping, error) {
	f, err := os.Open(mapsPath)
	if err != nil {
		return mapping{}, fmt.Errorf("samehost: open %s: %w", mapsPath, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), maxMapsLine+1)
	for sc.Scan() {
		m, err := parseMapsLine(sc.Bytes())
		if err != nil {
			return mapping{}, fmt.Errorf("samehost: %s: %w", mapsPath, err)
		}
		if addr >= m.start && addr < m.end {
			if uint64(m.end-addr) < n {
				return mapping{}, fmt.Errorf("%w: samehost: [%#x, +%d) spans more than one mapping (%#x-%#x %s)", errs.ErrInvalidArgument, addr, n, m.start, m.end, m.path)
			}
			return m, nil
		}
	}
	if err := sc.Err(); err != nil {
		return mapping{}, fmt.Errorf("samehost: read %s: %w", mapsPath, err)
	}
	return mapping{}, fmt.Errorf("%w: samehost: %#x is not mapped", errs.ErrInvalidArgument, addr)
}
