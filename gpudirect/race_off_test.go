//go:build !race

package gpudirect

const raceOn = false
