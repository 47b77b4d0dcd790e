package layout

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// CheckExportName checks name, given in field (e.g. "export_name"), as a
// name peers resolve, by the rule region export names follow: at most
// MaxNameLen bytes of ASCII letters, digits and -_./: (a layout's regions
// are exported as <export_name>.<region id>, so the two must agree). No
// NUL: the peer manager keys a name's read resolution as name + NUL +
// "read", and such a name could alias another's entry; no control byte,
// space or non-ASCII either, which would garble the logs and messages that
// quote it or look like another name. The empty name passes (the caller
// decides whether it may be empty).
func CheckExportName(field, name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %s is %d bytes, over the limit of %d", errs.ErrInvalidArgument, field, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !nameByte(c) {
			return fmt.Errorf("%w: %s %q has byte %#02x at offset %d: a name is ASCII letters, digits and -_./: (no NUL, control, space or non-ASCII byte)",
				errs.ErrInvalidArgument, field, name, c, i)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}
