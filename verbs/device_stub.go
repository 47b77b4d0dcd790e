//go:build !cgo || !linux

package verbs

// ListDevices is unavailable without cgo.
func ListDevices() ([]string, error) { return nil, errUnavailable }

// Context is an open device (stub).
type Context struct{}

// Open is unavailable without cgo.
func Open(name string) (*Context, error) { return nil, errUnavailable }

func (c *Context) Name() string                          { return "" }
func (c *Context) Attr() DeviceAttr                      { return DeviceAttr{} }
func (c *Context) QueryPort(port int) (PortAttr, error)  { return PortAttr{}, errUnavailable }
func (c *Context) QueryGID(port, index int) (GID, error) { return GID{}, errUnavailable }
func (c *Context) AsyncFD() int                          { return -1 }
func (c *Context) DrainAsync(out []AsyncEvent) int       { return 0 }
func (c *Context) Close() error                          { return nil }
