package local

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/b2bd/b2bd/internal/errs"
)

// The same-host proof. A daemon writes a random token into a file of its
// shm dir that only the daemon's user and the b2bd group can read (mode
// 0640 inside the 0770 shm dir), and advertises in its handshake its boot ID,
// the file's path and the token's digest, never the token. A sender believes
// the peer shares its host only when the boot IDs match AND the file at that
// path, opened on the sender's own host, holds a token with that digest. A
// remote peer cannot produce a digest of a file on our host that it cannot
// read; it could only repeat what a real local daemon advertised, and the
// sender would then talk to that local daemon, which checks the token again
// (the sender presents it on the Unix socket, where only local processes of
// the daemon's user or root can connect) and hands out memory only for keys
// of regions it exports.

// TokenSize is the secret token's length.
const TokenSize = 32

// DigestSize is the advertised digest's length (SHA-256).
const DigestSize = sha256.Size

// tokenDomain separates the token's digest from any other use of SHA-256.
const tokenDomain = "b2bd-local-token\x00"

// bootIDPath is where Linux keeps the random ID of the current boot.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID reads this host's boot ID.
func BootID() (string, error) {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return "", fmt.Errorf("samehost: read %s: %w", bootIDPath, err)
	}
	id := strings.TrimSpace(string(b))
	if err := checkBootID("boot_id", id); err != nil {
		return "", err
	}
	return id, nil
}

// checkBootID accepts the kernel's form: 36 characters of hex and dashes.
func checkBootID(field, id string) error {
	if len(id) != 36 {
		return fmt.Errorf("%w: %s %q: a boot ID is 36 characters, got %d", errs.ErrInvalidArgument, field, id, len(id))
	}
	for i, c := range id {
		dash := i == 8 || i == 13 || i == 18 || i == 23
		if dash != (c == '-') || (!dash && !strings.ContainsRune("0123456789abcdef", c)) {
			return fmt.Errorf("%w: %s %q: character %d is not a lower-case hex digit or a dash where one belongs", errs.ErrInvalidArgument, field, id, i)
		}
	}
	return nil
}

// Digest is the advertised digest of token.
func Digest(token []byte) []byte {
	h := sha256.New()
	h.Write([]byte(tokenDomain))
	h.Write(token)
	return h.Sum(nil)
}

// newToken creates dir/name holding a fresh random token, mode 0640, group
// gid when gid > 0.
func newToken(path string, gid int) ([]byte, error) {
	tok := make([]byte, TokenSize)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("samehost: random token: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("samehost: create token file %s: %w", path, err)
	}
	werr := func() error {
		if gid > 0 {
			if err := f.Chown(-1, gid); err != nil {
				return fmt.Errorf("chown to gid %d: %w", gid, err)
			}
		}
		if err := f.Chmod(0o640); err != nil {
			return fmt.Errorf("chmod 0640: %w", err)
		}
		if _, err := f.Write(tok); err != nil {
			return err
		}
		return nil
	}()
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("samehost: write token file %s: %w", path, err)
	}
	return tok, nil
}

// CheckEndpoint validates an advertised endpoint's fields (shape only).
func CheckEndpoint(ep Endpoint) error {
	if err := checkBootID("local.boot_id", ep.BootID); err != nil {
		return err
	}
	for _, f := range []struct{ name, path string }{{"local.socket", ep.Socket}, {"local.token_path", ep.TokenPath}} {
		switch {
		case f.path == "":
			return fmt.Errorf("%w: %s is empty", errs.ErrInvalidArgument, f.name)
		case len(f.path) > 107:
			return fmt.Errorf("%w: %s is %d bytes, over the limit of 107 (a Unix socket path)", errs.ErrInvalidArgument, f.name, len(f.path))
		case !filepath.IsAbs(f.path) || filepath.Clean(f.path) != f.path:
			return fmt.Errorf("%w: %s %q is not a clean absolute path", errs.ErrInvalidArgument, f.name, f.path)
		case strings.IndexByte(f.path, 0) >= 0:
			return fmt.Errorf("%w: %s holds a NUL byte", errs.ErrInvalidArgument, f.name)
		}
	}
	if len(ep.TokenDigest) != DigestSize {
		return fmt.Errorf("%w: local.token_digest is %d bytes, want %d", errs.ErrInvalidArgument, len(ep.TokenDigest), DigestSize)
	}
	return nil
}

// Verify checks that ep was advertised by a daemon on this host (see the
// proof above) and returns its token, which the sender presents on the
// daemon's socket. Errors say why the peer is not taken as local.
func Verify(ep Endpoint) ([]byte, error) {
	if err := CheckEndpoint(ep); err != nil {
		return nil, err
	}
	own, err := BootID()
	if err != nil {
		return nil, err
	}
	if own != ep.BootID {
		return nil, fmt.Errorf("%w: the peer's boot ID %s is not this host's %s", errs.ErrFailedPrecondition, ep.BootID, own)
	}
	f, err := os.Open(ep.TokenPath)
	if err != nil {
		return nil, fmt.Errorf("%w: the peer's token file %s cannot be read here (another host, or this daemon is not in the peer's b2bd group): %v", errs.ErrFailedPrecondition, ep.TokenPath, err)
	}
	defer f.Close()
	tok := make([]byte, TokenSize+1)
	n, err := io.ReadFull(f, tok)
	if err != io.ErrUnexpectedEOF && err != nil && err != io.EOF {
		return nil, fmt.Errorf("%w: read the peer's token file %s: %v", errs.ErrFailedPrecondition, ep.TokenPath, err)
	}
	if n != TokenSize {
		return nil, fmt.Errorf("%w: the peer's token file %s holds %d bytes, not %d", errs.ErrFailedPrecondition, ep.TokenPath, n, TokenSize)
	}
	tok = tok[:TokenSize]
	if subtle.ConstantTimeCompare(Digest(tok), ep.TokenDigest) != 1 {
		return nil, fmt.Errorf("%w: the token in %s does not match the digest the peer advertised", errs.ErrFailedPrecondition, ep.TokenPath)
	}
	return bytes.Clone(tok), nil
}
