//go:build race

package gpudirect

// raceOn: the race detector is on; sync.Pool then drops some of what it
// is given, so allocation counts are not the program's.
const raceOn = true
