//go:build race

package lease

// raceEnabled: the race detector slows everything ~10x; tests bound
// waits against hangs then, never assert speed.
const raceEnabled = true
