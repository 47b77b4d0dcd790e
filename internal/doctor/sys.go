package doctor

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

func memlock() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if r.Cur == unix.RLIM_INFINITY {
		return Unlimited, nil
	}
	return r.Cur, nil
}

// statfs describes the filesystem of path or, when path does not exist yet,
// of its nearest existing parent.
func statfs(path string) (FS, error) {
	for {
		var s unix.Statfs_t
		err := unix.Statfs(path, &s)
		if err == nil {
			return FS{Type: int64(s.Type), Free: s.Bavail * uint64(s.Bsize), Total: s.Blocks * uint64(s.Bsize)}, nil
		}
		parent := filepath.Dir(path)
		if !os.IsNotExist(err) || parent == path {
			return FS{}, fmt.Errorf("statfs %s: %w", path, err)
		}
		path = parent
	}
}
