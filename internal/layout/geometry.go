package layout

// GeometryError is a refusal that depends on a layout's geometry (its
// num_blocks, its segments and their block_len) rather than on the request
// alone. A daemon that judged a request against a cached resolution of a
// peer's layout may be judging by a geometry the peer has since replaced
// (the layout re-registered under the same export name): it drops the
// resolution and resolves once more before reporting the error.
type GeometryError struct {
	// Src and Dst say whose geometry refused: an id of that side not below
	// its num_blocks, or both for incompatible layouts.
	Src, Dst bool
	Err      error
}

func (e *GeometryError) Error() string { return e.Err.Error() }
func (e *GeometryError) Unwrap() error { return e.Err }
